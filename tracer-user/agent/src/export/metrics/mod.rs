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
//! Sources write typed families (`family.rs`: name, help, unit, gauge or counter, and samples as
//! label sets and values) into a [`MetricEncoder`]: for `/metrics` the text encoder, which writes
//! them through prometheus-client; for OTLP the exporter's, which makes OTLP metrics of the same
//! samples ([`MetricsRegistry::write_part`], `export::otlp::metrics`). One definition of every
//! family, and no text between the snapshot and OTLP.
//!
//! Every metric is listed in `docs/metrics.md`. Conventions: the `gpu_tracer_` prefix, base units
//! in the name (`_bytes`), counters end in `_total`, and kernel names are never labels.
//!
//! One file per family of what is exported ([`BUILTIN`] fixes the order of the exposition):
//!
//! - `probes.rs`: each probe family's state (`probe_family_up`, `probe_family_info`).
//! - `health.rs`: `build_info`, the kernel's per-probe accounting (`probe_events_*`, `records_*`,
//!   `accounting_exact`), decode errors and the user-space stages' counters.
//! - `driver.rs`: the driver ledger per cgroup (`cgroup_*` memory and ioctls) and per GPU
//!   (`gpu_vidmem`, ...), and the state stage's counters (`state_events`, `ioctls`, ...).
//! - `cuda.rs`: the CUDA ledger per cgroup (`cgroup_cuda_*`) and `cuda_calls`.
//! - `attribution.rs`: the attribution lines per GPU (`attribution_*`, `gpu_sharing_info`), the
//!   per-container totals (`container_*`) and the `bill`.
//! - `nvml.rs`: NVML's device readings (`nvml_*`, `gpu_info`, `gpu_power`, ...).
//! - `guardrails.rs`: `violations`, `violation_info`.
//! - `kubernetes.rs`: `kubernetes_*`, `pod_resources_*`, `pod_labels`.
//! - `otlp.rs`: the OTLP exporter's `otlp_exported`, `otlp_dropped` and queue.
//! - `api.rs`: the gRPC API's hub (`api_subscribers`, `api_events_published`, `api_events_lost`)
//!   and the HTTP server's refused connections (`http_connections_refused`).
//!
//! - `process.rs`: the agent's own `process_*` (CPU, memory, fds, threads), unprefixed as every
//!   client library names them; only where [`MetricsRegistry::with_process_metrics`] asks.
//!
//! `family.rs` holds the metric model and the text encoder ([`Family`], [`LabelSet`], [`Value`],
//! [`MetricEncoder`]); `labels.rs` the label sets several families share (container, GPU); this
//! file the registry ([`MetricsRegistry`], [`Scrape`], [`MetricSource`]) and the helpers every
//! source is written with ([`gauge`], [`counter`], [`gauge_family`], [`counter_family`]).
mod api;
mod attribution;
mod cuda;
mod driver;
mod family;
mod guardrails;
mod health;
mod kubernetes;
mod labels;
mod nvml;
mod otlp;
mod probes;
mod process;
#[cfg(test)]
pub(crate) mod tests;

use std::{collections::HashMap, fmt, sync::Arc};

use prometheus_client::{collector::Collector, encoding::DescriptorEncoder, registry::Registry};

use self::family::TextEncoder;
pub use self::{
    api::{api, http},
    attribution::{attribution_lines, bill, container_totals},
    cuda::{cgroup_cuda, cuda_calls},
    driver::{cgroup_memory, gpu_memory, state_counters},
    family::{Family, LabelSet, MetricEncoder, MetricKind, SampleSink, Unit, Value},
    guardrails::violations,
    health::{build_info, decode_errors, pipeline_stats, probe_accounting},
    kubernetes::{kubernetes, pod_labels},
    labels::{CgroupOnly, ContainerLabels, ContainerResolver, GpuIdLabels},
    nvml::nvml_devices,
    otlp::otlp,
    probes::probe_families,
    process::ProcessStats,
};
use tracer_core::{attribution::gpu::FULL, config::CgroupLabel, model::AgentSnapshot};

/// The prefix of every metric name.
pub const PREFIX: &str = "gpu_tracer";

/// What a [`MetricSource`] sees during one scrape.
pub struct Scrape<'a> {
    /// The latest published snapshot.
    pub snapshot: &'a AgentSnapshot,
    /// Container identity of cgroups.
    pub resolver: &'a dyn ContainerResolver,
    /// When container series carry the `cgroup` label.
    pub cgroup_label: CgroupLabel,
}

impl Scrape<'_> {
    /// The labels of a cgroup row: the snapshot's own container identity when it names the pod
    /// (namespace, pod and container), else the resolver's. The `cgroup` label is left empty on
    /// a named pod's series unless [`CgroupLabel::Always`].
    pub fn container(&self, cgroup_id: u64, path: Option<&str>) -> ContainerLabels {
        let mut labels = match self.snapshot.containers.get(&cgroup_id) {
            Some(id) if id.namespace.is_some() && id.pod.is_some() && id.container.is_some() => ContainerLabels {
                namespace: id.namespace.clone().unwrap_or_default(),
                pod: id.pod.clone().unwrap_or_default(),
                container: id.container.clone().unwrap_or_default(),
                cgroup: ContainerLabels::for_cgroup(cgroup_id, path.or(id.cgroup_path.as_deref())).cgroup,
            },
            _ => self.resolver.labels(cgroup_id, path),
        };
        if self.cgroup_label == CgroupLabel::Auto && !labels.pod.is_empty() {
            labels.cgroup.clear();
        }
        labels
    }

    /// Whether the snapshot comes from eBPF probes. Without them (`--nvml-only`), the families of
    /// the probes, the ledgers and the pipeline are left out, not exported as zeros that read as
    /// "nothing happened".
    pub fn has_probes(&self) -> bool {
        self.snapshot.attach_mode != tracer_core::model::probes::ProbeMode::NvmlOnly
    }

    /// The labels of a cgroup known only by id (attribution lines): its path comes from the
    /// snapshot's identity, else from the state's cgroup rows.
    pub(crate) fn container_by_id(&self, cgroup_id: u64) -> ContainerLabels {
        let path = self.snapshot.containers.get(&cgroup_id).and_then(|i| i.cgroup_path.as_deref()).or_else(|| {
            self.snapshot.state.cgroups.iter().find(|c| c.cgroup_id == cgroup_id).and_then(|c| c.path.as_deref())
        });
        self.container(cgroup_id, path)
    }
}

/// One part of the exposition (and of the OTLP metrics): writes some metric families from a
/// scrape into a [`MetricEncoder`], which is the text exposition for `/metrics` and OTLP metrics
/// for the OTLP exporter.
///
/// Implemented for every `Fn(&Scrape, &mut dyn MetricEncoder) -> fmt::Result`, so a new part is
/// one function, written with [`gauge`], [`counter`], [`gauge_family`] and [`counter_family`].
/// Metric names passed to those helpers omit the `gpu_tracer_` prefix, the unit and `_total`
/// (the encoders add them).
pub trait MetricSource: Send + Sync + 'static {
    /// Write this source's families. Never write a family name another source writes.
    fn encode(&self, scrape: &Scrape<'_>, encoder: &mut dyn MetricEncoder) -> fmt::Result;
}

impl<F> MetricSource for F
where
    F: Fn(&Scrape<'_>, &mut dyn MetricEncoder) -> fmt::Result + Send + Sync + 'static,
{
    fn encode(&self, scrape: &Scrape<'_>, encoder: &mut dyn MetricEncoder) -> fmt::Result {
        self(scrape, encoder)
    }
}

/// A built-in source: a name (for docs and tests) and its function.
pub type BuiltinSource = (&'static str, fn(&Scrape<'_>, &mut dyn MetricEncoder) -> fmt::Result);

/// The built-in sources, in exposition order.
pub const BUILTIN: &[BuiltinSource] = &[
    ("build_info", build_info),
    ("probe_families", probe_families),
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
    ("pod_labels", pod_labels),
    ("otlp", otlp),
    ("api", api),
    ("http", http),
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
    pub(crate) fn content_type(self) -> &'static str {
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
    /// Also the process's own `process_*` families (the agent's /metrics).
    process: bool,
    cgroup_label: CgroupLabel,
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
            process: false,
            cgroup_label: CgroupLabel::default(),
        }
    }

    /// No sources at all (for a caller that wants to choose every part).
    pub fn empty() -> Self {
        MetricsRegistry {
            sources: Vec::new(),
            resolver: Arc::new(CgroupOnly),
            process: false,
            cgroup_label: CgroupLabel::default(),
        }
    }

    #[cfg(test)]
    /// Add a source, encoded after the ones already there.
    pub(crate) fn with_source(mut self, source: impl MetricSource) -> Self {
        self.sources.push(Arc::new(source));
        self
    }

    #[cfg(test)]
    /// Use this resolver for the container labels (e.g. the Kubernetes pod index).
    pub(crate) fn with_resolver(mut self, resolver: impl ContainerResolver) -> Self {
        self.resolver = Arc::new(resolver);
        self
    }

    /// When container series carry the `cgroup` label (`metrics.cgroup_label`).
    pub fn with_cgroup_label(mut self, cgroup_label: CgroupLabel) -> Self {
        self.cgroup_label = cgroup_label;
        self
    }

    /// Also expose this process's `process_*` families (CPU, memory, fds, threads, start time),
    /// read from `/proc/self` at each scrape: the agent's own health, as every exporter has it.
    pub(crate) fn with_process_metrics(mut self) -> Self {
        self.process = true;
        self
    }

    /// Encode one snapshot in the given format.
    pub fn encode(&self, snapshot: &Arc<AgentSnapshot>, format: ExpositionFormat) -> Result<String, fmt::Error> {
        // The process families go unprefixed at the top; ours under the prefix.
        let mut registry = Registry::default();
        if self.process {
            registry.register_collector(Box::new(process::ProcessCollector));
        }
        registry.sub_registry_with_prefix(PREFIX).register_collector(Box::new(ScrapeCollector {
            snapshot: Arc::clone(snapshot),
            sources: self.sources.clone(),
            resolver: Arc::clone(&self.resolver),
            cgroup_label: self.cgroup_label,
        }));
        let mut out = String::with_capacity(16 * 1024);
        match format {
            ExpositionFormat::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &registry)?,
            ExpositionFormat::Prometheus => prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?,
        }
        Ok(out)
    }

    /// How many sources [`write_part`](Self::write_part) walks through.
    pub fn parts(&self) -> usize {
        self.sources.len()
    }

    /// Write the families of source `part` (`0..parts()`, exposition order) of one snapshot into
    /// `encoder`, with this registry's resolver and `cgroup_label` (the OTLP exporter's way to the
    /// sources: one source at a time, no text). No family spans two sources. A `part` past the end
    /// writes nothing.
    pub(crate) fn write_part(
        &self,
        part: usize,
        snapshot: &AgentSnapshot,
        encoder: &mut dyn MetricEncoder,
    ) -> fmt::Result {
        let Some(source) = self.sources.get(part) else { return Ok(()) };
        let scrape = Scrape { snapshot, resolver: &*self.resolver, cgroup_label: self.cgroup_label };
        source.encode(&scrape, encoder)
    }
}

/// One scrape's collector: owns the snapshot it encodes (prometheus-client wants `'static`).
struct ScrapeCollector {
    snapshot: Arc<AgentSnapshot>,
    sources: Vec<Arc<dyn MetricSource>>,
    resolver: Arc<dyn ContainerResolver>,
    cgroup_label: CgroupLabel,
}

impl fmt::Debug for ScrapeCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScrapeCollector").finish_non_exhaustive()
    }
}

impl Collector for ScrapeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let scrape = Scrape { snapshot: &self.snapshot, resolver: &*self.resolver, cgroup_label: self.cgroup_label };
        let mut text = TextEncoder(&mut encoder);
        for s in &self.sources {
            s.encode(&scrape, &mut text)?;
        }
        Ok(())
    }
}

// ---- helpers: one call per metric family ----

/// One unlabelled gauge.
pub fn gauge(
    e: &mut dyn MetricEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    value: impl Into<Value>,
) -> fmt::Result {
    family(e, Family { name, help, unit, kind: MetricKind::Gauge, size_hint: 1 }, [((), value)])
}

/// One unlabelled counter (`_total` is appended to the sample name).
pub fn counter(
    e: &mut dyn MetricEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    value: impl Into<Value>,
) -> fmt::Result {
    family(e, Family { name, help, unit, kind: MetricKind::Counter, size_hint: 1 }, [((), value)])
}

/// A gauge family: one series per `(labels, value)`. Label sets must be distinct. A family with no
/// rows is left out entirely (as client_golang does: some parsers reject metadata without samples).
pub fn gauge_family<L: LabelSet, V: Into<Value>>(
    e: &mut dyn MetricEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    rows: impl IntoIterator<Item = (L, V)>,
) -> fmt::Result {
    family(e, Family { name, help, unit, kind: MetricKind::Gauge, size_hint: 0 }, rows)
}

/// A counter family: one series per `(labels, value)`. Label sets must be distinct; no rows, no
/// family.
pub fn counter_family<L: LabelSet, V: Into<Value>>(
    e: &mut dyn MetricEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    rows: impl IntoIterator<Item = (L, V)>,
) -> fmt::Result {
    family(e, Family { name, help, unit, kind: MetricKind::Counter, size_hint: 0 }, rows)
}

/// One family of `rows`; none without rows.
fn family<L: LabelSet, V: Into<Value>>(
    e: &mut dyn MetricEncoder,
    mut family: Family<'_>,
    rows: impl IntoIterator<Item = (L, V)>,
) -> fmt::Result {
    let mut rows = rows.into_iter().peekable();
    if rows.peek().is_none() {
        return Ok(());
    }
    family.size_hint = rows.size_hint().0;
    e.family(&family, &mut |sample: &mut SampleSink<'_>| rows.by_ref().try_for_each(|(l, v)| sample(&l, v.into())))
}

/// Sum rows that resolve to the same labels (a removed cgroup and a new one with the same path,
/// or a resolver that maps several cgroups to one container): an exposition may not repeat a
/// label set.
fn by_container<'r, T: 'r, A: Default>(
    s: &Scrape<'_>,
    rows: impl IntoIterator<Item = &'r T>,
    key: impl Fn(&T) -> (u64, Option<&str>),
    mut add: impl FnMut(&mut A, &T),
) -> Vec<(ContainerLabels, A)> {
    // A hash index beside the rows, in first-seen order: a sorted map compared the label strings
    // ~10 times per row, a large share of a scrape at 800 cgroups.
    let mut out: Vec<(ContainerLabels, A)> = Vec::new();
    let mut index: HashMap<ContainerLabels, usize> = HashMap::new();
    for r in rows {
        let (id, path) = key(r);
        let labels = s.container(id, path);
        let i = match index.get(&labels) {
            Some(&i) => i,
            None => {
                out.push((labels.clone(), A::default()));
                index.insert(labels, out.len() - 1);
                out.len() - 1
            }
        };
        add(&mut out[i].1, r);
    }
    out
}

// ---- unit conversions shared by the sources ----

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
