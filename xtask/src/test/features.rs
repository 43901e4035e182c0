//! Whether `cargo build --release` and `cargo test --release` resolve the same features for the
//! crates both compile. Where a dev-dependency turns on a feature of a crate the release binaries
//! also use, cargo compiles that crate twice, once per feature set, and with it every crate above
//! it: tracer-agent and what links it, about 3 minutes of CI's cold build. `tests/Cargo.toml` turns
//! those features on for the normal build too; this check says when a new dev-dependency needs
//! another line there.
//!
//! Both resolutions come from `cargo tree -e features` (with `-e normal,build` for the build
//! without dev-dependencies), one line per package and feature set, `{p} {f}`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use crate::cmd;

/// Per package (`name vX.Y.Z`), the feature sets it is compiled with (a build script's or
/// proc-macro's host copy can differ from the target's: both are kept).
pub type Resolution = BTreeMap<String, BTreeSet<String>>;

/// Parses `cargo tree --prefix none -f '{p} {f}'`: `name vX.Y.Z [(path)] [(proc-macro)] [f1,f2]`
/// lines; feature lines of `-e features` (`name feature "x"`) and repeats (`(*)`) are folded in.
pub fn parse(tree: &str) -> Resolution {
    let mut out = Resolution::new();
    for line in tree.lines().map(str::trim) {
        if line.is_empty() || line.contains(" feature \"") {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(name), Some(version)) = (words.next(), words.next()) else { continue };
        if !version.starts_with('v') {
            continue;
        }
        let features = words.filter(|w| !w.starts_with('(')).collect::<Vec<_>>().join(" ");
        out.entry(format!("{name} {version}")).or_default().insert(features);
    }
    out
}

/// The packages both resolutions compile whose feature sets differ, one line each:
/// `name vX: build [a,b], test [a,b,c] (add c to tests/Cargo.toml)`.
pub fn differences(build: &Resolution, test: &Resolution) -> Vec<String> {
    let mut out = Vec::new();
    for (pkg, b) in build {
        let Some(t) = test.get(pkg) else { continue };
        if b == t {
            continue;
        }
        let all = |s: &BTreeSet<String>| -> BTreeSet<String> {
            s.iter().flat_map(|f| f.split(',').filter(|x| !x.is_empty()).map(str::to_string)).collect()
        };
        let missing: Vec<String> = all(t).difference(&all(b)).cloned().collect();
        let show = |s: &BTreeSet<String>| s.iter().map(|f| format!("[{f}]")).collect::<Vec<_>>().join(" ");
        let fix = if missing.is_empty() {
            // Same features in all, but the build compiles a second copy with fewer: the host's,
            // for build scripts and proc-macros, resolved apart.
            "the build scripts' and proc-macros' copy has fewer: turn its features on under \
             [build-dependencies] in tests/Cargo.toml"
                .to_string()
        } else {
            format!("turn on {} in tests/Cargo.toml's feature unification block", missing.join(", "))
        };
        out.push(format!("{pkg}: build {}, test {} ({fix})", show(b), show(t)));
    }
    out
}

/// Runs both `cargo tree`s in the workspace and returns the differences (empty: the build and
/// the tests share every crate they both compile).
pub fn check(cargo: impl Fn() -> Command) -> anyhow::Result<Vec<String>> {
    let tree = |edges: &str| -> anyhow::Result<Resolution> {
        let mut c = cargo();
        c.args(["tree", "--workspace", "--prefix", "none", "-f", "{p} {f}", "-e", edges]);
        Ok(parse(&cmd::output(&mut c)?))
    };
    Ok(differences(&tree("features,normal,build")?, &tree("features")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differing_feature_sets_are_named_with_what_to_turn_on() {
        let build = "\
tracer-agent v0.1.0 (/work/main/tracer-user/agent) default
nvml-wrapper-sys v0.10.0 default
nvml-wrapper-sys feature \"default\"
once_cell v1.21.4 alloc,race,std
once_cell v1.21.4 alloc,default,race,std
serde_derive v1.0.228 (proc-macro) default
serde_derive v1.0.228 (proc-macro) default (*)
";
        let test = "\
tracer-agent v0.1.0 (/work/main/tracer-user/agent) default
nvml-wrapper-sys v0.10.0 default,legacy-functions
once_cell v1.21.4 alloc,default,race,std
serde_derive v1.0.228 (proc-macro) default
proptest v1.9.0 default,std
";
        let b = parse(build);
        assert_eq!(b["serde_derive v1.0.228"], BTreeSet::from(["default".to_string()]));
        assert_eq!(b["once_cell v1.21.4"].len(), 2, "host and target copies");
        let d = differences(&b, &parse(test));
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(
            d[0].starts_with("nvml-wrapper-sys v0.10.0: build [default], test [default,legacy-functions]")
                && d[0].contains("turn on legacy-functions"),
            "{d:?}"
        );
        assert!(d[1].starts_with("once_cell v1.21.4: build [alloc,default,race,std] [alloc,race,std]"), "{d:?}");
        assert!(d[1].contains("[build-dependencies]"), "{d:?}");
        // Only in the tests (dev-dependencies): nothing to share, nothing to say.
        assert!(!d.iter().any(|l| l.contains("proptest")));
        assert!(differences(&b, &b).is_empty());
    }
}
