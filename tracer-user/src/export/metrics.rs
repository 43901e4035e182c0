//! Prometheus / OpenMetrics exposition of an [`AgentSnapshot`] (`/metrics`).
//!
//! Series are built at scrape time from the latest immutable snapshot (prometheus-client's
//! `Collector`, the dcgm-exporter / kube-state-metrics shape): nothing is kept between scrapes, so
//! a container that went away has no stale series.
//!
//! The exposition is a list of [`MetricSource`]s, each one function that writes some metric
//! families from a [`Scrape`]. [`MetricsRegistry::new`] holds the built-in ones ([`BUILTIN`]);
//! more are added with [`MetricsRegistry::with_source`] — this is the extension point for the
//! attribution lines (per GPU/container memory, SM share, energy, cost) and violations. A source
//! reads either a field of the snapshot or data it owns (e.g. its own `Arc` to another snapshot).
//!
//! Every metric is listed in `docs/metrics.md`. Conventions: the `gpu_tracer_` prefix, base units
//! in the name (`_bytes`), counters end in `_total`, and kernel names are never labels.
use std::{collections::BTreeMap, fmt, sync::Arc};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet, NoLabelSet},
    metrics::MetricType,
    registry::{Registry, Unit},
};

use crate::{cuda::ledger::CudaUsage, pipeline::AgentSnapshot, state::snapshot::Usage};

/// The prefix of every metric name.
pub const PREFIX: &str = "gpu_tracer";

/// The identity labels of every per-container series.
///
/// `cgroup` is always set (the cgroup path, or `id:N` when the path is unknown); `namespace`,
/// `pod` and `container` are empty strings until a [`ContainerResolver`] knows them (an empty
/// label value is the same as no label to Prometheus, so queries need not change later).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, prometheus_client::encoding::EncodeLabelSet)]
pub struct ContainerLabels {
    /// Kubernetes namespace of the pod.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name within the pod.
    pub container: String,
    /// cgroup v2 path (relative to the cgroup root).
    pub cgroup: String,
}

impl ContainerLabels {
    /// Labels that carry only the cgroup: its path, or `id:N` when the path was never resolved.
    pub fn for_cgroup(cgroup_id: u64, path: Option<&str>) -> Self {
        ContainerLabels { cgroup: path.map_or_else(|| format!("id:{cgroup_id}"), str::to_owned), ..Default::default() }
    }
}

// Families are encoded from borrowed rows; `&` is fundamental, so this impl is ours to write.
impl EncodeLabelSet for &ContainerLabels {
    fn encode(&self, encoder: &mut prometheus_client::encoding::LabelSetEncoder) -> fmt::Result {
        (**self).encode(encoder)
    }
}

/// Maps a cgroup to its container identity (the Kubernetes enrichment plugs in here).
pub trait ContainerResolver: Send + Sync + 'static {
    /// The labels of the series of one cgroup row. Rows that resolve to the same labels are summed.
    fn labels(&self, cgroup_id: u64, cgroup_path: Option<&str>) -> ContainerLabels;
}

/// The resolver used without Kubernetes: the cgroup label only.
#[derive(Clone, Copy, Debug, Default)]
pub struct CgroupOnly;

impl ContainerResolver for CgroupOnly {
    fn labels(&self, cgroup_id: u64, cgroup_path: Option<&str>) -> ContainerLabels {
        ContainerLabels::for_cgroup(cgroup_id, cgroup_path)
    }
}

impl<F> ContainerResolver for F
where
    F: Fn(u64, Option<&str>) -> ContainerLabels + Send + Sync + 'static,
{
    fn labels(&self, cgroup_id: u64, cgroup_path: Option<&str>) -> ContainerLabels {
        self(cgroup_id, cgroup_path)
    }
}

/// What a [`MetricSource`] sees during one scrape.
pub struct Scrape<'a> {
    /// The latest published snapshot.
    pub snapshot: &'a AgentSnapshot,
    /// Container identity of cgroups.
    pub resolver: &'a dyn ContainerResolver,
}

impl Scrape<'_> {
    /// The labels of a cgroup row.
    pub fn container(&self, cgroup_id: u64, path: Option<&str>) -> ContainerLabels {
        self.resolver.labels(cgroup_id, path)
    }
}

/// One part of the exposition: writes some metric families from a scrape.
///
/// Implemented for every `Fn(&Scrape, &mut DescriptorEncoder) -> fmt::Result`, so a new part is
/// one function, written with [`gauge`], [`counter`], [`gauge_family`] and [`counter_family`].
/// Metric names passed to those helpers omit the `gpu_tracer_` prefix, the unit and `_total`
/// (prometheus-client appends them).
pub trait MetricSource: Send + Sync + 'static {
    /// Write this source's families. Never write a family name another source writes.
    fn encode(&self, scrape: &Scrape<'_>, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result;
}

impl<F> MetricSource for F
where
    F: Fn(&Scrape<'_>, &mut DescriptorEncoder<'_>) -> fmt::Result + Send + Sync + 'static,
{
    fn encode(&self, scrape: &Scrape<'_>, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
        self(scrape, encoder)
    }
}

/// A built-in source: a name (for docs and tests) and its function.
pub type BuiltinSource = (&'static str, fn(&Scrape<'_>, &mut DescriptorEncoder<'_>) -> fmt::Result);

/// The built-in sources, in exposition order.
pub const BUILTIN: &[BuiltinSource] = &[
    ("build_info", build_info),
    ("cgroup_memory", cgroup_memory),
    ("gpu_memory", gpu_memory),
    ("cgroup_cuda", cgroup_cuda),
    ("cuda_calls", cuda_calls),
    ("probe_accounting", probe_accounting),
    ("decode_errors", decode_errors),
    ("pipeline_stats", pipeline_stats),
    ("state_counters", state_counters),
];

/// The wire format of a scrape answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpositionFormat {
    /// OpenMetrics 1.0 text (what Prometheus asks for first); ends with `# EOF`.
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4 (curl, older scrapers).
    Prometheus,
}

impl ExpositionFormat {
    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            ExpositionFormat::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            ExpositionFormat::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
        }
    }

    /// The format an `Accept` header asks for: OpenMetrics when it names it, else classic text.
    pub fn negotiate(accept: Option<&str>) -> Self {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => ExpositionFormat::OpenMetrics,
            _ => ExpositionFormat::Prometheus,
        }
    }
}

/// The metric sources and the container resolver; encodes a snapshot at scrape time.
#[derive(Clone)]
pub struct MetricsRegistry {
    sources: Vec<Arc<dyn MetricSource>>,
    resolver: Arc<dyn ContainerResolver>,
}

impl fmt::Debug for MetricsRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsRegistry").field("sources", &self.sources.len()).finish_non_exhaustive()
    }
}

impl Default for MetricsRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricsRegistry {
    /// The built-in sources ([`BUILTIN`]) with the cgroup-only resolver.
    pub fn new() -> Self {
        MetricsRegistry {
            sources: BUILTIN.iter().map(|(_, f)| Arc::new(*f) as Arc<dyn MetricSource>).collect(),
            resolver: Arc::new(CgroupOnly),
        }
    }

    /// No sources at all (for a caller that wants to choose every part).
    pub fn empty() -> Self {
        MetricsRegistry { sources: Vec::new(), resolver: Arc::new(CgroupOnly) }
    }

    /// Add a source, encoded after the ones already there.
    pub fn with_source(mut self, source: impl MetricSource) -> Self {
        self.sources.push(Arc::new(source));
        self
    }

    /// Use this resolver for the container labels (e.g. the Kubernetes pod index).
    pub fn with_resolver(mut self, resolver: impl ContainerResolver) -> Self {
        self.resolver = Arc::new(resolver);
        self
    }

    /// Encode one snapshot in the given format.
    pub fn encode(&self, snapshot: &Arc<AgentSnapshot>, format: ExpositionFormat) -> Result<String, fmt::Error> {
        let mut registry = Registry::with_prefix(PREFIX);
        registry.register_collector(Box::new(ScrapeCollector {
            snapshot: Arc::clone(snapshot),
            sources: self.sources.clone(),
            resolver: Arc::clone(&self.resolver),
        }));
        let mut out = String::with_capacity(16 * 1024);
        match format {
            ExpositionFormat::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &registry)?,
            ExpositionFormat::Prometheus => prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?,
        }
        Ok(out)
    }
}

/// One scrape's collector: owns the snapshot it encodes (prometheus-client wants `'static`).
struct ScrapeCollector {
    snapshot: Arc<AgentSnapshot>,
    sources: Vec<Arc<dyn MetricSource>>,
    resolver: Arc<dyn ContainerResolver>,
}

impl fmt::Debug for ScrapeCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScrapeCollector").finish_non_exhaustive()
    }
}

impl Collector for ScrapeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let scrape = Scrape { snapshot: &self.snapshot, resolver: &*self.resolver };
        for s in &self.sources {
            s.encode(&scrape, &mut encoder)?;
        }
        Ok(())
    }
}

// ---- helpers: one call per metric family ----

/// One unlabelled gauge.
pub fn gauge(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: impl EncodeGaugeValue,
) -> fmt::Result {
    e.encode_descriptor(name, help, unit, MetricType::Gauge)?.encode_gauge(&value)
}

/// One unlabelled counter (`_total` is appended to the sample name).
pub fn counter(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: impl EncodeCounterValue,
) -> fmt::Result {
    e.encode_descriptor(name, help, unit, MetricType::Counter)?.encode_counter::<NoLabelSet, _, u64>(&value, None)
}

/// A gauge family: one series per `(labels, value)`. Label sets must be distinct. A family with no
/// rows is left out entirely (as client_golang does: some parsers reject metadata without samples).
pub fn gauge_family<L: EncodeLabelSet, V: EncodeGaugeValue>(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    rows: impl IntoIterator<Item = (L, V)>,
) -> fmt::Result {
    let mut rows = rows.into_iter().peekable();
    if rows.peek().is_none() {
        return Ok(());
    }
    let mut m = e.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for (labels, v) in rows {
        m.encode_family(&labels)?.encode_gauge(&v)?;
    }
    Ok(())
}

/// A counter family: one series per `(labels, value)`. Label sets must be distinct; no rows, no
/// family.
pub fn counter_family<L: EncodeLabelSet, V: EncodeCounterValue>(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    rows: impl IntoIterator<Item = (L, V)>,
) -> fmt::Result {
    let mut rows = rows.into_iter().peekable();
    if rows.peek().is_none() {
        return Ok(());
    }
    let mut m = e.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (labels, v) in rows {
        m.encode_family(&labels)?.encode_counter::<NoLabelSet, _, u64>(&v, None)?;
    }
    Ok(())
}

/// Sum rows that resolve to the same labels (a removed cgroup and a new one with the same path,
/// or a resolver that maps several cgroups to one container): an exposition may not repeat a
/// label set.
fn by_container<'r, T: 'r, A: Default>(
    s: &Scrape<'_>,
    rows: impl IntoIterator<Item = &'r T>,
    key: impl Fn(&T) -> (u64, Option<&str>),
    mut add: impl FnMut(&mut A, &T),
) -> BTreeMap<ContainerLabels, A> {
    let mut out: BTreeMap<ContainerLabels, A> = BTreeMap::new();
    for r in rows {
        let (id, path) = key(r);
        add(out.entry(s.container(id, path)).or_default(), r);
    }
    out
}

// ---- built-in sources ----

/// Labels of a build_info series.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    driver_version: String,
    attach_mode: String,
}

/// `gpu_tracer_build_info`: version, driver version and probe attach mode as labels, value 1.
pub fn build_info(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
    let labels = BuildLabels {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        driver_version: s.snapshot.driver_version.clone(),
        attach_mode: s.snapshot.attach_mode.to_owned(),
    };
    gauge_family(
        e,
        "build_info",
        "gpu-tracer version, NVIDIA driver version and where the driver probes attach (value 1).",
        None,
        [(labels, 1u64)],
    )
}

/// Live memory and counts per cgroup (driver ledger), and table sizes.
pub fn cgroup_memory(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
    let st = &s.snapshot.state;
    let rows = by_container(
        s,
        &st.cgroups,
        |c| (c.cgroup_id, c.path.as_deref()),
        |a: &mut (Usage, u64), c| {
            add_usage(&mut a.0, &c.usage);
            a.1 += c.processes as u64;
        },
    );
    let bytes = Some(&Unit::Bytes);
    let g = |e: &mut DescriptorEncoder<'_>, name, help, unit, f: fn(&Usage) -> u64| {
        gauge_family(e, name, help, unit, rows.iter().map(|(l, (u, _))| (l, f(u))))
    };
    let c = |e: &mut DescriptorEncoder<'_>, name, help, f: fn(&Usage) -> u64| {
        counter_family(e, name, help, None, rows.iter().map(|(l, (u, _))| (l, f(u))))
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
        rows.iter().map(|(l, (_, p))| (l, *p)),
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

fn add_usage(a: &mut Usage, b: &Usage) {
    a.vidmem_bytes += b.vidmem_bytes;
    a.sysmem_bytes += b.sysmem_bytes;
    a.va_reserved_bytes += b.va_reserved_bytes;
    a.managed_bytes += b.managed_bytes;
    a.inferred_vidmem_bytes += b.inferred_vidmem_bytes;
    a.live_allocations += b.live_allocations;
    a.managed_mappings += b.managed_mappings;
    a.allocations += b.allocations;
    a.frees += b.frees;
    a.ioctls += b.ioctls;
    a.failed_calls += b.failed_calls;
}

/// Labels of a per-GPU series: the `/dev/nvidiaN` minor and dcgm-exporter's `device` label.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct GpuLabels {
    minor: String,
    device: String,
}

impl EncodeLabelSet for &GpuLabels {
    fn encode(&self, encoder: &mut prometheus_client::encoding::LabelSetEncoder) -> fmt::Result {
        (**self).encode(encoder)
    }
}

/// Live memory per GPU (by `/dev/nvidiaN` minor; `unknown` for memory with no known GPU).
pub fn gpu_memory(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
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
    let bytes = Some(&Unit::Bytes);
    let g = |e: &mut DescriptorEncoder<'_>, name, help, unit, f: fn(&Usage) -> u64| {
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

/// libcuda-level numbers per cgroup: launches and CUDA allocations.
pub fn cgroup_cuda(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
    let rows = by_container(
        s,
        &s.snapshot.cuda.cgroups,
        |c| (c.cgroup_id, c.path.as_deref()),
        |a: &mut CudaUsage, c| {
            a.device_bytes += c.usage.device_bytes;
            a.managed_bytes += c.usage.managed_bytes;
            a.host_bytes += c.usage.host_bytes;
            a.launches += c.usage.launches;
            a.graph_launches += c.usage.graph_launches;
            a.allocs += c.usage.allocs;
            a.frees += c.usage.frees;
            a.failed_allocs += c.usage.failed_allocs;
        },
    );
    let bytes = Some(&Unit::Bytes);
    let g = |e: &mut DescriptorEncoder<'_>, name, help, f: fn(&CudaUsage) -> u64| {
        gauge_family(e, name, help, bytes, rows.iter().map(|(l, u)| (l, f(u))))
    };
    let c = |e: &mut DescriptorEncoder<'_>, name, help, f: fn(&CudaUsage) -> u64| {
        counter_family(e, name, help, None, rows.iter().map(|(l, u)| (l, f(u))))
    };
    c(e, "cgroup_cuda_launches", "CUDA kernel launches (cuLaunchKernel*, cuLaunchCooperativeKernel*).", |u| {
        u.launches
    })?;
    c(e, "cgroup_cuda_graph_launches", "CUDA graph launches (cuGraphLaunch*); one may run many kernels.", |u| {
        u.graph_launches
    })?;
    g(e, "cgroup_cuda_device", "Live bytes of cuMemAlloc*/cuMemCreate (CUDA ledger).", |u| u.device_bytes)?;
    g(e, "cgroup_cuda_managed", "Live bytes of cuMemAllocManaged.", |u| u.managed_bytes)?;
    g(e, "cgroup_cuda_host", "Live bytes of cuMemAllocHost (pinned host memory).", |u| u.host_bytes)?;
    c(e, "cgroup_cuda_allocations", "Successful CUDA allocation calls.", |u| u.allocs)?;
    c(e, "cgroup_cuda_frees", "CUDA free calls.", |u| u.frees)?;
    c(e, "cgroup_cuda_failed_allocations", "CUDA allocation calls that returned an error.", |u| u.failed_allocs)
}

/// libcuda calls by entry point (a fixed set of symbol names), and frees of unknown pointers.
pub fn cuda_calls(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
    let cuda = &s.snapshot.cuda;
    counter_family(
        e,
        "cuda_calls",
        "libcuda calls seen, by entry point.",
        None,
        cuda.calls_by_entry.iter().map(|(k, v)| ([("entry", *k)], *v)),
    )?;
    counter(e, "cuda_unknown_frees", "CUDA frees of pointers the ledger did not know.", None, cuda.unknown_frees)
}

/// The kernel's per-probe accounting (`seen = emitted + aggregated + dropped`) and the user-space
/// side of the identity.
pub fn probe_accounting(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
    let probes = &s.snapshot.kernel.probes;
    let per_probe =
        |e: &mut DescriptorEncoder<'_>, name, help, f: fn(&crate::source::counters::ProbeCounters) -> u64| {
            counter_family(e, name, help, None, probes.iter().map(|(p, c)| ([("probe", p.as_str())], f(c))))
        };
    per_probe(e, "probe_events_seen", "Calls a probe saw (in the kernel).", |c| c.seen)?;
    per_probe(e, "probe_events_emitted", "Records a probe wrote to the ring buffer.", |c| c.emitted)?;
    per_probe(e, "probe_events_aggregated", "Calls counted in an in-kernel aggregate instead of a record.", |c| {
        c.aggregated
    })?;
    let dropped = probes.iter().flat_map(|(p, c)| {
        [
            ("ringbuf_full", c.dropped_ringbuf_full),
            ("inflight_full", c.dropped_inflight_full),
            ("fd_map_full", c.dropped_fd_map_full),
            ("no_entry", c.dropped_no_entry),
            ("count_map_full", c.dropped_count_map_full),
        ]
        .map(|(reason, v)| ([("probe", p.as_str()), ("reason", reason)], v))
    });
    counter_family(e, "probe_events_dropped", "Calls a probe lost in the kernel, by reason.", None, dropped)?;
    let acc = &s.snapshot.accounting;
    counter(e, "records_received", "Records user space took out of the ring buffer.", None, acc.received)?;
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
pub fn decode_errors(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
    counter_family(
        e,
        "decode_errors",
        "Ring-buffer records that failed to decode, by reason.",
        None,
        s.snapshot.pipeline.decode_errors.iter().map(|(k, v)| ([("reason", *k)], *v)),
    )
}

/// Counters of the user-space stages.
pub fn pipeline_stats(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
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
    counter(e, "fd_map_cleanups", "Kernel NV_FDS entries removed after process exit.", None, p.fd_map_cleanups)?;
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
    )
}

/// Counters of the state stage: events by kind, ioctls by operation, releases by cause, and what
/// the bounded tables could not hold.
pub fn state_counters(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
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
    ];
    counter_family(
        e,
        "state_anomalies",
        "Things the state stage could not track exactly (full tables, unknown handles, PID reuse), by kind.",
        None,
        anomalies.map(|(k, v)| ([("kind", k)], v)),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;

    use openmetrics_parser::{MetricFamily, MetricsExposition, OpenMetricsType, OpenMetricsValue};

    use super::*;
    use crate::{
        cuda::ledger::{CudaCgroupRow, CudaSnapshot},
        pipeline::{Accounting, PipelineStats},
        source::counters::{KernelCounters, ProbeCounters},
        state::snapshot::{CgroupRow, GpuRow, Snapshot, Totals},
    };

    const POD_A: &str = "/kubepods.slice/kubepods-pod1.slice/cri-containerd-aaa.scope";
    const POD_B: &str = "/kubepods.slice/kubepods-pod2.slice/cri-containerd-bbb.scope";

    fn usage(vid: u64, sys: u64, managed: u64) -> Usage {
        Usage {
            vidmem_bytes: vid,
            sysmem_bytes: sys,
            managed_bytes: managed,
            live_allocations: 2,
            allocations: 5,
            frees: 3,
            ioctls: 40,
            failed_calls: 1,
            ..Default::default()
        }
    }

    /// A snapshot with two resolved cgroups, one with no path, two GPUs and the unknown bucket.
    pub(crate) fn sample_snapshot() -> AgentSnapshot {
        let cg = |id, path: Option<&str>, processes, u| CgroupRow {
            cgroup_id: id,
            path: path.map(Into::into),
            processes,
            removed: false,
            usage: u,
        };
        let mut state = Snapshot {
            totals: Totals { usage: Usage::default(), processes: 3, cgroups: 3, live_allocations: 6 },
            cgroups: vec![
                cg(11, Some(POD_A), 2, usage(3 << 30, 1 << 20, 0)),
                cg(12, Some(POD_B), 1, usage(1 << 30, 0, 64 << 20)),
                cg(13, None, 0, usage(4096, 0, 0)),
            ],
            processes: Vec::new(),
            gpus: vec![
                GpuRow { minor: Some(0), usage: usage(3 << 30, 0, 0) },
                GpuRow { minor: Some(1), usage: usage((1 << 30) + 4096, 1 << 20, 0) },
                GpuRow { minor: None, usage: usage(0, 0, 64 << 20) },
            ],
            ..Default::default()
        };
        state.counters.events.insert("ioctl", 9);
        state.counters.ioctls_by_op.insert("rm_alloc", 9);
        state.counters.failed_by_op.insert("rm_alloc", 1);
        state.counters.released_by.insert("process_exit", 2);
        state.counters.malformed_by_reason.insert("short_params", 1);
        state.counters.handle_table_full = 7;
        let cuda = CudaSnapshot {
            cgroups: vec![CudaCgroupRow {
                cgroup_id: 11,
                path: Some(POD_A.into()),
                usage: CudaUsage {
                    device_bytes: 2 << 30,
                    launches: 12345,
                    graph_launches: 3,
                    allocs: 4,
                    ..Default::default()
                },
            }],
            calls_by_entry: [("cuLaunchKernel", 12345)].into_iter().collect(),
            ..Default::default()
        };
        let probe = |seen, emitted, rb| ProbeCounters { seen, emitted, dropped_ringbuf_full: rb, ..Default::default() };
        AgentSnapshot {
            state,
            cuda,
            ledger_check: Vec::new(),
            kernel: KernelCounters {
                probes: vec![("ioctl".into(), probe(100, 97, 3)), ("open".into(), probe(5, 5, 0))],
            },
            pipeline: PipelineStats {
                received: 102,
                decoded: 101,
                decode_errors: [("truncated", 1)].into_iter().collect(),
                ..Default::default()
            },
            accounting: Accounting { seen: 105, received: 102, aggregated: 0, dropped: 3, in_flight: 0, exact: true },
            attach_mode: "tracepoint",
            driver_version: "570.86.15".into(),
            ..Default::default()
        }
    }

    pub(crate) type Parsed = MetricsExposition<OpenMetricsType, OpenMetricsValue>;

    /// Parse with a strict OpenMetrics parser (rejects duplicate series, missing `# EOF`, ...).
    pub(crate) fn parse(text: &str) -> Parsed {
        openmetrics_parser::openmetrics::parse_openmetrics(text)
            .unwrap_or_else(|e| panic!("exposition does not parse: {e:?}\n{text}"))
    }

    fn family<'a>(p: &'a Parsed, name: &str) -> &'a MetricFamily<OpenMetricsType, OpenMetricsValue> {
        p.families.get(name).unwrap_or_else(|| panic!("no family {name}; have {:?}", p.families.keys()))
    }

    /// The value of the series of `family` with exactly these labels.
    pub(crate) fn value(p: &Parsed, name: &str, labels: &[(&str, &str)]) -> f64 {
        let f = family(p, name);
        let want: HashMap<&str, &str> = labels.iter().copied().collect();
        let hits: Vec<f64> = f
            .iter_samples()
            .filter(|s| {
                let ls = s.get_labelset().expect("labelset");
                ls.iter().count() == want.len() && ls.iter().all(|(k, v)| want.get(k.as_str()) == Some(&v.as_str()))
            })
            .map(|s| match &s.value {
                OpenMetricsValue::Gauge(n) | OpenMetricsValue::Unknown(n) => n.as_f64(),
                OpenMetricsValue::Counter(c) => c.value.as_f64(),
                other => panic!("unexpected value {other:?}"),
            })
            .collect();
        assert_eq!(hits.len(), 1, "{name} {labels:?}: {} matching series", hits.len());
        hits[0]
    }

    fn container(cgroup: &str) -> [(&'static str, &str); 4] {
        [("namespace", ""), ("pod", ""), ("container", ""), ("cgroup", cgroup)]
    }

    #[test]
    fn openmetrics_exposition_parses_with_names_labels_and_values() {
        let text = MetricsRegistry::new().encode(&Arc::new(sample_snapshot()), ExpositionFormat::OpenMetrics).unwrap();
        assert!(text.ends_with("# EOF\n"));
        let p = parse(&text);
        assert_eq!(family(&p, "gpu_tracer_cgroup_vidmem_bytes").family_type, OpenMetricsType::Gauge);
        assert_eq!(family(&p, "gpu_tracer_cgroup_vidmem_bytes").unit, "bytes");
        assert_eq!(value(&p, "gpu_tracer_cgroup_vidmem_bytes", &container(POD_A)), (3u64 << 30) as f64);
        assert_eq!(value(&p, "gpu_tracer_cgroup_sysmem_bytes", &container(POD_A)), (1u64 << 20) as f64);
        assert_eq!(value(&p, "gpu_tracer_cgroup_managed_bytes", &container(POD_B)), (64u64 << 20) as f64);
        assert_eq!(value(&p, "gpu_tracer_cgroup_vidmem_bytes", &container("id:13")), 4096.0);
        assert_eq!(value(&p, "gpu_tracer_cgroup_processes", &container(POD_A)), 2.0);
        assert_eq!(value(&p, "gpu_tracer_processes", &[]), 3.0);
        // Counters: OpenMetrics family name without _total, type counter.
        assert_eq!(family(&p, "gpu_tracer_cgroup_cuda_launches").family_type, OpenMetricsType::Counter);
        assert_eq!(value(&p, "gpu_tracer_cgroup_cuda_launches", &container(POD_A)), 12345.0);
        assert_eq!(value(&p, "gpu_tracer_cgroup_cuda_device_bytes", &container(POD_A)), (2u64 << 30) as f64);
        assert_eq!(
            value(&p, "gpu_tracer_gpu_vidmem_bytes", &[("minor", "0"), ("device", "nvidia0")]),
            (3u64 << 30) as f64
        );
        assert_eq!(
            value(&p, "gpu_tracer_gpu_managed_bytes", &[("minor", "unknown"), ("device", "unknown")]),
            (64u64 << 20) as f64
        );
        assert_eq!(value(&p, "gpu_tracer_probe_events_seen", &[("probe", "ioctl")]), 100.0);
        assert_eq!(
            value(&p, "gpu_tracer_probe_events_dropped", &[("probe", "ioctl"), ("reason", "ringbuf_full")]),
            3.0
        );
        assert_eq!(value(&p, "gpu_tracer_probe_events_dropped", &[("probe", "open"), ("reason", "no_entry")]), 0.0);
        assert_eq!(value(&p, "gpu_tracer_decode_errors", &[("reason", "truncated")]), 1.0);
        assert_eq!(value(&p, "gpu_tracer_records_received", &[]), 102.0);
        assert_eq!(value(&p, "gpu_tracer_accounting_exact", &[]), 1.0);
        assert_eq!(value(&p, "gpu_tracer_cuda_calls", &[("entry", "cuLaunchKernel")]), 12345.0);
        assert_eq!(value(&p, "gpu_tracer_state_anomalies", &[("kind", "handle_table_full")]), 7.0);
        assert_eq!(value(&p, "gpu_tracer_memory_releases", &[("cause", "process_exit")]), 2.0);
        assert_eq!(
            value(
                &p,
                "gpu_tracer_build_info",
                &[
                    ("version", env!("CARGO_PKG_VERSION")),
                    ("driver_version", "570.86.15"),
                    ("attach_mode", "tracepoint")
                ]
            ),
            1.0
        );
        // Every cgroup and every GPU row is exposed, nothing else.
        assert_eq!(family(&p, "gpu_tracer_cgroup_vidmem_bytes").iter_samples().count(), 3);
        assert_eq!(family(&p, "gpu_tracer_gpu_vidmem_bytes").iter_samples().count(), 3);
    }

    #[test]
    fn every_family_is_prefixed_and_documented() {
        let text = MetricsRegistry::new().encode(&Arc::new(sample_snapshot()), ExpositionFormat::OpenMetrics).unwrap();
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md")).unwrap();
        let p = parse(&text);
        for (name, f) in &p.families {
            assert!(name.starts_with("gpu_tracer_"), "{name}");
            assert!(!f.help.is_empty(), "{name} has no help");
            // docs/metrics.md names each metric as it appears in a query (counters with _total).
            let sample_name =
                if f.family_type == OpenMetricsType::Counter { format!("{name}_total") } else { name.clone() };
            assert!(doc.contains(&format!("`{sample_name}`")), "docs/metrics.md does not list `{sample_name}`");
        }
        // And the other way: every metric in a table of the page is exposed.
        let documented: Vec<&str> =
            doc.lines().filter_map(|l| l.strip_prefix("| `gpu_tracer_")?.split('`').next()).collect();
        assert!(documented.len() > 40, "{documented:?}");
        for d in documented {
            let exposed = p.families.contains_key(&format!("gpu_tracer_{d}"))
                || d.strip_suffix("_total").is_some_and(|f| p.families.contains_key(&format!("gpu_tracer_{f}")));
            assert!(exposed, "docs/metrics.md lists gpu_tracer_{d}, which the exposition does not have");
        }
    }

    #[test]
    fn classic_text_format_parses_too() {
        let text = MetricsRegistry::new().encode(&Arc::new(sample_snapshot()), ExpositionFormat::Prometheus).unwrap();
        assert!(!text.contains("# EOF"));
        let p = openmetrics_parser::prometheus::parse_prometheus(&text).expect("classic exposition parses");
        let f = p.families.get("gpu_tracer_cgroup_cuda_launches_total").expect("counter family with _total");
        assert_eq!(f.iter_samples().count(), 1);
    }

    #[test]
    fn resolver_labels_and_rows_with_the_same_labels_are_summed() {
        // A resolver that knows pod A and maps the path-less cgroup onto the same container.
        let reg = MetricsRegistry::new().with_resolver(|id: u64, path: Option<&str>| {
            if id == 11 || id == 13 {
                ContainerLabels {
                    namespace: "ml".into(),
                    pod: "trainer-0".into(),
                    container: "main".into(),
                    cgroup: POD_A.into(),
                }
            } else {
                ContainerLabels::for_cgroup(id, path)
            }
        });
        let p = parse(&reg.encode(&Arc::new(sample_snapshot()), ExpositionFormat::OpenMetrics).unwrap());
        let a = [("namespace", "ml"), ("pod", "trainer-0"), ("container", "main"), ("cgroup", POD_A)];
        assert_eq!(value(&p, "gpu_tracer_cgroup_vidmem_bytes", &a), ((3u64 << 30) + 4096) as f64);
        assert_eq!(value(&p, "gpu_tracer_cgroup_allocations", &a), 10.0);
        assert_eq!(family(&p, "gpu_tracer_cgroup_vidmem_bytes").iter_samples().count(), 2);
    }

    #[test]
    fn an_added_source_is_encoded_after_the_builtins() {
        let reg = MetricsRegistry::new().with_source(|s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>| {
            gauge(
                e,
                "test_extra",
                "An extension source.",
                Some(&Unit::Joules),
                s.snapshot.state.totals.processes as u64 * 10,
            )
        });
        let p = parse(&reg.encode(&Arc::new(sample_snapshot()), ExpositionFormat::OpenMetrics).unwrap());
        assert_eq!(value(&p, "gpu_tracer_test_extra_joules", &[]), 30.0);
        assert!(p.families.contains_key("gpu_tracer_cgroup_vidmem_bytes"));
    }

    #[test]
    fn hostile_cgroup_paths_are_escaped() {
        let mut snap = sample_snapshot();
        snap.state.cgroups[0].path = Some("/a\"} evil{x=\"1\\\nnext".into());
        let p = parse(&MetricsRegistry::new().encode(&Arc::new(snap), ExpositionFormat::OpenMetrics).unwrap());
        assert_eq!(
            value(&p, "gpu_tracer_cgroup_vidmem_bytes", &container("/a\"} evil{x=\"1\\\nnext")),
            (3u64 << 30) as f64
        );
    }

    #[test]
    fn an_empty_snapshot_still_parses() {
        let mut snap = sample_snapshot();
        snap.state = Snapshot::default();
        snap.cuda = CudaSnapshot::default();
        snap.kernel = KernelCounters::default();
        let p = parse(&MetricsRegistry::new().encode(&Arc::new(snap), ExpositionFormat::OpenMetrics).unwrap());
        assert!(!p.families.contains_key("gpu_tracer_cgroup_vidmem_bytes"));
        assert_eq!(value(&p, "gpu_tracer_processes", &[]), 0.0);
    }

    #[test]
    fn negotiation_prefers_openmetrics_when_asked() {
        let prom = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(ExpositionFormat::negotiate(Some(prom)), ExpositionFormat::OpenMetrics);
        assert_eq!(ExpositionFormat::negotiate(Some("*/*")), ExpositionFormat::Prometheus);
        assert_eq!(ExpositionFormat::negotiate(None), ExpositionFormat::Prometheus);
    }
}
