//! OTLP export of the agent's metrics and events (`docs/otlp.md`).
//!
//! One thread (`otlp-export`, its own current-thread tokio runtime) does all the work; the agent
//! loop only hands things over and never waits:
//!
//! - [`OtlpExporter::publish`] swaps in the latest snapshot (one pointer under a short lock). Every
//!   `metric_export_interval` the thread turns the latest snapshot into OTLP metrics one part at a
//!   time ([`metrics::MetricBuilder`]) and sends them in requests of at most
//!   [`metrics::MAX_POINTS_PER_REQUEST`] points (cumulative temporality).
//! - [`OtlpExporter::offer_encoded`] (or [`offer_event`](OtlpExporter::offer_event)) puts an
//!   event the exporter [`accepts`](OtlpExporter::accepts) on a bounded queue as its encoding —
//!   the same bytes the API's subscribers get, shared, not a copy of the message (`try_send`: a
//!   full queue is a counted drop). The thread decodes and batches the queue into log records
//!   ([`logs`]) and sends a batch when it is full or every `log_export_interval`.
//!
//! The metric requests are written as protobuf bytes ([`wire`], from the typed families of
//! `/metrics` in [`metrics`]); the log requests are `opentelemetry-proto` messages; both are sent
//! by [`transport`] (gRPC through tonic, or HTTP/protobuf through hyper; rustls for `https://`). The
//! OpenTelemetry SDK is not used: its observable instruments and aggregation cost about 0.4 s of
//! CPU per export at 8 GPUs × 100 containers (`docs/benchmarks.md` §9, before), and its
//! periodic reader and batch processors drop silently.
//!
//! Metrics are never sent again: a request that fails or times out is counted as dropped with its
//! points (they are cumulative: the next export carries the same totals). A batch of log records
//! whose failure may pass (the collector down, overloaded, or slow) is kept and sent again at the
//! next log tick, [`LOG_ATTEMPTS`] times in all, then counted as dropped; meanwhile new events
//! wait in the bounded queue. Items a collector accepts but rejects (`partial_success`) are counted
//! as `rejected`. Memory stays bounded by the queue, one batch and one request whatever the
//! collector does. The counts are [`OtlpExporter::stats`] (`model::OtlpStats`, in each snapshot
//! and in `/metrics` as `gpu_tracer_otlp_*`).
//!
//! Files: `transport.rs` (sending per protocol), `metrics.rs` (snapshot → metrics), `wire.rs`
//! (metrics → request bytes), `logs.rs` (events → log records).
pub mod logs;
pub mod metrics;
pub mod names;
#[cfg(test)]
mod tests;
mod transport;
pub mod wire;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use gpu_tracer_proto::{EncodedSubscribeResponse, v1};
use opentelemetry_proto::tonic::{
    collector::logs::v1::ExportLogsServiceRequest,
    common::v1::InstrumentationScope,
    logs::v1::{ResourceLogs, ScopeLogs},
    resource::v1::Resource,
};
use tokio::sync::{mpsc, oneshot};

use self::{
    metrics::{IdentityIndex, MAX_POINTS_PER_REQUEST, MetricBuilder, kv, unix_ns_now},
    transport::{Accepted, SendError, Transport},
    wire::RequestWriter,
};
use crate::export::metrics::MetricsRegistry;
pub use tracer_core::config::otlp::{OtlpConfig, OtlpFlags, OtlpProtocol, OtlpSettingError, OtlpSettings};
use tracer_core::model::{AgentSnapshot, OtlpDrop, OtlpStats};

/// The signals, as the `signal` label.
pub const SIGNALS: [&str; 2] = ["metrics", "logs"];
/// Why items were dropped, as the `reason` label: the event queue was full, the collector refused
/// or could not be reached, the request took longer than the timeout, the agent stopped with
/// items still queued, or the collector took the request but rejected these items
/// (`partial_success`).
pub const DROP_REASONS: [&str; 5] = ["queue_full", "export_failed", "timeout", "shutdown", "rejected"];

const METRICS: usize = 0;
const LOGS: usize = 1;
const QUEUE_FULL: usize = 0;
const EXPORT_FAILED: usize = 1;
const TIMEOUT: usize = 2;
const SHUTDOWN: usize = 3;
const REJECTED: usize = 4;

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
        let mut attrs: std::collections::BTreeMap<String, String> = [
            ("service.name".to_owned(), "gpu-tracer".to_owned()),
            ("service.version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
        ]
        .into();
        attrs.extend(self.host_name.clone().map(|h| ("host.name".to_owned(), h)));
        attrs.extend(self.node_name.clone().map(|n| ("k8s.node.name".to_owned(), n)));
        attrs.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        Resource { attributes: attrs.into_iter().map(|(k, v)| kv(k, v)).collect(), ..Default::default() }
    }
}

/// The counters shared by the agent's side and the export thread.
#[derive(Debug, Default)]
struct Counters {
    metric_points_exported: AtomicU64,
    metric_exports: AtomicU64,
    metric_rounds: AtomicU64,
    log_records_exported: AtomicU64,
    log_exports: AtomicU64,
    log_retries: AtomicU64,
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
    events: mpsc::Sender<EncodedSubscribeResponse>,
    kinds: std::collections::BTreeSet<i32>,
    filters: tracer_core::filter::Filters,
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
    /// Check `settings` as [`start`](Self::start) does — the endpoint as a URL, every header
    /// name and value, the TLS files (PEM that parses, a key that matches) — without connecting
    /// (`doctor`). Safe to call from inside an async runtime.
    pub fn check(settings: &OtlpSettings) -> Result<(), OtlpError> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(OtlpError::Thread)?;
        let built = {
            let _in_runtime = rt.enter();
            Transport::build(settings).map(drop)
        };
        rt.shutdown_background();
        built.map_err(OtlpError::from)
    }

    pub fn start(settings: Option<OtlpSettings>, who: &ResourceInfo) -> Result<Option<OtlpExporter>, OtlpError> {
        let Some(settings) = settings else { return Ok(None) };
        let resource = who.resource(&settings.resource_attributes);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(OtlpError::Thread)?;
        let built = {
            let _in_runtime = rt.enter();
            Transport::build(&settings)
        };
        let transport = match built {
            Ok(t) => t,
            Err(e) => {
                // Dropping a runtime waits for it, which panics when the caller is itself async
                // (the agent starts the exporter from its runtime): hand it off instead.
                rt.shutdown_background();
                return Err(e.into());
            }
        };
        let scope = InstrumentationScope {
            name: "gpu-tracer".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        };
        let counters = Arc::new(Counters::default());
        let latest: Arc<Mutex<Option<Arc<AgentSnapshot>>>> = Arc::default();
        let (tx, rx) = mpsc::channel(settings.log_queue);
        let (stop_tx, stop_rx) = oneshot::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let worker = Worker {
            builder: MetricBuilder::new(MetricsRegistry::new(), settings.max_series_per_metric),
            requests: RequestWriter::new(&resource, &scope, MAX_POINTS_PER_REQUEST),
            settings: settings.clone(),
            transport,
            resource,
            scope,
            latest: Arc::clone(&latest),
            counters: Arc::clone(&counters),
            log_attempts: 0,
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

    #[cfg(test)]
    /// Queue `ev` as a log record if the exporter [`accepts`](Self::accepts) it; a full queue
    /// drops it (counted).
    pub(crate) fn offer_event(&self, ev: &v1::Event) {
        if self.accepts(ev) {
            self.offer_encoded(crate::export::api::hub::EventHub::encode(ev));
        }
    }

    /// Is `ev` exported (its kind, and the configured filters)?
    pub fn accepts(&self, ev: &v1::Event) -> bool {
        self.wants(ev.header.as_ref().map_or(0, |h| h.kind)) && self.filters.matches(ev)
    }

    /// Queue an event the exporter [`accepts`](Self::accepts), as the hub encoded it
    /// (`EventHub::encode`); a full queue drops it (counted).
    pub fn offer_encoded(&self, ev: EncodedSubscribeResponse) {
        self.counters.events_offered.fetch_add(1, Ordering::Relaxed);
        match self.events.try_send(ev) {
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
            metric_rounds: load(&c.metric_rounds),
            log_records_exported: load(&c.log_records_exported),
            log_exports: load(&c.log_exports),
            log_retries: load(&c.log_retries),
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

/// The export thread's state.
struct Worker {
    settings: OtlpSettings,
    builder: MetricBuilder,
    /// The metric requests of the export under way (its buffers kept from one export to the next).
    requests: RequestWriter,
    transport: Transport,
    resource: Resource,
    scope: InstrumentationScope,
    latest: Arc<Mutex<Option<Arc<AgentSnapshot>>>>,
    counters: Arc<Counters>,
    /// Attempts so far of the log batch waiting to be sent again (0: none waits).
    log_attempts: u32,
}

/// Attempts at one batch of log records whose failure may pass (the first included), one per
/// log tick; metrics are not sent again (they are cumulative: the next export carries the same
/// totals).
pub const LOG_ATTEMPTS: u32 = 3;

impl Worker {
    async fn run(mut self, mut rx: mpsc::Receiver<EncodedSubscribeResponse>, mut stop: oneshot::Receiver<Instant>) {
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
        let mut buf: Vec<EncodedSubscribeResponse> = Vec::with_capacity(batch);
        let deadline = loop {
            // A batch waiting to be sent again takes nothing more until it is through: what
            // arrives meanwhile waits in the bounded queue.
            let room = if self.log_attempts > 0 { 0 } else { batch - buf.len() };
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

    /// Send the latest snapshot's metrics: part by part, in requests of at most
    /// `MAX_POINTS_PER_REQUEST` points (a metric with more is split across requests), each sent
    /// as soon as the part that filled it is written.
    async fn export_metrics(&mut self, deadline: Option<Instant>) {
        let Some(snapshot) = self.latest.lock().unwrap_or_else(|e| e.into_inner()).clone() else { return };
        let ids = IdentityIndex::new(&snapshot);
        let now = unix_ns_now();
        let mut all_sent = true;
        for part in 0..self.builder.parts() {
            if let Err(e) = self.builder.part(part, &snapshot, &ids, now, &mut self.requests) {
                self.counters.error(format!("building metrics: {e}"));
            }
            while let Some((body, points)) = self.requests.take() {
                all_sent &= self.send_metrics(body, points, deadline).await;
            }
        }
        while let Some((body, points)) = self.requests.take_last() {
            all_sent &= self.send_metrics(body, points, deadline).await;
        }
        if all_sent {
            self.counters.metric_rounds.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Send one request (`body`, an `ExportMetricsServiceRequest` of `points` points); `true`
    /// when the collector took it (rejected points are still counted).
    async fn send_metrics(&mut self, body: Bytes, points: usize, deadline: Option<Instant>) -> bool {
        let budget = self.budget(deadline);
        let answer = tokio::time::timeout(budget, self.transport.metrics(body.clone())).await;
        self.requests.recycle(body);
        self.account(METRICS, points as u64, budget, answer)
    }

    /// Count what became of a request of `n` items; `true` when the collector took it.
    fn account(
        &self,
        signal: usize,
        n: u64,
        budget: Duration,
        answer: Result<Result<Accepted, SendError>, tokio::time::error::Elapsed>,
    ) -> bool {
        let c = &self.counters;
        let name = SIGNALS[signal];
        match answer {
            Ok(Ok(a)) => {
                let rejected = a.rejected.min(n);
                let (exported, requests) = match signal {
                    METRICS => (&c.metric_points_exported, &c.metric_exports),
                    _ => (&c.log_records_exported, &c.log_exports),
                };
                exported.fetch_add(n - rejected, Ordering::Relaxed);
                requests.fetch_add(1, Ordering::Relaxed);
                if rejected > 0 || !a.message.is_empty() {
                    c.lost(signal, REJECTED, rejected);
                    c.error(format!("{name}: the collector rejected {rejected} of {n}: {}", a.message));
                }
                true
            }
            // The client's own connect or request timeout (issue 45 item 7: these were counted
            // as export_failed): the same as no answer within the budget.
            Ok(Err(e)) if e.timed_out => {
                c.lost(signal, TIMEOUT, n);
                c.error(format!("{name}: no answer in time: {}", e.message));
                false
            }
            Ok(Err(e)) => {
                c.lost(signal, EXPORT_FAILED, n);
                c.error(format!("{name}: {}", e.message));
                false
            }
            Err(_) => {
                c.lost(signal, TIMEOUT, n);
                c.error(format!("{name}: no answer within {budget:?}"));
                false
            }
        }
    }

    /// Send `buf` as one batch of log records and empty it — unless the collector could not take
    /// it for a reason that may pass (down, overloaded, no answer in time): then `buf` is kept and
    /// sent again at the next log tick, up to [`LOG_ATTEMPTS`] times in all, and only then
    /// counted as dropped. At shutdown (`deadline`) there is one attempt.
    async fn export_logs(&mut self, buf: &mut Vec<EncodedSubscribeResponse>, deadline: Option<Instant>) {
        let now = unix_ns_now();
        let mut log_records = Vec::with_capacity(buf.len());
        let mut undecodable = 0;
        buf.retain(|ev| match ev.event() {
            Some(e) => {
                log_records.push(logs::record(&e, now));
                true
            }
            None => {
                undecodable += 1;
                false
            }
        });
        if undecodable > 0 {
            // Bytes the agent encoded itself always decode; counted all the same, never silent.
            self.counters.lost(LOGS, EXPORT_FAILED, undecodable);
            self.counters.error(format!("logs: {undecodable} queued events did not decode"));
        }
        let n = log_records.len() as u64;
        if n == 0 {
            return;
        }
        let req = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: Some(self.resource.clone()),
                scope_logs: vec![ScopeLogs { scope: Some(self.scope.clone()), log_records, ..Default::default() }],
                ..Default::default()
            }],
        };
        let budget = self.budget(deadline);
        let answer = tokio::time::timeout(budget, self.transport.logs(req)).await;
        let retryable = match &answer {
            Ok(Err(e)) => e.retryable,
            Ok(Ok(_)) => false,
            Err(_) => true,
        };
        if retryable && deadline.is_none() && self.log_attempts + 1 < LOG_ATTEMPTS {
            self.log_attempts += 1;
            self.counters.log_retries.fetch_add(1, Ordering::Relaxed);
            let why = match answer {
                Ok(Err(e)) => e.message,
                _ => format!("no answer within {budget:?}"),
            };
            self.counters.error(format!(
                "logs: {why} (attempt {} of {LOG_ATTEMPTS}; {n} records kept for the next)",
                self.log_attempts
            ));
            return;
        }
        self.log_attempts = 0;
        self.account(LOGS, n, budget, answer);
        buf.clear();
    }
}
