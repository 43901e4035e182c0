//! Reading apt's source lists (one-line `.list` files and deb822 `.sources` files) well enough to
//! tell whether a Debian component is enabled, and writing a `.sources` file that enables one.

use anyhow::Context;
use std::path::Path;

/// One repository entry: a line of a `.list` file or a stanza of a `.sources` file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceEntry {
    pub types: Vec<String>,
    pub uris: Vec<String>,
    pub suites: Vec<String>,
    pub components: Vec<String>,
    /// `Signed-By` / `[signed-by=...]`, verbatim (a path, or a multi-line inline key).
    pub signed_by: Option<String>,
    pub enabled: bool,
    /// The file it was read from (empty when parsed from a string).
    pub file: std::path::PathBuf,
}

/// Parses one-line-style sources (`deb [opts] uri suite component...`).
pub fn parse_one_line(text: &str) -> Vec<SourceEntry> {
    let mut entries = Vec::new();
    for raw in text.lines() {
        let line = raw.split('#').next().unwrap_or("").trim();
        let Some((ty, rest)) = line.split_once(char::is_whitespace) else { continue };
        if ty != "deb" && ty != "deb-src" {
            continue;
        }
        let mut rest = rest.trim_start();
        let mut signed_by = None;
        if let Some(opts) = rest.strip_prefix('[') {
            let Some((opts, after)) = opts.split_once(']') else { continue };
            for opt in opts.split_whitespace() {
                if let Some(v) = opt.strip_prefix("signed-by=") {
                    signed_by = Some(v.to_string());
                }
            }
            rest = after;
        }
        let mut words = rest.split_whitespace().map(str::to_string);
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else { continue };
        entries.push(SourceEntry {
            types: vec![ty.to_string()],
            uris: vec![uri],
            suites: vec![suite],
            components: words.collect(),
            signed_by,
            enabled: true,
            file: Default::default(),
        });
    }
    entries
}

/// Parses deb822-style sources: stanzas separated by blank lines, `Key: value` fields, continuation
/// lines starting with white space, `#` comment lines.
pub fn parse_deb822(text: &str) -> Vec<SourceEntry> {
    let mut entries = Vec::new();
    let mut fields: Vec<(String, String)> = Vec::new();
    let flush = |fields: &mut Vec<(String, String)>, entries: &mut Vec<SourceEntry>| {
        if fields.is_empty() {
            return;
        }
        let mut e = SourceEntry { enabled: true, ..Default::default() };
        for (key, value) in fields.drain(..) {
            let words = || value.split_whitespace().map(str::to_string).collect::<Vec<_>>();
            match key.to_ascii_lowercase().as_str() {
                "types" => e.types = words(),
                "uris" => e.uris = words(),
                "suites" => e.suites = words(),
                "components" => e.components = words(),
                "signed-by" => e.signed_by = Some(value.clone()),
                "enabled" => e.enabled = !value.trim().eq_ignore_ascii_case("no"),
                _ => {}
            }
        }
        entries.push(e);
    };
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        if line.trim().is_empty() {
            flush(&mut fields, &mut entries);
        } else if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = fields.last_mut() {
                value.push('\n');
                value.push_str(line);
            }
        } else if let Some((key, value)) = line.split_once(':') {
            fields.push((key.trim().to_string(), value.trim().to_string()));
        }
    }
    flush(&mut fields, &mut entries);
    entries
}

/// Every entry apt reads from `etc_apt` (`/etc/apt`): `sources.list`, `sources.list.d/*.list` and
/// `sources.list.d/*.sources` (other names in that directory are ignored, as apt ignores them).
pub fn read_all(etc_apt: &Path) -> anyhow::Result<Vec<SourceEntry>> {
    let mut entries = Vec::new();
    let main = etc_apt.join("sources.list");
    if main.exists() {
        let text = std::fs::read_to_string(&main).with_context(|| format!("reading {}", main.display()))?;
        entries.extend(parse_one_line(&text).into_iter().map(|e| SourceEntry { file: main.clone(), ..e }));
    }
    let dir = etc_apt.join("sources.list.d");
    if dir.is_dir() {
        let mut paths: Vec<_> = std::fs::read_dir(&dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        paths.sort();
        for path in paths {
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            if ext != "list" && ext != "sources" {
                continue;
            }
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            let parsed = if ext == "list" { parse_one_line(&text) } else { parse_deb822(&text) };
            entries.extend(parsed.into_iter().map(|e| SourceEntry { file: path.clone(), ..e }));
        }
    }
    Ok(entries)
}

/// Whether binary packages of `component` are enabled for release `codename` (e.g. "bookworm").
pub fn component_enabled(entries: &[SourceEntry], codename: &str, component: &str) -> bool {
    entries.iter().any(|e| {
        e.enabled
            && e.types.iter().any(|t| t == "deb")
            && e.suites.iter().any(|s| s == codename)
            && e.components.iter().any(|c| c == component)
    })
}

fn is_release_suite(suite: &str, codename: &str) -> bool {
    suite == codename || suite.strip_prefix(codename).is_some_and(|rest| rest.starts_with('-'))
}

/// A deb822 file enabling `components` (e.g. contrib and non-free) on the same Debian archives
/// (URIs, suites of `codename`, keys) that already serve `main`; Debian's default archive if none
/// does. `entries` should not include the file being (re)written.
pub fn stanzas_enabling(entries: &[SourceEntry], codename: &str, components: &[&str]) -> String {
    let wanted = components.join(" ");
    let mut out = format!(
        "# Added by `cargo xtask setup` (gpu-tracer): Debian's {wanted} components, for libcuda1 and\n\
         # libnvidia-ml1 (NVIDIA's user-space libraries, which the tests load without a GPU; their\n\
         # dependencies nvidia-support and glx-alternative-nvidia are in contrib).\n"
    );
    let mut seen = Vec::new();
    for e in entries {
        let suites: Vec<&str> = e.suites.iter().map(String::as_str).filter(|s| is_release_suite(s, codename)).collect();
        let debian_archive = e.uris.iter().any(|u| u.contains("debian"));
        if !e.enabled || !e.types.iter().any(|t| t == "deb") || suites.is_empty() || !debian_archive {
            continue;
        }
        let missing: Vec<&str> =
            components.iter().copied().filter(|c| !e.components.iter().any(|have| have == c)).collect();
        if !e.components.iter().any(|c| c == "main") || missing.is_empty() {
            continue;
        }
        let key = (e.uris.clone(), suites.clone());
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        out.push_str(&format!(
            "\nTypes: deb\nURIs: {}\nSuites: {}\nComponents: {}\n",
            e.uris.join(" "),
            suites.join(" "),
            missing.join(" ")
        ));
        if let Some(s) = &e.signed_by {
            out.push_str(&format!("Signed-By: {s}\n"));
        }
    }
    if seen.is_empty() {
        out.push_str(&format!(
            "\nTypes: deb\nURIs: http://deb.debian.org/debian\nSuites: {codename} {codename}-updates\n\
             Components: {wanted}\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests;
