//! The node agent's HTTP side: `/metrics`, `/healthz`, `/readyz`.
//!
//! The agent loop owns the pipeline (it is not `Send`) and publishes into a shared [`ServeState`]:
//! a heartbeat on every step, an immutable snapshot every interval. The server only reads that
//! state, so it runs as one spawned task beside the loop, on the same current-thread runtime.
//!
//! - `/metrics`: the latest snapshot, encoded at scrape time ([`MetricsRegistry`]); OpenMetrics
//!   when the `Accept` header asks for it (Prometheus does), the classic text format otherwise.
//!   503 until the first snapshot is published.
//! - `/healthz` (liveness): 200 while the loop's heartbeat is fresher than
//!   [`HealthSettings::stale_after`]; 503 when the loop is stuck, so the kubelet restarts the pod.
//! - `/readyz` (readiness): 200 once the probes are attached ([`ServeState::mark_attached`]) and
//!   the first snapshot is published, and while the loop is alive; otherwise 503 with the reason.
use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{
    Router,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use tokio::{sync::oneshot, task::JoinHandle};

use super::metrics::{ExpositionFormat, MetricsRegistry};
use crate::model::AgentSnapshot;

/// When the agent counts as alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthSettings {
    /// The loop is unhealthy when its last heartbeat is older than this. The default, 30 s, is far
    /// above one `step()` (at most the drain interval) and below the DaemonSet's liveness budget
    /// (3 failures × 20 s).
    pub stale_after: Duration,
}

impl Default for HealthSettings {
    fn default() -> Self {
        HealthSettings { stale_after: Duration::from_secs(30) }
    }
}

/// What the agent loop publishes and the HTTP handlers read.
#[derive(Debug)]
pub struct ServeState {
    metrics: MetricsRegistry,
    health: HealthSettings,
    /// Only ever held for a pointer copy, never across an `.await`.
    snapshot: RwLock<Option<Arc<AgentSnapshot>>>,
    /// Zero point of `last_beat_ms`.
    epoch: Instant,
    /// Milliseconds since `epoch` of the last heartbeat.
    last_beat_ms: AtomicU64,
    /// Set once the probes are attached: where they attached (shown by `/readyz`).
    attached: Mutex<Option<String>>,
    /// Wall-clock time the latest snapshot was published, ns since the epoch.
    published_at_unix_ns: AtomicU64,
}

/// Why `/readyz` says no.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// [`ServeState::mark_attached`] was not called yet.
    #[error("probes not attached yet (the agent is still loading its eBPF programs)")]
    NotAttached,
    /// No snapshot published yet.
    #[error("no snapshot published yet (the first comes after one interval)")]
    NoSnapshot,
    /// The loop stopped stepping.
    #[error(transparent)]
    Stalled(#[from] Unhealthy),
}

/// Why `/healthz` says no.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "agent loop stalled: no heartbeat for {:.1} s (limit {:.1} s); the pod will be restarted",
    since.as_secs_f64(),
    limit.as_secs_f64()
)]
pub struct Unhealthy {
    /// Time since the last heartbeat.
    pub since: Duration,
    /// [`HealthSettings::stale_after`].
    pub limit: Duration,
}

impl ServeState {
    /// Fresh state: alive (the heartbeat starts now), not ready, no snapshot.
    pub fn new(metrics: MetricsRegistry, health: HealthSettings) -> Self {
        ServeState {
            metrics,
            health,
            snapshot: RwLock::new(None),
            epoch: Instant::now(),
            last_beat_ms: AtomicU64::new(0),
            attached: Mutex::new(None),
            published_at_unix_ns: AtomicU64::new(0),
        }
    }

    /// The loop is alive: call once per `agent.step()`.
    pub fn heartbeat(&self) {
        let ms = self.epoch.elapsed().as_millis().min(u64::MAX as u128) as u64;
        self.last_beat_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// The probes are attached (or NVML-only mode was chosen); `attach_mode` is shown by `/readyz`.
    pub fn mark_attached(&self, attach_mode: &str) {
        *self.attached.lock().unwrap_or_else(|p| p.into_inner()) = Some(attach_mode.to_owned());
    }

    /// Publish a new snapshot (replaces the previous one; also a heartbeat).
    pub fn publish(&self, snapshot: Arc<AgentSnapshot>) {
        let mut slot = self.snapshot.write().unwrap_or_else(|p| p.into_inner());
        *slot = Some(snapshot);
        self.published_at_unix_ns.store(crate::clock::wall_now_unix_ns(), Ordering::Relaxed);
        drop(slot);
        self.heartbeat();
    }

    /// The latest published snapshot.
    pub fn latest(&self) -> Option<Arc<AgentSnapshot>> {
        self.snapshot.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The latest published snapshot and when it was published (wall clock, ns since the epoch).
    pub fn latest_with_time(&self) -> Option<(Arc<AgentSnapshot>, u64)> {
        let slot = self.snapshot.read().unwrap_or_else(|p| p.into_inner());
        slot.clone().map(|s| (s, self.published_at_unix_ns.load(Ordering::Relaxed)))
    }

    /// The metric sources used by `/metrics`.
    pub fn metrics(&self) -> &MetricsRegistry {
        &self.metrics
    }

    /// Is the loop alive?
    pub fn health(&self) -> Result<Duration, Unhealthy> {
        let since =
            self.epoch.elapsed().saturating_sub(Duration::from_millis(self.last_beat_ms.load(Ordering::Relaxed)));
        if since > self.health.stale_after {
            Err(Unhealthy { since, limit: self.health.stale_after })
        } else {
            Ok(since)
        }
    }

    /// Is the agent ready to be scraped? `Ok` carries the attach mode.
    pub fn readiness(&self) -> Result<String, NotReady> {
        self.health()?;
        let attached = self.attached.lock().unwrap_or_else(|p| p.into_inner()).clone().ok_or(NotReady::NotAttached)?;
        if self.snapshot.read().unwrap_or_else(|p| p.into_inner()).is_none() {
            return Err(NotReady::NoSnapshot);
        }
        Ok(attached)
    }
}

/// Errors of the HTTP server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}\n  hint: {hint}")]
    Bind {
        /// The `--listen` address.
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
        /// What to do about it.
        hint: String,
    },
    /// The server stopped with an I/O error.
    #[error("the metrics server on {addr} stopped: {source}")]
    Serve {
        /// The bound address.
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl ServeError {
    /// A short reason, for logs and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            ServeError::Bind { .. } => "bind",
            ServeError::Serve { .. } => "serve",
        }
    }
}

fn bind_hint(addr: SocketAddr, e: &std::io::Error) -> String {
    use std::io::ErrorKind::*;
    let port = addr.port();
    match e.kind() {
        AddrInUse => format!(
            "port {port} is already in use (another gpu-tracer agent, or dcgm-exporter's default port 9400?); \
             `ss -ltnp 'sport = :{port}'` shows which process; choose a free one with --listen"
        ),
        PermissionDenied => {
            "ports below 1024 need CAP_NET_BIND_SERVICE; use a port >= 1024 with --listen (e.g. 0.0.0.0:9400)".into()
        }
        AddrNotAvailable => {
            format!("{} is not an address of this host; use 0.0.0.0:{port} to listen on every interface", addr.ip())
        }
        _ => "check the --listen address (HOST:PORT, e.g. 0.0.0.0:9400)".into(),
    }
}

/// The running server.
#[derive(Debug)]
pub struct RunningServer {
    /// The address actually bound (the port is chosen by the kernel when `--listen` gave 0).
    pub local_addr: SocketAddr,
    /// The server task; ends with an error only if accepting fails.
    pub task: JoinHandle<Result<(), ServeError>>,
    shutdown: oneshot::Sender<()>,
}

impl RunningServer {
    /// Stop accepting, finish the requests in progress, and wait for the task.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        // The task may already have ended (then the receiver is gone and so is the need to signal).
        let _ = self.shutdown.send(());
        match self.task.await {
            Ok(r) => r,
            Err(e) => Err(ServeError::Serve { addr: self.local_addr, source: std::io::Error::other(e) }),
        }
    }
}

/// The routes, on a state (exposed for tests that drive the router without a socket).
pub fn router(state: Arc<ServeState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Bind `listen` and serve `/metrics`, `/healthz` and `/readyz` from `state` on a spawned task.
///
/// Must be called inside a tokio runtime (current-thread is fine: the handlers never block for
/// long — encoding a snapshot takes milliseconds).
pub async fn serve(listen: SocketAddr, state: Arc<ServeState>) -> Result<RunningServer, ServeError> {
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|source| ServeError::Bind {
        addr: listen,
        hint: bind_hint(listen, &source),
        source,
    })?;
    let local_addr = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: listen,
        hint: bind_hint(listen, &source),
        source,
    })?;
    let (tx, rx) = oneshot::channel::<()>();
    let app = router(state);
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = rx.await;
            })
            .await
            .map_err(|source| ServeError::Serve { addr: local_addr, source })
    });
    Ok(RunningServer { local_addr, task, shutdown: tx })
}

fn text(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

async fn metrics(State(state): State<Arc<ServeState>>, headers: HeaderMap) -> Response {
    let Some(snapshot) = state.latest() else {
        return text(StatusCode::SERVICE_UNAVAILABLE, format!("{}\n", NotReady::NoSnapshot));
    };
    let format = ExpositionFormat::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    match state.metrics.encode(&snapshot, format) {
        Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, format.content_type())], body).into_response(),
        // Only a source's own formatting can fail; say so rather than serve half an exposition.
        Err(_) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "encoding the metrics failed (a metric source returned an error)\n".into(),
        ),
    }
}

async fn healthz(State(state): State<Arc<ServeState>>) -> Response {
    match state.health() {
        Ok(since) => text(StatusCode::OK, format!("ok: last agent step {:.1} s ago\n", since.as_secs_f64())),
        Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    }
}

async fn readyz(State(state): State<Arc<ServeState>>) -> Response {
    match state.readiness() {
        Ok(mode) => text(StatusCode::OK, format!("ready: probes attached ({mode}), snapshot published\n")),
        Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
    }
}

#[cfg(test)]
mod tests;
