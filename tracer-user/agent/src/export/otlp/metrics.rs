//! The OTLP metrics of one snapshot, built directly as `opentelemetry-proto` messages.
//!
//! Two parts:
//!
//! - **Every `/metrics` family**, with the same meaning: each [`MetricSource`] of the Prometheus
//!   registry ([`MetricsRegistry::encode_part`]) is encoded on its own, and each family becomes
//!   an OTLP metric named `gpu_tracer.` + the family name without the prefix, the unit suffix
//!   and `_total`, its first `_` made a `.` (`gpu_tracer_attribution_memory_bytes` →
//!   `gpu_tracer.attribution.memory`, unit `By`). Going through the exposition keeps one
//!   definition of every family: a family added to `/metrics` is exported over OTLP with no change
//!   here. Labels become attributes: `namespace`, `pod`, `container`, `gpu` become
//!   `k8s.namespace.name`, `k8s.pod.name`, `k8s.container.name`, `hw.id`; the `cgroup` path
//!   becomes `container.id` and `k8s.pod.uid` (from the snapshot's identity, else parsed from the
//!   path) and is dropped, as are PIDs, command and kernel names ([`FORBIDDEN_KEYS`]); series that
//!   then coincide are summed (what `sum without (cgroup)` would give). Empty label values are
//!   left out. Counters are cumulative monotonic sums, everything else a gauge; byte counts are
//!   integers (exact), the rest doubles.
//! - **The hardware semantic conventions** from the NVML sample: `hw.gpu.memory.usage`,
//!   `hw.gpu.memory.limit`, `hw.gpu.utilization`, `hw.power`, `hw.energy`, with `hw.id` (the
//!   UUID), `hw.type=gpu` and `hw.name` (the model).
//!
//! [`MetricBuilder`] hands the metrics out one source at a time ([`MetricBuilder::part`]), so the
//! exporter sends them in requests of at most [`MAX_POINTS_PER_REQUEST`] points while it builds
//! the next: what one export holds at a time is one source's text and one request, not the whole
//! node's metrics. Nothing here goes through the OpenTelemetry SDK (no instruments, no
//! aggregation state kept between exports): a point is built from a line of text and sent.
use std::{
    borrow::Cow,
    collections::{HashSet, hash_map::Entry},
    sync::Arc,
};

/// Maps keyed by the agent's own strings (no hash flooding to defend against).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

use opentelemetry_proto::tonic::{
    common::v1::{AnyValue, KeyValue, any_value},
    metrics::v1::{AggregationTemporality, Gauge, Metric, NumberDataPoint, Sum, metric, number_data_point},
};

use crate::export::metrics::{MetricsRegistry, PREFIX};
use tracer_core::{
    identity::{ContainerIdentity, cgroup::parse_cgroup_path},
    model::AgentSnapshot,
};

/// Attribute keys never exported on a metric (cardinality: one series per process or cgroup).
pub const FORBIDDEN_KEYS: &[&str] =
    &["cgroup", "cgroup_path", "pid", "tgid", "comm", "kernel", "kernel_name", "process.pid"];

/// Data points one export request carries at most (about 0.6 MiB at 8 GPUs × 100 containers);
/// a snapshot with more is sent in several requests, a metric with more split across them.
pub const MAX_POINTS_PER_REQUEST: usize = 2000;

/// The attribute the series past a metric's cardinality limit are summed under (as the
/// OpenTelemetry SDKs do).
pub const OVERFLOW_KEY: &str = "otel.metric.overflow";

/// Builds the OTLP metrics of snapshots; keeps its text buffer between exports.
#[derive(Debug)]
pub struct MetricBuilder {
    registry: MetricsRegistry,
    text: String,
    /// Series one metric may have at most; more are summed into one overflow series.
    max_series: usize,
    /// `start_time_unix_nano` of the cumulative sums: when export started.
    start_unix_ns: u64,
    /// Metrics that hit `max_series` (warned about once each).
    overflowed: HashSet<String>,
}

impl MetricBuilder {
    /// A builder for the families of `registry`, at most `max_series` series per metric.
    /// Every row keeps its cgroup, whatever the registry's `metrics.cgroup_label`: OTLP turns it
    /// into the semantic conventions' `container.id` and `k8s.pod.uid`, never the path itself.
    pub fn new(registry: MetricsRegistry, max_series: usize) -> Self {
        MetricBuilder {
            registry: registry.with_cgroup_label(tracer_core::config::CgroupLabel::Always),
            text: String::new(),
            max_series: max_series.max(2),
            start_unix_ns: unix_ns_now(),
            overflowed: HashSet::new(),
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
        self.registry.encode_part(part, snapshot, &mut self.text)?;
        let ctx = Ctx { ids, start: self.start_unix_ns, time: time_unix_ns, max_series: self.max_series };
        for f in parse_exposition(&self.text) {
            if let Some((m, overflow)) = bridge(&f, &ctx) {
                if overflow && self.overflowed.insert(m.name.clone()) {
                    tracing::warn!(metric = %m.name, limit = self.max_series,
                        "an OTLP metric has more series than otlp.max_series_per_metric; the rest are summed under otel.metric.overflow=true");
                }
                out.push(m);
            }
        }
        Ok(())
    }

    /// Every metric of `snapshot` at once (tests and benchmarks; the exporter goes part by part).
    pub fn all(&mut self, snapshot: &Arc<AgentSnapshot>) -> Vec<Metric> {
        let ids = IdentityIndex::new(snapshot);
        let now = unix_ns_now();
        let mut out = Vec::new();
        for p in 0..self.parts() {
            // Encoding into a String cannot fail; a source that fails is left out, as in /metrics.
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

/// A sample's labels, borrowing the text unless a value holds an escape.
pub type Labels<'a> = Vec<(&'a str, Cow<'a, str>)>;

/// One family of an OpenMetrics exposition, borrowing the text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpositionFamily<'a> {
    /// The `# TYPE` name (with the unit suffix, without `_total`).
    pub name: &'a str,
    pub kind: &'a str,
    pub unit: &'a str,
    pub help: Cow<'a, str>,
    /// (labels, value text)
    pub samples: Vec<(Labels<'a>, &'a str)>,
}

/// Parse OpenMetrics text as prometheus-client writes it (`# HELP`, `# TYPE`, `# UNIT`, samples
/// `name{k="v",...} value`). Lines it does not understand are skipped.
pub fn parse_exposition(text: &str) -> Vec<ExpositionFamily<'_>> {
    let mut out: Vec<ExpositionFamily<'_>> = Vec::new();
    let mut help: Option<(&str, &str)> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (what, name, arg) = (parts.next(), parts.next(), parts.next().unwrap_or(""));
            match (what, name) {
                (Some("HELP"), Some(n)) => help = Some((n, arg)),
                (Some("TYPE"), Some(n)) => out.push(ExpositionFamily {
                    name: n,
                    kind: arg,
                    help: help.filter(|(h, _)| *h == n).map_or(Cow::Borrowed(""), |(_, h)| unescape(h)),
                    ..Default::default()
                }),
                (Some("UNIT"), Some(n)) => {
                    if let Some(f) = out.last_mut().filter(|f| f.name == n) {
                        f.unit = arg;
                    }
                }
                _ => {}
            }
            continue;
        }
        let Some(f) = out.last_mut() else { continue };
        let (name, labels, rest) = match line.bytes().position(|b| b == b'{' || b == b' ') {
            Some(i) if line.as_bytes()[i] == b'{' => match parse_labels(&line[i + 1..]) {
                Some((labels, rest)) => (&line[..i], labels, rest),
                None => continue,
            },
            Some(i) => (&line[..i], Vec::new(), &line[i..]),
            None => continue,
        };
        if name != f.name && name.strip_suffix("_total") != Some(f.name) {
            continue; // `_created` and the like
        }
        if let Some(v) = rest.split_whitespace().next() {
            f.samples.push((labels, v));
        }
    }
    out
}

/// `k="v",k2="v2"}` → labels and what follows the `}`. Values borrow the text unless they hold an
/// escape.
fn parse_labels(s: &str) -> Option<(Labels<'_>, &str)> {
    let mut labels = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    loop {
        while i < b.len() && (b[i] == b',' || b[i] == b' ') {
            i += 1;
        }
        if i < b.len() && b[i] == b'}' {
            return Some((labels, &s[i + 1..]));
        }
        let eq = s[i..].find('=')? + i;
        let key = &s[i..eq];
        if b.get(eq + 1) != Some(&b'"') {
            return None;
        }
        let start = eq + 2;
        let mut j = start;
        let mut owned: Option<String> = None;
        loop {
            match *b.get(j)? {
                b'\\' => {
                    let o = owned.get_or_insert_with(|| s[start..j].to_owned());
                    match *b.get(j + 1)? {
                        b'n' => o.push('\n'),
                        c => o.push(c as char),
                    }
                    j += 2;
                }
                b'"' => break,
                c => {
                    let len = if c < 0x80 { 1 } else { s[j..].chars().next()?.len_utf8() };
                    if let Some(o) = owned.as_mut() {
                        o.push_str(&s[j..j + len]);
                    }
                    j += len;
                }
            }
        }
        labels.push((key, owned.map_or(Cow::Borrowed(&s[start..j]), Cow::Owned)));
        i = j + 1;
    }
}

fn unescape(s: &str) -> Cow<'_, str> {
    if s.contains('\\') { Cow::Owned(s.replace("\\n", "\n").replace("\\\\", "\\")) } else { Cow::Borrowed(s) }
}

/// The OTLP name and UCUM unit of an exposition family.
pub fn otel_name(family: &str, unit: &str) -> (String, &'static str) {
    let short = family.strip_prefix(PREFIX).and_then(|s| s.strip_prefix('_')).unwrap_or(family);
    let short = if unit.is_empty() { short } else { short.strip_suffix(&format!("_{unit}")).unwrap_or(short) };
    let name = match short.split_once('_') {
        Some((group, rest)) => format!("{PREFIX}.{group}.{rest}"),
        None => format!("{PREFIX}.{short}"),
    };
    let ucum = match unit {
        "bytes" => "By",
        "seconds" => "s",
        "joules" => "J",
        "watts" => "W",
        "ratio" => "1",
        "celsius" => "Cel",
        "hertz" => "Hz",
        _ => "",
    };
    (name, ucum)
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

/// What every point of one export shares.
struct Ctx<'i, 'a> {
    ids: &'i IdentityIndex<'a>,
    start: u64,
    time: u64,
    max_series: usize,
}

/// A value of a point: exact integers for byte counts, doubles otherwise.
#[derive(Clone, Copy)]
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

type Attrs<'a> = Vec<(&'a str, Cow<'a, str>)>;

/// An exposition family as an OTLP metric (`None` for a family with no usable sample), and
/// whether it hit the cardinality limit.
fn bridge<'t>(f: &ExpositionFamily<'t>, ctx: &Ctx<'_, 't>) -> Option<(Metric, bool)> {
    let (name, unit) = otel_name(f.name, f.unit);
    let counter = f.kind == "counter";
    let exact = f.unit == "bytes";
    let mut index: HashMap<Attrs<'t>, usize> = HashMap::with_capacity_and_hasher(f.samples.len(), Default::default());
    let mut series: Vec<(Attrs<'t>, Num)> = Vec::with_capacity(f.samples.len());
    let mut overflow: Option<Num> = None;
    for (labels, value) in &f.samples {
        let v = match (exact, value.parse::<u64>()) {
            (true, Ok(v)) => Num::Int(v),
            _ => match value.parse::<f64>() {
                Ok(v) if v.is_finite() && exact => Num::Int(v.max(0.0).round() as u64),
                Ok(v) if v.is_finite() => Num::Float(v),
                _ => continue,
            },
        };
        let attrs = attributes(labels, ctx.ids);
        match index.entry(attrs) {
            Entry::Occupied(e) => series[*e.get()].1.add(v),
            Entry::Vacant(e) if series.len() + 1 < ctx.max_series => {
                series.push((e.key().clone(), v));
                e.insert(series.len() - 1);
            }
            Entry::Vacant(_) => match overflow.as_mut() {
                Some(o) => o.add(v),
                None => overflow = Some(v),
            },
        }
    }
    if series.is_empty() && overflow.is_none() {
        return None;
    }
    let start = if counter { ctx.start } else { 0 };
    let mut points: Vec<NumberDataPoint> = series
        .into_iter()
        .map(|(a, v)| point(a.into_iter().map(|(k, v)| kv(k, v.into_owned())).collect(), v, start, ctx.time))
        .collect();
    if let Some(v) = overflow {
        points.push(point(
            vec![KeyValue {
                key: OVERFLOW_KEY.into(),
                value: Some(AnyValue { value: Some(any_value::Value::BoolValue(true)) }),
            }],
            v,
            start,
            ctx.time,
        ));
    }
    let kind = if counter { Instrument::Counter } else { Instrument::Gauge };
    Some((metric(name, f.help.clone().into_owned(), unit, kind, points), overflow.is_some()))
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

/// Prometheus labels → OTLP attributes (sorted by key, empty values left out).
fn attributes<'a>(labels: &[(&'a str, Cow<'a, str>)], ids: &IdentityIndex<'a>) -> Attrs<'a> {
    let mut out: Attrs<'a> = Vec::with_capacity(labels.len() + 1);
    for (k, v) in labels {
        if *k == "cgroup" {
            let (cid, uid) = ids.ids(v);
            out.extend(cid.map(|c| ("container.id", c)));
            out.extend(uid.map(|u| ("k8s.pod.uid", u)));
            continue;
        }
        if v.is_empty() || FORBIDDEN_KEYS.contains(k) {
            continue;
        }
        let key: &'a str = match *k {
            "namespace" => "k8s.namespace.name",
            "pod" => "k8s.pod.name",
            "container" => "k8s.container.name",
            "gpu" => "hw.id",
            other => other,
        };
        out.push((key, v.clone()));
    }
    out.sort();
    out
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
