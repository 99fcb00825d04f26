//! The `dart` binary: parse flags, then run the node or the demo.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = dart_node::cli::Cli::parse();
    match dart_node::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dart: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
