//! Prometheus / OpenMetrics exposition of an [`AgentSnapshot`] (`/metrics`).
//!
//! Series are built at scrape time from the latest immutable snapshot (prometheus-client's
//! `Collector`, the dcgm-exporter / kube-state-metrics shape): nothing is kept between scrapes, so
//! a container that went away has no stale series.
//!
//! The exposition is a list of [`MetricSource`]s, each one function that writes some metric
//! families from a [`Scrape`]. [`MetricsRegistry::new`] holds the built-in ones ([`BUILTIN`]);
//! more are added with [`MetricsRegistry::with_source`]. A source reads either a field of the
//! snapshot or data it owns (e.g. its own `Arc` to another snapshot). The attribution families
//! split each GPU into `line`s (containers and named remainders) so that `sum by (gpu)` is the
//! device total, never a double count.
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

use crate::{
    attribution::{
        SharingMode,
        attributor::suggests_smaller,
        gpu::{ComputeMethod, FULL},
        rightsizing::Fit,
    },
    cuda::ledger::CudaUsage,
    guardrails::ViolationKind,
    model::AgentSnapshot,
    state::snapshot::Usage,
};

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
    /// The labels of a cgroup row: the snapshot's own container identity when it names the pod
    /// (namespace, pod and container), else the resolver's.
    pub fn container(&self, cgroup_id: u64, path: Option<&str>) -> ContainerLabels {
        if let Some(id) = self.snapshot.containers.get(&cgroup_id)
            && let (Some(namespace), Some(pod), Some(container)) = (&id.namespace, &id.pod, &id.container)
        {
            let cgroup = ContainerLabels::for_cgroup(cgroup_id, path.or(id.cgroup_path.as_deref())).cgroup;
            return ContainerLabels {
                namespace: namespace.clone(),
                pod: pod.clone(),
                container: container.clone(),
                cgroup,
            };
        }
        self.resolver.labels(cgroup_id, path)
    }

    /// The labels of a cgroup known only by id (attribution lines): its path comes from the
    /// snapshot's identity, else from the state's cgroup rows.
    pub fn container_by_id(&self, cgroup_id: u64) -> ContainerLabels {
        let path = self.snapshot.containers.get(&cgroup_id).and_then(|i| i.cgroup_path.as_deref()).or_else(|| {
            self.snapshot.state.cgroups.iter().find(|c| c.cgroup_id == cgroup_id).and_then(|c| c.path.as_deref())
        });
        self.container(cgroup_id, path)
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
    ("attribution_lines", attribution_lines),
    ("container_totals", container_totals),
    ("bill", bill),
    ("nvml_devices", nvml_devices),
    ("violations", violations),
    ("kubernetes", kubernetes),
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
        attach_mode: s.snapshot.attach_mode.as_str().to_owned(),
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

// ---- attribution, NVML, guardrails and Kubernetes ----

/// Labels of a GPU in the attribution and NVML families: `gpu` is the `GPU-…` or `MIG-…` UUID,
/// `device` dcgm-exporter's `nvidiaN` (empty when the minor is unknown), `mig_profile` the MIG
/// profile of a MIG instance (empty for a whole GPU).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, EncodeLabelSet)]
pub struct GpuIdLabels {
    /// `GPU-…` or `MIG-…` UUID.
    pub gpu: String,
    /// `nvidiaN` (the physical GPU's `/dev/nvidiaN`), or empty.
    pub device: String,
    /// e.g. `3g.71gb`; empty off MIG.
    pub mig_profile: String,
}

impl GpuIdLabels {
    fn new(uuid: &str, minor: Option<u32>, mig_profile: Option<&str>) -> Self {
        GpuIdLabels {
            gpu: uuid.to_owned(),
            device: minor.map(|m| format!("nvidia{m}")).unwrap_or_default(),
            mig_profile: mig_profile.unwrap_or_default().to_owned(),
        }
    }
}

impl EncodeLabelSet for &GpuIdLabels {
    fn encode(&self, encoder: &mut prometheus_client::encoding::LabelSetEncoder) -> fmt::Result {
        (**self).encode(encoder)
    }
}

/// One line of a GPU's split: `line` is `container` (with the container labels) or a named
/// remainder (`driver_reserved`, `unattributed`, `free`, `idle`) with empty container labels, so
/// `sum by (gpu)` over a family is the device total.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, EncodeLabelSet)]
struct GpuLineLabels {
    #[prometheus(flatten)]
    gpu: GpuIdLabels,
    line: &'static str,
    #[prometheus(flatten)]
    container: ContainerLabels,
}

impl EncodeLabelSet for &GpuLineLabels {
    fn encode(&self, encoder: &mut prometheus_client::encoding::LabelSetEncoder) -> fmt::Result {
        (**self).encode(encoder)
    }
}

/// Per GPU, a sharing mode and compute method (info-style, value 1).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, EncodeLabelSet)]
struct SharingLabels {
    #[prometheus(flatten)]
    gpu: GpuIdLabels,
    mode: &'static str,
    method: &'static str,
}

fn sharing_mode_label(m: SharingMode) -> &'static str {
    match m {
        SharingMode::Exclusive => "exclusive",
        SharingMode::TimeSlicing => "time_slicing",
        SharingMode::Mps => "mps",
        SharingMode::Mig => "mig",
        SharingMode::Unknown => "unknown",
    }
}

fn compute_method_label(m: ComputeMethod) -> &'static str {
    match m {
        ComputeMethod::ProcessSamples => "process_samples",
        ComputeMethod::LaunchCounts => "launch_counts",
        ComputeMethod::None => "none",
    }
}

/// Millipercent (100 % = 100 000) as a ratio 0..1.
fn ratio_of_millipct(v: u64) -> f64 {
    v as f64 / FULL as f64
}

/// Nano-currency as currency units.
fn currency(nano: u64) -> f64 {
    nano as f64 / 1e9
}

/// Millijoules as joules.
fn joules(mj: u64) -> f64 {
    mj as f64 / 1e3
}

fn ratio_unit() -> Unit {
    Unit::Other("ratio".into())
}

/// The latest interval's attribution: per GPU, memory, SM share, energy and cost split into lines
/// that add up to the device (and to the interval's price), the sharing mode, and each container's
/// launches. Nothing when attribution has not run.
pub fn attribution_lines(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
    let Some(a) = s.snapshot.attribution.as_deref() else {
        return Ok(());
    };
    type Lines = BTreeMap<GpuLineLabels, u64>;
    let (mut memory, mut sm, mut energy, mut cost, mut launches) =
        (Lines::new(), Lines::new(), Lines::new(), Lines::new(), Lines::new());
    let mut totals: BTreeMap<GpuIdLabels, u64> = BTreeMap::new();
    let mut sharing: BTreeMap<SharingLabels, u64> = BTreeMap::new();
    let add = |m: &mut Lines, gpu: &GpuIdLabels, line: &'static str, c: Option<&ContainerLabels>, v: u64| {
        let k = GpuLineLabels { gpu: gpu.clone(), line, container: c.cloned().unwrap_or_default() };
        let slot = m.entry(k).or_default();
        *slot = slot.saturating_add(v);
    };
    for g in &a.gpus {
        let id = GpuIdLabels::new(&g.uuid, g.minor, g.mig_profile.as_deref());
        sharing.insert(
            SharingLabels {
                gpu: id.clone(),
                mode: sharing_mode_label(g.sharing),
                method: compute_method_label(g.compute.method),
            },
            1,
        );
        for c in &g.containers {
            let labels = s.container_by_id(c.container.0);
            let l = Some(&labels);
            add(&mut sm, &id, "container", l, c.sm_millipct as u64);
            add(&mut launches, &id, "container", l, c.launches);
            if g.memory.is_some() {
                add(&mut memory, &id, "container", l, c.memory_bytes);
            }
            if let Some(mj) = c.energy_mj {
                add(&mut energy, &id, "container", l, mj);
            }
            if let Some(n) = c.cost_nano {
                add(&mut cost, &id, "container", l, n);
            }
        }
        if let Some(m) = &g.memory {
            add(&mut memory, &id, "driver_reserved", None, m.driver_reserved);
            add(&mut memory, &id, "unattributed", None, m.unattributed);
            add(&mut memory, &id, "free", None, m.free);
            let t = totals.entry(id.clone()).or_default();
            *t = t.saturating_add(m.total);
        }
        add(&mut sm, &id, "unattributed", None, g.compute.unattributed as u64);
        add(&mut sm, &id, "idle", None, g.compute.idle as u64);
        if let Some(en) = &g.energy {
            add(&mut energy, &id, "unattributed", None, en.unattributed);
            add(&mut energy, &id, "idle", None, en.idle);
        }
        if let Some(k) = &g.cost {
            add(&mut cost, &id, "driver_reserved", None, k.driver_reserved);
            add(&mut cost, &id, "unattributed", None, k.unattributed);
            add(&mut cost, &id, "idle", None, k.idle);
        }
    }
    gauge_family(
        e,
        "gpu_sharing_info",
        "How each GPU is shared (mode) and how its SM time was split (method); value 1.",
        None,
        sharing,
    )?;
    gauge_family(
        e,
        "attribution_memory",
        "GPU memory by line: container lines + driver_reserved + unattributed + free = the GPU's total.",
        Some(&Unit::Bytes),
        memory.iter().map(|(l, v)| (l, *v)),
    )?;
    gauge_family(
        e,
        "attribution_memory_total",
        "GPU memory total the attribution lines add up to.",
        Some(&Unit::Bytes),
        totals.iter().map(|(l, v)| (l, *v)),
    )?;
    gauge_family(
        e,
        "attribution_sm_share",
        "Share of the interval's SM time by line (container, unattributed, idle); sums to 1 per GPU.",
        Some(&ratio_unit()),
        sm.iter().map(|(l, v)| (l, ratio_of_millipct(*v))),
    )?;
    gauge_family(
        e,
        "attribution_interval_energy",
        "GPU energy of the latest interval by line (container, unattributed, idle).",
        Some(&Unit::Joules),
        energy.iter().map(|(l, v)| (l, joules(*v))),
    )?;
    gauge_family(
        e,
        "attribution_interval_cost",
        "The GPU's price for the latest interval by line, in the price's currency.",
        None,
        cost.iter().map(|(l, v)| (l, currency(*v))),
    )?;
    gauge_family(
        e,
        "attribution_interval_launches",
        "Kernel launches per container and GPU in the latest interval.",
        None,
        launches.iter().map(|(l, v)| (l, *v)),
    )?;
    gauge(
        e,
        "attribution_interval",
        "Length of the latest attribution interval.",
        Some(&Unit::Seconds),
        a.interval_ns as f64 / 1e9,
    )?;
    if let Some(p) = a.price_per_gpu_hour {
        gauge(e, "price_per_gpu_hour", "The price of one GPU for one hour, as applied to cost.", None, p)?;
    }
    Ok(())
}

/// Labels of a container's rightsizing suggestion.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, EncodeLabelSet)]
struct RightsizingLabels {
    #[prometheus(flatten)]
    container: ContainerLabels,
    /// `mig_profile`, `fraction` or `whole_gpu`.
    fit: &'static str,
    /// The MIG profile, `NN%` of the GPU, or `whole`.
    suggested: String,
    /// The fit is smaller than what it asked for (or than a GPU, with no request).
    smaller: &'static str,
}

/// Per container across GPUs: cumulative energy and cost, idle reservations and rightsizing.
pub fn container_totals(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
    let Some(a) = s.snapshot.attribution.as_deref() else {
        return Ok(());
    };
    #[derive(Default)]
    struct Acc {
        energy_mj: u64,
        cost_nano: u64,
        has_cost: bool,
        idle_bytes: Option<u64>,
        idle_since_ns: u64,
    }
    let mut acc: BTreeMap<ContainerLabels, Acc> = BTreeMap::new();
    let mut rightsizing: BTreeMap<RightsizingLabels, u64> = BTreeMap::new();
    // (container, stat) -> (memory bytes, SM millipercent).
    let mut peaks: BTreeMap<(ContainerLabels, &'static str), (u64, u64)> = BTreeMap::new();
    for c in &a.containers {
        let labels = s.container_by_id(c.container.0);
        let x = acc.entry(labels.clone()).or_default();
        x.energy_mj = x.energy_mj.saturating_add(c.cumulative_energy_mj);
        x.cost_nano = x.cost_nano.saturating_add(c.cumulative_cost_nano);
        x.has_cost |= a.price_per_gpu_hour.is_some() || c.cumulative_cost_nano > 0;
        if let Some(r) = &c.idle_reservation {
            x.idle_bytes = Some(x.idle_bytes.unwrap_or(0).saturating_add(r.held_bytes));
            x.idle_since_ns = if x.idle_since_ns == 0 { r.since_unix_ns } else { x.idle_since_ns.min(r.since_unix_ns) };
        }
        if let Some(r) = &c.rightsizing {
            let (fit, suggested) = match &r.fit {
                Fit::MigProfile { profile } => ("mig_profile", profile.clone()),
                Fit::Fraction { pct } => ("fraction", format!("{pct}%")),
                Fit::WholeGpu => ("whole_gpu", "whole".to_owned()),
            };
            let smaller = if suggests_smaller(r) { "true" } else { "false" };
            rightsizing.insert(RightsizingLabels { container: labels.clone(), fit, suggested, smaller }, 1);
            for (stat, mem, sm) in
                [("peak", r.peak_memory_bytes, r.peak_sm_millipct), ("p95", r.p95_memory_bytes, r.p95_sm_millipct)]
            {
                let p = peaks.entry((labels.clone(), stat)).or_default();
                p.0 = p.0.max(mem);
                p.1 = p.1.max(sm as u64);
            }
        }
    }
    counter_family(
        e,
        "container_energy",
        "GPU energy attributed to the container since it first appeared (its share of each GPU's energy).",
        Some(&Unit::Joules),
        acc.iter().map(|(l, x)| (l, joules(x.energy_mj))),
    )?;
    counter_family(
        e,
        "container_cost",
        "Cost attributed to the container since it first appeared, in the price's currency.",
        None,
        acc.iter().filter(|(_, x)| x.has_cost).map(|(l, x)| (l, currency(x.cost_nano))),
    )?;
    gauge_family(
        e,
        "container_idle_reservation",
        "GPU memory held by a container that has run nothing for the configured time (only flagged containers).",
        Some(&Unit::Bytes),
        acc.iter().filter_map(|(l, x)| Some((l, x.idle_bytes?))),
    )?;
    gauge_family(
        e,
        "container_idle_reservation_since_timestamp",
        "When a flagged container's idle reservation started (Unix time).",
        Some(&Unit::Seconds),
        acc.iter().filter(|(_, x)| x.idle_bytes.is_some()).map(|(l, x)| (l, x.idle_since_ns as f64 / 1e9)),
    )?;
    gauge_family(
        e,
        "container_rightsizing_info",
        "What would fit the container's peak use with headroom (fit, suggested), and whether it is smaller; value 1.",
        None,
        rightsizing,
    )?;
    gauge_family(
        e,
        "container_rightsizing_memory",
        "Peak and p95 of the container's GPU memory over the rightsizing window, by stat.",
        Some(&Unit::Bytes),
        peaks.iter().map(|(l, (m, _))| ((&l.0, [("stat", l.1)]), *m)),
    )?;
    gauge_family(
        e,
        "container_rightsizing_sm_share",
        "Peak and p95 of the container's SM share (of one GPU) over the rightsizing window, by stat.",
        Some(&ratio_unit()),
        peaks.iter().map(|(l, (_, sm))| ((&l.0, [("stat", l.1)]), ratio_of_millipct(*sm))),
    )
}

/// The bill so far by line; the lines add up to the bill exactly.
pub fn bill(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
    let Some(a) = s.snapshot.attribution.as_deref() else {
        return Ok(());
    };
    if a.price_per_gpu_hour.is_none() && a.bill.total == 0 {
        return Ok(());
    }
    let b = a.bill;
    let containers = a.containers.iter().fold(0u64, |t, c| t.saturating_add(c.cumulative_cost_nano));
    let lines = [
        ("containers", containers),
        ("evicted", b.evicted),
        ("idle", b.idle),
        ("driver_reserved", b.driver_reserved),
        ("unattributed", b.unattributed),
    ];
    counter_family(
        e,
        "bill",
        "The bill so far by line, in the price's currency; the lines add up to the GPUs' price.",
        None,
        lines.map(|(line, v)| ([("line", line)], currency(v))),
    )
}

/// Labels of `gpu_tracer_gpu_info`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct GpuInfoLabels {
    #[prometheus(flatten)]
    gpu: GpuIdLabels,
    /// NVML index (dcgm-exporter's `gpu` label).
    index: String,
    model: String,
    pci_bus_id: String,
}

/// NVML's device readings (dcgm-exporter's device metrics with the same meaning) and whether
/// NVML is in use.
pub fn nvml_devices(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
    let n = &s.snapshot.nvml;
    gauge(
        e,
        "nvml_up",
        "1 when NVML is loaded and sampled, else 0 (off or unavailable).",
        None,
        u64::from(n.status == crate::model::NvmlStatus::Ready),
    )?;
    counter(e, "nvml_samples", "NVML samples taken.", None, n.samples)?;
    counter_family(
        e,
        "nvml_failed_readings",
        "NVML readings refused, by reason (not_supported: the GPU lacks the feature).",
        None,
        n.failed_readings.iter().map(|(k, v)| ([("reason", *k)], *v)),
    )?;
    let Some(sample) = n.sample.as_deref() else {
        return Ok(());
    };
    let devices = &sample.devices;
    let id = |d: &crate::nvml::model::DeviceSample| GpuIdLabels::new(&d.uuid, d.minor, None);
    gauge_family(
        e,
        "gpu_info",
        "Each GPU NVML sees: UUID, /dev/nvidiaN, NVML index, model and PCI bus id; value 1.",
        None,
        devices.iter().map(|d| {
            let l = GpuInfoLabels {
                gpu: id(d),
                index: d.index.to_string(),
                model: d.name.clone().unwrap_or_default(),
                pci_bus_id: d.pci_bus_id.clone().unwrap_or_default(),
            };
            (l, 1u64)
        }),
    )?;
    gauge_family(
        e,
        "gpu_lost",
        "1 when NVML says the GPU fell off the bus (its other readings are then absent).",
        None,
        devices.iter().map(|d| (id(d), u64::from(d.lost))),
    )?;
    let each = |f: &dyn Fn(&crate::nvml::model::DeviceSample) -> Option<f64>| -> Vec<(GpuIdLabels, f64)> {
        devices.iter().filter_map(|d| Some((id(d), f(d)?))).collect()
    };
    gauge_family(
        e,
        "gpu_power",
        "Power draw (DCGM_FI_DEV_POWER_USAGE).",
        Some(&Unit::Other("watts".into())),
        each(&|d| Some(d.power_mw? as f64 / 1e3)),
    )?;
    counter_family(
        e,
        "gpu_energy",
        "Energy used since the driver loaded (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, which is in mJ).",
        Some(&Unit::Joules),
        each(&|d| Some(joules(d.energy_mj?))),
    )?;
    gauge_family(
        e,
        "gpu_temperature",
        "GPU temperature (DCGM_FI_DEV_GPU_TEMP).",
        Some(&Unit::Celsius),
        each(&|d| Some(d.temperature_c? as f64)),
    )?;
    gauge_family(
        e,
        "gpu_utilization",
        "Time at least one kernel ran, 0..1 (DCGM_FI_DEV_GPU_UTIL, which is in percent).",
        Some(&ratio_unit()),
        each(&|d| Some(d.utilization?.gpu_pct as f64 / 100.0)),
    )?;
    gauge_family(
        e,
        "gpu_memory_utilization",
        "Time device memory was read or written, 0..1 (DCGM_FI_DEV_MEM_COPY_UTIL, in percent).",
        Some(&ratio_unit()),
        each(&|d| Some(d.utilization?.memory_pct as f64 / 100.0)),
    )?;
    let hz = Some(Unit::Other("hertz".into()));
    gauge_family(
        e,
        "gpu_sm_clock",
        "SM clock (DCGM_FI_DEV_SM_CLOCK, which is in MHz).",
        hz.as_ref(),
        each(&|d| Some(d.clocks.sm_mhz? as f64 * 1e6)),
    )?;
    gauge_family(
        e,
        "gpu_memory_clock",
        "Memory clock (DCGM_FI_DEV_MEM_CLOCK, which is in MHz).",
        hz.as_ref(),
        each(&|d| Some(d.clocks.memory_mhz? as f64 * 1e6)),
    )?;
    // Memory of GPUs and of MIG instances (the instance's own memory, under its MIG UUID).
    let mut mem: BTreeMap<GpuIdLabels, crate::nvml::model::MemoryInfo> = BTreeMap::new();
    for d in devices {
        if let Some(m) = d.memory {
            mem.insert(id(d), m);
        }
        for m in &d.mig_instances {
            if let Some(mi) = m.memory {
                let profile = m.name.as_deref().and_then(crate::attribution::input::mig_profile_of);
                mem.insert(GpuIdLabels::new(&m.uuid, d.minor, Some(profile.as_deref().unwrap_or("unknown"))), mi);
            }
        }
    }
    let bytes = Some(&Unit::Bytes);
    let m = |e: &mut DescriptorEncoder<'_>, name, help, f: fn(&crate::nvml::model::MemoryInfo) -> u64| {
        gauge_family(e, name, help, bytes, mem.iter().map(|(l, m)| (l, f(m))))
    };
    m(
        e,
        "gpu_memory_used",
        "Device memory in use, not counting driver-reserved (DCGM_FI_DEV_FB_USED, in MiB).",
        |m| m.used.saturating_sub(m.reserved),
    )?;
    m(e, "gpu_memory_reserved", "Device memory the driver reserves (DCGM_FI_DEV_FB_RESERVED, in MiB).", |m| {
        m.reserved
    })?;
    m(e, "gpu_memory_free", "Free device memory (DCGM_FI_DEV_FB_FREE, in MiB).", |m| m.free)?;
    m(e, "gpu_memory_total", "Device memory: used + reserved + free (DCGM_FI_DEV_FB_TOTAL, in MiB).", |m| m.total)
}

/// Labels of one violation series.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, EncodeLabelSet)]
struct ViolationLabels {
    kind: &'static str,
    namespace: String,
    pod: String,
    container: String,
    /// The MIG device, else the physical GPU's UUID, else `minor:N`; empty for all GPUs.
    gpu: String,
}

/// Guardrail violations: counts per kind (every kind, also at 0), uses that could not be checked,
/// and one series per violation raised.
pub fn violations(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
    let c = &s.snapshot.violation_counts;
    counter_family(
        e,
        "violations",
        "GPU uses outside the container's allocation raised so far, by kind (each once per container, GPU and kind).",
        None,
        ViolationKind::ALL.map(|k| ([("kind", k.as_str())], c.get(k))),
    )?;
    counter(
        e,
        "violations_unresolved",
        "GPU uses that could not be checked (the GPU or an allocation could not be tied to a physical GPU).",
        None,
        c.unresolved,
    )?;
    let rows: BTreeMap<ViolationLabels, u64> = s
        .snapshot
        .violations
        .iter()
        .map(|v| {
            let gpu = v.gpu.as_ref().map_or_else(String::new, |g| match (&g.mig_uuid, &g.uuid, g.minor) {
                (Some(m), _, _) => m.clone(),
                (None, Some(u), _) => u.clone(),
                (None, None, Some(m)) => format!("minor:{m}"),
                (None, None, None) => String::new(),
            });
            let l = ViolationLabels {
                kind: v.kind.as_str(),
                namespace: v.namespace.clone(),
                pod: v.pod.clone(),
                container: v.container.clone(),
                gpu,
            };
            (l, 1)
        })
        .collect();
    gauge_family(e, "violation_info", "One series per violation raised (kind, pod, GPU); value 1.", None, rows)
}

/// Whether the Kubernetes sides (pod watcher, kubelet pod-resources) work.
pub fn kubernetes(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
    let k = &s.snapshot.kubernetes;
    let watcher_up = k.watcher.as_ref().is_some_and(|w| w.connected && w.ready);
    gauge(
        e,
        "kubernetes_up",
        "1 when the pod watcher is connected and has listed the node's pods, else 0 (also when off).",
        None,
        u64::from(watcher_up),
    )?;
    let pr_up = k.pod_resources.as_ref().is_some_and(|p| p.available);
    gauge(
        e,
        "pod_resources_up",
        "1 when the last kubelet pod-resources refresh succeeded, else 0 (also when off).",
        None,
        u64::from(pr_up),
    )?;
    if let Some(w) = &k.watcher {
        gauge(e, "kubernetes_pods_cached", "Pods of this node in the watcher's cache.", None, w.pods_cached as u64)?;
        counter(e, "kubernetes_watch_errors", "Errors the pod watcher met (list, watch, reconnect).", None, w.errors)?;
        counter(e, "kubernetes_relists", "Complete pod lists after the first one.", None, w.relists)?;
    }
    if let Some(p) = &k.pod_resources {
        counter(e, "pod_resources_refreshes", "Successful kubelet pod-resources refreshes.", None, p.refreshes)?;
        counter(e, "pod_resources_failures", "Failed kubelet pod-resources refreshes.", None, p.failures)?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;

    use openmetrics_parser::{MetricFamily, MetricsExposition, OpenMetricsType, OpenMetricsValue};

    use super::*;
    use crate::{
        allocation::source::AllocationStatus,
        attribution::{
            AttributionInput, AttributionSnapshot, Attributor, ContainerInput, ContainerKey, GpuInput, ProcessInput,
            input::{EnergyInput, EnergySource},
        },
        config::AttachMode,
        config::AttributionSettings,
        cuda::ledger::{CudaCgroupRow, CudaSnapshot},
        guardrails::{GpuRef, Violation, ViolationCounts, ViolationKind},
        identity::{ContainerIdentity, KubeStatus},
        model::{Accounting, KubeView, KubernetesStatus, NvmlStatus, NvmlView, PipelineStats},
        nvml::model::{Clocks, DeviceSample, MemoryInfo, MigInstance, NvmlSample, Utilization},
        probe::ProbeMode,
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
            attach_mode: ProbeMode::Attached(AttachMode::SyscallTracepoint),
            driver_version: "570.86.15".into(),
            attribution: Some(Arc::new(sample_attribution())),
            containers: [(
                12,
                ContainerIdentity {
                    cgroup_id: 12,
                    cgroup_path: Some(POD_B.into()),
                    kind: "container",
                    namespace: Some("team-b".into()),
                    pod: Some("serve-1".into()),
                    container: Some("server".into()),
                    ..Default::default()
                },
            )]
            .into_iter()
            .collect(),
            violations: vec![
                violation(ViolationKind::UnallocatedGpuOpen, Some(GPU_A)),
                violation(ViolationKind::GpuUseWithoutAllocation, None),
            ],
            violation_counts: ViolationCounts {
                unallocated_gpu_open: 1,
                gpu_use_without_allocation: 1,
                unresolved: 2,
                ..Default::default()
            },
            nvml: NvmlView {
                status: NvmlStatus::Ready,
                failed_readings: [("not_supported", 3)].into_iter().collect(),
                samples: 7,
                sample: Some(Arc::new(sample_nvml())),
                ..Default::default()
            },
            kubernetes: KubeView {
                status: KubernetesStatus::Running,
                watcher: Some(KubeStatus { connected: true, ready: true, pods_cached: 4, ..Default::default() }),
                pod_resources: Some(AllocationStatus { available: true, refreshes: 5, ..Default::default() }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    const GPU_A: &str = "GPU-aaaaaaaa-1111-2222-3333-444444444444";
    const GPU_PARENT: &str = "GPU-cccccccc-1111-2222-3333-444444444444";
    const MIG_B: &str = "MIG-bbbbbbbb-1111-2222-3333-444444444444";

    fn proc(pid: u32, container: Option<u64>, used: u64, sm: Option<f64>) -> ProcessInput {
        ProcessInput {
            pid,
            container: container.map(ContainerKey),
            nvml_used_bytes: Some(used),
            nvml_sm_pct: sm,
            ..Default::default()
        }
    }

    /// One interval of a real attribution: a time-sliced GPU (containers 11 and 12 and a host
    /// process; 12 holds memory and runs nothing) and a MIG instance used by 11, priced.
    fn sample_attribution() -> AttributionSnapshot {
        let whole = GpuInput {
            uuid: GPU_A.into(),
            index: Some(0),
            minor: Some(0),
            name: Some("NVIDIA H100 80GB HBM3".into()),
            share_of_gpu_ppm: 1_000_000,
            memory: Some(MemoryInfo {
                total: 80 * GIB,
                reserved: 512 * MIB,
                used: 31 * GIB,
                free: 49 * GIB - 512 * MIB,
            }),
            sm_activity_pct: Some(60),
            energy: Some(EnergyInput { delta_mj: 100_000, source: EnergySource::Counter }),
            processes: vec![
                proc(101, Some(11), 20 * GIB, Some(50.0)),
                proc(102, Some(12), 10 * GIB, Some(0.0)),
                proc(200, None, GIB, Some(5.0)),
            ],
            launches: [(ContainerKey(11), 500)].into_iter().collect(),
            ..Default::default()
        };
        let mig = GpuInput {
            uuid: MIG_B.into(),
            parent_uuid: Some(GPU_PARENT.into()),
            index: Some(1),
            minor: Some(1),
            mig_profile: Some("3g.40gb".into()),
            share_of_gpu_ppm: 428_571,
            memory: Some(MemoryInfo { total: 40 * GIB, reserved: 0, used: 5 * GIB, free: 35 * GIB }),
            energy: Some(EnergyInput { delta_mj: 20_000, source: EnergySource::ParentShare }),
            processes: vec![proc(103, Some(11), 5 * GIB, None)],
            launches: [(ContainerKey(11), 100)].into_iter().collect(),
            ..Default::default()
        };
        let containers = [(11, "ml/trainer-0/main"), (12, "team-b/serve-1/server")]
            .into_iter()
            .map(|(k, n)| (ContainerKey(k), ContainerInput { name: Some(n.into()), request: None }))
            .collect();
        let input = AttributionInput {
            start_unix_ns: 1_700_000_000_000_000_000,
            interval_ns: 1_000_000_000,
            gpus: vec![whole, mig],
            containers,
        };
        let settings =
            AttributionSettings { price_per_gpu_hour: Some(3.6), idle_reservation_after_s: 0, ..Default::default() };
        Attributor::new(&settings).update(&input)
    }

    fn sample_nvml() -> NvmlSample {
        let gpu = DeviceSample {
            index: 0,
            uuid: GPU_A.into(),
            name: Some("NVIDIA H100 80GB HBM3".into()),
            minor: Some(0),
            memory: Some(MemoryInfo { total: 80 * GIB, reserved: 512 * MIB, used: 31 * GIB, free: 49 * GIB }),
            utilization: Some(Utilization { gpu_pct: 60, memory_pct: 25 }),
            power_mw: Some(250_500),
            energy_mj: Some(123_456_789),
            clocks: Clocks { sm_mhz: Some(1980), memory_mhz: Some(2619), ..Default::default() },
            temperature_c: Some(55),
            ..Default::default()
        };
        let parent = DeviceSample {
            index: 1,
            uuid: GPU_PARENT.into(),
            minor: Some(1),
            mig_enabled: Some(true),
            mig_instances: vec![MigInstance {
                uuid: MIG_B.into(),
                name: Some("NVIDIA H100 80GB HBM3 MIG 3g.40gb".into()),
                memory: Some(MemoryInfo { total: 40 * GIB, reserved: 0, used: 5 * GIB, free: 35 * GIB }),
                ..Default::default()
            }],
            ..Default::default()
        };
        NvmlSample { devices: vec![gpu, parent], ..Default::default() }
    }

    fn violation(kind: ViolationKind, gpu: Option<&str>) -> Violation {
        Violation {
            kind,
            namespace: "team-c".into(),
            pod: "sidecar-0".into(),
            container: "borrower".into(),
            pid: 300,
            gpu: gpu.map(|u| GpuRef { uuid: Some(u.into()), minor: Some(0), index: Some(0), mig_uuid: None }),
            evidence: Default::default(),
        }
    }

    /// Every series of a family as (labels, value).
    fn samples(p: &Parsed, name: &str) -> Vec<(HashMap<String, String>, f64)> {
        family(p, name)
            .iter_samples()
            .map(|s| {
                let ls = s.get_labelset().expect("labelset");
                let labels = ls.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
                let v = match &s.value {
                    OpenMetricsValue::Gauge(n) | OpenMetricsValue::Unknown(n) => n.as_f64(),
                    OpenMetricsValue::Counter(c) => c.value.as_f64(),
                    other => panic!("unexpected value {other:?}"),
                };
                (labels, v)
            })
            .collect()
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
        // Cgroup 12 has a Kubernetes identity in the snapshot: its series carry it.
        let b = [("namespace", "team-b"), ("pod", "serve-1"), ("container", "server"), ("cgroup", POD_B)];
        assert_eq!(value(&p, "gpu_tracer_cgroup_managed_bytes", &b), (64u64 << 20) as f64);
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
                    ("attach_mode", "syscall-tracepoint")
                ]
            ),
            1.0
        );
        // Every cgroup and every GPU row is exposed, nothing else.
        assert_eq!(family(&p, "gpu_tracer_cgroup_vidmem_bytes").iter_samples().count(), 3);
        assert_eq!(family(&p, "gpu_tracer_gpu_vidmem_bytes").iter_samples().count(), 3);
    }

    /// The labels of a line of GPU `gpu` (`device`, `mig_profile`) and container `c`.
    fn line<'a>(gpu: [&'a str; 3], line: &'a str, c: [(&'static str, &'a str); 4]) -> Vec<(&'static str, &'a str)> {
        let mut v = vec![("gpu", gpu[0]), ("device", gpu[1]), ("mig_profile", gpu[2]), ("line", line)];
        v.extend(c);
        v
    }

    #[test]
    fn attribution_lines_add_up_and_carry_identity() {
        let text = MetricsRegistry::new().encode(&Arc::new(sample_snapshot()), ExpositionFormat::OpenMetrics).unwrap();
        let p = parse(&text);
        // Per GPU, the memory lines sum to the GPU's total, and the SM shares to 1.
        let totals = samples(&p, "gpu_tracer_attribution_memory_total_bytes");
        assert_eq!(totals.len(), 2);
        let memory = samples(&p, "gpu_tracer_attribution_memory_bytes");
        let sm = samples(&p, "gpu_tracer_attribution_sm_share_ratio");
        for (labels, total) in &totals {
            let gpu = &labels["gpu"];
            let lines: Vec<f64> = memory.iter().filter(|(l, _)| &l["gpu"] == gpu).map(|(_, v)| *v).collect();
            assert!(lines.len() >= 4, "{gpu}: {lines:?}");
            assert_eq!(lines.iter().sum::<f64>(), *total, "memory lines of {gpu}");
            let share: f64 = sm.iter().filter(|(l, _)| &l["gpu"] == gpu).map(|(_, v)| *v).sum();
            assert!((share - 1.0).abs() < 1e-9, "SM shares of {gpu} sum to {share}");
        }
        let a = [GPU_A, "nvidia0", ""];
        let mig = [MIG_B, "nvidia1", "3g.40gb"];
        assert_eq!(
            value(
                &p,
                "gpu_tracer_attribution_memory_total_bytes",
                &[("gpu", GPU_A), ("device", "nvidia0"), ("mig_profile", "")]
            ),
            (80 * GIB) as f64
        );
        // Container 12's lines carry namespace/pod/container from the snapshot's identity.
        let team_b = [("namespace", "team-b"), ("pod", "serve-1"), ("container", "server"), ("cgroup", POD_B)];
        assert_eq!(value(&p, "gpu_tracer_attribution_memory_bytes", &line(a, "container", team_b)), (10 * GIB) as f64);
        assert_eq!(value(&p, "gpu_tracer_attribution_sm_share_ratio", &line(a, "container", team_b)), 0.0);
        assert_eq!(
            value(&p, "gpu_tracer_attribution_memory_bytes", &line(a, "driver_reserved", container(""))),
            (512 * MIB) as f64
        );
        assert_eq!(
            value(&p, "gpu_tracer_attribution_memory_bytes", &line(mig, "container", container(POD_A))),
            (5 * GIB) as f64
        );
        assert_eq!(
            value(&p, "gpu_tracer_attribution_interval_launches", &line(mig, "container", container(POD_A))),
            100.0
        );
        assert_eq!(
            value(
                &p,
                "gpu_tracer_gpu_sharing_info",
                &[
                    ("gpu", GPU_A),
                    ("device", "nvidia0"),
                    ("mig_profile", ""),
                    ("mode", "time_slicing"),
                    ("method", "process_samples")
                ]
            ),
            1.0
        );
        assert_eq!(
            value(
                &p,
                "gpu_tracer_gpu_sharing_info",
                &[
                    ("gpu", MIG_B),
                    ("device", "nvidia1"),
                    ("mig_profile", "3g.40gb"),
                    ("mode", "mig"),
                    ("method", "launch_counts")
                ]
            ),
            1.0
        );
        // Energy lines add up to the GPU's delta; cost lines to the interval's price, and the bill
        // (one interval so far) to the same.
        let energy: f64 = samples(&p, "gpu_tracer_attribution_interval_energy_joules")
            .iter()
            .filter(|(l, _)| l["gpu"] == GPU_A)
            .map(|(_, v)| *v)
            .sum();
        assert!((energy - 100.0).abs() < 1e-9, "{energy}");
        let cost: f64 = samples(&p, "gpu_tracer_attribution_interval_cost").iter().map(|(_, v)| *v).sum();
        let bill: f64 = samples(&p, "gpu_tracer_bill").iter().map(|(_, v)| *v).sum();
        let price = 0.001 + 0.001 * 0.428_571;
        assert!((cost - price).abs() < 1e-9 && (bill - price).abs() < 1e-9, "cost {cost} bill {bill} price {price}");
        assert!(value(&p, "gpu_tracer_container_cost", &team_b) > 0.0);
        assert!(value(&p, "gpu_tracer_container_energy_joules", &container(POD_A)) > 0.0);
        assert_eq!(value(&p, "gpu_tracer_price_per_gpu_hour", &[]), 3.6);
        // Container 12 holds 10 GiB and ran nothing: flagged.
        assert_eq!(value(&p, "gpu_tracer_container_idle_reservation_bytes", &team_b), (10 * GIB) as f64);
        assert_eq!(family(&p, "gpu_tracer_container_idle_reservation_bytes").iter_samples().count(), 1);
        let rs = samples(&p, "gpu_tracer_container_rightsizing_info");
        assert!(
            rs.iter().any(|(l, v)| l["pod"] == "serve-1"
                && l["fit"] == "mig_profile"
                && !l["suggested"].is_empty()
                && *v == 1.0),
            "{rs:?}"
        );
    }

    #[test]
    fn nvml_violations_and_kubernetes_series() {
        let p =
            parse(&MetricsRegistry::new().encode(&Arc::new(sample_snapshot()), ExpositionFormat::OpenMetrics).unwrap());
        let gpu = [("gpu", GPU_A), ("device", "nvidia0"), ("mig_profile", "")];
        assert_eq!(value(&p, "gpu_tracer_nvml_up", &[]), 1.0);
        assert_eq!(value(&p, "gpu_tracer_nvml_failed_readings", &[("reason", "not_supported")]), 3.0);
        assert_eq!(value(&p, "gpu_tracer_gpu_power_watts", &gpu), 250.5);
        assert_eq!(value(&p, "gpu_tracer_gpu_energy_joules", &gpu), 123_456.789);
        assert_eq!(value(&p, "gpu_tracer_gpu_temperature_celsius", &gpu), 55.0);
        assert_eq!(value(&p, "gpu_tracer_gpu_utilization_ratio", &gpu), 0.6);
        assert_eq!(value(&p, "gpu_tracer_gpu_sm_clock_hertz", &gpu), 1.98e9);
        assert_eq!(value(&p, "gpu_tracer_gpu_memory_used_bytes", &gpu), (31 * GIB - 512 * MIB) as f64);
        let mig = [("gpu", MIG_B), ("device", "nvidia1"), ("mig_profile", "3g.40gb")];
        assert_eq!(value(&p, "gpu_tracer_gpu_memory_total_bytes", &mig), (40 * GIB) as f64);
        // The parent of the MIG instance reported no power: no series rather than 0.
        assert_eq!(family(&p, "gpu_tracer_gpu_power_watts").iter_samples().count(), 1);
        // Every kind, also at 0.
        for (kind, n) in [
            ("unallocated_gpu_open", 1.0),
            ("unallocated_gpu_in_nvml", 0.0),
            ("gpu_use_without_allocation", 1.0),
            ("visible_devices_all_without_request", 0.0),
        ] {
            assert_eq!(value(&p, "gpu_tracer_violations", &[("kind", kind)]), n, "{kind}");
        }
        assert_eq!(value(&p, "gpu_tracer_violations_unresolved", &[]), 2.0);
        let who = [("namespace", "team-c"), ("pod", "sidecar-0"), ("container", "borrower")];
        let mut l = vec![("kind", "unallocated_gpu_open")];
        l.extend(who);
        l.push(("gpu", GPU_A));
        assert_eq!(value(&p, "gpu_tracer_violation_info", &l), 1.0);
        assert_eq!(value(&p, "gpu_tracer_kubernetes_up", &[]), 1.0);
        assert_eq!(value(&p, "gpu_tracer_pod_resources_up", &[]), 1.0);
        // With NVML and Kubernetes off: up is 0, the rest is left out.
        let mut snap = sample_snapshot();
        snap.nvml = NvmlView { status: NvmlStatus::Off, ..Default::default() };
        snap.kubernetes = KubeView::default();
        snap.attribution = None;
        let p = parse(&MetricsRegistry::new().encode(&Arc::new(snap), ExpositionFormat::OpenMetrics).unwrap());
        assert_eq!(value(&p, "gpu_tracer_nvml_up", &[]), 0.0);
        assert_eq!(value(&p, "gpu_tracer_kubernetes_up", &[]), 0.0);
        assert!(!p.families.contains_key("gpu_tracer_gpu_power_watts"));
        assert!(!p.families.contains_key("gpu_tracer_attribution_memory_bytes"));
        assert!(!p.families.contains_key("gpu_tracer_bill"));
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
