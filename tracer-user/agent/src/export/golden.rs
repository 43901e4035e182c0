//! What leaves the agent, pinned: the Prometheus exposition (both formats), the OTLP metrics and
//! log records, the `gputracer.v1` snapshot and status messages, and every kind of event as
//! protobuf and JSON, each made from the same fixtures and compared with the files under
//! `golden/` (decoded: `gputracer.v1` messages as JSON with their map entries sorted, OTLP
//! messages as their `Debug` form with its timestamps zeroed and its metrics and points in a fixed
//! order).
//!
//! A code move must leave them byte for byte as they are. A change that means to change an output
//! rewrites them with `GOLDEN_UPDATE=1 cargo test -p <crate> golden`, and the diff of the files is
//! then part of the change for a reviewer to read.
use std::{path::PathBuf, sync::Arc};

use gpu_tracer_proto::v1;
use opentelemetry_proto::tonic::metrics::v1::{Metric, metric::Data};

use super::{
    metrics::{ExpositionFormat, MetricsRegistry, tests::sample_snapshot},
    otlp::{logs, metrics::MetricBuilder},
};
use tracer_core::model::{
    EventContext,
    probes::{KernelFeatures, ProbeReport},
};
use tracer_core::{
    fixtures::events,
    wire::{
        events::{to_json, to_proto},
        snapshot::{snapshot_from_proto, snapshot_to_proto, status_to_proto},
    },
};

/// A `gputracer.v1` message as pretty JSON; its protobuf maps (hash maps) come out sorted.
fn json(message: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(&serde_json::to_value(message).unwrap()).unwrap() + "\n"
}

fn golden_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/golden"))
}

/// `actual` is what `golden/<name>` holds, or (with `GOLDEN_UPDATE=1`) becomes it.
fn check(name: &str, actual: &str) {
    let path = golden_dir().join(name);
    if std::env::var_os("GOLDEN_UPDATE").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (GOLDEN_UPDATE=1 writes it)", path.display()));
    if expected != actual {
        let line = expected.lines().zip(actual.lines()).position(|(a, b)| a != b);
        let at = line.unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "{name} differs from {} at line {} (expected {:?}, got {:?}); if the change is meant, \
             rewrite it with GOLDEN_UPDATE=1 and read the diff",
            path.display(),
            at + 1,
            expected.lines().nth(at),
            actual.lines().nth(at)
        );
    }
}

/// The snapshot the outputs are made from: the Prometheus tests' sample, with a real container's
/// identity on one cgroup (as the OTLP tests use it).
fn snapshot() -> Arc<tracer_core::model::AgentSnapshot> {
    let mut snap = sample_snapshot();
    let id = snap.containers.get_mut(&12).unwrap();
    id.container_id = Some("b".repeat(64));
    id.pod_uid = Some("22222222-3333-4444-5555-666666666666".into());
    Arc::new(snap)
}

#[test]
fn metrics_exposition_is_unchanged() {
    let snap = snapshot();
    let registry = MetricsRegistry::new();
    check("metrics.openmetrics.txt", &registry.encode(&snap, ExpositionFormat::OpenMetrics).unwrap());
    check("metrics.prometheus.txt", &registry.encode(&snap, ExpositionFormat::Prometheus).unwrap());
}

/// OTLP metrics in a fixed order with their clock readings zeroed (the builder stamps them now).
fn normalized(mut metrics: Vec<Metric>) -> String {
    for m in &mut metrics {
        match m.data.as_mut() {
            Some(Data::Gauge(g)) => {
                for p in &mut g.data_points {
                    p.time_unix_nano = 0;
                    p.start_time_unix_nano = 0;
                }
                g.data_points.sort_by_key(|p| format!("{:?}", p.attributes));
            }
            Some(Data::Sum(s)) => {
                for p in &mut s.data_points {
                    p.time_unix_nano = 0;
                    p.start_time_unix_nano = 0;
                }
                s.data_points.sort_by_key(|p| format!("{:?}", p.attributes));
            }
            other => panic!("{}: a kind of OTLP metric the agent does not make: {other:?}", m.name),
        }
    }
    metrics.sort_by(|a, b| a.name.cmp(&b.name));
    format!("{metrics:#?}\n")
}

#[test]
fn otlp_metrics_are_unchanged() {
    let metrics = MetricBuilder::new(MetricsRegistry::new(), 20_000).all(&snapshot());
    check("otlp_metrics.txt", &normalized(metrics));
}

#[test]
fn snapshot_and_status_messages_are_unchanged() {
    let snap = snapshot();
    let message = snapshot_to_proto(&snap, 1_790_000_000_000_000_000);
    check("snapshot.proto.json", &json(&message));
    // What a client reads back from it.
    let back = snapshot_from_proto(message).unwrap();
    check("snapshot.read_back.json", &(serde_json::to_string_pretty(&back).unwrap() + "\n"));
    // Detected from this machine's kernel: not the same everywhere.
    let report = ProbeReport::nvml_only(KernelFeatures {
        release: "6.1.0-golden".into(),
        btf: true,
        tracefs: true,
        syscall_tracepoints: true,
        driver_entry_detail: "no nvidia module".into(),
        ..Default::default()
    });
    let status = status_to_proto(&snap, &report, "0.0.0-golden", 1_790_000_000_000_000_000);
    check("status.proto.json", &json(&status));
}

#[test]
fn events_are_unchanged() {
    let ctx = EventContext {
        wall_time_unix_ns: 1_790_000_000_000_000_000,
        process_start_time_ns: 99_000_000,
        cgroup_path: Some("/kubepods.slice/kubepods-pod1234.slice/cri-containerd-abc.scope".into()),
        comm: Some("python3".into()),
        released_bytes: Some(2 << 20),
        kernel_name: Some("sgemm_kernel".into()),
        container: snapshot().containers.get(&12).cloned().map(Arc::new),
    };
    let messages: Vec<v1::Event> = events().iter().map(|e| to_proto(e, &ctx)).collect();
    check("events.proto.json", &json(&messages));
    let lines: String = messages.iter().map(|m| to_json(m).to_string() + "\n").collect();
    check("events.jsonl", &lines);
    let records: Vec<_> = messages.iter().map(|m| logs::record(m, 1_790_000_000_500_000_000)).collect();
    check("otlp_logs.txt", &format!("{records:#?}\n"));
}
