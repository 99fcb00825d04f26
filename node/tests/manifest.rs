//! The shipped deployment files stay in step with the binary (docs/deployment.md):
//!
//! - the plain Kubernetes manifest's container arguments parse with the binary's flag parser, turn
//!   the peer-plane secret, an upstream allow list and DNS discovery through its headless Service
//!   on, and name only env variables the container declares;
//! - the Helm chart, rendered by hand from its values.yaml (a small line-based reader and a
//!   renderer for the few template constructs the chart uses; helm itself is not run), gives
//!   arguments that parse, for each discovery mode;
//! - the ports of values.yaml, the chart and the manifest are the binary's flag defaults;
//! - every `--flag` in the manifest and the chart's templates is a flag of the binary;
//! - the Grafana dashboard parses and queries only metric names and labels the node exports.
//!
//! Nothing is started: the exported metrics come from the node's own registry, rendered to text.

use clap::{CommandFactory, Parser};
use dart_net_tokio::cache::MemCache;
use dart_net_tokio::metrics::{Metrics, Scrape};
use dart_node::cli::{listen_addr, Cli, NodeFlags};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MANIFEST: &str = "deploy/kubernetes/dart.yaml";
const CHART: &str = "deploy/helm/dart";
const DASHBOARD: &str = "deploy/grafana/dart.json";
/// The release name the docs install the chart under (`helm install dart deploy/helm/dart`).
const RELEASE: &str = "dart";

fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo_path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Kubernetes YAML, line by line (the files are written in the few shapes read here).

/// The container's `args:` entries: `- --flag=value` list items (comments aside, quotes off).
fn container_args(yaml: &str) -> Vec<String> {
    yaml.lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix("- "))
        .map(unquote)
        .filter(|a| a.starts_with("--"))
        .collect()
}

/// The `--name` of every argument list item of a file, its comments aside (a comment may quote
/// other programs' flags, such as kubectl's).
fn flag_names(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("- "))
        .map(unquote)
        .filter_map(|a| a.strip_prefix("--").map(str::to_owned))
        .map(|a| a.split('=').next().unwrap_or_default().to_owned())
        .collect()
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    s.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(s).to_owned()
}

/// `key: value` pairs of a line, block (`- name: x`) or flow (`- {name: x, port: 1}`) style.
fn pairs(line: &str) -> Vec<(String, String)> {
    let l = line.trim();
    let l = l.strip_prefix("- ").unwrap_or(l);
    let l = l.trim_start_matches('{').trim_end_matches('}');
    l.split(", ")
        .filter_map(|kv| kv.split_once(": "))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// A `key: <number>` of the list item named `name` (`containerPort`, `hostPort`, `port`).
fn named_port(yaml: &str, name: &str, key: &str) -> Option<u16> {
    let mut current = None::<String>;
    for line in yaml.lines() {
        for (k, v) in pairs(line) {
            if k == "name" {
                current = Some(v);
            } else if k == key && current.as_deref() == Some(name) {
                return Some(v.parse().unwrap_or_else(|e| panic!("{key}: {v}: {e}")));
            }
        }
    }
    None
}

/// The YAML document of `kind` (documents split at `---`).
fn document<'a>(yaml: &'a str, kind: &str) -> &'a str {
    yaml.split("\n---\n")
        .find(|d| d.lines().any(|l| l.trim() == format!("kind: {kind}")))
        .unwrap_or_else(|| panic!("no {kind} document"))
}

/// `metadata.name` of a document.
fn metadata_name(doc: &str) -> String {
    let mut lines = doc.lines().skip_while(|l| l.trim_end() != "metadata:").skip(1);
    let line = lines.find(|l| l.trim_start().starts_with("name: ")).expect("metadata.name");
    line.trim().trim_start_matches("name: ").to_owned()
}

/// The env variable names the container declares (`- name: POD_IP` followed by `valueFrom`).
fn env_names(yaml: &str) -> BTreeSet<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[1].trim().starts_with("valueFrom:"))
        .filter_map(|w| w[0].trim().strip_prefix("- name: "))
        .map(str::to_owned)
        .collect()
}

/// Expands `$(VAR)` as Kubernetes does, with a stand-in value; every variable must be one the
/// container declares (Kubernetes leaves an undeclared one unexpanded, silently).
fn expand(arg: &str, declared: &BTreeSet<String>) -> String {
    let mut out = arg.to_owned();
    while let Some(start) = out.find("$(") {
        let end = start + out[start..].find(')').expect("closing parenthesis");
        let var = &out[start + 2..end];
        assert!(declared.contains(var), "{arg}: $({var}) is not in the container's env");
        let value = match var {
            "POD_IP" => "10.0.0.7",
            "NODE_NAME" => "node-7",
            "POD_NAMESPACE" => "cache-ns",
            other => panic!("no stand-in value for $({other})"),
        };
        out.replace_range(start..=end, value);
    }
    out
}

/// The manifest's arguments expanded and parsed by the binary's parser.
fn parse_args(yaml: &str, what: &str) -> (Vec<String>, NodeFlags) {
    let args = container_args(yaml);
    let declared = env_names(yaml);
    let expanded: Vec<String> = args.iter().map(|a| expand(a, &declared)).collect();
    let cli = Cli::try_parse_from(std::iter::once("dart".to_owned()).chain(expanded.clone()))
        .unwrap_or_else(|e| panic!("{what}: the arguments do not parse: {e}\n{expanded:?}"));
    (args, cli.node)
}

/// The value of `--name=` among `args` (the last one).
fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let prefix = format!("--{name}=");
    args.iter().rev().find_map(|a| a.strip_prefix(prefix.as_str()))
}

fn port_of(listen: &str) -> u16 {
    let (_, port) = listen.rsplit_once(':').unwrap_or_else(|| panic!("no port in {listen}"));
    port.parse().unwrap_or_else(|e| panic!("{listen}: {e}"))
}

/// The client, peer and admin ports of the binary's flag defaults.
fn default_ports() -> BTreeMap<&'static str, u16> {
    let d = NodeFlags::default();
    let port = |s: &str| listen_addr(s).unwrap_or_else(|e| panic!("{e}")).port();
    BTreeMap::from([
        ("client", port(&d.listen)),
        ("peer", port(&d.peer_listen)),
        ("admin", port(&d.admin)),
    ])
}

/// Checks a rendered DaemonSet + Service against each other and the binary: the listeners'
/// ports are the container ports, the discovery name is the Service's, the advertised address
/// is the pod IP at the peer port, the secret file is in the mounted secret.
fn check_consistent(daemonset: &str, service: &str, what: &str) -> (Vec<String>, NodeFlags) {
    let (args, flags) = parse_args(daemonset, what);
    let container = |name: &str| {
        named_port(daemonset, name, "containerPort")
            .unwrap_or_else(|| panic!("{what}: no containerPort {name}"))
    };
    assert_eq!(port_of(&flags.listen), container("client"), "{what}: --listen");
    assert_eq!(port_of(&flags.peer_listen), container("peer"), "{what}: --peer-listen");
    assert_eq!(port_of(&flags.admin), container("admin"), "{what}: --admin");
    assert_eq!(named_port(service, "peer", "port"), Some(container("peer")), "{what}: Service");
    if let Some(discover) = arg(&args, "discover").filter(|d| d.starts_with("dns:")) {
        let svc = metadata_name(document(service, "Service"));
        let want = format!("dns:{svc}.$(POD_NAMESPACE).svc.cluster.local:{}", container("peer"));
        assert_eq!(discover, want, "{what}: --discover names the headless Service");
        assert!(service.contains("clusterIP: None"), "{what}: the Service is headless");
        assert!(service.contains("publishNotReadyAddresses: true"), "{what}");
    }
    if arg(&args, "discover").is_some() {
        let want = format!("$(POD_IP):{}", container("peer"));
        assert_eq!(arg(&args, "peer-advertise"), Some(want.as_str()), "{what}");
    }
    let secret = flags.cluster_secret_file.as_deref().expect("--cluster-secret-file");
    let mount = secret.parent().expect("a directory").to_str().expect("UTF-8");
    assert!(daemonset.contains(&format!("mountPath: {mount}")), "{what}: {mount} not mounted");
    let cache = flags.cache_dir.to_str().expect("UTF-8");
    assert!(daemonset.contains(&format!("mountPath: {cache}")), "{what}: {cache} not mounted");
    (args, flags)
}

#[test]
fn the_shipped_manifest_arguments_parse_and_turn_security_and_discovery_on() {
    let text = read(MANIFEST);
    let what = MANIFEST;
    let (args, flags) =
        check_consistent(document(&text, "DaemonSet"), document(&text, "Service"), what);
    assert!(args.len() >= 12, "{args:?}");
    assert_eq!(
        flags.cluster_secret_file.as_deref(),
        Some(Path::new("/etc/dart/secret/cluster-secret"))
    );
    assert!(!flags.allow_upstream.is_empty(), "the manifest narrows the upstream policy");
    for p in &flags.allow_upstream {
        p.parse::<dart_core::policy::Pattern>().unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(!flags.credential_ttl.is_zero());
    // Discovery through the headless Service `dart` in the pod's own namespace.
    assert_eq!(
        arg(&args, "discover"),
        Some("dns:dart.$(POD_NAMESPACE).svc.cluster.local:9000"),
        "{args:?}"
    );
    assert_eq!(arg(&args, "peer-advertise"), Some("$(POD_IP):9000"), "{args:?}");
    assert!(flags.peers.is_empty(), "membership comes from discovery, not a fixed list");
    assert!(!flags.self_id.is_empty());
}

// ---------------------------------------------------------------------------------------------
// The Helm chart, rendered by hand.

#[derive(Clone, Debug, PartialEq)]
enum Value {
    Scalar(String),
    List(Vec<String>),
}

/// values.yaml as dotted paths (`ports.peer`) to scalars and lists of scalars: nested maps by
/// indentation, `key: value`, `key: []`, `- item` lists; `#` comments. Anything else panics.
fn parse_values(text: &str) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    // The keys (and their indentation) of the maps and lists the current line is inside.
    let mut open: Vec<(usize, String)> = Vec::new();
    let path_of = |open: &[(usize, String)]| {
        open.iter().map(|(_, k)| k.as_str()).collect::<Vec<_>>().join(".")
    };
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split(" #").next().unwrap_or_default().trim_end();
        let t = line.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        assert!(!t.contains(['{', '|', '>', '&', '*']), "values.yaml:{}: unsupported: {t}", n + 1);
        let indent = line.len() - t.len();
        if let Some(item) = t.strip_prefix("- ") {
            while open.last().is_some_and(|(i, _)| *i > indent) {
                open.pop();
            }
            let path = path_of(&open);
            match out.entry(path).or_insert_with(|| Value::List(Vec::new())) {
                Value::List(items) => items.push(unquote(item)),
                Value::Scalar(_) => panic!("values.yaml:{}: a list item under a scalar", n + 1),
            }
            continue;
        }
        while open.last().is_some_and(|(i, _)| *i >= indent) {
            open.pop();
        }
        let (key, value) = t.split_once(':').unwrap_or_else(|| panic!("values.yaml:{}", n + 1));
        let value = value.trim();
        open.push((indent, key.to_owned()));
        let path = path_of(&open);
        if value.is_empty() {
            continue; // a map or a list follows
        }
        open.pop();
        let v = if value == "[]" { Value::List(Vec::new()) } else { Value::Scalar(unquote(value)) };
        assert!(out.insert(path.clone(), v).is_none(), "values.yaml: {path} twice");
    }
    out
}

/// A renderer for the template constructs the chart uses, line by line: `{{ .Values.a.b }}`,
/// `{{ . }}` in a range, `{{ include "dart.fullname" . }}`, `{{ join "," .Values.list }}`,
/// `| quote`, `.Release.Name/Namespace`; control lines `{{- if <cond> }}`, `{{- else if <cond> }}`,
/// `{{- else }}`, `{{- range .Values.list }}`, `{{- end }}` each alone on its line, with
/// conditions `.Values.x`, `eq .Values.x "v"`, `ne .Values.x "v"`. Anything else panics, so a
/// template change this renderer does not understand fails the test instead of passing it. A
/// value the templates name that values.yaml lacks panics too (helm would render it empty).
struct Chart {
    values: BTreeMap<String, Value>,
    namespace: &'static str,
}

impl Chart {
    fn load(overrides: &[(&str, Value)]) -> Chart {
        let mut values = parse_values(&read(&format!("{CHART}/values.yaml")));
        for (k, v) in overrides {
            assert!(values.insert((*k).to_owned(), v.clone()).is_some(), "no value {k}");
        }
        Chart { values, namespace: "cache-ns" }
    }

    fn value(&self, path: &str) -> &Value {
        let key = path.strip_prefix(".Values.").unwrap_or_else(|| panic!("not a value: {path}"));
        self.values.get(key).unwrap_or_else(|| panic!("values.yaml has no {key}"))
    }

    fn scalar(&self, path: &str) -> String {
        match self.value(path) {
            Value::Scalar(s) => s.clone(),
            Value::List(l) => panic!("{path} is a list: {l:?}"),
        }
    }

    fn list(&self, path: &str) -> Vec<String> {
        match self.value(path) {
            Value::List(l) => l.clone(),
            Value::Scalar(s) => panic!("{path} is a scalar: {s}"),
        }
    }

    /// templates/_helpers.tpl's dart.fullname.
    fn fullname(&self) -> String {
        let over = self.scalar(".Values.fullnameOverride");
        if !over.is_empty() {
            over
        } else if RELEASE.contains("dart") {
            RELEASE.to_owned()
        } else {
            format!("{RELEASE}-dart")
        }
    }

    fn render_file(&self, rel: &str) -> String {
        let text = read(&format!("{CHART}/templates/{rel}"));
        let lines: Vec<&str> = text.lines().collect();
        let mut out = Vec::new();
        self.render(&lines, None, &mut out);
        let rendered = out.join("\n") + "\n";
        assert!(!rendered.contains("{{"), "{rel}: left unrendered:\n{rendered}");
        rendered
    }

    fn render(&self, lines: &[&str], dot: Option<&str>, out: &mut Vec<String>) {
        let mut i = 0;
        while i < lines.len() {
            let Some(action) = control(lines[i]) else {
                out.push(self.substitute(lines[i], dot));
                i += 1;
                continue;
            };
            let (elses, end) = block(lines, i);
            if let Some(list) = action.strip_prefix("range ") {
                for item in self.list(list) {
                    self.render(&lines[i + 1..end], Some(&item), out);
                }
            } else if let Some(cond) = action.strip_prefix("if ") {
                // Branches: (condition, first line, end line); `else` has no condition.
                let mut starts = vec![(Some(cond), i + 1)];
                for &e in &elses {
                    let a = control(lines[e]).expect("else");
                    starts.push((a.strip_prefix("else if "), e + 1));
                }
                for (k, &(cond, from)) in starts.iter().enumerate() {
                    let to = starts.get(k + 1).map_or(end, |&(_, next)| next - 1);
                    if cond.is_none_or(|c| self.truthy(c)) {
                        self.render(&lines[from..to], dot, out);
                        break;
                    }
                }
            } else {
                panic!("unexpected control line: {}", lines[i]);
            }
            i = end + 1;
        }
    }

    fn truthy(&self, cond: &str) -> bool {
        let words: Vec<&str> = cond.split_whitespace().collect();
        match words.as_slice() {
            [path] => match self.value(path) {
                Value::Scalar(s) => !matches!(s.as_str(), "" | "false" | "0"),
                Value::List(l) => !l.is_empty(),
            },
            ["eq", path, lit] => self.scalar(path) == unquote(lit),
            ["ne", path, lit] => self.scalar(path) != unquote(lit),
            _ => panic!("the hand renderer does not know the condition {cond:?}"),
        }
    }

    fn substitute(&self, line: &str, dot: Option<&str>) -> String {
        let mut out = String::new();
        let mut rest = line;
        while let Some(start) = rest.find("{{") {
            out.push_str(&rest[..start]);
            let end = start + rest[start..].find("}}").expect("}}");
            out.push_str(&self.eval(&rest[start + 2..end], dot));
            rest = &rest[end + 2..];
        }
        out.push_str(rest);
        out
    }

    fn eval(&self, expr: &str, dot: Option<&str>) -> String {
        let expr = expr.trim().trim_start_matches('-').trim_end_matches('-').trim();
        if let Some((inner, filter)) = expr.rsplit_once('|') {
            let v = self.eval(inner, dot);
            return match filter.trim() {
                "quote" => format!("{v:?}"),
                other => panic!("the hand renderer does not know the filter {other:?}"),
            };
        }
        let words: Vec<&str> = expr.split_whitespace().collect();
        match words.as_slice() {
            ["."] => dot.expect("{{ . }} outside a range").to_owned(),
            ["include", "\"dart.fullname\"", "."] => self.fullname(),
            ["join", sep, path] => self.list(path).join(&unquote(sep)),
            [".Release.Name"] => RELEASE.to_owned(),
            [".Release.Namespace"] => self.namespace.to_owned(),
            [path] if path.starts_with(".Values.") => self.scalar(path),
            _ => panic!("the hand renderer does not know {{{{ {expr} }}}}"),
        }
    }
}

/// The action of a control line (`{{- if x }}` alone on its line), if it is one.
fn control(line: &str) -> Option<&str> {
    let t = line.trim();
    let inner = t.strip_prefix("{{")?.strip_suffix("}}")?;
    assert!(!inner.contains("{{"), "one action per control line: {t}");
    let inner = inner.trim_start_matches('-').trim_end_matches('-').trim();
    let keyword = inner.split_whitespace().next().unwrap_or_default();
    ["if", "else", "end", "range"].contains(&keyword).then_some(inner)
}

/// The `else` lines and the `end` line of the block opened at `open`.
fn block(lines: &[&str], open: usize) -> (Vec<usize>, usize) {
    let mut depth = 0;
    let mut elses = Vec::new();
    for (i, line) in lines.iter().enumerate().skip(open + 1) {
        match control(line).and_then(|a| a.split_whitespace().next()) {
            Some("if" | "range") => depth += 1,
            Some("else") if depth == 0 => elses.push(i),
            Some("end") if depth == 0 => return (elses, i),
            Some("end") => depth -= 1,
            _ => {}
        }
    }
    panic!("no end for: {}", lines[open]);
}

fn scalar(s: &str) -> Value {
    Value::Scalar(s.to_owned())
}

fn list(items: &[&str]) -> Value {
    Value::List(items.iter().map(|s| (*s).to_owned()).collect())
}

#[test]
fn the_chart_values_hold_what_the_docs_promise() {
    let v = Chart::load(&[]).values;
    for (k, want) in [
        ("image.repository", "dart"),
        ("image.tag", "dev"),
        ("hostPort", "true"),
        ("clusterSecret.existingSecret", "dart-cluster-secret"),
        ("cache.dir", "/var/cache/dart"),
        ("cache.size", "8GiB"),
        ("cache.memSize", "512MiB"),
        ("cache.emptyDirSizeLimit", "10Gi"),
        ("discovery.mode", "dns"),
        ("discovery.interval", "5s"),
        ("discovery.forgetAfter", "60s"),
        ("resources.requests.cpu", "200m"),
        ("resources.requests.memory", "1Gi"),
        ("resources.limits.memory", "2Gi"),
        ("fullnameOverride", ""),
    ] {
        assert_eq!(v.get(k), Some(&scalar(want)), "{k}");
    }
    assert_eq!(v.get("extraArgs"), Some(&list(&[])));
    assert!(matches!(v.get("allowUpstream"), Some(Value::List(l)) if !l.is_empty()));
    let chart = read(&format!("{CHART}/Chart.yaml"));
    for line in ["apiVersion: v2", "name: dart", "version: 0.1.0", "appVersion: \"0.1.0\""] {
        assert!(chart.lines().any(|l| l == line), "Chart.yaml: {line}");
    }
}

#[test]
fn the_chart_renders_by_hand_to_arguments_the_binary_parses() {
    // The defaults: DNS discovery through the chart's headless Service.
    let chart = Chart::load(&[]);
    let (ds, svc) = (chart.render_file("daemonset.yaml"), chart.render_file("service.yaml"));
    let (args, flags) = check_consistent(&ds, &svc, "chart defaults");
    assert_eq!(
        arg(&args, "discover"),
        Some("dns:dart.$(POD_NAMESPACE).svc.cluster.local:9000"),
        "{args:?}"
    );
    assert_eq!(arg(&args, "discover-interval"), Some("5s"));
    assert_eq!(arg(&args, "forget-after"), Some("60s"));
    assert_eq!(flags.cache_size, 8 << 30);
    assert_eq!(flags.mem_size, 512 << 20);
    assert_eq!(flags.allow_upstream, chart.list(".Values.allowUpstream"));
    assert!(ds.contains("image: dart:dev"), "{ds}");
    assert!(ds.contains("secretName: dart-cluster-secret"), "{ds}");
    assert!(ds.contains("sizeLimit: 10Gi"), "{ds}");

    // Another release name: the discovery name follows the Service's.
    let chart = Chart::load(&[("fullnameOverride", scalar("edge-cache"))]);
    let (ds, svc) = (chart.render_file("daemonset.yaml"), chart.render_file("service.yaml"));
    let (args, _) = check_consistent(&ds, &svc, "fullnameOverride");
    assert_eq!(
        arg(&args, "discover"),
        Some("dns:edge-cache.$(POD_NAMESPACE).svc.cluster.local:9000")
    );

    // Static discovery, extra flags, other ports, no hostPort.
    let chart = Chart::load(&[
        ("discovery.mode", scalar("static")),
        ("discovery.static", list(&["10.0.0.1:9000", "10.0.0.2:9000"])),
        ("extraArgs", list(&["--credential-ttl=10s", "--warm-start"])),
        ("ports.peer", scalar("7000")),
        ("ports.client", scalar("7080")),
        ("hostPort", scalar("false")),
    ]);
    let (ds, svc) = (chart.render_file("daemonset.yaml"), chart.render_file("service.yaml"));
    let (args, flags) = check_consistent(&ds, &svc, "static discovery");
    assert_eq!(arg(&args, "discover"), Some("static:10.0.0.1:9000,10.0.0.2:9000"));
    assert_eq!(arg(&args, "peer-advertise"), Some("$(POD_IP):7000"));
    assert_eq!(flags.credential_ttl, std::time::Duration::from_secs(10));
    assert!(flags.warm_start);
    assert_eq!(named_port(&ds, "client", "hostPort"), None);

    // No discovery: standalone nodes.
    let chart = Chart::load(&[("discovery.mode", scalar("none"))]);
    let (ds, svc) = (chart.render_file("daemonset.yaml"), chart.render_file("service.yaml"));
    let (args, _) = check_consistent(&ds, &svc, "no discovery");
    for flag in ["discover", "discover-interval", "forget-after", "peer-advertise"] {
        assert_eq!(arg(&args, flag), None, "{flag}: {args:?}");
    }
}

#[test]
fn the_chart_and_the_manifest_use_the_binary_default_ports() {
    let defaults = default_ports();
    assert_eq!(defaults, BTreeMap::from([("client", 8080), ("peer", 9000), ("admin", 9100)]));
    let chart = Chart::load(&[]);
    let ds = chart.render_file("daemonset.yaml");
    let svc = chart.render_file("service.yaml");
    let manifest = read(MANIFEST);
    for (name, port) in &defaults {
        let value = chart.scalar(&format!(".Values.ports.{name}"));
        assert_eq!(value, port.to_string(), "values.yaml ports.{name}");
        assert_eq!(named_port(&ds, name, "containerPort"), Some(*port), "chart {name}");
        assert_eq!(named_port(&manifest, name, "containerPort"), Some(*port), "manifest {name}");
    }
    // Clients reach the node on their own machine's address; peers and admin stay on pod IPs.
    assert_eq!(named_port(&ds, "client", "hostPort"), Some(defaults["client"]));
    assert_eq!(named_port(&manifest, "client", "hostPort"), Some(defaults["client"]));
    for name in ["peer", "admin"] {
        assert_eq!(named_port(&ds, name, "hostPort"), None, "chart {name}");
        assert_eq!(named_port(&manifest, name, "hostPort"), None, "manifest {name}");
    }
    assert_eq!(named_port(&svc, "peer", "port"), Some(defaults["peer"]));
    assert_eq!(named_port(document(&manifest, "Service"), "peer", "port"), Some(defaults["peer"]));
}

#[test]
fn every_flag_in_the_deployment_files_is_a_flag_of_the_binary() {
    let known: BTreeSet<String> =
        Cli::command().get_arguments().filter_map(|a| a.get_long().map(str::to_owned)).collect();
    let dir = repo_path(&format!("{CHART}/templates"));
    let mut files = vec![MANIFEST.to_owned()];
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let name = entry.expect("entry").file_name().into_string().expect("UTF-8");
        if name.ends_with(".yaml") {
            files.push(format!("{CHART}/templates/{name}"));
        }
    }
    assert!(files.len() >= 3, "{files:?}");
    let mut seen = BTreeSet::new();
    for file in &files {
        for flag in flag_names(&read(file)) {
            assert!(known.contains(&flag), "{file}: --{flag} is not a flag of dart");
            seen.insert(flag);
        }
    }
    // The scan found the arguments (a scan that finds nothing would pass vacuously).
    for flag in ["listen", "peer-listen", "discover", "peer-advertise", "cluster-secret-file"] {
        assert!(seen.contains(flag), "--{flag} not found in {files:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// The Grafana dashboard.

/// The node's own exposition (every family with a sample: the circuit gauge as with a peer
/// path, one fetch observed from each source): sample name -> label name -> label values, and
/// the family names (`dart_block_fetch_seconds` of `dart_block_fetch_seconds_bucket`).
type Samples = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn exported() -> (Samples, BTreeSet<String>) {
    let snapshot = Box::new(|| Scrape {
        open_circuits: Some(0),
        tracker_files: Some(0),
        registry_tokens: Some((0, 0)),
        neighbours: Some(vec![dart_core::engine::neighbours::NeighbourReport {
            id: "node-b".into(),
            score: 64,
            weight: 64,
            requests: 0,
            failures: 0,
            round_trip_ms: 300,
        }]),
        broadcast_targets: Some(0),
        ..Scrape::default()
    });
    let metrics = Metrics::new(snapshot, Arc::new(MemCache::default()));
    metrics.observe_fetch("peer", 0.02);
    metrics.observe_fetch("origin", 0.2);
    let text = metrics.encode();
    let mut samples: Samples = BTreeMap::new();
    let mut families = BTreeSet::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            families.insert(t.split(' ').next().unwrap_or_default().to_owned());
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let series = line.rsplit_once(' ').map_or(line, |(s, _)| s);
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        let entry = samples.entry(name.to_owned()).or_default();
        for pair in labels.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or_else(|| panic!("{line}"));
            entry.entry(k.to_owned()).or_default().insert(unquote(v));
        }
    }
    assert!(samples.contains_key("dart_block_source_total"), "{text}");
    assert!(families.contains("dart_block_fetch_seconds"), "{text}");
    (samples, families)
}

/// Labels Prometheus attaches at scrape time (the dashboard's node variable uses `instance`).
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// A label matcher: label, operator (`=`, `!=`, `=~`, `!~`), value.
type Matcher = (String, String, String);

/// Every `dart_*` name in `s`, with the label matchers `{...}` that follow it.
fn selectors(s: &str) -> Vec<(String, Vec<Matcher>)> {
    let mut out = Vec::new();
    let bytes = s.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut i = 0;
    while let Some(at) = s[i..].find("dart_").map(|p| p + i) {
        let mut end = at;
        while end < bytes.len() && ident(bytes[end]) {
            end += 1;
        }
        i = end;
        if at > 0 && ident(bytes[at - 1]) {
            continue;
        }
        let mut matchers = Vec::new();
        if s[end..].starts_with('{') {
            let close = end + s[end..].find('}').expect("}");
            for m in s[end + 1..close].split(',').map(str::trim).filter(|m| !m.is_empty()) {
                let op_at = m.find(['=', '!']).unwrap_or_else(|| panic!("matcher {m}"));
                let op_len = if m[op_at..].starts_with("=~")
                    || m[op_at..].starts_with("!~")
                    || m[op_at..].starts_with("!=")
                {
                    2
                } else {
                    1
                };
                let (label, op, value) =
                    (&m[..op_at], &m[op_at..op_at + op_len], &m[op_at + op_len..]);
                matchers.push((label.trim().to_owned(), op.to_owned(), unquote(value)));
            }
        }
        out.push((s[at..end].to_owned(), matchers));
    }
    out
}

/// The labels of `by (...)` and `without (...)` clauses.
fn grouping_labels(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for kw in ["by (", "without ("] {
        let mut rest = expr;
        while let Some(p) = rest.find(kw) {
            let after = &rest[p + kw.len()..];
            let close = after.find(')').expect(")");
            out.extend(after[..close].split(',').map(|l| l.trim().to_owned()));
            rest = &after[close..];
        }
    }
    out
}

fn strings(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        serde_json::Value::Object(o) => o.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

/// Every panel, rows' nested panels included.
fn panels(dash: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    let mut stack: Vec<&serde_json::Value> =
        dash["panels"].as_array().expect("panels").iter().collect();
    while let Some(p) = stack.pop() {
        if let Some(nested) = p["panels"].as_array() {
            stack.extend(nested);
        }
        out.push(p);
    }
    out
}

#[test]
fn the_grafana_dashboard_queries_only_metrics_the_node_exports() {
    let text = read(DASHBOARD);
    let dash: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"));
    let (exported, families) = exported();

    // The data source is an import input, used by every panel, query and variable.
    let inputs = dash["__inputs"].as_array().expect("__inputs");
    assert!(inputs.iter().any(|i| i["name"] == "DS_PROMETHEUS" && i["pluginId"] == "prometheus"));
    let ds = serde_json::json!({"type": "prometheus", "uid": "${DS_PROMETHEUS}"});
    let mut queries = 0;
    for p in panels(&dash).into_iter().filter(|p| p["type"] != "row") {
        assert_eq!(p["datasource"], ds, "panel {}", p["title"]);
        for t in p["targets"].as_array().expect("targets") {
            assert_eq!(t["datasource"], ds, "panel {}", p["title"]);
            let expr = t["expr"].as_str().expect("expr");
            queries += 1;
            let used = selectors(expr);
            assert!(!used.is_empty(), "{expr}: no dart metric");
            // The labels a query may group or name: its metrics' own and the target labels.
            let mut labels: BTreeSet<&str> = TARGET_LABELS.into_iter().collect();
            for (name, matchers) in &used {
                let have = exported.get(name).unwrap_or_else(|| {
                    panic!("{expr}: {name} is not exported; exported: {:?}", exported.keys())
                });
                labels.extend(have.keys().map(String::as_str));
                for (label, op, value) in matchers {
                    if TARGET_LABELS.contains(&label.as_str()) {
                        continue;
                    }
                    let values = have
                        .get(label)
                        .unwrap_or_else(|| panic!("{expr}: {name} has no label {label}"));
                    if op == "=" {
                        assert!(values.contains(value), "{expr}: {name}{{{label}}} is {values:?}");
                    }
                }
            }
            for g in grouping_labels(expr) {
                assert!(labels.contains(g.as_str()), "{expr}: groups by unknown label {g}");
            }
            let legend = t["legendFormat"].as_str().unwrap_or_default();
            for part in legend.split("{{").skip(1) {
                let label = part.split("}}").next().unwrap_or_default().trim();
                assert!(labels.contains(label), "{expr}: legend names unknown label {label}");
            }
        }
    }
    assert!(queries >= 10, "{queries} queries");

    // Every dart_* name anywhere in the dashboard (variables, descriptions too) is exported, as
    // a sample or (in prose) a family.
    let mut all = Vec::new();
    strings(&dash, &mut all);
    let mut used = BTreeSet::new();
    for s in &all {
        for (name, _) in selectors(s) {
            let known = exported.contains_key(&name) || families.contains(&name);
            assert!(known, "{s}: {name} is not exported");
            used.insert(name);
        }
    }
    for name in [
        "dart_block_source_total",
        "dart_bytes_total",
        "dart_peer_circuits_open",
        "dart_hedge_total",
        "dart_peer_failover_total",
        "dart_block_fetch_seconds_bucket",
        "dart_store_slots",
        "dart_store_blocks",
        "dart_requests_given_up_total",
    ] {
        assert!(used.contains(name), "the dashboard does not show {name}");
    }
}
