//! What the metric instruments report: a [`MetricView`] built from one snapshot at collection time.
//!
//! Two parts:
//!
//! - **Every `/metrics` family**, with the same meaning: the snapshot is encoded by the Prometheus
//!   registry ([`MetricsRegistry`]) and each family becomes an OTLP metric named `gpu_tracer.` +
//!   the family name without the prefix, the unit suffix and `_total`, its first `_` made a `.`
//!   (`gpu_tracer_attribution_memory_bytes` → `gpu_tracer.attribution.memory`, unit `By`). Going
//!   through the exposition keeps one definition of every family: a family added to `/metrics` is
//!   exported over OTLP with no change here. Labels become attributes: `namespace`, `pod`,
//!   `container`, `gpu` become `k8s.namespace.name`, `k8s.pod.name`, `k8s.container.name`,
//!   `hw.id`; the `cgroup` path becomes `container.id` and `k8s.pod.uid` (from the snapshot's
//!   identity, else parsed from the path) and is dropped, as are PIDs, command and kernel names
//!   ([`FORBIDDEN_KEYS`]); series that then coincide are summed (what `sum without (cgroup)`
//!   would give). Empty label values are left out.
//! - **The hardware semantic conventions** from the NVML sample: `hw.gpu.memory.usage`,
//!   `hw.gpu.memory.limit`, `hw.gpu.utilization`, `hw.power`, `hw.energy`, with `hw.id` (the
//!   UUID), `hw.type=gpu` and `hw.name` (the model).
use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex},
};

use opentelemetry::{
    KeyValue,
    metrics::{AsyncInstrument, Meter},
};

use crate::{
    export::metrics::{ExpositionFormat, MetricsRegistry, PREFIX},
    identity::{ContainerIdentity, cgroup::parse_cgroup_path},
    model::AgentSnapshot,
};

/// Attribute keys never exported on a metric (cardinality: one series per process or cgroup).
pub const FORBIDDEN_KEYS: &[&str] =
    &["cgroup", "cgroup_path", "pid", "tgid", "comm", "kernel", "kernel_name", "process.pid"];

/// How an OTLP metric is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A current value (`ObservableGauge`).
    Gauge,
    /// A monotonic cumulative count (`ObservableCounter`).
    Counter,
}

/// The points of one metric.
#[derive(Clone, Debug, PartialEq)]
pub enum Points {
    /// Integers (bytes, counts of bytes): exact.
    U64(Vec<(Vec<KeyValue>, u64)>),
    F64(Vec<(Vec<KeyValue>, f64)>),
}

impl Points {
    /// How many points.
    pub fn len(&self) -> usize {
        match self {
            Points::U64(p) => p.len(),
            Points::F64(p) => p.len(),
        }
    }

    /// No points.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One OTLP metric: name, description, unit, kind and points.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricFamily {
    pub name: String,
    pub description: String,
    /// UCUM unit (`By`, `s`, `J`, `W`, `1`), or empty.
    pub unit: &'static str,
    pub kind: Kind,
    pub points: Points,
}

impl MetricFamily {
    fn is_u64(&self) -> bool {
        matches!(self.points, Points::U64(_))
    }
}

/// Every metric of one snapshot, by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricView {
    pub families: BTreeMap<String, MetricFamily>,
}

impl MetricView {
    /// The view of `snapshot`: the `/metrics` families encoded by `registry`, then the hardware
    /// semantic conventions.
    pub fn build(snapshot: &Arc<AgentSnapshot>, registry: &MetricsRegistry) -> MetricView {
        let mut view = MetricView::default();
        if let Ok(text) = registry.encode(snapshot, ExpositionFormat::OpenMetrics) {
            let ids = IdentityIndex::new(snapshot);
            for f in parse_exposition(&text) {
                if let Some(m) = bridge(&f, &ids) {
                    view.families.insert(m.name.clone(), m);
                }
            }
        }
        for m in hardware(snapshot) {
            view.families.insert(m.name.clone(), m);
        }
        view
    }

    /// Points in the view.
    pub fn points(&self) -> usize {
        self.families.values().map(|f| f.points.len()).sum()
    }
}

/// The instruments registered so far and the view their callbacks read.
pub(super) struct Instruments {
    meter: Meter,
    current: Arc<Mutex<Arc<MetricView>>>,
    /// Names registered (with the value type): an instrument lives as long as the provider.
    registered: HashSet<(String, bool)>,
}

impl Instruments {
    pub(super) fn new(meter: Meter) -> Self {
        Instruments { meter, current: Arc::default(), registered: HashSet::new() }
    }

    /// Make `view` the one the callbacks read, registering an instrument for each metric not seen
    /// before.
    pub(super) fn set(&mut self, view: MetricView) {
        for f in view.families.values() {
            let key = (f.name.clone(), f.is_u64());
            if self.registered.contains(&key) {
                continue;
            }
            self.register(f);
            self.registered.insert(key);
        }
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(view);
    }

    fn register(&self, f: &MetricFamily) {
        let name: Cow<'static, str> = f.name.clone().into();
        let (current, n) = (Arc::clone(&self.current), f.name.clone());
        let read = move || current.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let m = &self.meter;
        let desc = f.description.clone();
        match (&f.points, f.kind) {
            (Points::U64(_), Kind::Gauge) => {
                m.u64_observable_gauge(name)
                    .with_description(desc)
                    .with_unit(f.unit)
                    .with_callback(move |o| observe_u64(&read(), &n, o))
                    .build();
            }
            (Points::U64(_), Kind::Counter) => {
                m.u64_observable_counter(name)
                    .with_description(desc)
                    .with_unit(f.unit)
                    .with_callback(move |o| observe_u64(&read(), &n, o))
                    .build();
            }
            (Points::F64(_), Kind::Gauge) => {
                m.f64_observable_gauge(name)
                    .with_description(desc)
                    .with_unit(f.unit)
                    .with_callback(move |o| observe_f64(&read(), &n, o))
                    .build();
            }
            (Points::F64(_), Kind::Counter) => {
                m.f64_observable_counter(name)
                    .with_description(desc)
                    .with_unit(f.unit)
                    .with_callback(move |o| observe_f64(&read(), &n, o))
                    .build();
            }
        }
    }
}

fn observe_u64(view: &MetricView, name: &str, o: &dyn AsyncInstrument<u64>) {
    if let Some(Points::U64(p)) = view.families.get(name).map(|f| &f.points) {
        for (attrs, v) in p {
            o.observe(*v, attrs);
        }
    }
}

fn observe_f64(view: &MetricView, name: &str, o: &dyn AsyncInstrument<f64>) {
    if let Some(Points::F64(p)) = view.families.get(name).map(|f| &f.points) {
        for (attrs, v) in p {
            o.observe(*v, attrs);
        }
    }
}

// ---- the /metrics families ----

/// One family of an OpenMetrics exposition.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpositionFamily {
    /// The `# TYPE` name (with the unit suffix, without `_total`).
    pub name: String,
    pub kind: String,
    pub unit: String,
    pub help: String,
    /// (labels, value text)
    pub samples: Vec<(Vec<(String, String)>, String)>,
}

/// Parse OpenMetrics text as prometheus-client writes it (`# HELP`, `# TYPE`, `# UNIT`, samples
/// `name{k="v",...} value`). Lines it does not understand are skipped.
pub fn parse_exposition(text: &str) -> Vec<ExpositionFamily> {
    let mut out: Vec<ExpositionFamily> = Vec::new();
    let mut helps: HashMap<&str, &str> = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (what, name, arg) = (parts.next(), parts.next(), parts.next().unwrap_or(""));
            match (what, name) {
                (Some("HELP"), Some(n)) => {
                    helps.insert(n, arg);
                }
                (Some("TYPE"), Some(n)) => out.push(ExpositionFamily {
                    name: n.to_owned(),
                    kind: arg.to_owned(),
                    help: unescape(helps.get(n).copied().unwrap_or("")),
                    ..Default::default()
                }),
                (Some("UNIT"), Some(n)) => {
                    if let Some(f) = out.last_mut().filter(|f| f.name == n) {
                        f.unit = arg.to_owned();
                    }
                }
                _ => {}
            }
            continue;
        }
        let Some(f) = out.last_mut() else { continue };
        let (name, labels, rest) = match line.find(['{', ' ']) {
            Some(i) if line.as_bytes()[i] == b'{' => match parse_labels(&line[i + 1..]) {
                Some((labels, rest)) => (&line[..i], labels, rest),
                None => continue,
            },
            Some(i) => (&line[..i], Vec::new(), &line[i..]),
            None => continue,
        };
        let base = &f.name;
        if name != base && name.strip_suffix("_total") != Some(base.as_str()) {
            continue; // `_created` and the like
        }
        if let Some(v) = rest.split_whitespace().next() {
            f.samples.push((labels, v.to_owned()));
        }
    }
    out
}

/// `k="v",k2="v2"}` → labels and what follows the `}`.
fn parse_labels(s: &str) -> Option<(Vec<(String, String)>, &str)> {
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
        let key = s[i..eq].to_owned();
        if b.get(eq + 1) != Some(&b'"') {
            return None;
        }
        let mut j = eq + 2;
        let mut value = String::new();
        loop {
            match *b.get(j)? {
                b'\\' => {
                    match *b.get(j + 1)? {
                        b'n' => value.push('\n'),
                        c => value.push(c as char),
                    }
                    j += 2;
                }
                b'"' => break,
                _ => {
                    let ch = s[j..].chars().next()?;
                    value.push(ch);
                    j += ch.len_utf8();
                }
            }
        }
        labels.push((key, value));
        i = j + 1;
    }
}

fn unescape(s: &str) -> String {
    s.replace("\\n", "\n").replace("\\\\", "\\")
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
struct IdentityIndex<'a> {
    by_path: HashMap<&'a str, &'a ContainerIdentity>,
    snapshot: &'a AgentSnapshot,
}

impl<'a> IdentityIndex<'a> {
    fn new(snapshot: &'a AgentSnapshot) -> Self {
        let by_path = snapshot
            .containers
            .values()
            .filter_map(|c| Some((c.cgroup_path.as_deref()?, c)))
            .collect::<HashMap<_, _>>();
        IdentityIndex { by_path, snapshot }
    }

    /// `container.id` and `k8s.pod.uid` of a cgroup label value.
    fn ids(&self, cgroup: &str) -> (Option<String>, Option<String>) {
        let known = match cgroup.strip_prefix("id:").and_then(|n| n.parse::<u64>().ok()) {
            Some(id) => self.snapshot.containers.get(&id),
            None => self.by_path.get(cgroup).copied(),
        };
        match known {
            Some(c) if c.container_id.is_some() || c.pod_uid.is_some() => (c.container_id.clone(), c.pod_uid.clone()),
            _ if cgroup.starts_with('/') => {
                let p = parse_cgroup_path(cgroup);
                (p.container_id, p.pod_uid)
            }
            _ => (None, None),
        }
    }
}

/// An exposition family as an OTLP metric (`None` for a family with no usable sample).
fn bridge(f: &ExpositionFamily, ids: &IdentityIndex<'_>) -> Option<MetricFamily> {
    let (name, unit) = otel_name(&f.name, &f.unit);
    let kind = if f.kind == "counter" { Kind::Counter } else { Kind::Gauge };
    let exact = f.unit == "bytes";
    let mut ints: BTreeMap<Vec<(&'static str, String)>, u64> = BTreeMap::new();
    let mut floats: BTreeMap<Vec<(&'static str, String)>, f64> = BTreeMap::new();
    for (labels, value) in &f.samples {
        let attrs = attributes(labels, ids);
        if exact && let Ok(v) = value.parse::<u64>() {
            let slot = ints.entry(attrs).or_default();
            *slot = slot.saturating_add(v);
            continue;
        }
        let Ok(v) = value.parse::<f64>() else { continue };
        if !v.is_finite() {
            continue;
        }
        if exact {
            let slot = ints.entry(attrs).or_default();
            *slot = slot.saturating_add(v.max(0.0).round() as u64);
        } else {
            *floats.entry(attrs).or_default() += v;
        }
    }
    let kv = |a: Vec<(&'static str, String)>| a.into_iter().map(|(k, v)| KeyValue::new(k, v)).collect::<Vec<_>>();
    let points = if exact {
        Points::U64(ints.into_iter().map(|(a, v)| (kv(a), v)).collect())
    } else {
        Points::F64(floats.into_iter().map(|(a, v)| (kv(a), v)).collect())
    };
    if points.is_empty() {
        return None;
    }
    Some(MetricFamily { name, description: f.help.clone(), unit, kind, points })
}

/// Prometheus labels → OTLP attributes (sorted by key, empty values left out).
fn attributes(labels: &[(String, String)], ids: &IdentityIndex<'_>) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> = Vec::with_capacity(labels.len() + 1);
    for (k, v) in labels {
        if k == "cgroup" {
            let (cid, uid) = ids.ids(v);
            out.extend(cid.map(|c| ("container.id", c)));
            out.extend(uid.map(|u| ("k8s.pod.uid", u)));
            continue;
        }
        if v.is_empty() || FORBIDDEN_KEYS.contains(&k.as_str()) {
            continue;
        }
        let key: &'static str = match k.as_str() {
            "namespace" => "k8s.namespace.name",
            "pod" => "k8s.pod.name",
            "container" => "k8s.container.name",
            "gpu" => "hw.id",
            other => intern(other),
        };
        out.push((key, v.clone()));
    }
    out.sort();
    out
}

/// Label names are a small fixed set (the families' label structs): keep one `'static` copy each.
fn intern(s: &str) -> &'static str {
    static NAMES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let set = names.get_or_insert_with(HashSet::new);
    if let Some(n) = set.get(s) {
        return n;
    }
    let leaked: &'static str = Box::leak(s.to_owned().into_boxed_str());
    set.insert(leaked);
    leaked
}

// ---- hardware semantic conventions ----

/// `hw.*` metrics of the NVML sample (none without NVML).
fn hardware(snapshot: &AgentSnapshot) -> Vec<MetricFamily> {
    let Some(sample) = snapshot.nvml.sample.as_deref() else {
        return Vec::new();
    };
    let (mut usage, mut limit, mut util, mut power, mut energy) = (vec![], vec![], vec![], vec![], vec![]);
    let hw = |uuid: &str, name: Option<&str>, parent: Option<&str>| {
        let mut a = vec![KeyValue::new("hw.id", uuid.to_owned()), KeyValue::new("hw.type", "gpu")];
        a.extend(name.map(|n| KeyValue::new("hw.name", n.to_owned())));
        a.extend(parent.map(|p| KeyValue::new("hw.parent", p.to_owned())));
        a.push(KeyValue::new("hw.vendor", "NVIDIA"));
        a
    };
    for d in sample.devices.iter().filter(|d| !d.lost) {
        let attrs = hw(&d.uuid, d.name.as_deref(), None);
        if let Some(m) = &d.memory {
            usage.push((attrs.clone(), m.total.saturating_sub(m.free)));
            limit.push((attrs.clone(), m.total));
        }
        if let Some(u) = &d.utilization {
            let mut a = attrs.clone();
            a.push(KeyValue::new("hw.gpu.task", "general"));
            util.push((a, f64::from(u.gpu_pct) / 100.0));
        }
        if let Some(mw) = d.power_mw {
            power.push((attrs.clone(), f64::from(mw) / 1e3));
        }
        if let Some(mj) = d.energy_mj {
            energy.push((attrs.clone(), mj as f64 / 1e3));
        }
        for mig in &d.mig_instances {
            if let Some(m) = &mig.memory {
                let a = hw(&mig.uuid, mig.name.as_deref(), Some(&d.uuid));
                usage.push((a.clone(), m.total.saturating_sub(m.free)));
                limit.push((a, m.total));
            }
        }
    }
    let fam = |name: &str, description: &str, unit, kind, points: Points| MetricFamily {
        name: name.to_owned(),
        description: description.to_owned(),
        unit,
        kind,
        points,
    };
    [
        fam(
            "hw.gpu.memory.usage",
            "GPU memory in use (total - free, driver-reserved included), per GPU and MIG instance.",
            "By",
            Kind::Gauge,
            Points::U64(usage),
        ),
        fam("hw.gpu.memory.limit", "GPU memory size.", "By", Kind::Gauge, Points::U64(limit)),
        fam(
            "hw.gpu.utilization",
            "Time at least one kernel ran, 0..1 (NVML's GPU utilization).",
            "1",
            Kind::Gauge,
            Points::F64(util),
        ),
        fam("hw.power", "Power draw.", "W", Kind::Gauge, Points::F64(power)),
        fam("hw.energy", "Energy since the driver loaded.", "J", Kind::Counter, Points::F64(energy)),
    ]
    .into_iter()
    .filter(|f| !f.points.is_empty())
    .collect()
}
