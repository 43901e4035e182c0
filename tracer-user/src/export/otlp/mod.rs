//! OTLP export of the agent's metrics and events (`docs/otlp.md`).
//!
//! One thread (`otlp-export`, its own current-thread tokio runtime) does all the work; the agent
//! loop only hands things over and never waits:
//!
//! - [`OtlpExporter::publish`] swaps in the latest snapshot (one pointer under a short lock). Every
//!   `metric_export_interval` the thread builds a [`metrics::MetricView`] of the latest snapshot,
//!   the SDK's observable instruments read it while a `ManualReader` collects, and the
//!   `opentelemetry-otlp` exporter sends the result (cumulative temporality).
//! - [`OtlpExporter::offer_event`] keeps the configured event kinds and puts a copy on a bounded
//!   queue (`try_send`: a full queue is a counted drop). The thread batches the queue into log
//!   records ([`logs`]) and sends a batch when it is full or every `log_export_interval`.
//!
//! Nothing is retried and nothing is kept for later: a request that fails or times out is counted
//! as dropped with the number of items it carried (metrics are cumulative, so the next export
//! carries the same totals), and memory stays bounded by the queue and one batch whatever the
//! collector does. The counts are [`OtlpExporter::stats`] (`model::OtlpStats`, in each snapshot and
//! in `/metrics` as `gpu_tracer_otlp_*`). The SDK's own periodic reader and batch processors are
//! not used: they drop silently and run their exports on threads without a tokio runtime.
//!
//! Files: `settings.rs` (config section, environment, flags), `transport.rs` (the exporters per
//! protocol), `metrics.rs` (the metric view and instruments), `logs.rs` (events as log records).
pub mod logs;
pub mod metrics;
pub mod settings;
#[cfg(test)]
mod tests;
mod transport;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use gpu_tracer_proto::v1;
use opentelemetry::{
    InstrumentationScope, KeyValue,
    logs::{Logger as _, LoggerProvider as _},
    metrics::MeterProvider as _,
};
use opentelemetry_sdk::{
    Resource,
    logs::{LogBatch, LogExporter as _, SdkLogRecord, SdkLoggerProvider},
    metrics::{
        ManualReader, Pipeline, SdkMeterProvider, Stream, Temporality,
        data::{AggregatedMetrics, MetricData, ResourceMetrics},
        exporter::PushMetricExporter as _,
        reader::MetricReader,
    },
};
use tokio::sync::{mpsc, oneshot};

pub use self::settings::{OtlpConfig, OtlpFlags, OtlpProtocol, OtlpSettingError, OtlpSettings};
use self::{metrics::Instruments, transport::Transport};
use crate::{
    export::metrics::MetricsRegistry,
    model::{AgentSnapshot, OtlpDrop, OtlpStats},
};

/// The signals, as the `signal` label.
pub const SIGNALS: [&str; 2] = ["metrics", "logs"];
/// Why items were dropped, as the `reason` label: the event queue was full, the collector refused
/// or could not be reached, the request took longer than the timeout, or the agent stopped with
/// items still queued.
pub const DROP_REASONS: [&str; 4] = ["queue_full", "export_failed", "timeout", "shutdown"];

const METRICS: usize = 0;
const LOGS: usize = 1;
const QUEUE_FULL: usize = 0;
const EXPORT_FAILED: usize = 1;
const TIMEOUT: usize = 2;
const SHUTDOWN: usize = 3;

/// Errors starting the exporter.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error(transparent)]
    Setting(#[from] OtlpSettingError),
    #[error("cannot start the OTLP export thread: {0}")]
    Thread(#[source] std::io::Error),
}

impl OtlpError {
    /// A short reason for a metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            OtlpError::Setting(_) => "invalid_setting",
            OtlpError::Thread(_) => "thread",
        }
    }
}

/// Who is exporting: the resource's attributes besides the service's own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceInfo {
    /// `host.name`.
    pub host_name: Option<String>,
    /// `k8s.node.name`.
    pub node_name: Option<String>,
}

impl ResourceInfo {
    /// This host's name, and the node name: `configured` (`kubernetes.node_name`), else
    /// `$NODE_NAME` (the chart sets it from `spec.nodeName`).
    pub fn detect(configured: Option<&str>) -> ResourceInfo {
        let node_name =
            configured.map(str::to_owned).or_else(|| std::env::var("NODE_NAME").ok()).filter(|n| !n.is_empty());
        let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty());
        ResourceInfo { host_name, node_name }
    }

    /// The OpenTelemetry resource: `service.name=gpu-tracer`, `service.version`, `host.name`,
    /// `k8s.node.name`, then the configured attributes (which may override any of them).
    pub fn resource(&self, extra: &std::collections::BTreeMap<String, String>) -> Resource {
        let mut attrs = vec![
            KeyValue::new("service.name", "gpu-tracer"),
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        ];
        attrs.extend(self.host_name.clone().map(|h| KeyValue::new("host.name", h)));
        attrs.extend(self.node_name.clone().map(|n| KeyValue::new("k8s.node.name", n)));
        attrs.extend(extra.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())));
        Resource::builder_empty().with_attributes(attrs).build()
    }
}

/// The counters shared by the agent's side and the export thread.
#[derive(Debug, Default)]
struct Counters {
    metric_points_exported: AtomicU64,
    metric_exports: AtomicU64,
    log_records_exported: AtomicU64,
    log_exports: AtomicU64,
    events_offered: AtomicU64,
    dropped: [[AtomicU64; DROP_REASONS.len()]; SIGNALS.len()],
    last_error: Mutex<Option<String>>,
}

impl Counters {
    fn lost(&self, signal: usize, reason: usize, n: u64) {
        self.dropped[signal][reason].fetch_add(n, Ordering::Relaxed);
    }

    fn error(&self, e: String) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }
}

/// The OTLP exporter of a running agent (see the module documentation).
pub struct OtlpExporter {
    latest: Arc<Mutex<Option<Arc<AgentSnapshot>>>>,
    events: mpsc::Sender<v1::Event>,
    kinds: std::collections::BTreeSet<i32>,
    filters: crate::export::api::filter::Filters,
    counters: Arc<Counters>,
    stop: Option<oneshot::Sender<Instant>>,
    done: std::sync::mpsc::Receiver<()>,
    thread: Option<std::thread::JoinHandle<()>>,
    endpoint: String,
    protocol: OtlpProtocol,
    queue_capacity: usize,
}

impl std::fmt::Debug for OtlpExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpExporter").field("endpoint", &self.endpoint).finish_non_exhaustive()
    }
}

impl OtlpExporter {
    /// Start exporting with `settings` (`None`: export is off, and so is this). Nothing connects
    /// yet: a collector that is not there costs counted drops later, not an error now.
    pub fn start(settings: Option<OtlpSettings>, who: &ResourceInfo) -> Result<Option<OtlpExporter>, OtlpError> {
        let Some(settings) = settings else { return Ok(None) };
        let resource = who.resource(&settings.resource_attributes);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(OtlpError::Thread)?;
        let transport = {
            let _in_runtime = rt.enter();
            Transport::build(&settings, &resource)?
        };
        let reader = SharedReader(Arc::new(ManualReader::builder().with_temporality(Temporality::Cumulative).build()));
        let limit = settings.max_series_per_metric;
        let provider = SdkMeterProvider::builder()
            .with_resource(resource.clone())
            .with_reader(reader.clone())
            .with_view(move |_: &opentelemetry_sdk::metrics::Instrument| {
                Stream::builder().with_cardinality_limit(limit).build().ok()
            })
            .build();
        let scope = InstrumentationScope::builder("gpu-tracer").with_version(env!("CARGO_PKG_VERSION")).build();
        let meter = provider.meter_with_scope(scope.clone());
        let loggers = SdkLoggerProvider::builder().with_resource(resource).build();
        let counters = Arc::new(Counters::default());
        let latest: Arc<Mutex<Option<Arc<AgentSnapshot>>>> = Arc::default();
        let (tx, rx) = mpsc::channel(settings.log_queue);
        let (stop_tx, stop_rx) = oneshot::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let worker = Worker {
            settings: settings.clone(),
            transport,
            reader,
            _provider: provider,
            instruments: Instruments::new(meter),
            logger: loggers.logger_with_scope(scope.clone()),
            _loggers: loggers,
            scope,
            registry: MetricsRegistry::new(),
            latest: Arc::clone(&latest),
            counters: Arc::clone(&counters),
        };
        let thread = std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                rt.block_on(worker.run(rx, stop_rx));
                let _ = done_tx.send(());
            })
            .map_err(OtlpError::Thread)?;
        tracing::info!(endpoint = %settings.endpoint, from = settings.endpoint_source, protocol = settings.protocol.as_str(), "OTLP export on");
        Ok(Some(OtlpExporter {
            latest,
            events: tx,
            kinds: settings.event_kinds.clone(),
            filters: settings.filters.clone(),
            counters,
            stop: Some(stop_tx),
            done: done_rx,
            thread: Some(thread),
            endpoint: settings.endpoint,
            protocol: settings.protocol,
            queue_capacity: settings.log_queue,
        }))
    }

    /// The snapshot the next metric export reports (called once per interval; never waits on
    /// the export).
    pub fn publish(&self, snapshot: Arc<AgentSnapshot>) {
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = Some(snapshot);
    }

    /// Queue `ev` as a log record if its kind is exported; a full queue drops it (counted).
    pub fn offer_event(&self, ev: &v1::Event) {
        if !self.wants(ev.header.as_ref().map_or(0, |h| h.kind)) || !self.filters.matches(ev) {
            return;
        }
        self.counters.events_offered.fetch_add(1, Ordering::Relaxed);
        match self.events.try_send(ev.clone()) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => self.counters.lost(LOGS, QUEUE_FULL, 1),
            Err(mpsc::error::TrySendError::Closed(_)) => self.counters.lost(LOGS, SHUTDOWN, 1),
        }
    }

    /// Is an event of this `EventKind` exported? (Lets a caller skip building the message.)
    pub fn wants(&self, kind: i32) -> bool {
        self.kinds.contains(&kind)
    }

    /// What was sent and lost so far.
    pub fn stats(&self) -> OtlpStats {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut dropped = Vec::with_capacity(SIGNALS.len() * DROP_REASONS.len());
        for (si, signal) in SIGNALS.iter().enumerate() {
            for (ri, reason) in DROP_REASONS.iter().enumerate() {
                dropped.push(OtlpDrop { signal, reason, count: load(&c.dropped[si][ri]) });
            }
        }
        OtlpStats {
            endpoint: self.endpoint.clone(),
            protocol: self.protocol.as_str(),
            metric_points_exported: load(&c.metric_points_exported),
            metric_exports: load(&c.metric_exports),
            log_records_exported: load(&c.log_records_exported),
            log_exports: load(&c.log_exports),
            events_offered: load(&c.events_offered),
            log_queue_len: self.queue_capacity - self.events.capacity(),
            log_queue_capacity: self.queue_capacity,
            dropped,
            last_error: c.last_error.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }

    /// Export the latest snapshot's metrics and the queued events once more, spending at most
    /// `deadline`; what is still queued then is counted as dropped (`shutdown`). Returns the final
    /// counts.
    pub fn shutdown(mut self, deadline: Duration) -> OtlpStats {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(Instant::now() + deadline);
        }
        // The thread keeps to the deadline; a little more for it to notice, then leave it behind.
        if self.done.recv_timeout(deadline + Duration::from_millis(500)).is_ok()
            && let Some(t) = self.thread.take()
        {
            let _ = t.join();
        }
        self.stats()
    }
}

/// The `ManualReader`, shared between the provider (which registers it) and the export thread
/// (which collects through it).
#[derive(Clone, Debug)]
struct SharedReader(Arc<ManualReader>);

impl MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: std::sync::Weak<Pipeline>) {
        self.0.register_pipeline(pipeline)
    }
    fn collect(&self, rm: &mut ResourceMetrics) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.collect(rm)
    }
    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }
    fn temporality(&self, kind: opentelemetry_sdk::metrics::InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}

/// Data points in a collection.
pub fn count_points(rm: &ResourceMetrics) -> u64 {
    fn n<T>(d: &MetricData<T>) -> usize {
        match d {
            MetricData::Gauge(g) => g.data_points().count(),
            MetricData::Sum(s) => s.data_points().count(),
            MetricData::Histogram(h) => h.data_points().count(),
            MetricData::ExponentialHistogram(h) => h.data_points().count(),
        }
    }
    rm.scope_metrics()
        .flat_map(|s| s.metrics())
        .map(|m| match m.data() {
            AggregatedMetrics::F64(d) => n(d),
            AggregatedMetrics::U64(d) => n(d),
            AggregatedMetrics::I64(d) => n(d),
        } as u64)
        .sum()
}

/// The export thread's state.
struct Worker {
    settings: OtlpSettings,
    transport: Transport,
    reader: SharedReader,
    _provider: SdkMeterProvider,
    instruments: Instruments,
    logger: opentelemetry_sdk::logs::SdkLogger,
    _loggers: SdkLoggerProvider,
    scope: InstrumentationScope,
    registry: MetricsRegistry,
    latest: Arc<Mutex<Option<Arc<AgentSnapshot>>>>,
    counters: Arc<Counters>,
}

impl Worker {
    async fn run(mut self, mut rx: mpsc::Receiver<v1::Event>, mut stop: oneshot::Receiver<Instant>) {
        let start = tokio::time::Instant::now();
        let mut metric_tick = tokio::time::interval_at(
            start + self.settings.metric_export_interval,
            self.settings.metric_export_interval,
        );
        metric_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut log_tick =
            tokio::time::interval_at(start + self.settings.log_export_interval, self.settings.log_export_interval);
        log_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let batch = self.settings.log_batch;
        let mut buf: Vec<v1::Event> = Vec::with_capacity(batch);
        let deadline = loop {
            let room = batch - buf.len();
            tokio::select! {
                d = &mut stop => break d.unwrap_or_else(|_| Instant::now() + self.settings.timeout),
                _ = metric_tick.tick() => self.export_metrics(None).await,
                n = rx.recv_many(&mut buf, room), if room > 0 => {
                    if n == 0 {
                        // Every sender is gone: the exporter was dropped without `shutdown`.
                        break Instant::now() + self.settings.timeout;
                    }
                    if buf.len() >= batch {
                        self.export_logs(&mut buf, None).await;
                    }
                }
                _ = log_tick.tick() => {
                    if !buf.is_empty() {
                        self.export_logs(&mut buf, None).await;
                    }
                }
            }
        };
        rx.close();
        self.export_metrics(Some(deadline)).await;
        loop {
            while buf.len() < batch {
                match rx.try_recv() {
                    Ok(ev) => buf.push(ev),
                    Err(_) => break,
                }
            }
            if buf.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                let mut left = buf.len() as u64;
                while rx.try_recv().is_ok() {
                    left += 1;
                }
                self.counters.lost(LOGS, SHUTDOWN, left);
                break;
            }
            self.export_logs(&mut buf, Some(deadline)).await;
        }
    }

    /// How long the next request may take.
    fn budget(&self, deadline: Option<Instant>) -> Duration {
        let t = self.settings.timeout;
        deadline.map_or(t, |d| t.min(d.saturating_duration_since(Instant::now())))
    }

    /// Collect the latest snapshot's metrics and send them.
    async fn export_metrics(&mut self, deadline: Option<Instant>) {
        let Some(snapshot) = self.latest.lock().unwrap_or_else(|e| e.into_inner()).clone() else { return };
        self.instruments.set(metrics::MetricView::build(&snapshot, &self.registry));
        let mut rm = ResourceMetrics::default();
        if let Err(e) = self.reader.collect(&mut rm) {
            self.counters.error(format!("collecting metrics: {e}"));
            return;
        }
        let points = count_points(&rm);
        let budget = self.budget(deadline);
        match tokio::time::timeout(budget, self.transport.metrics.export(&rm)).await {
            Ok(Ok(())) => {
                self.counters.metric_points_exported.fetch_add(points, Ordering::Relaxed);
                self.counters.metric_exports.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(e)) => {
                self.counters.lost(METRICS, EXPORT_FAILED, points);
                self.counters.error(format!("metrics: {e}"));
            }
            Err(_) => {
                self.counters.lost(METRICS, TIMEOUT, points);
                self.counters.error(format!("metrics: no answer within {budget:?}"));
            }
        }
    }

    /// Send `buf` as one batch of log records and empty it.
    async fn export_logs(&mut self, buf: &mut Vec<v1::Event>, deadline: Option<Instant>) {
        let records: Vec<SdkLogRecord> = buf
            .drain(..)
            .map(|ev| {
                let mut r = self.logger.create_log_record();
                logs::fill_record(&mut r, &ev);
                r
            })
            .collect();
        let n = records.len() as u64;
        let refs: Vec<(&SdkLogRecord, &InstrumentationScope)> = records.iter().map(|r| (r, &self.scope)).collect();
        let budget = self.budget(deadline);
        match tokio::time::timeout(budget, self.transport.logs.export(LogBatch::new(&refs))).await {
            Ok(Ok(())) => {
                self.counters.log_records_exported.fetch_add(n, Ordering::Relaxed);
                self.counters.log_exports.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(e)) => {
                self.counters.lost(LOGS, EXPORT_FAILED, n);
                self.counters.error(format!("logs: {e}"));
            }
            Err(_) => {
                self.counters.lost(LOGS, TIMEOUT, n);
                self.counters.error(format!("logs: no answer within {budget:?}"));
            }
        }
    }
}
