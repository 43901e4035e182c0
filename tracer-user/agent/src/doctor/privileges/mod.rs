//! Privilege checks for `gpu-tracer doctor`: what this process may do on this node, and for each
//! missing piece, which gpu-tracer feature is lost (docs/security.md has the same table).
use std::path::Path;

use super::Check;
use crate::proc::{kernel_at_least, kernel_before};
use tracer_core::config::Config;

/// A Linux capability the agent uses: bit number, name, what it is for, what is lost without it.
pub(crate) struct Capability {
    pub bit: u32,
    pub name: &'static str,
    pub needed_for: &'static str,
    pub lost_without: &'static str,
}

/// Every capability doctor reports, in docs/security.md order.
pub(crate) const CAPABILITIES: [Capability; 6] = [
    Capability {
        bit: 39,
        name: "CAP_BPF",
        needed_for: "load eBPF programs and create maps",
        lost_without: "every probe family (only NVML is left)",
    },
    Capability {
        bit: 38,
        name: "CAP_PERFMON",
        needed_for: "load tracing programs and attach tracepoints",
        lost_without: "every probe family (only NVML is left)",
    },
    Capability {
        bit: 19,
        name: "CAP_SYS_PTRACE",
        needed_for: "read other users' /proc/PID/fd links, maps, environ and root",
        lost_without: "the start-up scan of processes that opened a GPU earlier, and libcuda copies in containers",
    },
    Capability {
        bit: 2,
        name: "CAP_DAC_READ_SEARCH",
        needed_for: "list other users' /proc/PID/fd and read their environ",
        lost_without: "the start-up scan and the NVIDIA_VISIBLE_DEVICES guardrail for non-root workloads",
    },
    Capability {
        bit: 21,
        name: "CAP_SYS_ADMIN",
        needed_for: "attach perf-event uprobes, used on kernels before 6.6 (no multi-uprobe links there), and \
                     everything BPF on kernels before 5.8",
        lost_without: "on kernels before 6.6 the cuda family (libcuda uprobes: launch counts, CUDA allocations); \
                       nothing on 6.6 and later",
    },
    Capability {
        bit: 24,
        name: "CAP_SYS_RESOURCE",
        needed_for: "raise RLIMIT_MEMLOCK on kernels before 5.11",
        lost_without: "nothing on 5.11 and later; map creation on older kernels",
    },
];

/// Names of the known capabilities set in `mask`.
pub(crate) fn capability_names(mask: u64) -> Vec<&'static str> {
    CAPABILITIES.iter().filter(|c| mask & (1u64 << c.bit) != 0).map(|c| c.name).collect()
}

/// One check per capability of [`CAPABILITIES`]; `kernel_release` decides whether
/// CAP_SYS_RESOURCE matters.
pub(crate) fn capability_checks(caps: u64, kernel_release: &str) -> Vec<Check> {
    let has = |bit: u32| caps & (1u64 << bit) != 0;
    let admin = has(21);
    let old_memlock = kernel_before(kernel_release, 5, 11);
    // Multi-uprobe links (6.6+) need only BPF and PERFMON; before, uprobes are perf events.
    let uprobe_multi = kernel_at_least(kernel_release, 6, 6);
    CAPABILITIES
        .iter()
        .map(|c| {
            let held = has(c.bit);
            // BPF and PERFMON are required unless SYS_ADMIN stands in for them; SYS_RESOURCE
            // only on kernels that charge maps to RLIMIT_MEMLOCK. The rest degrade features.
            let required = matches!(c.bit, 39 | 38) && !admin || c.bit == 24 && old_memlock;
            // Not held and not needed on this kernel: nothing to warn about.
            let unneeded = c.bit == 21 && uprobe_multi || c.bit == 24 && kernel_at_least(kernel_release, 5, 11);
            let detail = if held {
                format!("held: {}", c.needed_for)
            } else if unneeded {
                format!("not held, not needed on kernel {kernel_release} (it is needed to {})", c.needed_for)
            } else {
                format!("missing: needed to {}; without it: {}", c.needed_for, c.lost_without)
            };
            Check::new(c.name, held || unneeded, !required, detail)
        })
        .collect()
}

/// Whether `/proc/1/fd` of the configured procfs can be listed and one link read: the start-up
/// scan needs this for every GPU process.
fn proc_access(proc_root: &Path) -> Check {
    let fd_dir = proc_root.join("1/fd");
    let detail = match std::fs::read_dir(&fd_dir) {
        Err(e) => Err(format!("cannot list {}: {e}", fd_dir.display())),
        Ok(entries) => match entries.flatten().next() {
            None => Ok(format!("{} listed (no fds)", fd_dir.display())),
            Some(e) => match std::fs::read_link(e.path()) {
                Ok(_) => Ok(format!("{} listed and its links read", fd_dir.display())),
                Err(err) => Err(format!("listed {} but cannot read its links: {err}", fd_dir.display())),
            },
        },
    };
    match detail {
        Ok(d) => Check::new("other processes' /proc", true, true, d),
        Err(d) => Check::new(
            "other processes' /proc",
            false,
            true,
            format!(
                "{d}: processes that opened a GPU before the agent started are not seen, and libcuda copies \
                 inside containers are not probed. Fix: CAP_SYS_PTRACE + CAP_DAC_READ_SEARCH, and AppArmor \
                 unconfined for the container (docs/security.md)"
            ),
        ),
    }
}

/// Whether we share the host's PID namespace: PID 1 there is the host's init.
fn host_pid(proc_root: &Path) -> Check {
    let comm = crate::proc::stat(proc_root, 1).map(|s| s.comm);
    let in_container = Path::new("/.dockerenv").exists()
        || Path::new("/run/.containerenv").exists()
        || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let place = if in_container { "in a container" } else { "not in a container" };
    match comm {
        Ok(c) if matches!(c.as_str(), "systemd" | "init") => {
            Check::new("host PID namespace", true, true, format!("{place}; PID 1 is {c}: host PIDs are visible"))
        }
        Ok(c) => Check::new(
            "host PID namespace",
            false,
            true,
            format!(
                "{place}; PID 1 is `{c}`, not the host's init: NVML's and the driver's host PIDs cannot be \
                 matched to processes. Fix: hostPID: true in the pod, or proc_root pointing at the host's procfs"
            ),
        ),
        Err(e) => Check::new(
            "host PID namespace",
            false,
            true,
            format!("{place}; cannot read {}/1/stat: {e}", proc_root.display()),
        ),
    }
}

/// Whether the NVML library can be found: the configured file, else the usual driver paths.
fn nvml_library(cfg: &Config) -> Check {
    use tracer_core::config::SourceMode;
    if cfg.nvml.mode == SourceMode::Off {
        return Check::new("NVML library", true, true, "not used (nvml.mode = off)");
    }
    let candidates: Vec<std::path::PathBuf> = match &cfg.nvml.library {
        Some(p) => vec![p.clone()],
        None => crate::cuda::attach::SEARCH_PATHS
            .iter()
            .filter_map(|p| Path::new(p).parent().map(|d| d.join("libnvidia-ml.so.1")))
            .collect(),
    };
    let required = cfg.nvml.mode == SourceMode::Required;
    match candidates.iter().find(|p| p.exists()) {
        Some(p) => Check::new("NVML library", true, true, format!("{} present", p.display())),
        None => Check::new(
            "NVML library",
            false,
            !required,
            format!(
                "libnvidia-ml.so.1 not found ({}): no per-process memory or SM share from NVML, no fallback \
                 with probes off. Fix: mount the host's driver library directory and set nvml.library",
                candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
        ),
    }
}

/// The kubelet pod-resources socket: a Unix socket we can connect to.
fn pod_resources(cfg: &Config) -> Check {
    use tracer_core::config::SourceMode;
    let path = &cfg.kubernetes.pod_resources_socket;
    if cfg.kubernetes.mode == SourceMode::Off {
        return Check::new("pod-resources socket", true, true, "not used (kubernetes.mode = off)");
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Check::new("pod-resources socket", true, true, format!("{} accepts connections", path.display())),
        Err(e) => Check::new(
            "pod-resources socket",
            false,
            cfg.kubernetes.mode != SourceMode::Required,
            format!(
                "cannot connect to {}: {e}: the GPUs the kubelet allocated to each pod are unknown (no \
                 allocation check, no request-based cost). Fix: mount /var/lib/kubelet/pod-resources and run \
                 as uid 0 (the socket is root's)",
                path.display()
            ),
        ),
    }
}

/// `perf events`: whether `kernel.perf_event_paranoid` (`paranoid`; `None`: unreadable) lets this
/// process open perf events, and whether anything configured needs them. Debian and Ubuntu patch
/// their kernels so that 3 and above refuse `perf_event_open` without CAP_SYS_ADMIN, CAP_PERFMON
/// notwithstanding. The defaults need no perf event (tp_btf, raw_tp and multi-uprobe links are
/// `bpf()` links); the syscall-tracepoint mode, classic lifecycle tracepoints and perf-event
/// uprobes do. A warning only when something configured explicitly would be refused.
pub fn perf_events(cfg: &Config, caps: u64, paranoid: Option<i32>) -> Check {
    use tracer_core::config::{AttachMode, CudaAttach, LifecycleAttach};
    let Some(level) = paranoid else {
        return Check::new("perf events", true, true, "kernel.perf_event_paranoid unreadable: not checked");
    };
    let admin = caps & (1 << 21) != 0;
    if level < 3 || admin {
        let who = if level < 3 { "below 3: CAP_PERFMON suffices" } else { "CAP_SYS_ADMIN held" };
        return Check::new(
            "perf events",
            true,
            true,
            format!("kernel.perf_event_paranoid is {level} ({who}): perf events can be opened"),
        );
    }
    let mut needs = Vec::new();
    match cfg.attach_mode {
        AttachMode::SyscallTracepoint => needs.push("attach_mode = syscall-tracepoint"),
        AttachMode::DriverEntry if cfg.driver_entry_probes != tracer_core::config::DriverEntryProbes::Fentry => {
            needs.push("attach_mode = driver-entry (kprobes)")
        }
        _ => {}
    }
    if cfg.families.lifecycle && cfg.lifecycle_attach == LifecycleAttach::Tracepoint {
        needs.push("lifecycle_attach = tracepoint");
    }
    if cfg.families.cuda && cfg.cuda_attach == CudaAttach::PerfEvent {
        needs.push("cuda_attach = perf-event");
    }
    let refused = "refuses perf_event_open without CAP_SYS_ADMIN (a Debian/Ubuntu patch)";
    if needs.is_empty() {
        Check::new(
            "perf events",
            true,
            true,
            format!(
                "kernel.perf_event_paranoid is {level}: this kernel {refused}; nothing configured needs one \
                 (BTF/raw tracepoints and multi-uprobe links attach through bpf() links), but driver-entry \
                 mode's kprobes are refused (without CAP_SYS_ADMIN its fentry cannot open the module's BTF \
                 either, so `auto` uses btf-tracepoint instead, which taxes every syscall of the node; with \
                 `sysctl kernel.perf_event_paranoid=2` or CAP_SYS_ADMIN it would take driver-entry where the \
                 NVIDIA driver is loaded), as are the fallbacks (classic tracepoints \
                 without BTF, perf-event uprobes before 6.6)"
            ),
        )
    } else {
        Check::new(
            "perf events",
            false,
            true,
            format!(
                "kernel.perf_event_paranoid is {level}: this kernel {refused}, which {} needs; fix: \
                 `sysctl kernel.perf_event_paranoid=2`, add CAP_SYS_ADMIN, or use the default (auto)",
                needs.join(", ")
            ),
        )
    }
}

/// All privilege checks, for [`super::static_checks`].
pub(crate) fn privilege_checks(cfg: &Config, kernel_release: &str) -> Vec<Check> {
    let caps = super::effective_caps();
    let mut out = vec![Check::new(
        "capabilities",
        true,
        true,
        format!("CapEff {caps:016x}: {}", capability_names(caps).join(", ")),
    )];
    out.extend(capability_checks(caps, kernel_release));
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").ok();
    out.push(perf_events(cfg, caps, paranoid.as_deref().and_then(|v| v.trim().parse().ok())));
    out.push(proc_access(&cfg.proc_root));
    out.push(host_pid(&cfg.proc_root));
    out.push(pod_resources(cfg));
    out.push(nvml_library(cfg));
    out
}

#[cfg(test)]
mod tests;
