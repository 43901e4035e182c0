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

/// A section neither measured now nor in the old report (never run) is left out, not written as
/// skipped.
#[test]
fn a_section_never_run_is_not_written_as_skipped() {
    let new = NEW.replace("## 7. NVML\n\nnew seven\n\n", "## 7. NVML\n\nskipped\n\n## 8. API\n\nskipped\n\n");
    let (fresh, noted) = fresh_blocks(&["6".into()]);
    let doc = merge(OLD, &new, &fresh, &noted, "n");
    assert!(!doc.contains("## 7.") && !doc.contains("## 8.") && doc.contains("new six"), "{doc}");
}

/// A full run regenerates every section and keeps the hand-written notes (headings naming an issue)
/// where they were.
#[test]
fn a_full_run_keeps_the_hand_written_notes() {
    let old = OLD.replace(
        "## 1. Syscalls",
        "## Steps (issue 15, 2026-12-03)\n\nstep table\n\n## Guest (issue 17, 2026-12-04)\n\nguest table\n\n## 1. Syscalls",
    );
    let doc = keep_notes(&old, NEW);
    assert!(doc.contains("| date | new |\n\n## Steps (issue 15, 2026-12-03)\n\nstep table\n\n## Guest"), "{doc}");
    assert!(doc.contains("guest table\n\n## 1. Syscalls\n\nskipped"), "{doc}");
    assert!(!doc.contains("old one"), "{doc}");
    // A note whose neighbour is gone goes to the end rather than away.
    let orphan =
        OLD.replace("## 6. Attribution\n\nold six\n\n", "## 9. Gone\n\nx\n\n## Note (issue 9, 2026-12-01)\n\nkept\n\n");
    let doc = keep_notes(&orphan, NEW);
    assert!(doc.ends_with("## Note (issue 9, 2026-12-01)\n\nkept\n\n"), "{doc}");
    assert_eq!(keep_notes(NEW, NEW), NEW);
}
