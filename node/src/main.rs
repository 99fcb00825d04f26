//! The `dart` binary.

fn main() {
    println!("dart {}", env!("CARGO_PKG_VERSION"));
}
