use super::*;

#[test]
fn nothing_to_probe_serializes_as_failed() {
    let e = crate::cuda::attach::AttachError::NoLibrary { searched: crate::cuda::attach::SEARCH_PATHS };
    let st = e.family_status();
    assert!(matches!(st, FamilyStatus::NothingToProbe { .. }));
    assert_eq!(st.error(), Some(e.to_string().as_str()));
    assert_eq!(serde_json::to_value(&st).unwrap(), serde_json::json!({ "state": "failed", "error": e.to_string() }));
    let other = crate::cuda::attach::AttachError::NothingAttached { why: "x".into() };
    assert_eq!(other.family_status(), FamilyStatus::Failed { error: other.to_string() });
    assert_eq!(
        serde_json::to_value(FamilyStatus::Attached { programs: vec!["a".into()] }).unwrap(),
        serde_json::json!({ "state": "attached", "programs": ["a"] })
    );
    assert_eq!(serde_json::to_value(FamilyStatus::Disabled).unwrap(), serde_json::json!({ "state": "disabled" }));
    assert_eq!(FamilyStatus::Disabled.error(), None);
}

/// On 5.10 a refused map under the default 64 KiB memlock limit, without CAP_SYS_RESOURCE, is
/// the limit, and the hint says so with the fix; anywhere else it is the BPF capabilities.
#[test]
fn a_refused_load_names_the_memlock_limit_where_that_is_the_cause() {
    let chart = (1u64 << 39) | (1 << 38) | (1 << 19) | (1 << 2);
    let rings = 2 * 8 * 1024 * 1024;
    let h = load_hint(true, "5.10.0-46-amd64", Some(64 * 1024), chart, rings);
    assert!(h.contains("kernel 5.10.0-46-amd64 charges BPF map memory to RLIMIT_MEMLOCK"), "{h}");
    assert!(h.contains("64.0 KiB here") && h.contains("more than 16.0 MiB"), "{h}");
    assert!(h.contains("CAP_SYS_RESOURCE (Helm: memlockCapability=true)") && h.contains("ulimit -l unlimited"), "{h}");
    let bpf = "the agent needs CAP_BPF and CAP_PERFMON";
    // 5.11+ (memory cgroup accounting), a limit that is unlimited, SYS_RESOURCE held (aya raises
    // the limit itself), or another error: not the memlock limit.
    assert!(load_hint(true, "5.11.0", Some(65536), chart, rings).starts_with(bpf));
    assert!(load_hint(true, "6.1.0-57-amd64", Some(65536), chart, rings).starts_with(bpf));
    assert!(load_hint(true, "5.10.0", None, chart, rings).starts_with(bpf));
    assert!(load_hint(true, "5.10.0", Some(65536), chart | (1 << 24), rings).starts_with(bpf));
    assert!(load_hint(false, "5.10.0", Some(65536), chart, rings).starts_with(bpf));
    assert!(load_hint(true, "garbage", Some(65536), chart, rings).starts_with(bpf));
}
