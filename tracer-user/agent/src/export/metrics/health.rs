//! The tracer's own health: `build_info`, the per-probe accounting (is anything lost in the
//! kernel?), decode errors and the counters of the user-space stages.
use std::fmt;

use super::{LabelSet, MetricEncoder, Scrape, counter, counter_family, gauge, gauge_family};

/// Labels of a build_info series.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct BuildLabels {
    version: String,
    driver_version: String,
    abi_version: String,
    attach_mode: String,
}

impl LabelSet for BuildLabels {
    fn visit(&self, label: &mut dyn FnMut(&str, &str) -> fmt::Result) -> fmt::Result {
        label("version", &self.version)?;
        label("driver_version", &self.driver_version)?;
        label("abi_version", &self.abi_version)?;
        label("attach_mode", &self.attach_mode)
    }
}

/// `gpu_tracer_build_info`: version, the NVIDIA driver's version (NVML's when it answered, else
/// the one the agent resolved), the version whose struct layouts the decoder uses, and the probe
/// attach mode as labels, value 1.
pub fn build_info(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    let labels = BuildLabels {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        driver_version: s.snapshot.nvml.driver_version.clone().unwrap_or_else(|| s.snapshot.driver_version.clone()),
        abi_version: s.snapshot.driver_version.clone(),
        attach_mode: s.snapshot.attach_mode.as_str().to_owned(),
    };
    gauge_family(
        e,
        "build_info",
        "gpu-tracer version, NVIDIA driver version (NVML's when known), the driver version whose ioctl layouts are decoded, and where the driver probes attach (value 1).",
        None,
        [(labels, 1u64)],
    )
}

/// The kernel's per-probe accounting (`seen = emitted + aggregated + dropped`) and the user-space
/// side of the identity.
pub fn probe_accounting(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    if !s.has_probes() {
        return Ok(());
    }
    let probes = &s.snapshot.kernel.probes;
    let per_probe =
        |e: &mut dyn MetricEncoder, name, help, f: fn(&tracer_core::model::counters::ProbeCounters) -> u64| {
            counter_family(e, name, help, None, probes.iter().map(|(p, c)| ([("probe", p.as_str())], f(c))))
        };
    per_probe(e, "probe_events_seen", "Calls a probe saw (in the kernel).", |c| c.seen)?;
    per_probe(e, "probe_events_emitted", "Records a probe wrote to the ring buffer.", |c| c.emitted)?;
    per_probe(e, "probe_events_aggregated", "Calls counted in an in-kernel aggregate instead of a record.", |c| {
        c.aggregated
    })?;
    let dropped = probes
        .iter()
        .flat_map(|(p, c)| c.drops().map(move |(reason, v)| ([("probe", p.as_str()), ("reason", reason)], v)));
    counter_family(e, "probe_events_dropped", "Calls a probe lost in the kernel, by reason.", None, dropped)?;
    let acc = &s.snapshot.accounting;
    counter(
        e,
        "records_received",
        "Records user space took out of the ring buffers (the ledger ring and the bulk ring).",
        None,
        acc.received,
    )?;
    gauge(
        e,
        "records_in_flight",
        "Records emitted but not yet drained when the counters were read (0 when quiescent).",
        None,
        acc.in_flight,
    )?;
    gauge(
        e,
        "accounting_exact",
        "1 when seen = received + aggregated + dropped holds exactly with nothing in flight, else 0.",
        None,
        u64::from(acc.exact),
    )
}

/// Records that failed to decode, by reason.
pub fn decode_errors(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    if !s.has_probes() {
        return Ok(());
    }
    counter_family(
        e,
        "decode_errors",
        "Ring-buffer records that failed to decode, by reason.",
        None,
        // Every reason, also at 0: an alert on `increase(...) > 0` needs the series to exist.
        tracer_core::decode::DecodeError::REASONS
            .iter()
            .map(|r| (*r, 0))
            .chain(s.snapshot.pipeline.decode_errors.iter().map(|(k, v)| (*k, *v)))
            .collect::<std::collections::BTreeMap<&str, u64>>()
            .into_iter()
            .map(|(k, v)| ([("reason", k)], v)),
    )
}

/// Counters of the user-space stages.
pub fn pipeline_stats(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    if !s.has_probes() {
        return Ok(());
    }
    let p = &s.snapshot.pipeline;
    counter(e, "records_decoded", "Records decoded into events.", None, p.decoded)?;
    counter(
        e,
        "proc_scan_seeded_fds",
        "NVIDIA fds found by /proc scans (start-up and forked children).",
        None,
        p.seeded_fds,
    )?;
    counter(
        e,
        "proc_scan_unreadable",
        "Processes whose /proc/PID/fd could not be read during a scan.",
        None,
        p.scan_unreadable,
    )?;
    counter(
        e,
        "processes_reconciled",
        "Tracked processes found gone (or their PID reused) without an exit record, and forgotten.",
        None,
        p.processes_reconciled,
    )?;
    counter(
        e,
        "lost_records_untracked",
        "Processes that lost a ledger record but were not tracked (the drop counters cover them).",
        None,
        p.lost_records_untracked,
    )?;
    counter(
        e,
        "proc_scan_not_devices",
        "Fds a /proc scan found under an NVIDIA device name whose file is not an NVIDIA device (not traced).",
        None,
        p.scan_not_devices,
    )?;
    counter(
        e,
        "fd_map_cleanups",
        "Kernel fd-map and managed-mapping entries removed after process exit.",
        None,
        p.fd_map_cleanups,
    )?;
    counter(
        e,
        "fd_map_errors",
        "Failed kernel map updates from user space (seeding, cleanup).",
        None,
        p.fd_map_errors,
    )?;
    counter(
        e,
        "inflight_swept",
        "In-flight syscall entries of dead threads removed by the sweep.",
        None,
        p.inflight_swept,
    )?;
    counter(
        e,
        "cuda_libraries_found",
        "libcuda copies found in GPU processes' mappings and probed.",
        None,
        p.cuda_libraries_found,
    )?;
    counter(e, "cuda_library_errors", "Failures probing such a libcuda copy.", None, p.cuda_library_errors)?;
    counter(
        e,
        "cuda_libraries_detached",
        "libcuda copies detached after the last process mapping them exited.",
        None,
        p.cuda_libraries_detached,
    )?;
    counter_family(
        e,
        "cgroup_path_lookups",
        "cgroup id to path lookups of ids not known yet, by result: by_id (the kernel, at once), by_walk \
         (a walk of the hierarchy, where lookups by id are refused), unresolved (removed, or a walk not due).",
        None,
        [
            ([("result", "by_id")], p.cgroup_paths_by_id),
            ([("result", "by_walk")], p.cgroup_paths_by_walk),
            ([("result", "unresolved")], p.cgroup_paths_unresolved),
        ],
    )?;
    counter(e, "cgroup_walks", "Full walks of the cgroup hierarchy.", None, p.cgroup_walks)
}
