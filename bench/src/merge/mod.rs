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
    (&["5"], &["5", "5b", "5c"], "5"),
    (&["6", "attribution"], &["6"], "6"),
    (&["7", "nvml"], &["7"], "7"),
    (&["8", "api"], &["8"], "8"),
    (&["9", "exporters"], &["9"], "9"),
    (&["10", "cost"], &["10"], "10"),
    (&["11", "scan"], &["11"], "11"),
    (&["12", "profile"], &["12"], "12"),
    (&["13", "session"], &["13"], "13"),
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
/// `old` where `old` has it (a block neither measured now nor in `old`, a section never run, is left
/// out rather than written as skipped); blocks in `noted` get `note` as a quote under their heading.
/// A kept block brings along the old blocks after it that `new` lacks (a skipped section renders
/// without its subsections).
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
        } else if !fresh.contains(id) && !old.is_empty() {
            continue;
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

/// Whether a block is a hand-written note (a `## ` heading naming an issue: `## The NVIDIA ioctl
/// path, step by step (issue 15, 2026-12-03)`), which no run generates and every run keeps.
fn is_note(text: &str) -> bool {
    text.lines().next().is_some_and(|h| h.starts_with("## ") && h.contains("(issue "))
}

/// A full run's report `new` with the hand-written notes of `old` ([`is_note`]) kept, each after
/// the block it followed in `old` (or at the end when that block is gone).
pub fn keep_notes(old: &str, new: &str) -> String {
    let old = blocks(old);
    let new = blocks(new);
    let mut out = String::new();
    let mut placed = BTreeSet::new();
    for (id, text) in &new {
        out.push_str(text);
        if let Some(at) = old.iter().position(|(o, _)| o == id) {
            for (i, (_, t)) in old.iter().enumerate().skip(at + 1).take_while(|(_, (_, t))| is_note(t)) {
                out.push_str(t);
                placed.insert(i);
            }
        }
    }
    for (i, (_, t)) in old.iter().enumerate() {
        if is_note(t) && !placed.contains(&i) {
            out.push_str(t);
        }
    }
    out
}

#[cfg(test)]
mod tests;
