//! The driver ledger (the eBPF ioctl/mmap state): live memory and counts per cgroup and per GPU,
//! and the state stage's counters (events, ioctls by operation, releases, anomalies).
use std::{collections::BTreeMap, fmt};

use super::{LabelSet, MetricEncoder, Scrape, Unit, by_container, counter_family, gauge, gauge_family};
use tracer_core::state::snapshot::{Completeness, Usage};

/// Live memory and counts per cgroup (driver ledger), and table sizes.
pub fn cgroup_memory(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    if !s.has_probes() {
        return Ok(());
    }
    let st = &s.snapshot.state;
    let rows = by_container(
        s,
        &st.cgroups,
        |c| (c.cgroup_id, c.path.as_deref()),
        |a: &mut (Usage, u64, Completeness), c| {
            a.0 += &c.usage;
            a.1 += c.processes as u64;
            a.2.merge(&c.completeness);
        },
    );
    let bytes = Some(Unit::Bytes);
    let g = |e: &mut dyn MetricEncoder, name, help, unit, f: fn(&Usage) -> u64| {
        gauge_family(e, name, help, unit, rows.iter().map(|(l, (u, _, _))| (l, f(u))))
    };
    let c = |e: &mut dyn MetricEncoder, name, help, f: fn(&Usage) -> u64| {
        counter_family(e, name, help, None, rows.iter().map(|(l, (u, _, _))| (l, f(u))))
    };
    g(e, "cgroup_vidmem", "Live device (video) memory allocated through the driver, per cgroup.", bytes, |u| {
        u.vidmem_bytes
    })?;
    g(
        e,
        "cgroup_sysmem",
        "Live system memory allocated through the driver (incl. pinned host pages), per cgroup.",
        bytes,
        |u| u.sysmem_bytes,
    )?;
    g(
        e,
        "cgroup_managed",
        "Live managed (UVM mmap) ranges, per cgroup: not device memory until touched.",
        bytes,
        |u| u.managed_bytes,
    )?;
    g(e, "cgroup_va_reserved", "Live GPU virtual-address reservations without backing, per cgroup.", bytes, |u| {
        u.va_reserved_bytes
    })?;
    g(e, "cgroup_live_allocations", "Live driver memory allocations, per cgroup.", None, |u| u.live_allocations)?;
    c(e, "cgroup_allocations", "Successful driver memory allocations charged to the cgroup.", |u| u.allocations)?;
    c(e, "cgroup_frees", "Driver memory allocations released while charged to the cgroup.", |u| u.frees)?;
    c(e, "cgroup_ioctls", "NVIDIA ioctls made from the cgroup.", |u| u.ioctls)?;
    c(e, "cgroup_failed_ioctls", "NVIDIA ioctls from the cgroup whose syscall or status said failure.", |u| {
        u.failed_calls
    })?;
    gauge_family(
        e,
        "cgroup_processes",
        "Live GPU processes whose latest event came from the cgroup.",
        None,
        rows.iter().map(|(l, (_, p, _))| (l, *p)),
    )?;
    gauge_family(
        e,
        "cgroup_ledger_exact",
        "1 when the cgroup's ledger figures hold every byte of its live processes; 0 when some ran before \
         the agent started or lost records (see the next two series).",
        None,
        rows.iter().map(|(l, (_, _, c))| (l, u64::from(c.exact()))),
    )?;
    gauge_family(
        e,
        "cgroup_processes_from_before_agent",
        "Live processes of the cgroup already running when the agent started: their earlier allocations \
         are unknown to the ledger (NVML's per-process memory still counts them).",
        None,
        rows.iter().map(|(l, (_, _, c))| (l, u64::from(c.from_before_agent))),
    )?;
    gauge_family(
        e,
        "cgroup_memory_from_before_agent",
        "NVML's per-process memory of the cgroup's processes from before the agent (all GPUs): what \
         they hold that the ledger cannot know; only for cgroups with such processes and an NVML reading.",
        Some(Unit::Bytes),
        rows.iter().filter_map(|(l, (_, _, c))| c.nvml_bytes_from_before_agent.map(|b| (l, b))),
    )?;
    gauge_family(
        e,
        "cgroup_ledger_records_lost_since",
        "When (Unix seconds) a live process of the cgroup first lost a ledger record; only for such cgroups.",
        Some(Unit::Seconds),
        rows.iter().filter_map(|(l, (_, _, c))| c.records_lost_since_unix_ns.map(|t| (l, t / 1_000_000_000))),
    )?;
    gauge(e, "processes", "Live GPU processes tracked.", None, st.totals.processes as u64)?;
    gauge(
        e,
        "cgroups",
        "cgroup rows tracked (with live processes, live memory or recent activity).",
        None,
        st.totals.cgroups as u64,
    )
}

/// Labels of a per-GPU series: the `/dev/nvidiaN` minor and dcgm-exporter's `device` label.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct GpuLabels {
    minor: String,
    device: String,
}

impl LabelSet for GpuLabels {
    fn visit(&self, label: &mut dyn FnMut(&str, &str) -> fmt::Result) -> fmt::Result {
        label("minor", &self.minor)?;
        label("device", &self.device)
    }
}

/// Live memory per GPU (by `/dev/nvidiaN` minor; `unknown` for memory with no known GPU).
pub fn gpu_memory(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    if !s.has_probes() {
        return Ok(());
    }
    let rows: Vec<(GpuLabels, Usage)> = s
        .snapshot
        .state
        .gpus
        .iter()
        .map(|g| {
            let l = match g.minor {
                Some(m) => GpuLabels { minor: m.to_string(), device: format!("nvidia{m}") },
                None => GpuLabels { minor: "unknown".into(), device: "unknown".into() },
            };
            (l, g.usage)
        })
        .collect();
    let exact: Vec<(&GpuLabels, u64)> =
        rows.iter().zip(&s.snapshot.state.gpus).map(|((l, _), g)| (l, u64::from(g.completeness.exact()))).collect();
    gauge_family(
        e,
        "gpu_ledger_exact",
        "1 when the GPU's ledger figures hold every byte of the live processes using it; 0 when some ran \
         before the agent started or lost records.",
        None,
        exact,
    )?;
    let bytes = Some(Unit::Bytes);
    let g = |e: &mut dyn MetricEncoder, name, help, unit, f: fn(&Usage) -> u64| {
        gauge_family(e, name, help, unit, rows.iter().map(|(l, u)| (l, f(u))))
    };
    g(e, "gpu_vidmem", "Live device memory allocated through the driver, per GPU.", bytes, |u| u.vidmem_bytes)?;
    g(
        e,
        "gpu_inferred_vidmem",
        "The part of gpu_tracer_gpu_vidmem_bytes whose GPU was inferred from the device instance.",
        bytes,
        |u| u.inferred_vidmem_bytes,
    )?;
    g(e, "gpu_sysmem", "Live system memory allocated through the driver, per GPU.", bytes, |u| u.sysmem_bytes)?;
    g(
        e,
        "gpu_managed",
        "Live managed (UVM) ranges; always in the unknown bucket (no GPU until touched).",
        bytes,
        |u| u.managed_bytes,
    )?;
    g(e, "gpu_live_allocations", "Live driver memory allocations, per GPU.", None, |u| u.live_allocations)
}

/// the bounded tables could not hold.
pub fn state_counters(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    if !s.has_probes() {
        return Ok(());
    }
    let c = &s.snapshot.state.counters;
    let by = |m: &BTreeMap<&'static str, u64>, label: &'static str| -> Vec<([(&'static str, &'static str); 1], u64)> {
        m.iter().map(|(k, v)| ([(label, *k)], *v)).collect()
    };
    counter_family(e, "state_events", "Events applied to the state, by kind.", None, by(&c.events, "kind"))?;
    counter_family(e, "ioctls", "NVIDIA ioctls, by decoded operation.", None, by(&c.ioctls_by_op, "op"))?;
    counter_family(
        e,
        "failed_ioctls",
        "Failed NVIDIA ioctls (syscall or status), by operation.",
        None,
        by(&c.failed_by_op, "op"),
    )?;
    counter_family(
        e,
        "malformed_ioctls",
        "Malformed NVIDIA ioctls, by reason.",
        None,
        by(&c.malformed_by_reason, "reason"),
    )?;
    counter_family(
        e,
        "memory_releases",
        "Driver memory allocations released, by cause.",
        None,
        by(&c.released_by, "cause"),
    )?;
    let anomalies = [
        ("handle_table_full", c.handle_table_full),
        ("untracked_allocation", c.untracked_allocations),
        ("fd_table_full", c.fd_table_full),
        ("managed_table_full", c.managed_table_full),
        ("evicted_process", c.evicted_processes),
        ("evicted_cgroup", c.evicted_cgroups),
        ("implausible_size", c.implausible_sizes),
        ("unknown_handle_free", c.unknown_handle_frees),
        ("unknown_fd_close", c.unknown_fd_closes),
        ("unknown_munmap", c.unknown_munmaps),
        ("stale_handle_replaced", c.stale_handles_replaced),
        ("stale_fd_replaced", c.stale_fds_replaced),
        ("dup_unknown_source", c.dup_unknown_source),
        ("pid_reuse", c.pid_reuse),
        ("record_after_exit", c.records_after_exit),
    ];
    counter_family(
        e,
        "state_anomalies",
        "Things the state stage could not track exactly (full tables, unknown handles, PID reuse), by kind.",
        None,
        anomalies.map(|(k, v)| ([("kind", k)], v)),
    )
}

// ---- attribution, NVML, guardrails and Kubernetes ----
