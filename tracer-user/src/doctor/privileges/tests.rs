use super::*;
use crate::doctor::CheckStatus;

#[test]
fn parses_cap_eff_and_names_bits() {
    let status = "Name:\tgpu-tracer\nCapInh:\t0000000000000000\nCapPrm:\t000000c000080004\n\
                  CapEff:\t000000c000080004\nCapBnd:\t000000c000080004\n";
    let caps = parse_cap_eff(status).unwrap();
    assert_eq!(caps, (1 << 39) | (1 << 38) | (1 << 19) | (1 << 2));
    assert_eq!(capability_names(caps), vec!["CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"]);
    assert_eq!(parse_cap_eff("CapEff:\t000001ffffffffff\n").unwrap().count_ones(), 41);
    assert_eq!(parse_cap_eff("CapPrm:\t0\n"), None);
    assert_eq!(parse_cap_eff("CapEff:\tnot-hex\n"), None);
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
