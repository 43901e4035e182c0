//! Events as OTLP log records: `event.name` is `gputracer.<kind>` (`gputracer.violation`),
//! violations are WARN and everything else INFO, the timestamp is the event's wall time, and the
//! attributes are the event's fields (the JSON form of `export::events`), with the container's
//! identity under the OpenTelemetry semantic-convention keys (`k8s.namespace.name`,
//! `k8s.pod.name`, `k8s.pod.uid`, `k8s.container.name`, `container.id`) and the process under
//! `process.pid`; every other field is `gputracer.<field>`.
use std::sync::OnceLock;

use gpu_tracer_proto::v1::{self, EventKind};
use opentelemetry_proto::tonic::{
    common::v1::{AnyValue, ArrayValue, KeyValue, KeyValueList, any_value::Value as V},
    logs::v1::{LogRecord, SeverityNumber},
};
use serde_json::Value;

use tracer_core::config::otlp::event_kind_name;

/// `gputracer.<kind>` for an `EventKind` value (`gputracer.unknown` for one this build does not
/// know).
pub fn event_name(kind: i32) -> &'static str {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        (0..)
            .map_while(|v| EventKind::try_from(v).ok())
            .map(|k| &*Box::leak(format!("gputracer.{}", event_kind_name(k)).into_boxed_str()))
            .collect()
    });
    usize::try_from(kind).ok().and_then(|i| names.get(i).copied()).unwrap_or("gputracer.unknown")
}

/// `ev` as a log record observed at `observed_unix_ns`.
pub fn record(ev: &v1::Event, observed_unix_ns: u64) -> LogRecord {
    let h = ev.header.as_ref();
    let kind = h.map_or(0, |h| h.kind);
    let name = event_name(kind);
    let (severity, text) = if kind == EventKind::Violation as i32 {
        (SeverityNumber::Warn, "WARN")
    } else {
        (SeverityNumber::Info, "INFO")
    };
    let mut rec = LogRecord {
        time_unix_nano: h.map_or(0, |h| h.wall_time_unix_ns),
        observed_time_unix_nano: observed_unix_ns,
        severity_number: severity as i32,
        severity_text: text.to_owned(),
        body: Some(AnyValue { value: Some(V::StringValue(name.trim_start_matches("gputracer.").to_owned())) }),
        event_name: name.to_owned(),
        ..Default::default()
    };
    let Value::Object(mut fields) = tracer_core::wire::events::to_json(ev) else { return rec };
    let attrs = &mut rec.attributes;
    // The container's identity from the header. (In the JSON form a violation's own `container`,
    // the container's name, takes the header's `container` key: read the header itself.)
    let header_container = h.and_then(|h| h.container.clone()).map(|c| v1::Event {
        header: Some(v1::Header { container: Some(c), ..Default::default() }),
        ..Default::default()
    });
    let identity = header_container.map(|e| tracer_core::wire::events::to_json(&e)["container"].take());
    if let Some(Value::Object(c)) = identity {
        for (ck, cv) in c {
            let key = match ck.as_str() {
                "namespace" => "k8s.namespace.name".to_owned(),
                "pod" => "k8s.pod.name".to_owned(),
                "pod_uid" => "k8s.pod.uid".to_owned(),
                "container" => "k8s.container.name".to_owned(),
                "container_id" => "container.id".to_owned(),
                "runtime" => "container.runtime".to_owned(),
                other => format!("gputracer.container.{other}"),
            };
            add(attrs, key, cv);
        }
    }
    if matches!(fields.get("container"), Some(Value::Object(_))) {
        fields.remove("container");
    }
    for (k, v) in fields {
        // A violation names the pod in its payload too: under the same keys, unless the header
        // already gave them (the same values).
        let identity = match k.as_str() {
            "namespace" => Some("k8s.namespace.name"),
            "pod" => Some("k8s.pod.name"),
            "container" => Some("k8s.container.name"),
            _ => None,
        };
        match (k.as_str(), identity) {
            ("kind" | "cgroup_path", _) => {}
            (_, Some(key)) => {
                if !attrs.iter().any(|a| a.key == key) {
                    add(attrs, key.to_owned(), v);
                }
            }
            ("tgid", _) => add(attrs, "process.pid".to_owned(), v),
            _ => add(attrs, format!("gputracer.{k}"), v),
        }
    }
    rec
}

fn add(attrs: &mut Vec<KeyValue>, key: String, v: Value) {
    if let Some(value) = any_value(v) {
        attrs.push(KeyValue { key, value: Some(AnyValue { value: Some(value) }) });
    }
}

/// JSON → `AnyValue`; nulls and empty strings are left out. Integers past `i64` (never in practice:
/// the JSON form writes 64-bit ids as strings) become strings rather than lose precision.
fn any_value(v: Value) -> Option<V> {
    Some(match v {
        Value::Null => return None,
        Value::Bool(b) => V::BoolValue(b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => V::IntValue(i),
            (None, Some(u)) => V::StringValue(u.to_string()),
            _ => V::DoubleValue(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) if s.is_empty() => return None,
        Value::String(s) => V::StringValue(s),
        Value::Array(a) => V::ArrayValue(ArrayValue {
            values: a.into_iter().filter_map(any_value).map(|v| AnyValue { value: Some(v) }).collect(),
        }),
        Value::Object(o) => V::KvlistValue(KeyValueList {
            values: o
                .into_iter()
                .filter_map(|(key, v)| Some(KeyValue { key, value: Some(AnyValue { value: Some(any_value(v)?) }) }))
                .collect(),
        }),
    })
}
