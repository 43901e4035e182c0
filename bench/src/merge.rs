//! `--only`: the sections this run did not measure keep their text from the report already on disk,
//! so re-running one section does not wipe the others. The report is cut into blocks at its `## ` and
//! `### ` headings; a block is named by its number (`1`, `2b`, `3a`) or, unnumbered, by its title
//! (`machine`, `reading the numbers`); the text before the first heading is `title`.
use std::collections::{BTreeMap, BTreeSet};

/// `--only` keys, the blocks each one measures, and the block that gets the "re-run alone" note.
pub const GROUPS: &[(&[&str], &[&str], &str)] = &[
    (&["1"], &["1"], "1"),
    (&["2"], &["2", "2b"], "2"),
    (&["3a"], &["3", "3a"], "3a"),
    (&["3b"], &["3", "3b"], "3b"),
    (&["4"], &["4"], "4"),
    (&["5"], &["5", "5b"], "5"),
    (&["6", "attribution"], &["6"], "6"),
    (&["7", "nvml"], &["7"], "7"),
];

/// Every key `--only` accepts.
pub fn known_keys() -> impl Iterator<Item = &'static str> {
    GROUPS.iter().flat_map(|(keys, _, _)| keys.iter().copied())
}

/// (blocks measured, blocks that get the note) for these `--only` keys.
pub fn fresh_blocks(only: &[String]) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut fresh = BTreeSet::new();
    let mut noted = BTreeSet::new();
    for (keys, blocks, note_at) in GROUPS {
        if keys.iter().any(|k| only.iter().any(|o| o == k)) {
            fresh.extend(blocks.iter().map(|b| b.to_string()));
            noted.insert(note_at.to_string());
        }
    }
    (fresh, noted)
}

/// The name of the block a heading line starts (`## 2. Cost…` -> `2`, `### 5b. Launch…` -> `5b`,
/// `## Machine` -> `machine`), or `None` for a line that is not a `##`/`###` heading.
fn block_id(line: &str) -> Option<String> {
    let title = line.strip_prefix("### ").or_else(|| line.strip_prefix("## "))?.trim();
    if let Some((num, _)) = title.split_once(". ")
        && !num.is_empty()
        && num.starts_with(|c: char| c.is_ascii_digit())
        && num.chars().all(|c| c.is_ascii_alphanumeric())
    {
        return Some(num.to_string());
    }
    Some(title.to_lowercase())
}

/// The document cut into `(block name, text)` in order; the texts concatenated give it back.
pub fn blocks(doc: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut in_code = false;
    for line in doc.split_inclusive('\n') {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        match (block_id(line.trim_end_matches('\n')).filter(|_| !in_code), out.last_mut()) {
            (Some(id), _) => out.push((id, line.to_string())),
            (None, Some(last)) => last.1.push_str(line),
            (None, None) => out.push(("title".into(), line.to_string())),
        }
    }
    out
}

/// `new` (a whole report from a run that measured only `fresh`) with every other block taken from
/// `old` where `old` has it; blocks in `noted` get `note` as a quote under their heading. A kept
/// block brings along the old blocks after it that `new` lacks (a skipped section renders without
/// its subsections).
pub fn merge(old: &str, new: &str, fresh: &BTreeSet<String>, noted: &BTreeSet<String>, note: &str) -> String {
    let new = blocks(new);
    let new_ids: BTreeSet<&str> = new.iter().map(|(id, _)| id.as_str()).collect();
    let old = blocks(old);
    let old_at: BTreeMap<&str, usize> = old.iter().enumerate().map(|(i, (id, _))| (id.as_str(), i)).collect();
    let mut out = String::with_capacity(new.iter().chain(&old).map(|(_, t)| t.len()).sum());
    for (id, text) in &new {
        if !fresh.contains(id)
            && let Some(&at) = old_at.get(id.as_str())
        {
            out.push_str(&old[at].1);
            for (_, text) in old[at + 1..]
                .iter()
                .take_while(|(id, _)| !new_ids.contains(id.as_str()))
                .filter(|(id, _)| !fresh.contains(id))
            {
                out.push_str(text);
            }
        } else if noted.contains(id) {
            let (heading, rest) = text.split_once('\n').unwrap_or((text, ""));
            out.push_str(heading);
            out.push_str("\n\n> ");
            out.push_str(note);
            out.push_str("\n\n");
            out.push_str(rest.trim_start_matches('\n'));
        } else {
            out.push_str(text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "# Benchmarks\n\nintro\n\n## Machine\n\n| date | old |\n\n## 1. Syscalls\n\nold one\n\n\
                       ## 2. NV\n\nold two\n\n### 2b. Inside\n\nold 2b\n\n## 6. Attribution\n\nold six\n\n\
                       ## Reading the numbers\n\nold reading\n";
    const NEW: &str = "# Benchmarks\n\nintro\n\n## Machine\n\n| date | new |\n\n## 1. Syscalls\n\nskipped\n\n\
                       ## 2. NV\n\nskipped\n\n### 2b. Inside\n\nskipped\n\n## 6. Attribution\n\nnew six\n\n\
                       ## 7. NVML\n\nnew seven\n\n## Reading the numbers\n\nnew reading\n";

    #[test]
    fn blocks_cut_at_headings_and_give_the_text_back() {
        let b = blocks(OLD);
        let ids: Vec<&str> = b.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["title", "machine", "1", "2", "2b", "6", "reading the numbers"]);
        assert_eq!(b.iter().map(|(_, t)| t.as_str()).collect::<String>(), OLD);
        assert_eq!(block_id("### 3a. Offline: decode"), Some("3a".into()));
        assert_eq!(block_id("## 5. Cost per libcuda launch (`cuLaunchKernel` uprobes)"), Some("5".into()));
        assert_eq!(block_id("# Benchmarks"), None);
        assert_eq!(block_id("| ## 1. not a heading |"), None);
        // A heading-like line inside a code block is text.
        let code = blocks("## 1. A\n```\n## 2. B\n```\n");
        assert_eq!(code.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ["1"]);
    }

    #[test]
    fn only_the_measured_sections_are_replaced() {
        let (fresh, noted) = fresh_blocks(&["6".into(), "nvml".into()]);
        assert_eq!(fresh, ["6", "7"].map(String::from).into());
        let doc = merge(OLD, NEW, &fresh, &noted, "Re-run alone on 2026-11-30.");
        // Kept from the full run: the machine table, sections 1, 2, 2b, and the reading notes.
        for kept in ["| date | old |", "old one", "old two", "old 2b", "old reading"] {
            assert!(doc.contains(kept), "{kept} missing from\n{doc}");
        }
        for gone in ["| date | new |", "skipped", "old six", "new reading"] {
            assert!(!doc.contains(gone), "{gone} still in\n{doc}");
        }
        // Measured now, with the note under the heading; a section the old report lacked is added.
        assert!(doc.contains("## 6. Attribution\n\n> Re-run alone on 2026-11-30.\n\nnew six\n"), "{doc}");
        assert!(doc.contains("## 7. NVML\n\n> Re-run alone on 2026-11-30.\n\nnew seven\n"), "{doc}");
        // In the new report's order.
        let at = |s: &str| doc.find(s).unwrap();
        assert!(at("old 2b") < at("new six") && at("new six") < at("new seven") && at("new seven") < at("old reading"));
        // Re-running again replaces the earlier note instead of stacking notes.
        let again = merge(&doc, NEW, &fresh, &noted, "Re-run alone on 2026-12-01.");
        assert!(!again.contains("2026-11-30") && again.matches("Re-run alone").count() == 2, "{again}");
    }

    /// A skipped section renders without its subsections; the old ones stay, in place.
    #[test]
    fn kept_sections_keep_their_subsections() {
        let new = NEW.replace("### 2b. Inside\n\nskipped\n\n", "");
        let (fresh, noted) = fresh_blocks(&["6".into()]);
        let doc = merge(OLD, &new, &fresh, &noted, "n");
        assert!(doc.contains("## 2. NV\n\nold two\n\n### 2b. Inside\n\nold 2b\n\n## 6. Attribution\n\n> n"), "{doc}");
        // ... unless that section was measured now: its stale subsection goes.
        let (fresh, noted) = fresh_blocks(&["2".into()]);
        let doc = merge(OLD, &new, &fresh, &noted, "n");
        assert!(
            !doc.contains("old 2b") && doc.contains("## 2. NV\n\n> n\n\nskipped\n\n## 6. Attribution\n\nold six"),
            "{doc}"
        );
    }

    #[test]
    fn without_an_old_report_the_new_one_is_written_whole() {
        let (fresh, noted) = fresh_blocks(&["3a".into()]);
        assert!(fresh.contains("3") && fresh.contains("3a") && !fresh.contains("3b"));
        assert_eq!(noted, ["3a"].map(String::from).into());
        assert_eq!(merge("", NEW, &fresh, &noted, "x"), NEW);
    }
}
