//! Events as OTLP log records: `event.name` is `gputracer.<kind>` (`gputracer.violation`),
//! violations are WARN and everything else INFO, the timestamp is the event's wall time, and the
//! attributes are the event's fields (the JSON form of `export::events`), with the container's
//! identity under the OpenTelemetry semantic-convention keys (`k8s.namespace.name`,
//! `k8s.pod.name`, `k8s.pod.uid`, `k8s.container.name`, `container.id`) and the process under
//! `process.pid`; every other field is `gputracer.<field>`.
use std::{
    sync::OnceLock,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use gpu_tracer_proto::v1::{self, EventKind};
use opentelemetry::{
    Key,
    logs::{AnyValue, LogRecord as _, Severity},
};
use opentelemetry_sdk::logs::SdkLogRecord;
use serde_json::Value;

use super::settings::event_kind_name;

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

/// Write `ev` into a fresh log record.
pub fn fill_record(rec: &mut SdkLogRecord, ev: &v1::Event) {
    let h = ev.header.as_ref();
    let kind = h.map_or(0, |h| h.kind);
    let name = event_name(kind);
    rec.set_event_name(name);
    if let Some(ns) = h.map(|h| h.wall_time_unix_ns).filter(|ns| *ns > 0) {
        rec.set_timestamp(UNIX_EPOCH + Duration::from_nanos(ns));
    }
    rec.set_observed_timestamp(SystemTime::now());
    if kind == EventKind::Violation as i32 {
        rec.set_severity_number(Severity::Warn);
        rec.set_severity_text("WARN");
    } else {
        rec.set_severity_number(Severity::Info);
        rec.set_severity_text("INFO");
    }
    rec.set_body(AnyValue::from(name.trim_start_matches("gputracer.").to_owned()));
    let Value::Object(fields) = crate::export::events::to_json(ev) else { return };
    for (k, v) in fields {
        match k.as_str() {
            "kind" | "cgroup_path" => {}
            "container" => {
                if let Value::Object(c) = v {
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
                        add(rec, key, cv);
                    }
                }
            }
            "tgid" => add(rec, "process.pid".to_owned(), v),
            _ => add(rec, format!("gputracer.{k}"), v),
        }
    }
}

fn add(rec: &mut SdkLogRecord, key: String, v: Value) {
    if let Some(a) = any_value(v) {
        rec.add_attribute(Key::new(key), a);
    }
}

/// JSON → `AnyValue`; nulls and empty strings are left out.
fn any_value(v: Value) -> Option<AnyValue> {
    Some(match v {
        Value::Null => return None,
        Value::Bool(b) => AnyValue::Boolean(b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => AnyValue::Int(i),
            (None, Some(u)) => AnyValue::String(u.to_string().into()),
            _ => AnyValue::Double(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) if s.is_empty() => return None,
        Value::String(s) => AnyValue::String(s.into()),
        Value::Array(a) => AnyValue::ListAny(Box::new(a.into_iter().filter_map(any_value).collect())),
        Value::Object(o) => {
            AnyValue::Map(Box::new(o.into_iter().filter_map(|(k, v)| Some((Key::new(k), any_value(v)?))).collect()))
        }
    })
}
