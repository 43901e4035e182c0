//! The OTLP metrics of one snapshot, written directly as the protobuf bytes of export requests
//! ([`wire`](super::wire)).
//!
//! Two parts:
//!
//! - **Every `/metrics` family**, with the same meaning: each [`MetricSource`] of the registry
//!   writes its typed families ([`MetricsRegistry::write_part`], one source at a time) into this
//!   module's [`MetricEncoder`], which makes each family an OTLP metric named `gpu_tracer.` + the
//!   family name without the prefix, the unit suffix and `_total`, its first `_` made a `.`
//!   (`gpu_tracer_attribution_memory_bytes` → `gpu_tracer.attribution.memory`, unit `By`). The
//!   sources are the ones `/metrics` is encoded from, so there is one definition of every family:
//!   a family added to `/metrics` is exported over OTLP with no change here, and no text is
//!   written or parsed on the way. Labels become attributes: `namespace`, `pod`, `container`,
//!   `gpu` become `k8s.namespace.name`, `k8s.pod.name`, `k8s.container.name`, `hw.id`; the
//!   `cgroup` path becomes `container.id` and `k8s.pod.uid` (from the snapshot's identity, else
//!   parsed from the path) and is dropped, as are PIDs, command and kernel names
//!   ([`FORBIDDEN_KEYS`]); series that then coincide are summed (what `sum without (cgroup)` would
//!   give). Empty label values are left out. Counters are cumulative monotonic sums, everything
//!   else a gauge; byte counts are integers (exact), the rest doubles.
//! - **The hardware semantic conventions** from the NVML sample: `hw.gpu.memory.usage`,
//!   `hw.gpu.memory.limit`, `hw.gpu.memory.utilization`, `hw.gpu.utilization`, `hw.power`,
//!   `hw.energy`, with `hw.id` (the UUID), `hw.type=gpu`, `hw.name` and `hw.model` (the model),
//!   `hw.vendor` and `hw.driver_version`.
//!
//! [`MetricBuilder`] writes the metrics one source at a time ([`MetricBuilder::part`]) into a
//! [`RequestWriter`], which lays them out as requests of at most [`MAX_POINTS_PER_REQUEST`]
//! points; the exporter sends the full ones after each source: what one export holds at a time
//! is one source's requests, not the whole node's metrics, and a point's attributes are written
//! once, as their wire bytes (no message structs, no strings per attribute). Nothing here goes
//! through the OpenTelemetry SDK (no instruments, no aggregation state kept between exports): a
//! point is written from a source's sample and sent.
//!
//! [`MetricSource`]: crate::export::metrics::MetricSource
use std::{borrow::Cow, collections::HashSet, sync::Arc};

/// Maps keyed by the agent's own strings (no hash flooding to defend against).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

use opentelemetry_proto::tonic::{
    collector::metrics::v1::ExportMetricsServiceRequest,
    common::v1::{AnyValue, KeyValue, any_value},
    metrics::v1::{Metric, metric},
};
use prost::Message as _;

use super::wire::{Instrument, MetricHead, Num, Point, RequestWriter, put_attribute, put_bool_attribute};

use crate::export::metrics::{
    Family, LabelSet, MetricEncoder, MetricKind, MetricsRegistry, PREFIX, SampleSink, Unit, Value,
};
use tracer_core::{
    identity::{ContainerIdentity, cgroup::parse_cgroup_path},
    model::AgentSnapshot,
};

/// Attribute keys never exported on a metric (cardinality: one series per process or cgroup).
pub const FORBIDDEN_KEYS: &[&str] =
    &["cgroup", "cgroup_path", "pid", "tgid", "comm", "kernel", "kernel_name", "process.pid"];

/// Whether `key` is one of [`FORBIDDEN_KEYS`] (a `match`: this runs for every label of every sample).
fn forbidden(key: &str) -> bool {
    matches!(key, "cgroup" | "cgroup_path" | "pid" | "tgid" | "comm" | "kernel" | "kernel_name" | "process.pid")
}

/// Data points one export request carries at most (about 0.6 MiB at 8 GPUs × 100 containers);
/// a snapshot with more is sent in several requests, a metric with more split across them.
pub const MAX_POINTS_PER_REQUEST: usize = 2000;

/// The attribute the series past a metric's cardinality limit are summed under (as the
/// OpenTelemetry SDKs do).
pub const OVERFLOW_KEY: &str = "otel.metric.overflow";

/// Builds the OTLP metrics of snapshots.
#[derive(Debug)]
pub struct MetricBuilder {
    registry: MetricsRegistry,
    /// Series one metric may have at most; more are summed into one overflow series.
    max_series: usize,
    /// `start_time_unix_nano` of the cumulative sums: when export started.
    start_unix_ns: u64,
    /// Metrics that hit `max_series` (warned about once each).
    overflowed: HashSet<String>,
    series: Series,
}

impl MetricBuilder {
    /// A builder for the families of `registry`, at most `max_series` series per metric.
    /// Every row keeps its cgroup, whatever the registry's `metrics.cgroup_label`: OTLP turns it
    /// into the semantic conventions' `container.id` and `k8s.pod.uid`, never the path itself.
    pub fn new(registry: MetricsRegistry, max_series: usize) -> Self {
        MetricBuilder {
            registry: registry.with_cgroup_label(tracer_core::config::CgroupLabel::Always),
            max_series: max_series.max(2),
            start_unix_ns: unix_ns_now(),
            overflowed: HashSet::new(),
            series: Series::default(),
        }
    }

    /// How many parts [`part`](Self::part) hands out: one per `/metrics` source, then the
    /// hardware metrics.
    pub fn parts(&self) -> usize {
        self.registry.parts() + 1
    }

    /// Write the metrics of part `part` of `snapshot` to `out`, with `time_unix_ns` as their
    /// time. `ids` is [`IdentityIndex::new`] of the same snapshot (built once per export). A
    /// source that fails is left out whole (as it fails the whole of /metrics): `out` is as it
    /// was before the call.
    pub fn part(
        &mut self,
        part: usize,
        snapshot: &Arc<AgentSnapshot>,
        ids: &IdentityIndex<'_>,
        time_unix_ns: u64,
        out: &mut RequestWriter,
    ) -> std::fmt::Result {
        if part >= self.registry.parts() {
            hardware(snapshot, time_unix_ns, &mut self.series.arena, out);
            return Ok(());
        }
        let before = out.checkpoint();
        let mut encoder = OtlpEncoder {
            ids,
            start: self.start_unix_ns,
            time: time_unix_ns,
            max_series: self.max_series,
            out: &mut *out,
            overflowed: &mut self.overflowed,
            series: &mut self.series,
        };
        let written = self.registry.write_part(part, snapshot, &mut encoder);
        if written.is_err() {
            out.rollback(before);
        }
        written
    }

    /// Every part of `snapshot` written to `out`, at `time_unix_ns` (a source that fails is left
    /// out, as in /metrics); take the requests with [`RequestWriter::take_last`].
    pub fn write_all(&mut self, snapshot: &Arc<AgentSnapshot>, time_unix_ns: u64, out: &mut RequestWriter) {
        let ids = IdentityIndex::new(snapshot);
        for p in 0..self.parts() {
            let _ = self.part(p, snapshot, &ids, time_unix_ns, out);
        }
    }

    /// Every metric of `snapshot` at once, decoded from the bytes an export sends (tests and
    /// benchmarks; the exporter goes part by part).
    pub fn all(&mut self, snapshot: &Arc<AgentSnapshot>) -> Vec<Metric> {
        let mut out = RequestWriter::new(&Default::default(), &Default::default(), usize::MAX);
        self.write_all(snapshot, unix_ns_now(), &mut out);
        let mut metrics = Vec::new();
        while let Some((body, _)) = out.take_last() {
            // The writer's bytes always decode (the tests hold it to that).
            let req = ExportMetricsServiceRequest::decode(body).unwrap_or_default();
            metrics.extend(req.resource_metrics.into_iter().flat_map(|r| r.scope_metrics).flat_map(|s| s.metrics));
        }
        metrics
    }
}

/// Nanoseconds since the Unix epoch.
pub fn unix_ns_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Data points of a metric.
pub fn point_count(m: &Metric) -> usize {
    match &m.data {
        Some(metric::Data::Gauge(g)) => g.data_points.len(),
        Some(metric::Data::Sum(s)) => s.data_points.len(),
        Some(metric::Data::Histogram(h)) => h.data_points.len(),
        Some(metric::Data::ExponentialHistogram(h)) => h.data_points.len(),
        Some(metric::Data::Summary(s)) => s.data_points.len(),
        None => 0,
    }
}

// ---- the /metrics families ----

/// The OTLP name and UCUM unit of an exposition family (its name as `/metrics` has it, e.g.
/// `gpu_tracer_attribution_memory_bytes`, and its unit, e.g. `bytes`).
pub fn otel_name(family: &str, unit: &str) -> (String, &'static str) {
    let short = family.strip_prefix(PREFIX).and_then(|s| s.strip_prefix('_')).unwrap_or(family);
    let short = if unit.is_empty() { short } else { short.strip_suffix(&format!("_{unit}")).unwrap_or(short) };
    let (name, ucum_unit) = otel_metric_name(short, ucum(unit));
    (name.into_owned(), ucum_unit)
}

/// A family's OTLP name and unit, from its short name (as a [`Family`] names it:
/// `attribution_memory`) and its exposition unit's UCUM form: the row of
/// [`names::OTEL_METRICS`](super::names::OTEL_METRICS); a family without one (a test fails for
/// it) gets `gpu_tracer.` + the short name with its first `_` made a `.`, and its unit.
fn otel_metric_name(short: &str, unit: &'static str) -> (Cow<'static, str>, &'static str) {
    if let Some((name, unit)) = super::names::otel_metric(short) {
        return (Cow::Borrowed(name), unit);
    }
    let name = match short.split_once('_') {
        Some((group, rest)) => format!("{PREFIX}.{group}.{rest}"),
        None => format!("{PREFIX}.{short}"),
    };
    (Cow::Owned(name), unit)
}

/// The UCUM unit of an exposition unit.
fn ucum(unit: &str) -> &'static str {
    match unit {
        "bytes" => "By",
        "seconds" => "s",
        "joules" => "J",
        "watts" => "W",
        "ratio" => "1",
        "celsius" => "Cel",
        "hertz" => "Hz",
        _ => "",
    }
}

/// Container identity by the `cgroup` label's value (a path, or `id:N`).
#[derive(Debug)]
pub struct IdentityIndex<'a> {
    by_path: HashMap<&'a str, &'a ContainerIdentity>,
    snapshot: &'a AgentSnapshot,
}

impl<'a> IdentityIndex<'a> {
    /// The index of `snapshot`'s container identities.
    pub fn new(snapshot: &'a AgentSnapshot) -> Self {
        let by_path = snapshot
            .containers
            .values()
            .filter_map(|c| Some((c.cgroup_path.as_deref()?, c)))
            .collect::<HashMap<_, _>>();
        IdentityIndex { by_path, snapshot }
    }

    /// `container.id` and `k8s.pod.uid` of a cgroup label value.
    fn ids(&self, cgroup: &str) -> (Option<Cow<'a, str>>, Option<Cow<'a, str>>) {
        let known = match cgroup.strip_prefix("id:").and_then(|n| n.parse::<u64>().ok()) {
            Some(id) => self.snapshot.containers.get(&id),
            None => self.by_path.get(cgroup).copied(),
        };
        match known {
            Some(c) if c.container_id.is_some() || c.pod_uid.is_some() => {
                (c.container_id.as_deref().map(Cow::Borrowed), c.pod_uid.as_deref().map(Cow::Borrowed))
            }
            _ if cgroup.starts_with('/') => {
                let p = parse_cgroup_path(cgroup);
                (p.container_id.map(Cow::Owned), p.pod_uid.map(Cow::Owned))
            }
            _ => (None, None),
        }
    }
}

/// Writes the families of `/metrics` sources as OTLP metrics (the OTLP side of
/// [`MetricEncoder`]): one metric per family, one point per distinct attribute set.
struct OtlpEncoder<'x, 'a> {
    ids: &'x IdentityIndex<'a>,
    /// `start_time_unix_nano` of the cumulative sums.
    start: u64,
    time: u64,
    max_series: usize,
    out: &'x mut RequestWriter,
    /// Metrics that hit `max_series` (warned about once each).
    overflowed: &'x mut HashSet<String>,
    series: &'x mut Series,
}

/// The series of the family being built, found by their attributes' bytes: kept by the builder
/// so that its tables keep their capacity from one family (and export) to the next.
#[derive(Debug, Default)]
struct Series {
    /// The attributes of the family's points, as written on the wire, one after the other.
    arena: Vec<u8>,
    points: Vec<Point>,
    /// The attributes' hash → the newest point with it; `next[i]`: the one before it with the
    /// same hash (`usize::MAX`: none).
    by_hash: HashMap<u64, usize>,
    next: Vec<usize>,
    /// Where the sample at hand's attributes were written in the arena, in the order its labels
    /// came, and a copy of them to put them in order from.
    spans: Vec<Span>,
    scratch: Vec<u8>,
    hasher: foldhash::fast::RandomState,
}

impl Series {
    fn clear(&mut self) {
        self.arena.clear();
        self.points.clear();
        self.by_hash.clear();
        self.next.clear();
    }

    /// The point whose attributes are the same bytes as `arena[at..]` (the sample at hand's).
    fn find(&self, hash: u64, at: usize) -> Option<usize> {
        let attrs = &self.arena[at..];
        let mut i = self.by_hash.get(&hash).copied();
        while let Some(p) = i {
            let q = &self.points[p];
            if &self.arena[q.start as usize..q.end as usize] == attrs {
                return Some(p);
            }
            i = Some(self.next[p]).filter(|&n| n != usize::MAX);
        }
        None
    }

    /// Append a sample's labels to the arena as OTLP attributes: sorted by key (then value),
    /// empty values left out, the `cgroup` label made `container.id` and `k8s.pod.uid`.
    fn attributes(&mut self, labels: &dyn LabelSet, ids: &IdentityIndex<'_>) {
        let at = self.arena.len();
        let (arena, spans) = (&mut self.arena, &mut self.spans);
        spans.clear();
        let mut push = |k: &str, v: &str| {
            let start = arena.len() as u32;
            let (key, value) = put_attribute(arena, k, v);
            let mut prefix = [0u8; 16];
            let n = k.len().min(16);
            prefix[..n].copy_from_slice(&k.as_bytes()[..n]);
            spans.push(Span {
                prefix: u128::from_be_bytes(prefix),
                start,
                end: arena.len() as u32,
                key: key as u32,
                key_len: k.len() as u32,
                value: value as u32,
            });
        };
        // Visiting cannot fail here: the closure never returns an error.
        let _ = labels.visit(&mut |k, v| {
            let key = match k {
                "cgroup" => {
                    let (cid, uid) = ids.ids(v);
                    if let Some(c) = cid {
                        push("container.id", &c);
                    }
                    if let Some(u) = uid {
                        push("k8s.pod.uid", &u);
                    }
                    return Ok(());
                }
                _ if v.is_empty() || forbidden(k) => return Ok(()),
                "namespace" => "k8s.namespace.name",
                "pod" => "k8s.pod.name",
                "container" => "k8s.container.name",
                "gpu" => "hw.id",
                other => other,
            };
            push(key, v);
            Ok(())
        });
        // Sorted by key, then value: the prefixes decide nearly every comparison.
        let arena = &self.arena;
        let order = |x: &Span, y: &Span| {
            x.prefix.cmp(&y.prefix).then_with(|| {
                let kv = |s: &Span| {
                    let k = &arena[s.key as usize..(s.key + s.key_len) as usize];
                    (k, &arena[s.value as usize..s.end as usize])
                };
                kv(x).cmp(&kv(y))
            })
        };
        if self.spans.windows(2).all(|w| order(&w[0], &w[1]).is_le()) {
            return;
        }
        self.spans.sort_unstable_by(order);
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.arena[at..]);
        self.arena.truncate(at);
        for s in &self.spans {
            self.arena.extend_from_slice(&self.scratch[s.start as usize - at..s.end as usize - at]);
        }
    }
}

/// Where one attribute of the sample at hand is in the arena: the whole `KeyValue` field
/// (`start..end`), its key (`key`, `key_len` bytes) and its value (`value..end`); `prefix` is the
/// key's first 16 bytes, big-endian, to order keys without a call.
#[derive(Clone, Copy, Debug)]
struct Span {
    prefix: u128,
    start: u32,
    end: u32,
    key: u32,
    key_len: u32,
    value: u32,
}

impl Num {
    /// A sample's value as a point's: byte counts (`exact`) as integers (a double rounded, a
    /// negative one 0), the rest as doubles; `None` for NaN and infinities, which OTLP leaves out.
    fn of(value: Value, exact: bool) -> Option<Num> {
        match value {
            Value::U64(v) if exact => Some(Num::Int(v)),
            Value::U64(v) => Some(Num::Float(v as f64)),
            Value::I64(v) if exact => Some(Num::Int(u64::try_from(v).unwrap_or(0))),
            Value::I64(v) => Some(Num::Float(v as f64)),
            Value::F64(v) if !v.is_finite() => None,
            Value::F64(v) if exact => Some(Num::Int(v.max(0.0).round() as u64)),
            Value::F64(v) => Some(Num::Float(v)),
        }
    }
}

impl MetricEncoder for OtlpEncoder<'_, '_> {
    /// The family as one OTLP metric (none when it has no usable sample). Samples whose attributes
    /// coincide (they differed only by a cgroup path) are summed; past `max_series` series the rest
    /// are summed into one `otel.metric.overflow=true` series.
    fn family(
        &mut self,
        family: &Family<'_>,
        samples: &mut dyn FnMut(&mut SampleSink<'_>) -> std::fmt::Result,
    ) -> std::fmt::Result {
        let exact = family.unit == Some(Unit::Bytes);
        let counter = family.kind == MetricKind::Counter;
        let (ids, max_series) = (self.ids, self.max_series);
        let series = &mut *self.series;
        series.clear();
        series.points.reserve(family.size_hint.min(max_series));
        // One point per distinct attribute set, in first-seen order.
        let mut overflow: Option<Num> = None;
        samples(&mut |labels, value| {
            let Some(v) = Num::of(value, exact) else { return Ok(()) };
            let at = series.arena.len();
            series.attributes(labels, ids);
            let hash = std::hash::BuildHasher::hash_one(&series.hasher, &series.arena[at..]);
            if let Some(i) = series.find(hash, at) {
                series.points[i].value.add(v);
                series.arena.truncate(at);
            } else if series.points.len() + 1 < max_series {
                let i = series.points.len();
                series.points.push(Point { start: at as u32, end: series.arena.len() as u32, value: v });
                series.next.push(series.by_hash.insert(hash, i).unwrap_or(usize::MAX));
            } else {
                series.arena.truncate(at);
                match overflow.as_mut() {
                    Some(o) => o.add(v),
                    None => overflow = Some(v),
                }
            }
            Ok(())
        })?;
        if series.points.is_empty() && overflow.is_none() {
            return Ok(());
        }
        let (name, unit) = otel_metric_name(family.name, ucum(family.unit.map_or("", Unit::as_str)));
        if let Some(v) = overflow {
            let at = series.arena.len();
            put_bool_attribute(&mut series.arena, OVERFLOW_KEY, true);
            series.points.push(Point { start: at as u32, end: series.arena.len() as u32, value: v });
            if self.overflowed.insert(name.to_string()) {
                tracing::warn!(metric = %name, limit = max_series,
                    "an OTLP metric has more series than otlp.max_series_per_metric; the rest are summed under otel.metric.overflow=true");
            }
        }
        let head = MetricHead {
            name: &name,
            description: family.help,
            unit,
            kind: if counter { Instrument::Counter } else { Instrument::Gauge },
            start: if counter { self.start } else { 0 },
            time: self.time,
        };
        self.out.metric(&head, &series.arena, &series.points);
        Ok(())
    }
}

/// A string attribute.
pub fn kv(key: impl Into<String>, value: impl Into<String>) -> KeyValue {
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(any_value::Value::StringValue(value.into())) }) }
}

// ---- hardware semantic conventions ----

/// Writes the `hw.*` metrics of the NVML sample to `out` (none without NVML); `arena` is
/// scratch space for the points' attributes.
fn hardware(snapshot: &AgentSnapshot, time: u64, arena: &mut Vec<u8>, out: &mut RequestWriter) {
    let Some(sample) = snapshot.nvml.sample.as_deref() else {
        return;
    };
    type Points<'s> = Vec<(Vec<(&'static str, &'s str)>, Num)>;
    let (mut usage, mut limit, mut mem_util, mut util, mut power, mut energy): (
        Points,
        Points,
        Points,
        Points,
        Points,
        Points,
    ) = Default::default();
    let driver = snapshot.nvml.driver_version.as_deref().filter(|v| !v.is_empty());
    // The GPU metrics' attributes of the semantic conventions (hardware/gpu): `hw.id` required;
    // `hw.name`, `hw.model` (NVML's product name for both), `hw.parent` (a MIG instance's GPU),
    // `hw.vendor` and `hw.driver_version` recommended.
    fn hw<'s>(
        uuid: &'s str,
        name: Option<&'s str>,
        parent: Option<&'s str>,
        driver: Option<&'s str>,
    ) -> Vec<(&'static str, &'s str)> {
        let mut a = vec![("hw.id", uuid), ("hw.type", "gpu")];
        a.extend(name.map(|n| ("hw.name", n)));
        a.extend(name.map(|n| ("hw.model", n)));
        a.extend(parent.map(|p| ("hw.parent", p)));
        a.push(("hw.vendor", "NVIDIA"));
        a.extend(driver.map(|v| ("hw.driver_version", v)));
        a
    }
    // The fraction of the memory in use, where there is any memory.
    let fraction = |used: u64, total: u64| Num::Float(used as f64 / total as f64);
    for d in sample.devices.iter().filter(|d| !d.lost) {
        let attrs = hw(&d.uuid, d.name.as_deref(), None, driver);
        if let Some(m) = &d.memory {
            let used = m.total.saturating_sub(m.free);
            usage.push((attrs.clone(), Num::Int(used)));
            limit.push((attrs.clone(), Num::Int(m.total)));
            if m.total > 0 {
                mem_util.push((attrs.clone(), fraction(used, m.total)));
            }
        }
        if let Some(u) = &d.utilization {
            let mut a = attrs.clone();
            a.push(("hw.gpu.task", "general"));
            util.push((a, Num::Float(f64::from(u.gpu_pct) / 100.0)));
        }
        if let Some(mw) = d.power_mw {
            power.push((attrs.clone(), Num::Float(f64::from(mw) / 1e3)));
        }
        if let Some(mj) = d.energy_mj {
            energy.push((attrs.clone(), Num::Float(mj as f64 / 1e3)));
        }
        for mig in &d.mig_instances {
            if let Some(m) = &mig.memory {
                let a = hw(&mig.uuid, mig.name.as_deref(), Some(&d.uuid), driver);
                let used = m.total.saturating_sub(m.free);
                usage.push((a.clone(), Num::Int(used)));
                limit.push((a.clone(), Num::Int(m.total)));
                if m.total > 0 {
                    mem_util.push((a, fraction(used, m.total)));
                }
            }
        }
    }
    // `hw.energy` counts from when the driver loaded, which the sample does not say: a start time
    // of 0 is what the specification allows for a cumulative point whose start is unknown.
    let mut fam = |name: &str, description: &str, unit: &str, kind: Instrument, points: Points<'_>| {
        arena.clear();
        let points: Vec<Point> = points
            .into_iter()
            .map(|(attrs, value)| {
                let start = arena.len() as u32;
                for (k, v) in attrs {
                    put_attribute(arena, k, v);
                }
                Point { start, end: arena.len() as u32, value }
            })
            .collect();
        out.metric(&MetricHead { name, description, unit, kind, start: 0, time }, arena, &points);
    };
    use Instrument::{Counter, Gauge, UpDownCounter};
    fam(
        "hw.gpu.memory.usage",
        "GPU memory in use (total - free, driver-reserved included), per GPU and MIG instance.",
        "By",
        UpDownCounter,
        usage,
    );
    fam("hw.gpu.memory.limit", "GPU memory size.", "By", UpDownCounter, limit);
    fam(
        "hw.gpu.memory.utilization",
        "Fraction of GPU memory used (hw.gpu.memory.usage / hw.gpu.memory.limit), per GPU and MIG instance.",
        "1",
        Gauge,
        mem_util,
    );
    fam("hw.gpu.utilization", "Time at least one kernel ran, 0..1 (NVML's GPU utilization).", "1", Gauge, util);
    fam("hw.power", "Power draw.", "W", Gauge, power);
    fam("hw.energy", "Energy since the driver loaded.", "J", Counter, energy);
}

#[cfg(test)]
#[test]
fn the_forbidden_match_is_the_list() {
    assert!(FORBIDDEN_KEYS.iter().all(|k| forbidden(k)));
    for k in ["namespace", "pod", "container", "gpu", "line", "cgroups", "pids", ""] {
        assert!(!forbidden(k), "{k}");
    }
}
