//! What the OTLP exporter has sent and lost.
use serde::Serialize;

/// The OTLP exporter's counters (`export::otlp`), set on each snapshot while export is on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OtlpStats {
    /// The collector's URL.
    pub endpoint: String,
    /// `grpc` or `http/protobuf`.
    pub protocol: &'static str,
    /// Metric data points the collector accepted, and the requests that carried them.
    pub metric_points_exported: u64,
    pub metric_exports: u64,
    /// Metric exports (one snapshot each, sent in one or more requests) the collector took whole.
    pub metric_rounds: u64,
    /// Log records (events) the collector accepted, and the requests that carried them.
    pub log_records_exported: u64,
    pub log_exports: u64,
    /// Log batches sent again after a failure that may pass (the collector down or overloaded).
    pub log_retries: u64,
    /// Events that passed the kind filter and were offered to the queue.
    pub events_offered: u64,
    /// Events waiting in the queue, and its capacity.
    pub log_queue_len: usize,
    pub log_queue_capacity: usize,
    /// Items lost, by signal (`metrics`, `logs`) and reason (`queue_full`, `export_failed`,
    /// `timeout`, `shutdown`, `rejected`); every pair is listed, also at 0.
    pub dropped: Vec<OtlpDrop>,
    /// The latest export error, for people.
    pub last_error: Option<String>,
}

impl OtlpStats {
    /// All items dropped for `signal`.
    pub fn dropped_for(&self, signal: &str) -> u64 {
        self.dropped.iter().filter(|d| d.signal == signal).map(|d| d.count).sum()
    }
}

/// Items of one signal lost for one reason.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OtlpDrop {
    pub signal: &'static str,
    pub reason: &'static str,
    pub count: u64,
}
