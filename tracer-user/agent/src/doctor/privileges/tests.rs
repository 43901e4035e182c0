use super::*;
use crate::doctor::CheckStatus;

#[test]
fn names_capability_bits() {
    // CapEff is read by crate::proc (procfs's Status; its parse is tested there).
    let caps = (1 << 39) | (1 << 38) | (1 << 19) | (1 << 2);
    assert_eq!(capability_names(caps), vec!["CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"]);
}

#[test]
fn least_privilege_set_passes_and_missing_bpf_fails() {
    let least = (1u64 << 39) | (1 << 38) | (1 << 19) | (1 << 2);
    let checks = capability_checks(least, "6.1.0-18-amd64");
    assert!(checks.iter().all(|c| c.status != CheckStatus::Fail), "{checks:?}");
    let admin = checks.iter().find(|c| c.name == "CAP_SYS_ADMIN").unwrap();
    assert_eq!(admin.status, CheckStatus::Warn, "6.1 has no multi-uprobe links");
    assert!(admin.detail.contains("cuda family"));
    // 6.6+: multi-uprobe links, so neither SYS_ADMIN nor (5.11+) SYS_RESOURCE is missed.
    let new = capability_checks(least, "6.18.44");
    assert!(new.iter().all(|c| c.status == CheckStatus::Ok), "{new:?}");
    assert!(new.iter().find(|c| c.name == "CAP_SYS_ADMIN").unwrap().detail.starts_with("not held, not needed"));
    let no_bpf = capability_checks(least & !(1 << 39), "6.1.0");
    assert_eq!(no_bpf.iter().find(|c| c.name == "CAP_BPF").unwrap().status, CheckStatus::Fail);
    // SYS_ADMIN stands in for BPF and PERFMON.
    assert!(capability_checks(1 << 21, "6.1.0").iter().all(|c| c.status != CheckStatus::Fail));
    // Before 5.11 the memlock rlimit matters.
    let old = capability_checks(least, "5.10.0-28-amd64");
    assert_eq!(old.iter().find(|c| c.name == "CAP_SYS_RESOURCE").unwrap().status, CheckStatus::Fail);
    assert!(!kernel_before("garbage", 5, 11));
}

#[test]
fn perf_events_warn_only_when_a_configured_path_needs_them() {
    use tracer_core::config::{AttachMode, CudaAttach, LifecycleAttach};
    let chart = (1u64 << 39) | (1 << 38) | (1 << 19) | (1 << 2);
    // Below 3, or with SYS_ADMIN: fine whatever is configured.
    let mut cfg = Config { lifecycle_attach: LifecycleAttach::Tracepoint, ..Config::default() };
    assert_eq!(perf_events(&cfg, chart, Some(2)).status, CheckStatus::Ok);
    assert_eq!(perf_events(&cfg, chart | (1 << 21), Some(3)).status, CheckStatus::Ok);
    // Debian's 3 with the defaults: nothing needs a perf event; the detail says what would.
    let d = perf_events(&Config::default(), chart, Some(3));
    assert_eq!(d.status, CheckStatus::Ok, "{d:?}");
    assert!(d.detail.contains("is 3") && d.detail.contains("fallbacks"), "{}", d.detail);
    assert!(d.detail.contains("driver-entry mode's kprobes are refused"), "{}", d.detail);
    let de = perf_events(&Config { attach_mode: AttachMode::DriverEntry, ..Config::default() }, chart, Some(3));
    assert_eq!(de.status, CheckStatus::Warn, "{de:?}");
    assert!(de.detail.contains("attach_mode = driver-entry (kprobes)") && de.detail.contains("fix:"), "{}", de.detail);
    // Each explicit perf-event path is named, with the fix.
    let c = perf_events(&cfg, chart, Some(4));
    assert_eq!(c.status, CheckStatus::Warn);
    assert!(c.detail.contains("lifecycle_attach = tracepoint") && c.detail.contains("fix:"), "{}", c.detail);
    cfg.attach_mode = AttachMode::SyscallTracepoint;
    cfg.cuda_attach = CudaAttach::PerfEvent;
    let c = perf_events(&cfg, chart, Some(3));
    for named in ["syscall-tracepoint", "lifecycle_attach", "cuda_attach = perf-event"] {
        assert!(c.detail.contains(named), "{named}: {}", c.detail);
    }
    // A family that is off needs nothing.
    cfg.families.cuda = false;
    cfg.families.lifecycle = false;
    assert!(!perf_events(&cfg, chart, Some(3)).detail.contains("cuda_attach"));
    // Unreadable: not checked, not an error.
    assert_eq!(perf_events(&cfg, chart, None).status, CheckStatus::Ok);
}
