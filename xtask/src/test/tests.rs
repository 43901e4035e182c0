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

/// Every `#[ignore]`d test of the guest-only files is allowed, and nothing else of theirs is listed.
#[test]
fn guest_only_tests_are_exactly_the_allowed_ignored_ones() {
    for file in kernel_matrix::KMOD_TESTS {
        let path = cmd::workspace_root().join(format!("tests/tests/{file}.rs"));
        let text = std::fs::read_to_string(&path).unwrap();
        let mut ignored = Vec::new();
        let mut lines = text.lines();
        while let Some(l) = lines.next() {
            if l.trim_start().starts_with("#[ignore") {
                let f = lines.find_map(|l| l.trim_start().strip_prefix("fn ")).unwrap();
                ignored.push(f.split('(').next().unwrap().to_string());
            }
        }
        assert!(!ignored.is_empty(), "{}", path.display());
        for name in &ignored {
            assert!(ALLOWED_IGNORED.iter().any(|(a, _)| a == name), "{name} ({file}.rs) is not in ALLOWED_IGNORED");
        }
        for (name, why) in ALLOWED_IGNORED.iter().filter(|(_, why)| why.contains(&format!("--test {file}"))) {
            assert!(
                ignored.iter().any(|n| n == name),
                "ALLOWED_IGNORED lists {name} ({why}), {file}.rs has no such test"
            );
        }
    }
}

#[test]
fn a_test_ignored_here_that_passed_in_the_guest_is_no_longer_skipped() {
    let mut host = parse(
        "test auto_chooses ... ignored, runs in the guest\ntest other ... ignored\ntest a ... ok\n\
         test result: ok. 1 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 1s\n",
    );
    let guest = parse(
        "test auto_chooses ... ok\ntest b ... FAILED\n\
         test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 9s\n",
    );
    host.absorb(guest);
    assert_eq!((host.passed, host.failed, host.ignored), (2, 1, 1));
    assert_eq!(host.ignored_names, ["other"]);
    assert_eq!(host.unexpected_ignored(&[]), ["other"]);
    assert_eq!(host.line(), "2 passed, 1 failed, 1 skipped");
}

#[test]
fn the_times_line_names_each_phase_and_the_sum() {
    let mut t = Times::new();
    t.lap("setup");
    t.lap("build");
    t.laps = vec![("setup".into(), 1.2), ("build".into(), 30.4), ("6.1 guest".into(), 140.0)];
    assert_eq!(t.line(), "setup 1 s, build 30 s, 6.1 guest 140 s, all 172 s");
}
