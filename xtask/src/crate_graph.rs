//! The crate graph `docs/ARCHITECTURE.md` draws, checked against the workspace's manifests: the
//! arrows between the workspace's own crates (normal and build dependencies), and what the layers
//! below the agent must never link (an async runtime, the kernel, the network, the cluster). A new
//! arrow is a design change: it is made in ARCHITECTURE.md and in the manifests together, or this
//! test fails. Run by `cargo test -p xtask` (so by `cargo xtask test`).
use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Command,
};

/// The graph between the markers `<!-- crate-graph -->` and `<!-- /crate-graph -->` of
/// ARCHITECTURE.md: lines `crate -> dep, dep` (a crate with no workspace dependency: `crate ->`).
pub fn documented(text: &str) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let start = text.find("<!-- crate-graph -->").ok_or("no `<!-- crate-graph -->` marker")?;
    let end = text.find("<!-- /crate-graph -->").ok_or("no `<!-- /crate-graph -->` marker")?;
    let mut graph = BTreeMap::new();
    for line in text[start..end].lines().skip(1) {
        let line = line.trim();
        let Some((from, to)) = line.split_once("->") else { continue };
        let deps = to.split(',').map(str::trim).filter(|d| !d.is_empty()).map(str::to_string).collect();
        if graph.insert(from.trim().to_string(), deps).is_some() {
            return Err(format!("{} is listed twice", from.trim()));
        }
    }
    Ok(graph)
}

/// The arrows the manifests make between the workspace's crates (normal and build dependencies;
/// dev-dependencies are the tests' business), read from `cargo metadata`.
pub fn actual(metadata: &serde_json::Value) -> BTreeMap<String, BTreeSet<String>> {
    let packages = metadata["packages"].as_array().cloned().unwrap_or_default();
    let ours: BTreeSet<String> = packages.iter().filter_map(|p| p["name"].as_str().map(str::to_string)).collect();
    let mut graph = BTreeMap::new();
    for p in &packages {
        let name = p["name"].as_str().unwrap_or_default().to_string();
        let deps = p["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["kind"].is_null() || d["kind"] == "build")
            .filter_map(|d| d["name"].as_str())
            .filter(|d| ours.contains(*d))
            .map(str::to_string)
            .collect();
        graph.insert(name, deps);
    }
    graph
}

/// Crates that must not be in the normal dependency tree of the layers below the agent.
pub const RUNTIME_CRATES: &[&str] =
    &["tokio", "tonic", "hyper", "axum", "aya", "aya-obj", "kube", "k8s-openapi", "nvml-wrapper", "procfs"];

/// The crates whose normal dependency tree (resolved for the crate alone) must not hold any of
/// [`RUNTIME_CRATES`], and why.
pub const PURE_LAYERS: &[(&str, &str)] = &[("tracer-core", "no kernel, no async runtime, no network")];

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> &'static Path {
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
    }

    fn cargo() -> Command {
        Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
    }

    #[test]
    fn the_crate_graph_is_the_one_architecture_md_draws() {
        let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
        let documented = documented(&doc).unwrap();
        let out = cargo()
            .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
            .current_dir(root())
            .output()
            .expect("cargo metadata runs");
        assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
        let actual = actual(&serde_json::from_slice(&out.stdout).unwrap());
        let mut problems = Vec::new();
        for (krate, deps) in &actual {
            match documented.get(krate) {
                None => problems.push(format!("{krate} is not in the graph")),
                Some(doc) if doc != deps => {
                    let added: Vec<_> = deps.difference(doc).collect();
                    let gone: Vec<_> = doc.difference(deps).collect();
                    problems.push(format!("{krate}: arrows not documented {added:?}, documented but gone {gone:?}"));
                }
                Some(_) => {}
            }
        }
        for krate in documented.keys().filter(|k| !actual.contains_key(*k)) {
            problems.push(format!("{krate} is documented but not a workspace crate"));
        }
        assert!(
            problems.is_empty(),
            "the crate graph drifted from docs/ARCHITECTURE.md (change both together):\n  {}",
            problems.join("\n  ")
        );
    }

    #[test]
    fn the_pure_layers_link_no_runtime() {
        for (krate, why) in PURE_LAYERS {
            let out = cargo()
                .args(["tree", "-p", krate, "-e", "normal", "--prefix", "none", "--offline"])
                .current_dir(root())
                .output()
                .expect("cargo tree runs");
            assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
            let tree = String::from_utf8_lossy(&out.stdout);
            let linked: BTreeSet<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
            let bad: Vec<_> = RUNTIME_CRATES.iter().filter(|c| linked.contains(**c)).collect();
            assert!(
                bad.is_empty(),
                "{krate} ({why}) links {bad:?}: `cargo tree -p {krate} -i <crate>` says through what"
            );
        }
    }

    #[test]
    fn the_graph_section_parses() {
        let g = documented("x\n<!-- crate-graph -->\n```\na -> b, c\nb ->\n```\n<!-- /crate-graph -->\n").unwrap();
        assert_eq!(g["a"], ["b", "c"].into_iter().map(String::from).collect());
        assert!(g["b"].is_empty());
        assert!(documented("a -> b").is_err());
        assert!(documented("<!-- crate-graph -->\na ->\na -> b\n<!-- /crate-graph -->").is_err());
    }
}
