use super::*;

const OUTPUT: &str = "\
running 3 tests
test tests::a ... ok
test tests::b ... ignored
test root::needs_bpf ... ignored, needs root
test tests::c ... FAILED

test result: FAILED. 1 passed; 1 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.01s

running 2 tests
test src/lib.rs - read_stream (line 5) ... ok
test src/lib.rs - x (line 9) ... ok

test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.20s
";

fn parse(text: &str) -> Summary {
    let mut s = Summary::default();
    text.lines().for_each(|l| s.feed(l));
    s
}

#[test]
fn sums_result_lines_and_collects_ignored_names() {
    let s = parse(OUTPUT);
    assert_eq!((s.passed, s.failed, s.ignored, s.results), (3, 1, 2, 2));
    assert_eq!(s.ignored_names, ["tests::b", "root::needs_bpf"]);
    assert_eq!(s.line(), "3 passed, 1 failed, 2 skipped");
}

#[test]
fn allowed_ignored_tests_are_not_reported() {
    let s = parse(OUTPUT);
    assert_eq!(s.unexpected_ignored(&[("tests::b", "slow")]), ["root::needs_bpf"]);
}

#[test]
fn a_clean_run_has_a_plain_closing_line() {
    let s = parse("test result: ok. 12 passed; 0 failed; 0 ignored; 0 measured; 3 filtered out; finished in 1.5s\n");
    assert_eq!(s.line(), "12 passed, 0 failed");
    assert!(s.unexpected_ignored(ALLOWED_IGNORED).is_empty());
}
