//! The last pipeline stage: what leaves the tracer.
//!
//! - [`api`]: the agent's gRPC API (Subscribe, GetSnapshot, GetStatus), server and conversions.
//! - [`attribution_table`]: the attribution snapshot as per-GPU tables that add up.
//! - [`cost`]: the bill split per namespace, label, pod or node (`gpu-tracer cost`), from an
//!   agent or from Prometheus for a fleet.
//! - [`events`]: decoded events as the versioned `gputracer.v1` protobuf schema, written as a
//!   length-delimited stream or as JSON lines (`gpu-tracer events`).
//! - [`metrics`]: a snapshot as Prometheus / OpenMetrics text (`docs/metrics.md`).
//! - [`otlp`]: metrics and events over OTLP (gRPC or HTTP/protobuf) to an OpenTelemetry collector.
//! - [`table`]: the compact table style shared by the people-facing outputs.
//! - [`http`]: the agent's `/metrics`, `/healthz` and `/readyz` server.
pub mod api;
pub mod attribution_table;
pub mod cost;
pub mod events;
#[cfg(test)]
mod golden;
pub mod http;
pub mod metrics;
pub mod otlp;
pub mod table;
pub mod top;
