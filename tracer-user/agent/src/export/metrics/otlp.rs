//! The OTLP exporter's own accounting (`otlp_*`): what it sent, what it lost and why, and its
//! event queue. Nothing when OTLP export is off.
use std::fmt;

use super::{MetricEncoder, Scrape, counter, counter_family, gauge};

/// `otlp_exported_total{signal}`, `otlp_dropped_total{signal,reason}` (every pair, also at 0) and
/// the event queue's length and capacity.
pub fn otlp(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    let Some(o) = &s.snapshot.otlp else {
        return Ok(());
    };
    counter_family(
        e,
        "otlp_exported",
        "Items the OTLP collector accepted, by signal (metrics: data points; logs: events).",
        None,
        [([("signal", "metrics")], o.metric_points_exported), ([("signal", "logs")], o.log_records_exported)],
    )?;
    counter_family(
        e,
        "otlp_dropped",
        "Items lost on the way to the OTLP collector, by signal and reason (queue_full, export_failed, timeout, shutdown, rejected).",
        None,
        o.dropped.iter().map(|d| ([("signal", d.signal), ("reason", d.reason)], d.count)),
    )?;
    counter(
        e,
        "otlp_log_retries",
        "Batches of log records sent again after a failure that may pass (collector down, overloaded or slow).",
        None,
        o.log_retries,
    )?;
    gauge(e, "otlp_log_queue_length", "Events waiting for OTLP export.", None, o.log_queue_len as u64)?;
    gauge(e, "otlp_log_queue_capacity", "Events the OTLP queue holds at most.", None, o.log_queue_capacity as u64)
}
