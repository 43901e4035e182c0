//! The last pipeline stage: what leaves the agent.
//!
//! - [`api`]: the agent's gRPC API (Subscribe, GetSnapshot, GetStatus, Profile): the server.
//! - [`metrics`]: a snapshot as Prometheus / OpenMetrics text (`docs/metrics.md`).
//! - [`otlp`]: metrics and events over OTLP (gRPC or HTTP/protobuf) to an OpenTelemetry collector.
//! - [`http`]: the agent's `/metrics`, `/healthz` and `/readyz` server.
//! - [`stream`]: launch batches and violations as events, for the hub, OTLP and `events`.
pub mod api;
#[cfg(test)]
mod golden;
pub mod http;
pub mod metrics;
pub mod otlp;
pub mod stream;

/// A [`BillWriter`](tracer_core::cost::bill::BillWriter) for this process: the node from `kubernetes.node_name`,
/// `$NODE_NAME` or the host name, and the process's start time (as `process_start_time_seconds`
/// says it).
pub fn bill_writer_for_this_process(configured_node: Option<&str>) -> tracer_core::cost::bill::BillWriter {
    let info = otlp::ResourceInfo::detect(configured_node);
    let node = info.node_name.or(info.host_name).unwrap_or_else(|| "(unknown node)".into());
    let start = metrics::ProcessStats::of_self().map(|p| (p.start_time_seconds * 1e9) as u64).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
    });
    tracer_core::cost::bill::BillWriter::new(node, start)
}
