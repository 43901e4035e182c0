use super::*;

#[test]
fn toolchain_names_are_matched_exactly() {
    let list = "stable-x86_64-unknown-linux-gnu (active, default)\n\
                nightly-2026-05-19-x86_64-unknown-linux-gnu\n\
                1.95.0-x86_64-unknown-linux-gnu\n";
    assert!(toolchain_listed(list, "stable"));
    assert!(toolchain_listed(list, "1.95.0"));
    assert!(toolchain_listed(list, "nightly-2026-05-19"));
    assert!(!toolchain_listed(list, "nightly"));
    assert!(toolchain_listed("nightly-x86_64-unknown-linux-gnu\n", "nightly"));
}
