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
//!   the first snapshot is published, and while the loop is alive and no probe family that is
//!   switched on failed to attach; otherwise 503 with the reason (`driver family failed: ...`).
//!
//! The server is built for a node where anything may connect ([`ServeLimits`]): at most
//! `max_connections` at once, and at most `max_connections_per_peer` from one client address, so
//! that one slow or hostile client cannot take the slots Prometheus and the kubelet's probes need
//! (more are closed at accept, counted by reason in [`HttpStats`] and logged), request headers
//! must arrive within `header_read_timeout` and fit in 16 KiB (hyper's buffer bound), a connection
//! lives at most `max_connection_age` (Prometheus reconnects), and stopping waits at most
//! `shutdown_deadline` for requests in progress before it drops the connections that are left.
use std::{
    collections::HashMap,
    fmt,
    net::{IpAddr, SocketAddr},
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
use tokio::{
    sync::{Semaphore, oneshot, watch},
    task::{JoinHandle, JoinSet},
};

use super::metrics::{ExpositionFormat, MetricsRegistry};
use tracer_core::model::{AgentSnapshot, HttpStats};

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
    /// Connections the server closed at accept: over `max_connections`, over the per-peer cap.
    refused_server_limit: AtomicU64,
    refused_peer_limit: AtomicU64,
    /// Scrapes of /metrics refused for their token.
    unauthorized: AtomicU64,
    /// The bearer token a scrape of /metrics must carry (`metrics.token_file`).
    token: Option<Secret>,
}

/// A bearer token; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Whether `header` (an `Authorization` value) is `Bearer <this token>`, compared in time that
    /// does not depend on where the first difference is.
    fn admits(&self, header: Option<&[u8]>) -> bool {
        let Some(given) = header.and_then(|h| h.strip_prefix(b"Bearer ")) else { return false };
        let want = self.0.as_bytes();
        given.len() == want.len() && given.iter().zip(want).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Who may read the endpoints, and how (`[metrics]` tls_cert, tls_key, token_file): TLS, and a
/// bearer token for /metrics. Both optional; loaded once at start, so a bad file is an error then.
#[derive(Clone, Default)]
pub(crate) struct ServeSecurity {
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub token: Option<Secret>,
}

impl fmt::Debug for ServeSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeSecurity").field("tls", &self.tls.is_some()).field("token", &self.token).finish()
    }
}

/// A TLS certificate, key or token file that cannot be used; names the setting.
#[derive(Debug, thiserror::Error)]
#[error("{key} ({}): {why}", path.display())]
pub(crate) struct SecurityError {
    pub key: &'static str,
    pub path: std::path::PathBuf,
    pub why: String,
}

/// Which file of a TLS server's certificate and key could not be used, and why (the caller names
/// the setting and the path).
#[derive(Debug)]
pub(crate) enum TlsFileProblem {
    Cert(String),
    Key(String),
}

/// A rustls server (ring; TLS 1.2 and 1.3) for the PEM certificate chain in `cert` and the private
/// key in `key`, speaking `alpn`: the /metrics server's (`http/1.1`) and the gRPC API's (`h2`).
pub(crate) fn tls_server(
    cert: &std::path::Path,
    key: &std::path::Path,
    alpn: &[u8],
) -> Result<Arc<rustls::ServerConfig>, TlsFileProblem> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsFileProblem::Cert(format!("not a readable PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(TlsFileProblem::Cert("no certificate in the file".into()));
    }
    let pk = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsFileProblem::Key(format!("not a readable PEM private key: {e}")))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, pk))
        .map_err(|e| TlsFileProblem::Key(format!("the certificate and key do not make a TLS server: {e}")))?;
    cfg.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(cfg))
}

impl ServeSecurity {
    /// Read the certificate chain and key (PEM) and the token file.
    pub fn load(
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
        token_file: Option<&std::path::Path>,
    ) -> Result<Self, SecurityError> {
        let err = |key, path: &std::path::Path, why: String| SecurityError { key, path: path.to_path_buf(), why };
        let tls = match (cert, key) {
            (Some(c), Some(k)) => Some(tls_server(c, k, b"http/1.1").map_err(|e| match e {
                TlsFileProblem::Cert(why) => err("metrics.tls_cert", c, why),
                TlsFileProblem::Key(why) => err("metrics.tls_key", k, why),
            })?),
            (None, None) => None,
            (Some(p), None) | (None, Some(p)) => {
                return Err(err("metrics.tls_cert", p, "TLS needs both metrics.tls_cert and metrics.tls_key".into()));
            }
        };
        let token = match token_file {
            Some(p) => Some(Secret(
                tracer_core::config::read_token_file("metrics.token_file", p).map_err(|e| err(e.key, p, e.why))?,
            )),
            None => None,
        };
        Ok(ServeSecurity { tls, token })
    }
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
    /// Probe families that are switched on but did not attach: `(family, why)`. The agent runs
    /// on without them, but not as configured, so a rollout should stop here.
    #[error("{}", families_failed(.0))]
    FamiliesFailed(Vec<(&'static str, String)>),
    /// The loop stopped stepping.
    #[error(transparent)]
    Stalled(#[from] Unhealthy),
}

fn families_failed(failed: &[(&'static str, String)]) -> String {
    let each: Vec<String> = failed.iter().map(|(family, why)| format!("{family} family failed: {why}")).collect();
    each.join("; ")
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
            refused_server_limit: AtomicU64::new(0),
            refused_peer_limit: AtomicU64::new(0),
            unauthorized: AtomicU64::new(0),
            token: None,
        }
    }

    /// Scrapes of /metrics must carry this bearer token (`ServeSecurity::token`).
    pub fn with_token(mut self, token: Option<Secret>) -> Self {
        self.token = token;
        self
    }

    /// The HTTP server's counters (the agent puts them in each snapshot it publishes).
    pub(crate) fn http_stats(&self) -> HttpStats {
        HttpStats {
            refused_server_limit: self.refused_server_limit.load(Ordering::Relaxed),
            refused_peer_limit: self.refused_peer_limit.load(Ordering::Relaxed),
            unauthorized: self.unauthorized.load(Ordering::Relaxed),
        }
    }

    /// The loop is alive: call once per `agent.step()`.
    pub(crate) fn heartbeat(&self) {
        let ms = self.epoch.elapsed().as_millis().min(u64::MAX as u128) as u64;
        self.last_beat_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// The probes are attached (or NVML-only mode was chosen); `attach_mode` is shown by `/readyz`.
    pub(crate) fn mark_attached(&self, attach_mode: &str) {
        *self.attached.lock().unwrap_or_else(|p| p.into_inner()) = Some(attach_mode.to_owned());
    }

    /// Publish a new snapshot (replaces the previous one; also a heartbeat).
    pub fn publish(&self, snapshot: Arc<AgentSnapshot>) {
        let mut slot = self.snapshot.write().unwrap_or_else(|p| p.into_inner());
        *slot = Some(snapshot);
        self.published_at_unix_ns.store(tracer_core::clock::wall_now_unix_ns(), Ordering::Relaxed);
        drop(slot);
        self.heartbeat();
    }

    /// The latest published snapshot.
    pub fn latest(&self) -> Option<Arc<AgentSnapshot>> {
        self.snapshot.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The latest published snapshot and when it was published (wall clock, ns since the epoch).
    pub(crate) fn latest_with_time(&self) -> Option<(Arc<AgentSnapshot>, u64)> {
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

    /// Is the agent ready to be scraped, and running as configured? `Ok` carries the attach mode.
    pub fn readiness(&self) -> Result<String, NotReady> {
        self.health()?;
        let attached = self.attached.lock().unwrap_or_else(|p| p.into_inner()).clone().ok_or(NotReady::NotAttached)?;
        let snapshot = self.latest().ok_or(NotReady::NoSnapshot)?;
        let failed: Vec<(&'static str, String)> =
            snapshot.probe_families.iter().filter_map(|f| f.failure().map(|why| (f.family, why.to_owned()))).collect();
        if !failed.is_empty() {
            return Err(NotReady::FamiliesFailed(failed));
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

/// How much the server gives any one client, and how long it waits for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections served at once; one more is closed at accept (counted).
    pub max_connections: usize,
    /// Connections served at once from one client address (IPv4-mapped IPv6 counts as the IPv4
    /// address); one more from it is closed at accept (counted). A quarter of `max_connections`
    /// by default: a client that holds its slots (slowloris) leaves the rest to the others.
    pub max_connections_per_peer: usize,
    /// A request's header block must arrive within this (slow clients are disconnected).
    pub header_read_timeout: Duration,
    /// A connection is closed after this long, between requests (a keep-alive scraper reconnects).
    pub max_connection_age: Duration,
    /// Stopping waits this long for requests in progress, then drops what is left.
    pub shutdown_deadline: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            max_connections: 64,
            max_connections_per_peer: 16,
            header_read_timeout: Duration::from_secs(5),
            max_connection_age: Duration::from_secs(300),
            shutdown_deadline: Duration::from_secs(2),
        }
    }
}

/// Bytes of request header a connection may buffer (hyper's smallest allowed read buffer): a
/// larger header is answered 431 and the connection closed.
const MAX_HEADER_BYTES: usize = 16 * 1024;

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
    /// Stop accepting, finish the requests in progress (within the shutdown deadline; then the
    /// connections left are dropped), and wait for the task.
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
pub(crate) fn router(state: Arc<ServeState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Bind `listen` and serve `/metrics`, `/healthz` and `/readyz` from `state` on a spawned task,
/// with the default [`ServeLimits`].
///
/// Must be called inside a tokio runtime (current-thread is fine: the handlers never block for
/// long — encoding a snapshot takes milliseconds).
pub async fn serve(listen: SocketAddr, state: Arc<ServeState>) -> Result<RunningServer, ServeError> {
    serve_with(listen, state, ServeLimits::default()).await
}

/// [`serve`] with the given limits.
pub(crate) async fn serve_with(
    listen: SocketAddr,
    state: Arc<ServeState>,
    limits: ServeLimits,
) -> Result<RunningServer, ServeError> {
    serve_secure(listen, state, limits, None).await
}

/// [`serve_with`], over TLS when `tls` is given (the handshake must finish within the header
/// timeout).
pub(crate) async fn serve_secure(
    listen: SocketAddr,
    state: Arc<ServeState>,
    limits: ServeLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Result<RunningServer, ServeError> {
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
    let task = tokio::spawn(accept_loop(listener, state, limits, tls, rx));
    Ok(RunningServer { local_addr, task, shutdown: tx })
}

/// The connections open per client address; a [`PeerSlot`] holds one.
pub(crate) type PeerCounts = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// One open connection of a client address; released when the connection's task ends.
pub(crate) struct PeerSlot {
    counts: PeerCounts,
    ip: IpAddr,
}

impl PeerSlot {
    /// A slot for `ip`, unless it already holds `max`.
    pub(crate) fn take(counts: &PeerCounts, ip: IpAddr, max: usize) -> Option<PeerSlot> {
        let ip = ip.to_canonical();
        let mut c = counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = c.entry(ip).or_insert(0);
        if *n >= max.max(1) {
            return None;
        }
        *n += 1;
        Some(PeerSlot { counts: Arc::clone(counts), ip })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = c.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.remove(&self.ip);
            }
        }
    }
}

/// Counts a connection closed at accept, and logs the first and then every power of two.
fn refuse(counter: &AtomicU64, peer: SocketAddr, why: &str, limit: usize) {
    let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
    if n.is_power_of_two() {
        tracing::warn!(%peer, refused = n, limit, "the metrics server is at its {why}; closing new connections");
    }
}

/// Accept connections until `stop`, each served on its own task within `limits`.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    state: Arc<ServeState>,
    limits: ServeLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut stop: oneshot::Receiver<()>,
) -> Result<(), ServeError> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let app = router(Arc::clone(&state));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(true);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let peers = PeerCounts::default();
    let (closing_tx, closing) = watch::channel(false);
    let mut conns = JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut stop => break,
            // Finished connection tasks are reaped as they end (the set stays small).
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: pass, without spinning.
                    tracing::warn!(error = %e, "the metrics server could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // The per-peer cap first: a client over its own share is refused even while the server has
        // room, and never takes a server slot from the others.
        let Some(peer_slot) = PeerSlot::take(&peers, peer.ip(), limits.max_connections_per_peer) else {
            refuse(&state.refused_peer_limit, peer, "per-client connection limit", limits.max_connections_per_peer);
            drop(stream);
            continue;
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            refuse(&state.refused_server_limit, peer, "connection limit", limits.max_connections);
            drop(stream);
            continue;
        };
        let (http, app, closing, acceptor) = (http.clone(), app.clone(), closing.clone(), acceptor.clone());
        conns.spawn(async move {
            let _slots = (slot, peer_slot);
            let Some(acceptor) = acceptor else {
                return serve_connection(&http, stream, app, closing, limits).await;
            };
            // The handshake counts against the header timeout: a client that opens and says
            // nothing is held no longer over TLS than without.
            match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => serve_connection(&http, tls, app, closing, limits).await,
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics server: TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "metrics server: TLS handshake timed out"),
            }
        });
    }
    drop(listener);
    let _ = closing_tx.send(true);
    let drained =
        tokio::time::timeout(limits.shutdown_deadline, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::info!(left = conns.len(), deadline = ?limits.shutdown_deadline,
            "metrics server: connections still open at the shutdown deadline are dropped");
        conns.abort_all();
    }
    Ok(())
}

/// Serve one connection until it ends, the server closes, or it reaches its maximum age.
async fn serve_connection<S>(
    http: &hyper::server::conn::http1::Builder,
    stream: S,
    app: Router,
    mut closing: watch::Receiver<bool>,
    limits: ServeLimits,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let conn =
        http.serve_connection(hyper_util::rt::TokioIo::new(stream), hyper_util::service::TowerToHyperService::new(app));
    tokio::pin!(conn);
    let age = tokio::time::sleep(limits.max_connection_age);
    tokio::pin!(age);
    tokio::select! {
        _ = &mut conn => return,
        _ = closing.wait_for(|c| *c) => {}
        _ = &mut age => {}
    }
    // Finish the request in progress (if any), then close; the deadline is the caller's.
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

fn text(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

async fn metrics(State(state): State<Arc<ServeState>>, headers: HeaderMap) -> Response {
    if let Some(token) = &state.token
        && !token.admits(headers.get(header::AUTHORIZATION).map(|v| v.as_bytes()))
    {
        state.unauthorized.fetch_add(1, Ordering::Relaxed);
        return (
            StatusCode::UNAUTHORIZED,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8"), (header::WWW_AUTHENTICATE, "Bearer")],
            "/metrics needs `Authorization: Bearer <token>` (the agent's metrics.token_file)\n",
        )
            .into_response();
    }
    let Some(snapshot) = state.latest() else {
        return text(StatusCode::SERVICE_UNAVAILABLE, format!("{}\n", NotReady::NoSnapshot));
    };
    let format = ExpositionFormat::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    match state.metrics.encode(&snapshot, format) {
        // Prometheus asks for gzip: the text compresses about tenfold (docs/benchmarks.md).
        Ok(body) if accepts_gzip(&headers) => match gzip(body.as_bytes()) {
            Ok(zipped) => (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, format.content_type()),
                    (header::CONTENT_ENCODING, "gzip"),
                    (header::VARY, "accept-encoding"),
                ],
                zipped,
            )
                .into_response(),
            Err(_) => (StatusCode::OK, [(header::CONTENT_TYPE, format.content_type())], body).into_response(),
        },
        Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, format.content_type())], body).into_response(),
        // Only a source's own formatting can fail; say so rather than serve half an exposition.
        Err(_) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "encoding the metrics failed (a metric source returned an error)\n".into(),
        ),
    }
}

/// Whether the client takes a gzip body: `Accept-Encoding` names `gzip` (or `*`) without `q=0`.
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(
        |item| {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            let refused =
                parts.any(|p| p.trim().strip_prefix("q=").and_then(|q| q.trim().parse::<f32>().ok()) == Some(0.0));
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
        },
    )
}

/// `body` gzipped at the fastest level (a scrape is on the agent's CPU, the bytes on the network's).
pub fn gzip(body: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut z = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 8 + 64), flate2::Compression::fast());
    z.write_all(body)?;
    z.finish()
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
