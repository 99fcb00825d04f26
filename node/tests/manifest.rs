//! The shipped Kubernetes manifest stays in step with the flags: its container arguments parse,
//! and they turn the peer-plane secret and an upstream allow list on.

use clap::Parser;
use dart_node::cli::Cli;

#[test]
fn the_shipped_manifest_arguments_parse_and_turn_security_on() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes/dart.yaml");
    let text = std::fs::read_to_string(path).expect("deploy/kubernetes/dart.yaml");
    // The container's `args:` entries: `- --flag=value` lines (comments and other lists aside).
    let args: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix("- --"))
        .map(|a| format!("--{a}"))
        // Kubernetes expands $(VAR) from the downward API; any value does for parsing.
        .map(|a| a.replace("$(POD_IP)", "10.0.0.7").replace("$(NODE_NAME)", "node-7"))
        .collect();
    assert!(args.len() >= 8, "{args:?}");
    let cli = Cli::try_parse_from(std::iter::once("dart".to_owned()).chain(args.clone()))
        .unwrap_or_else(|e| panic!("the manifest's arguments do not parse: {e}\n{args:?}"));
    let flags = cli.node;
    assert_eq!(
        flags.cluster_secret_file.as_deref(),
        Some(std::path::Path::new("/etc/dart/secret/cluster-secret"))
    );
    assert!(!flags.allow_upstream.is_empty(), "the manifest narrows the upstream policy");
    for p in &flags.allow_upstream {
        p.parse::<dart_core::policy::Pattern>().unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(!flags.credential_ttl.is_zero());
}
