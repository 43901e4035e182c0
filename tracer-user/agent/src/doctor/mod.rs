//! `gpu-tracer doctor`: what works on this node and why not — kernel features, privileges, the
//! driver, cgroups, and what actually happens when the probes are loaded.
//!
//! [`static_checks`] look without loading anything; [`run`] adds what starting the agent shows
//! (NVML, Kubernetes, the kubelet's allocations, the probe families) and returns the whole
//! [`DoctorReport`], which the binary prints as text or JSON.

use serde::Serialize;

use tracer_core::{config::Config, model::probes::KernelFeatures};

mod live;
pub mod privileges;

pub use live::run;

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    /// Works.
    Ok,
    /// Works in part, or is missing something gpu-tracer can do without.
    Warn,
    /// Missing something needed: `doctor` exits with status 1.
    Fail,
}

impl CheckStatus {
    /// `ok`, `warn` or `fail` (the JSON form too).
    pub fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Ok => "ok",
            CheckStatus::Warn => "warn",
            CheckStatus::Fail => "fail",
        }
    }

    /// `Ok` when `ok`, else `Warn` when only a warning, else `Fail`.
    pub fn judge(ok: bool, warn_only: bool) -> Self {
        if ok {
            CheckStatus::Ok
        } else if warn_only {
            CheckStatus::Warn
        } else {
            CheckStatus::Fail
        }
    }
}

impl std::fmt::Display for CheckStatus {
    /// Honours width and alignment (`{:<5}`), like a `str`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// One line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: CheckStatus,
    pub detail: String,
}

impl Check {
    /// A check with this outcome.
    pub fn with(name: &'static str, status: CheckStatus, detail: impl Into<String>) -> Self {
        Self { name, status, detail: detail.into() }
    }

    fn new(name: &'static str, ok: bool, warn_only: bool, detail: impl Into<String>) -> Self {
        Self::with(name, CheckStatus::judge(ok, warn_only), detail)
    }
}

/// `driver BTF`: whether driver-entry mode can take fentry/fexit (the NVIDIA module has BTF with
/// the entry points) or takes kprobes, and why. Never a fault: kprobes work without it.
fn module_btf_check(f: &KernelFeatures) -> Check {
    let Some(points) = &f.driver_entry else {
        return Check::new("driver BTF", true, true, format!("not checked: {}", f.driver_entry_detail));
    };
    let n = &points.nvidia;
    match crate::probe::module_btf::functions_in("nvidia", &[n.open, n.release, n.ioctl]) {
        Ok(_) => Check::new(
            "driver BTF",
            true,
            true,
            "nvidia.ko has BTF with its entry points: driver-entry mode uses fentry/fexit (BPF trampolines, no perf \
             event; opening the module's BTF needs CAP_SYS_ADMIN, without it kprobes)",
        ),
        Err(e) => Check::new(
            "driver BTF",
            true,
            true,
            format!("driver-entry mode uses kprobes (fentry/fexit need the module's BTF): {e}"),
        ),
    }
}

/// `device nodes`: is `ctl` the NVIDIA driver's control device? A character device is; anything
/// else at that path (a regular file left by some tool, a test double) means the driver is not
/// there, and says what the path is instead.
pub(crate) fn device_node_check(ctl: &str) -> Check {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(md) = std::fs::metadata(ctl) else {
        return Check::with(
            "device nodes",
            CheckStatus::Warn,
            format!("{ctl} not found: no NVIDIA driver here, or dev_dir is wrong (set --dev-dir)"),
        );
    };
    let ft = md.file_type();
    if ft.is_char_device() {
        let (major, minor) = (libc::major(md.rdev()), libc::minor(md.rdev()));
        return Check::with(
            "device nodes",
            CheckStatus::Ok,
            format!("{ctl} present (character device {major}:{minor})"),
        );
    }
    let what = if ft.is_file() {
        "a regular file"
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a character device"
    };
    Check::with(
        "device nodes",
        CheckStatus::Warn,
        format!(
            "{ctl} is {what}, not the NVIDIA driver's character device: the driver is not loaded here \
             (a file left by some tool, or a test double); remove it, or point --dev-dir at the driver's nodes"
        ),
    )
}

/// Everything `doctor` found: the checks in order, and the probe report when the probes loaded.
#[derive(Clone, Debug, Serialize)]
pub struct DoctorReport {
    pub checks: Vec<Check>,
    pub probes: Option<tracer_core::model::probes::ProbeReport>,
}

impl DoctorReport {
    /// Did any check fail? (`doctor` then exits with status 1.)
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.status == CheckStatus::Fail)
    }

    /// One line per check: status padded to 5, name padded to 20, detail.
    pub fn render_text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        for c in &self.checks {
            let _ = writeln!(out, "{:<5} {:<20} {}", c.status, c.name, c.detail);
        }
        out
    }

    /// Pretty JSON `{"checks": [...], "probes": ...}`, object keys sorted (as `doctor --json`
    /// always printed them), without a trailing newline.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(&serde_json::to_value(self)?)
    }
}

/// Effective capabilities of this process (`CapEff` in /proc/self/status).
pub(crate) fn effective_caps() -> u64 {
    crate::proc::status(std::path::Path::new("/proc"), "self").map_or(0, |s| s.capeff)
}

/// `config`: the values and host paths the other commands refuse to start with
/// ([`Config::validate`], [`Config::check_host_paths`]); `doctor` reports them and looks further.
pub(crate) fn config_check(cfg: &Config) -> Check {
    match cfg.validate().and_then(|()| cfg.check_host_paths()) {
        Ok(()) => Check::with(
            "config",
            CheckStatus::Ok,
            format!("valid (dev_dir {}, proc_root {})", cfg.dev_dir.display(), cfg.proc_root.display()),
        ),
        Err(e) => Check::with("config", CheckStatus::Fail, format!("{e} (the agent would refuse to start)")),
    }
}

/// Static checks (no programs loaded).
pub(crate) fn static_checks(cfg: &Config) -> Vec<Check> {
    let f = crate::probe::detect_features();
    let mut out = vec![config_check(cfg), Check::new("kernel", true, false, format!("Linux {}", f.release))];
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
            match &f.driver_entry {
                Some(_) => format!("available: driver-entry attach mode on {}", f.driver_entry_detail),
                None => format!("available, but driver-entry attach mode is not: {}", f.driver_entry_detail),
            }
        } else {
            "not built into this kernel: driver-entry attach mode unavailable".to_string()
        },
    ));
    out.push(module_btf_check(&f));
    out.push(Check::new(
        "syscall tracepoints",
        f.syscall_tracepoints,
        true,
        if f.syscall_tracepoints { "syscalls:* present" } else { "syscalls:* absent (CONFIG_FTRACE_SYSCALLS unset)" },
    ));
    out.extend(privileges::privilege_checks(cfg, &f.release));
    let ver = tracer_core::config::resolve_driver_version(cfg);
    out.push(Check::new(
        "driver version",
        ver.from_driver,
        true,
        format!("{} (from {})", ver.version_string(), ver.source),
    ));
    out.push(device_node_check(&format!("{}ctl", cfg.dev_prefix())));
    let cg = cfg.cgroup_root.clone().or_else(|| crate::proc::cgroup2_mount(&cfg.proc_root));
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

/// `otlp` and `api`: where the agent would send and serve its data, and whether that works from
/// here — the collector answers a TCP connection (else every export would be a counted drop), the
/// API's socket path is free (or which agent already serves on it).
pub(crate) fn exporter_checks(cfg: &Config, env: impl Fn(&str) -> Option<String>) -> Vec<Check> {
    use crate::export::otlp::OtlpSettings;
    let otlp = match OtlpSettings::resolve(&cfg.otlp, env) {
        Err(e) => Check::with("otlp", CheckStatus::Fail, e.to_string()),
        Ok(None) => Check::with(
            "otlp",
            CheckStatus::Ok,
            "off (no endpoint: otlp.endpoint, OTEL_EXPORTER_OTLP_ENDPOINT or --otlp-endpoint turns it on)",
        ),
        Ok(Some(s)) => {
            let tls = match &s.tls {
                None => "",
                Some(t) if t.ca_pem.is_some() && t.identity.is_some() => {
                    ", TLS with the configured CA and a client certificate"
                }
                Some(t) if t.ca_pem.is_some() => ", TLS with the configured CA",
                Some(t) if t.identity.is_some() => ", TLS with the system's roots and a client certificate",
                Some(_) => ", TLS with the system's roots",
            };
            let what = format!("{} ({}{tls}, from {})", s.endpoint, s.protocol.as_str(), s.endpoint_source);
            if let Err(e) = crate::export::otlp::OtlpExporter::check(&s) {
                // What the agent would refuse at start: a header, a TLS file, the URL.
                return vec![Check::with("otlp", CheckStatus::Fail, format!("{what}: {e}")), api_check(cfg)];
            }
            match reach(&s.endpoint, s.protocol.default_port()) {
                Ok(addr) => Check::with("otlp", CheckStatus::Ok, format!("{what}: {addr} accepts connections")),
                Err(e) => Check::with(
                    "otlp",
                    CheckStatus::Warn,
                    format!(
                        "{what}: not reachable from here ({e}); the agent keeps running and counts every export as dropped (gpu_tracer_otlp_dropped_total)"
                    ),
                ),
            }
        }
    };
    vec![otlp, api_check(cfg)]
}

/// Connects to the host and port of an `http://host[:port][/path]` endpoint (2 s at most).
fn reach(endpoint: &str, default_port: u16) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let authority = endpoint.split_once("://").map_or(endpoint, |(_, rest)| rest);
    let authority = authority.split('/').next().unwrap_or(authority);
    let with_port = if authority.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) {
        authority.to_string()
    } else {
        format!("{authority}:{default_port}")
    };
    let addrs: Vec<_> = with_port.to_socket_addrs().map_err(|e| format!("cannot resolve {with_port}: {e}"))?.collect();
    let mut last = format!("{with_port} resolves to no address");
    for a in addrs {
        match std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(2)) {
            Ok(_) => return Ok(a),
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    Err(last)
}

/// `api`: the address the agent would serve its gRPC API on, and whether it is free.
fn api_check(cfg: &Config) -> Check {
    use tracer_core::config::api::ApiAddr;
    match cfg.api.addr() {
        Err(e) => Check::with("api", CheckStatus::Fail, e.to_string()),
        Ok(None) => Check::with("api", CheckStatus::Ok, "off (api.listen = \"off\")"),
        Ok(Some(ApiAddr::Unix(p))) if std::os::unix::net::UnixStream::connect(&p).is_ok() => Check::with(
            "api",
            CheckStatus::Ok,
            format!("unix://{}: an agent is serving there (`gpu-tracer api get-status` asks it)", p.display()),
        ),
        Ok(Some(addr)) => Check::with("api", CheckStatus::Ok, format!("{addr} (mode 0660 for a unix socket)")),
    }
}

#[cfg(test)]
mod tests;
