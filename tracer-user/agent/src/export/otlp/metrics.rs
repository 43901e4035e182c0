//! The OTLP metrics of one snapshot, built directly as `opentelemetry-proto` messages.
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
//!   `hw.gpu.memory.limit`, `hw.gpu.utilization`, `hw.power`, `hw.energy`, with `hw.id` (the
//!   UUID), `hw.type=gpu` and `hw.name` (the model).
//!
//! [`MetricBuilder`] hands the metrics out one source at a time ([`MetricBuilder::part`]), so the
//! exporter sends them in requests of at most [`MAX_POINTS_PER_REQUEST`] points while it builds
//! the next: what one export holds at a time is one source's metrics and one request, not the
//! whole node's metrics. Nothing here goes through the OpenTelemetry SDK (no instruments, no
//! aggregation state kept between exports): a point is built from a source's sample and sent.
//!
//! [`MetricSource`]: crate::export::metrics::MetricSource
use std::{borrow::Cow, collections::HashSet, sync::Arc};

/// Maps keyed by the agent's own strings (no hash flooding to defend against).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

use opentelemetry_proto::tonic::{
    common::v1::{AnyValue, KeyValue, any_value},
    metrics::v1::{AggregationTemporality, Gauge, Metric, NumberDataPoint, Sum, metric, number_data_point},
};

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

    /// Append the metrics of part `part` of `snapshot` to `out`, with `time_unix_ns` as their
    /// time. `ids` is [`IdentityIndex::new`] of the same snapshot (built once per export).
    pub fn part(
        &mut self,
        part: usize,
        snapshot: &Arc<AgentSnapshot>,
        ids: &IdentityIndex<'_>,
        time_unix_ns: u64,
        out: &mut Vec<Metric>,
    ) -> std::fmt::Result {
        if part >= self.registry.parts() {
            out.extend(hardware(snapshot, time_unix_ns));
            return Ok(());
        }
        let before = out.len();
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
            // A source that fails is left out whole, as it fails the whole of /metrics.
            out.truncate(before);
        }
        written
    }

    /// Every metric of `snapshot` at once (tests and benchmarks; the exporter goes part by part).
    pub fn all(&mut self, snapshot: &Arc<AgentSnapshot>) -> Vec<Metric> {
        let ids = IdentityIndex::new(snapshot);
        let now = unix_ns_now();
        let mut out = Vec::new();
        for p in 0..self.parts() {
            // A source that fails is left out, as in /metrics.
            let _ = self.part(p, snapshot, &ids, now, &mut out);
        }
        out
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

/// Split `m` after its first `n` points: `m` keeps them, the returned metric (same name,
/// description, unit and kind) has the rest.
pub fn split_off(m: &mut Metric, n: usize) -> Metric {
    let mut rest =
        Metric { name: m.name.clone(), description: m.description.clone(), unit: m.unit.clone(), ..Default::default() };
    rest.data = match &mut m.data {
        Some(metric::Data::Gauge(g)) => {
            Some(metric::Data::Gauge(Gauge { data_points: g.data_points.split_off(n.min(g.data_points.len())) }))
        }
        Some(metric::Data::Sum(s)) => Some(metric::Data::Sum(Sum {
            data_points: s.data_points.split_off(n.min(s.data_points.len())),
            aggregation_temporality: s.aggregation_temporality,
            is_monotonic: s.is_monotonic,
        })),
        _ => None,
    };
    rest
}

// ---- the /metrics families ----

/// The OTLP name and UCUM unit of an exposition family (its name as `/metrics` has it, e.g.
/// `gpu_tracer_attribution_memory_bytes`, and its unit, e.g. `bytes`).
pub fn otel_name(family: &str, unit: &str) -> (String, &'static str) {
    let short = family.strip_prefix(PREFIX).and_then(|s| s.strip_prefix('_')).unwrap_or(family);
    let short = if unit.is_empty() { short } else { short.strip_suffix(&format!("_{unit}")).unwrap_or(short) };
    (otel_metric_name(short), ucum(unit))
}

/// `gpu_tracer.` + a family's name without the prefix, unit and `_total` (as a [`Family`] names
/// it), its first `_` made a `.`: `attribution_memory` → `gpu_tracer.attribution.memory`.
fn otel_metric_name(short: &str) -> String {
    match short.split_once('_') {
        Some((group, rest)) => format!("{PREFIX}.{group}.{rest}"),
        None => format!("{PREFIX}.{short}"),
    }
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
    out: &'x mut Vec<Metric>,
    /// Metrics that hit `max_series` (warned about once each).
    overflowed: &'x mut HashSet<String>,
    series: &'x mut Series,
}

/// The series of the family being built, found by their attributes: kept by the builder so that
/// its tables keep their capacity from one family (and export) to the next.
#[derive(Debug, Default)]
struct Series {
    /// The attributes' hash → the newest series with it; `next[i]`: the one before it with the
    /// same hash (`usize::MAX`: none).
    by_hash: HashMap<u64, usize>,
    next: Vec<usize>,
    /// Each series' value, summed.
    values: Vec<Num>,
    /// The attributes of the sample at hand, sorted.
    scratch: Vec<KeyValue>,
    hasher: foldhash::fast::RandomState,
}

impl Series {
    /// The series of `points` whose attributes are `self.scratch`.
    fn find(&self, points: &[NumberDataPoint], hash: u64) -> Option<usize> {
        let mut at = self.by_hash.get(&hash).copied();
        while let Some(i) = at {
            if points[i].attributes == self.scratch {
                return Some(i);
            }
            at = Some(self.next[i]).filter(|&n| n != usize::MAX);
        }
        None
    }
}

/// Hashes attributes by their string values (the only values a series has). The keys are left
/// out: within a family they are nearly always the same, and [`Series::find`] compares the whole
/// attributes anyway.
struct AttrsHash<'a>(&'a [KeyValue]);

impl std::hash::Hash for AttrsHash<'_> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        for a in self.0 {
            string_value(a).hash(h);
        }
    }
}

/// A string attribute's value ("" for any other).
fn string_value(a: &KeyValue) -> &str {
    match a.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s,
        _ => "",
    }
}

/// A value of a point: exact integers for byte counts, doubles otherwise.
#[derive(Clone, Copy, Debug)]
enum Num {
    Int(u64),
    Float(f64),
}

impl Num {
    fn add(&mut self, other: Num) {
        *self = match (*self, other) {
            (Num::Int(a), Num::Int(b)) => Num::Int(a.saturating_add(b)),
            (a, b) => Num::Float(a.as_f64() + b.as_f64()),
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }

    fn value(self) -> number_data_point::Value {
        match self {
            Num::Int(i) => number_data_point::Value::AsInt(i64::try_from(i).unwrap_or(i64::MAX)),
            Num::Float(f) => number_data_point::Value::AsDouble(f),
        }
    }
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
        let unit = family.unit.map_or("", Unit::as_str);
        let exact = family.unit == Some(Unit::Bytes);
        let counter = family.kind == MetricKind::Counter;
        let (ids, max_series) = (self.ids, self.max_series);
        let start = if counter { self.start } else { 0 };
        let time = self.time;
        let series = &mut *self.series;
        series.by_hash.clear();
        series.next.clear();
        series.values.clear();
        // One point per distinct attribute set, in first-seen order; its value is set at the end.
        let mut points: Vec<NumberDataPoint> = Vec::with_capacity(family.size_hint.min(max_series));
        let mut overflow: Option<Num> = None;
        samples(&mut |labels, value| {
            let Some(v) = Num::of(value, exact) else { return Ok(()) };
            attributes(labels, ids, &mut series.scratch);
            let hash = std::hash::BuildHasher::hash_one(&series.hasher, AttrsHash(&series.scratch));
            if let Some(i) = series.find(&points, hash) {
                series.values[i].add(v);
                series.scratch.clear();
            } else if points.len() + 1 < max_series {
                let mut attributes = Vec::with_capacity(series.scratch.len());
                attributes.append(&mut series.scratch);
                let i = points.len();
                points.push(NumberDataPoint {
                    attributes,
                    start_time_unix_nano: start,
                    time_unix_nano: time,
                    ..Default::default()
                });
                series.values.push(v);
                series.next.push(series.by_hash.insert(hash, i).unwrap_or(usize::MAX));
            } else {
                series.scratch.clear();
                match overflow.as_mut() {
                    Some(o) => o.add(v),
                    None => overflow = Some(v),
                }
            }
            Ok(())
        })?;
        if points.is_empty() && overflow.is_none() {
            return Ok(());
        }
        for (p, v) in points.iter_mut().zip(&series.values) {
            p.value = Some(v.value());
        }
        let name = otel_metric_name(family.name);
        if let Some(v) = overflow {
            points.push(point(
                vec![KeyValue {
                    key: OVERFLOW_KEY.into(),
                    value: Some(AnyValue { value: Some(any_value::Value::BoolValue(true)) }),
                }],
                v,
                start,
                self.time,
            ));
            if self.overflowed.insert(name.clone()) {
                tracing::warn!(metric = %name, limit = max_series,
                    "an OTLP metric has more series than otlp.max_series_per_metric; the rest are summed under otel.metric.overflow=true");
            }
        }
        let kind = if counter { Instrument::Counter } else { Instrument::Gauge };
        self.out.push(metric(name, family.help.to_owned(), ucum(unit), kind, points));
        Ok(())
    }
}

fn point(attributes: Vec<KeyValue>, v: Num, start: u64, time: u64) -> NumberDataPoint {
    NumberDataPoint {
        attributes,
        start_time_unix_nano: start,
        time_unix_nano: time,
        value: Some(v.value()),
        ..Default::default()
    }
}

/// How a metric's points are reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Instrument {
    Gauge,
    /// A monotonic cumulative sum.
    Counter,
    /// A non-monotonic cumulative sum.
    UpDownCounter,
}

fn metric(
    name: String,
    description: String,
    unit: &str,
    kind: Instrument,
    data_points: Vec<NumberDataPoint>,
) -> Metric {
    let data = match kind {
        Instrument::Gauge => metric::Data::Gauge(Gauge { data_points }),
        Instrument::Counter | Instrument::UpDownCounter => metric::Data::Sum(Sum {
            data_points,
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: kind == Instrument::Counter,
        }),
    };
    Metric { name, description, unit: unit.to_owned(), data: Some(data), ..Default::default() }
}

/// A string attribute.
pub fn kv(key: impl Into<String>, value: impl Into<String>) -> KeyValue {
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(any_value::Value::StringValue(value.into())) }) }
}

/// A sample's labels → OTLP attributes in `out` (cleared first; sorted by key, empty values left
/// out; the `cgroup` label becomes `container.id` and `k8s.pod.uid`).
fn attributes(labels: &dyn LabelSet, ids: &IdentityIndex<'_>, out: &mut Vec<KeyValue>) {
    out.clear();
    // Visiting cannot fail here: the closure never returns an error.
    let _ = labels.visit(&mut |k, v| {
        let key = match k {
            "cgroup" => {
                let (cid, uid) = ids.ids(v);
                out.extend(cid.map(|c| kv("container.id", c)));
                out.extend(uid.map(|u| kv("k8s.pod.uid", u)));
                return Ok(());
            }
            _ if v.is_empty() || forbidden(k) => return Ok(()),
            "namespace" => "k8s.namespace.name",
            "pod" => "k8s.pod.name",
            "container" => "k8s.container.name",
            "gpu" => "hw.id",
            other => other,
        };
        out.push(kv(key, v));
        Ok(())
    });
    out.sort_unstable_by(|a, b| a.key.cmp(&b.key).then_with(|| string_value(a).cmp(string_value(b))));
}

// ---- hardware semantic conventions ----

/// `hw.*` metrics of the NVML sample (none without NVML).
fn hardware(snapshot: &AgentSnapshot, time: u64) -> Vec<Metric> {
    let Some(sample) = snapshot.nvml.sample.as_deref() else {
        return Vec::new();
    };
    type Points = Vec<(Vec<KeyValue>, Num)>;
    let (mut usage, mut limit, mut util, mut power, mut energy): (Points, Points, Points, Points, Points) =
        Default::default();
    let hw = |uuid: &str, name: Option<&str>, parent: Option<&str>| {
        let mut a = vec![kv("hw.id", uuid), kv("hw.type", "gpu")];
        a.extend(name.map(|n| kv("hw.name", n)));
        a.extend(parent.map(|p| kv("hw.parent", p)));
        a.push(kv("hw.vendor", "NVIDIA"));
        a
    };
    for d in sample.devices.iter().filter(|d| !d.lost) {
        let attrs = hw(&d.uuid, d.name.as_deref(), None);
        if let Some(m) = &d.memory {
            usage.push((attrs.clone(), Num::Int(m.total.saturating_sub(m.free))));
            limit.push((attrs.clone(), Num::Int(m.total)));
        }
        if let Some(u) = &d.utilization {
            let mut a = attrs.clone();
            a.push(kv("hw.gpu.task", "general"));
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
                let a = hw(&mig.uuid, mig.name.as_deref(), Some(&d.uuid));
                usage.push((a.clone(), Num::Int(m.total.saturating_sub(m.free))));
                limit.push((a, Num::Int(m.total)));
            }
        }
    }
    // `hw.energy` counts from when the driver loaded, which the sample does not say: a start time
    // of 0 is what the specification allows for a cumulative point whose start is unknown.
    let fam = |name: &str, description: &str, unit: &str, kind: Instrument, points: Points| {
        let points = points.into_iter().map(|(a, v)| point(a, v, 0, time)).collect();
        metric(name.to_owned(), description.to_owned(), unit, kind, points)
    };
    use Instrument::{Counter, Gauge, UpDownCounter};
    [
        fam(
            "hw.gpu.memory.usage",
            "GPU memory in use (total - free, driver-reserved included), per GPU and MIG instance.",
            "By",
            UpDownCounter,
            usage,
        ),
        fam("hw.gpu.memory.limit", "GPU memory size.", "By", UpDownCounter, limit),
        fam("hw.gpu.utilization", "Time at least one kernel ran, 0..1 (NVML's GPU utilization).", "1", Gauge, util),
        fam("hw.power", "Power draw.", "W", Gauge, power),
        fam("hw.energy", "Energy since the driver loaded.", "J", Counter, energy),
    ]
    .into_iter()
    .filter(|m| point_count(m) > 0)
    .collect()
}

#[cfg(test)]
#[test]
fn the_forbidden_match_is_the_list() {
    assert!(FORBIDDEN_KEYS.iter().all(|k| forbidden(k)));
    for k in ["namespace", "pod", "container", "gpu", "line", "cgroups", "pids", ""] {
        assert!(!forbidden(k), "{k}");
    }
}
