//! `gpu-tracer doctor`: what works on this node and why not — kernel features, privileges, the
//! driver, cgroups, and what actually happens when the probes are loaded.
use std::path::Path;

use serde::Serialize;

use crate::{config::Config, probe::KernelFeatures};

pub mod privileges;

/// One line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    /// `ok`, `warn` or `fail`.
    pub status: &'static str,
    pub detail: String,
}

impl Check {
    fn new(name: &'static str, ok: bool, warn_only: bool, detail: impl Into<String>) -> Self {
        let status = if ok {
            "ok"
        } else if warn_only {
            "warn"
        } else {
            "fail"
        };
        Self { name, status, detail: detail.into() }
    }
}

/// Effective capabilities of this process (`CapEff` in /proc/self/status).
pub fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status").ok().and_then(|s| privileges::parse_cap_eff(&s)).unwrap_or(0)
}

/// Static checks (no programs loaded).
pub fn static_checks(cfg: &Config) -> Vec<Check> {
    let f = KernelFeatures::detect();
    let mut out = vec![Check::new("kernel", true, false, format!("Linux {}", f.release))];
    out.push(Check::new(
        "btf",
        f.btf,
        true,
        if f.btf {
            "/sys/kernel/btf/vmlinux present: btf-tracepoint mode available".to_string()
        } else {
            "no /sys/kernel/btf/vmlinux: btf-tracepoint mode unavailable, raw-tracepoint is used".to_string()
        },
    ));
    out.push(Check::new(
        "tracefs",
        f.tracefs,
        false,
        if f.tracefs {
            "mounted at /sys/kernel/tracing".to_string()
        } else {
            "not mounted: tracepoints cannot attach. Fix: mount -t tracefs tracefs /sys/kernel/tracing (or mount \
             the host's /sys/kernel/tracing into the pod)"
                .to_string()
        },
    ));
    out.push(Check::new(
        "kprobes",
        f.kprobes,
        true,
        if f.kprobes {
            "available (driver-entry attach mode is detected but not implemented yet)".to_string()
        } else {
            "not built into this kernel: driver-entry attach mode unavailable".to_string()
        },
    ));
    out.push(Check::new(
        "syscall tracepoints",
        f.syscall_tracepoints,
        true,
        if f.syscall_tracepoints { "syscalls:* present" } else { "syscalls:* absent (CONFIG_FTRACE_SYSCALLS unset)" },
    ));
    out.extend(privileges::privilege_checks(cfg, &f.release));
    let ver = crate::config::resolve_driver_version(cfg);
    out.push(Check::new(
        "driver version",
        ver.from_driver,
        true,
        format!("{} (from {})", ver.version_string(), ver.source),
    ));
    let prefix = cfg.dev_prefix();
    let ctl = format!("{prefix}ctl");
    out.push(Check::new(
        "device nodes",
        Path::new(&ctl).exists(),
        true,
        if Path::new(&ctl).exists() {
            format!("{ctl} present")
        } else {
            format!("{ctl} not found: no NVIDIA driver here, or dev_dir is wrong (set --dev-dir)")
        },
    ));
    let cg = cfg
        .cgroup_root
        .clone()
        .or_else(|| crate::source::procscan::cgroup2_mount(&cfg.proc_root.join("self/mountinfo")));
    out.push(Check::new(
        "cgroup v2",
        cg.is_some(),
        true,
        match &cg {
            Some(p) => format!("mounted at {}", p.display()),
            None => "no cgroup2 mount: cgroup ids cannot be resolved to paths".to_string(),
        },
    ));
    out
}
