//! The one metric model `/metrics` and OTLP are both written from.
//!
//! A source describes each family it writes ([`Family`]: name, help, [`Unit`], gauge or counter)
//! and hands over its samples, a [`LabelSet`] and a [`Value`] each, to a [`MetricEncoder`]. Two
//! encoders implement it: [`TextEncoder`] writes the Prometheus / OpenMetrics exposition through
//! prometheus-client (which keeps the two text formats, label escaping and number formatting), and
//! the OTLP exporter's (`export::otlp::metrics`) turns the same typed samples into OTLP `Metric`s
//! with no text in between. A family added to a source is therefore in both, with one definition.
use std::fmt;

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeLabel, EncodeLabelSet, LabelSetEncoder, NoLabelSet},
    metrics::MetricType,
};

/// Whether a family's samples are gauges or counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// A value that goes up and down.
    Gauge,
    /// A cumulative count (its samples are `<name>_total` in the exposition).
    Counter,
}

/// The unit of a family: the suffix of its exposition name and its OpenMetrics `# UNIT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// `_bytes` (OTLP `By`; the values are exact integers there).
    Bytes,
    /// `_seconds` (`s`).
    Seconds,
    /// `_joules` (`J`).
    Joules,
    /// `_watts` (`W`).
    Watts,
    /// `_ratio`, 0..1 (`1`).
    Ratio,
    /// `_celsius` (`Cel`).
    Celsius,
    /// `_hertz` (`Hz`).
    Hertz,
}

impl Unit {
    /// The name's suffix and the `# UNIT` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Seconds => "seconds",
            Unit::Joules => "joules",
            Unit::Watts => "watts",
            Unit::Ratio => "ratio",
            Unit::Celsius => "celsius",
            Unit::Hertz => "hertz",
        }
    }

    fn prometheus(self) -> prometheus_client::registry::Unit {
        use prometheus_client::registry::Unit as P;
        match self {
            Unit::Bytes => P::Bytes,
            Unit::Seconds => P::Seconds,
            Unit::Joules => P::Joules,
            Unit::Celsius => P::Celsius,
            other => P::Other(other.as_str().to_owned()),
        }
    }
}

/// What describes one metric family.
#[derive(Clone, Copy, Debug)]
pub struct Family<'a> {
    /// The name without the `gpu_tracer_` prefix, the unit and `_total` (`cgroup_vidmem`).
    pub name: &'a str,
    /// One line of help text.
    pub help: &'a str,
    pub unit: Option<Unit>,
    pub kind: MetricKind,
    /// How many samples the family has at least, as far as the source knows before writing them
    /// (0 when it does not): lets an encoder size its buffers once.
    pub size_hint: usize,
}

/// A sample's value: an integer where the source counts, else a double.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    U64(u64),
    /// A gauge that may go below 0 (as a counter, below 0 is 0).
    I64(i64),
    F64(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::U64(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::I64(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::F64(v)
    }
}

/// A sample's labels, visited in order (the exposition's order; OTLP sorts its attributes).
pub trait LabelSet {
    /// Call `label` with each `(name, value)`; stop at its first error.
    fn visit(&self, label: &mut dyn FnMut(&str, &str) -> fmt::Result) -> fmt::Result;
}

impl<L: LabelSet + ?Sized> LabelSet for &L {
    fn visit(&self, label: &mut dyn FnMut(&str, &str) -> fmt::Result) -> fmt::Result {
        (**self).visit(label)
    }
}

/// No labels (an unlabelled series).
impl LabelSet for () {
    fn visit(&self, _: &mut dyn FnMut(&str, &str) -> fmt::Result) -> fmt::Result {
        Ok(())
    }
}

impl<K: AsRef<str>, V: AsRef<str>, const N: usize> LabelSet for [(K, V); N] {
    fn visit(&self, label: &mut dyn FnMut(&str, &str) -> fmt::Result) -> fmt::Result {
        self.iter().try_for_each(|(k, v)| label(k.as_ref(), v.as_ref()))
    }
}

impl<K: AsRef<str>, V: AsRef<str>> LabelSet for Vec<(K, V)> {
    fn visit(&self, label: &mut dyn FnMut(&str, &str) -> fmt::Result) -> fmt::Result {
        self.iter().try_for_each(|(k, v)| label(k.as_ref(), v.as_ref()))
    }
}

/// The labels of `A`, then those of `B`.
impl<A: LabelSet, B: LabelSet> LabelSet for (A, B) {
    fn visit(&self, label: &mut dyn FnMut(&str, &str) -> fmt::Result) -> fmt::Result {
        self.0.visit(label)?;
        self.1.visit(label)
    }
}

/// Takes one sample of a family.
pub type SampleSink<'s> = dyn FnMut(&dyn LabelSet, Value) -> fmt::Result + 's;

/// Where sources write their families: the text exposition ([`TextEncoder`]) or OTLP metrics.
pub trait MetricEncoder {
    /// One family: `samples` is called once and hands each sample to the sink it is given. A
    /// family's label sets are distinct, and no two families of one output share a name.
    fn family(
        &mut self,
        family: &Family<'_>,
        samples: &mut dyn FnMut(&mut SampleSink<'_>) -> fmt::Result,
    ) -> fmt::Result;
}

/// Writes families as the exposition, through prometheus-client's encoder (OpenMetrics or the
/// classic text format, whichever `encoder` writes).
pub(crate) struct TextEncoder<'a, 'b>(pub(crate) &'a mut DescriptorEncoder<'b>);

impl MetricEncoder for TextEncoder<'_, '_> {
    fn family(
        &mut self,
        family: &Family<'_>,
        samples: &mut dyn FnMut(&mut SampleSink<'_>) -> fmt::Result,
    ) -> fmt::Result {
        let unit = family.unit.map(Unit::prometheus);
        let ty = match family.kind {
            MetricKind::Gauge => MetricType::Gauge,
            MetricKind::Counter => MetricType::Counter,
        };
        let mut m = self.0.encode_descriptor(family.name, family.help, unit.as_ref(), ty)?;
        let kind = family.kind;
        samples(&mut |labels, value| {
            let labels = TextLabels(labels);
            let mut s = m.encode_family(&labels)?;
            match (kind, value) {
                (MetricKind::Gauge, Value::U64(v)) => s.encode_gauge(&v),
                (MetricKind::Gauge, Value::I64(v)) => s.encode_gauge(&v),
                (MetricKind::Gauge, Value::F64(v)) => s.encode_gauge(&v),
                (MetricKind::Counter, Value::U64(v)) => s.encode_counter::<NoLabelSet, _, u64>(&v, None),
                (MetricKind::Counter, Value::I64(v)) => {
                    s.encode_counter::<NoLabelSet, _, u64>(&u64::try_from(v).unwrap_or(0), None)
                }
                (MetricKind::Counter, Value::F64(v)) => s.encode_counter::<NoLabelSet, _, u64>(&v, None),
            }
        })
    }
}

/// A [`LabelSet`] as prometheus-client encodes labels (it escapes the values).
struct TextLabels<'a>(&'a dyn LabelSet);

impl EncodeLabelSet for TextLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> fmt::Result {
        self.0.visit(&mut |k, v| (k, v).encode(encoder.encode_label()))
    }
}
