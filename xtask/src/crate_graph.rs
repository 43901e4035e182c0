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

/// The crates whose top-level modules must form no cycle (the layering inside a crate, which the
/// compiler does not keep): their source folders.
pub const ACYCLIC_CRATES: &[&str] =
    &["tracer-user/core/src", "tracer-user/agent/src", "tracer-user/client/src", "tracer-user/cli/src"];

/// The product crates' source folders, whose files keep to [`MAX_FILE_LINES`].
pub const PRODUCT_SOURCES: &[&str] = &[
    "tracer-common/src",
    "tracer-ebpf/src",
    "proto/src",
    "tracer-user/core/src",
    "tracer-user/agent/src",
    "tracer-user/client/src",
    "tracer-user/cli/src",
];

/// The most lines a product source file may have, its inline `#[cfg(test)] mod tests` not counted.
pub const MAX_FILE_LINES: usize = 800;

/// A file's lines up to its inline `#[cfg(test)] mod tests`, if it has one.
pub fn code_lines(text: &str) -> usize {
    text.split("\n#[cfg(test)]\nmod tests").next().unwrap_or_default().lines().count()
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// The top-level module a source file belongs to (`src/foo.rs`, `src/foo/…` → `foo`), and whether
/// the file is the module's own root (where `super::` is the crate root). `None` for the crate root
/// and for test files (`tests.rs`, anything under a `tests/` folder).
fn top_module(rel: &Path) -> Option<(String, bool)> {
    let parts: Vec<_> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let file = parts.last()?;
    if file == "tests.rs" || parts.iter().any(|p| p == "tests") {
        return None;
    }
    match parts.as_slice() {
        [f] if f == "lib.rs" || f == "main.rs" => None,
        [f] => Some((f.trim_end_matches(".rs").to_string(), true)),
        [d, f] => Some((d.clone(), f == "mod.rs")),
        [d, ..] => Some((d.clone(), false)),
        [] => None,
    }
}

/// The top-level modules one file's code names (`crate::x`, `use crate::{x, …}`, and `super::x` in
/// a module root), comments and an inline `#[cfg(test)] mod tests` left out.
pub fn references(text: &str, module_root: bool) -> BTreeSet<String> {
    let code: String = text
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default()
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect() };
    let mut prefixes = vec!["crate::"];
    if module_root {
        prefixes.push("super::");
    }
    for prefix in prefixes {
        for (at, _) in code.match_indices(prefix) {
            let rest = &code[at + prefix.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // The names at the group's first level: `{a, b::{c, d}, e::f}` → a, b, e.
                let (mut depth, mut item) = (0, String::new());
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            out.insert(ident(item.trim()));
                            item.clear();
                            continue;
                        }
                        _ => {}
                    }
                    if depth == 0 {
                        item.push(c);
                    }
                }
                out.insert(ident(item.trim()));
            } else {
                out.insert(ident(rest));
            }
        }
    }
    out.retain(|m| !m.is_empty() && m != "self" && m.chars().next().is_some_and(|c| c.is_ascii_lowercase()));
    out
}

/// The arrows between one crate's top-level modules, each with a file that makes it.
pub fn module_graph(src: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let files = rust_files(src);
    let mut modules = BTreeSet::new();
    let mut refs = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(src).unwrap_or(f);
        let Some((me, root)) = top_module(rel) else { continue };
        modules.insert(me.clone());
        let text = std::fs::read_to_string(f).unwrap_or_default();
        refs.push((me, rel.display().to_string(), references(&text, root)));
    }
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for m in &modules {
        graph.entry(m.clone()).or_default();
    }
    for (me, file, to) in refs {
        for t in to.into_iter().filter(|t| *t != me && modules.contains(t)) {
            graph.entry(me.clone()).or_default().entry(t).or_insert_with(|| file.clone());
        }
    }
    graph
}

/// One cycle of `graph`, as the modules along it (the first repeated at the end), if there is one.
pub fn find_cycle<V>(graph: &BTreeMap<String, BTreeMap<String, V>>) -> Option<Vec<String>> {
    // 0: not seen, 1: on the current path, 2: done.
    fn visit<V>(
        v: &str,
        graph: &BTreeMap<String, BTreeMap<String, V>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(v.to_string(), 1);
        path.push(v.to_string());
        for w in graph.get(v).into_iter().flat_map(|m| m.keys()) {
            match state.get(w.as_str()).copied().unwrap_or(0) {
                1 => {
                    let start = path.iter().position(|p| p == w).unwrap_or(0);
                    let mut cycle = path[start..].to_vec();
                    cycle.push(w.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(w, graph, state, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(v.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for v in graph.keys() {
        if state.get(v.as_str()).copied().unwrap_or(0) == 0 {
            let mut path = Vec::new();
            if let Some(c) = visit(v, graph, &mut state, &mut path) {
                return Some(c);
            }
        }
    }
    None
}

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

    #[test]
    fn the_modules_of_each_user_space_crate_form_no_cycle() {
        let mut problems = Vec::new();
        for src in ACYCLIC_CRATES {
            let graph = module_graph(&root().join(src));
            assert!(graph.len() > 3, "{src}: found only {} modules; is the path right?", graph.len());
            if let Some(cycle) = find_cycle(&graph) {
                let arrows: Vec<String> =
                    cycle.windows(2).map(|w| format!("{} -> {} ({})", w[0], w[1], graph[&w[0]][&w[1]])).collect();
                problems.push(format!("{src}: {}", arrows.join(", ")));
            }
        }
        assert!(
            problems.is_empty(),
            "top-level modules that depend on each other (move what both need below both, or merge them):\n  {}",
            problems.join("\n  ")
        );
    }

    #[test]
    fn module_references_and_cycles_are_found() {
        let r = references("use crate::{a, b::{c, d}, e::f};\nlet x = crate::g::h();\n// crate::no\nsuper::s();", true);
        assert_eq!(r, ["a", "b", "e", "g", "s"].into_iter().map(String::from).collect());
        assert!(!references("super::s();", false).contains("s"));
        assert!(references("#[cfg(test)]\nmod tests { use crate::t; }", true).is_empty());
        let g = |arrows: &[(&str, &str)]| {
            let mut g: BTreeMap<String, BTreeMap<String, ()>> = BTreeMap::new();
            for (a, b) in arrows {
                g.entry(a.to_string()).or_default().insert(b.to_string(), ());
                g.entry(b.to_string()).or_default();
            }
            g
        };
        assert_eq!(find_cycle(&g(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
        assert_eq!(
            find_cycle(&g(&[("a", "b"), ("b", "c"), ("c", "a")])),
            Some(["a", "b", "c", "a"].into_iter().map(String::from).collect())
        );
    }

    #[test]
    fn no_product_file_is_over_the_size_budget() {
        let mut over = Vec::new();
        let mut seen = 0;
        for dir in PRODUCT_SOURCES {
            for f in rust_files(&root().join(dir)) {
                let rel = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
                let name = f.file_name().unwrap_or_default().to_string_lossy();
                if name == "tests.rs" || rel.contains("/tests/") {
                    continue;
                }
                seen += 1;
                let n = code_lines(&std::fs::read_to_string(&f).unwrap());
                if n > MAX_FILE_LINES {
                    over.push(format!("{rel}: {n} lines"));
                }
            }
        }
        assert!(seen > 100, "found only {seen} product files; are PRODUCT_SOURCES right?");
        assert!(
            over.is_empty(),
            "files over {MAX_FILE_LINES} lines (split them by what they do; tests go in a tests.rs beside them):\n  {}",
            over.join("\n  ")
        );
    }

    #[test]
    fn code_lines_stop_at_the_inline_tests() {
        assert_eq!(code_lines("a\nb\n#[cfg(test)]\nmod tests {\n x\n}\n"), 2);
        assert_eq!(code_lines("a\nb\nc\n"), 3);
    }
}
