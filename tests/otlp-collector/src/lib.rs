//! An OTLP collector double: the receiving end of `gpu-tracer`'s OTLP exporter in tests and
//! benchmarks.
//!
//! * **OTLP/gRPC** ([`Collector::grpc`]): the `opentelemetry-proto` crate's generated tonic
//!   services (`MetricsService`, `LogsService`), as a real collector serves them.
//! * **OTLP/HTTP with protobuf bodies** ([`Collector::http`]): `POST /v1/metrics` and
//!   `POST /v1/logs` (axum on hyper's HTTP/1.1), each body decoded as the export request;
//!   one that does not decode is answered 400.
//!
//! Either can serve TLS ([`CollectorBuilder::tls`]) and require client certificates signed by a CA
//! ([`CollectorBuilder::client_ca`]), refuse its first requests with a status
//! ([`CollectorBuilder::fail_first`]), and bound the size of a request
//! ([`CollectorBuilder::max_message_bytes`]). What arrives is recorded in [`Received`]: per
//! request its size and points (metrics) or records (logs), and the request itself unless
//! [`CollectorBuilder::keep_requests`] says not to (a benchmark sending many large requests).
//!
//! A collector runs on a runtime of its own (one worker thread), so it is started and stopped
//! from plain synchronous code — a `#[test]`, a benchmark — not from inside an async task.
//! Stopping it ([`Collector::stop`] or drop) closes its listener and every connection, as a
//! collector that goes away; another can then be started on the same address
//! ([`CollectorBuilder::bind`]), recording into the same [`Received`]
//! ([`CollectorBuilder::record_into`]).
//!
//! ```no_run
//! let collector = otlp_collector::Collector::grpc().start().unwrap();
//! // ... point the exporter at collector.endpoint(), then:
//! assert!(collector.received().metric_points() > 0);
//! ```

use std::{
    io,
    net::SocketAddr,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use opentelemetry_proto::tonic::{
    collector::{
        logs::v1::{
            ExportLogsServiceResponse,
            logs_service_server::{LogsService, LogsServiceServer},
        },
        metrics::v1::{
            ExportMetricsServiceResponse,
            metrics_service_server::{MetricsService, MetricsServiceServer},
        },
    },
    metrics::v1::{Metric, metric},
};
use prost::Message as _;

/// The OTLP messages (the `opentelemetry-proto` crate), so a caller decodes what arrived with the
/// very types the collector used.
pub use opentelemetry_proto as proto;
pub use opentelemetry_proto::tonic::collector::{
    logs::v1::ExportLogsServiceRequest, metrics::v1::ExportMetricsServiceRequest,
};
pub use tonic::Code;

/// A collector's default bound on one request's size: 4 MiB, tonic's default for gRPC (and the
/// OpenTelemetry Collector's `max_recv_msg_size_mib`).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;

/// How long [`Collector::stop`] lets the server close gracefully before it drops the connections.
const GRACEFUL_STOP: Duration = Duration::from_secs(2);

/// The message of a refusal that [`CollectorBuilder::fail_first`] asks for.
pub const REFUSAL_MESSAGE: &str = "not now (the collector double refuses this request)";

/// The OTLP transport a collector serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC.
    Grpc,
    /// OTLP/HTTP with protobuf bodies.
    HttpProtobuf,
}

/// An OTLP signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Metrics,
    Logs,
}

/// One metrics export request as it arrived.
#[derive(Clone, Debug)]
pub struct MetricsExport {
    /// Its encoded size: the body as sent (HTTP), the decoded message re-encoded (gRPC).
    pub bytes: usize,
    /// Data points in it, of every metric kind.
    pub points: usize,
    /// The encoded request (see [`MetricsExport::bytes`]), unless the collector keeps none.
    pub body: Option<Vec<u8>>,
}

impl MetricsExport {
    /// The request, decoded from [`MetricsExport::body`] (`None` when it was not kept).
    pub fn request(&self) -> Option<ExportMetricsServiceRequest> {
        ExportMetricsServiceRequest::decode(self.body.as_deref()?).ok()
    }
}

/// One logs export request as it arrived.
#[derive(Clone, Debug)]
pub struct LogsExport {
    /// Its encoded size, as [`MetricsExport::bytes`].
    pub bytes: usize,
    /// Log records in it.
    pub records: usize,
    /// The request, unless the collector keeps none.
    pub request: Option<ExportLogsServiceRequest>,
}

/// What a collector received (and refused); shared with the caller, and across a restart
/// ([`CollectorBuilder::record_into`]).
#[derive(Debug, Default)]
pub struct Received {
    metrics: Mutex<Vec<MetricsExport>>,
    logs: Mutex<Vec<LogsExport>>,
    refused_metrics: AtomicU64,
    refused_logs: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Received {
    /// Every metrics request taken, in order of arrival.
    pub fn metrics(&self) -> Vec<MetricsExport> {
        lock(&self.metrics).clone()
    }

    /// How many metrics requests were taken.
    pub fn metric_requests(&self) -> usize {
        lock(&self.metrics).len()
    }

    /// Data points in every metrics request taken.
    pub fn metric_points(&self) -> u64 {
        lock(&self.metrics).iter().map(|m| m.points as u64).sum()
    }

    /// The encoded metrics requests kept, in order of arrival.
    pub fn metric_bodies(&self) -> Vec<Vec<u8>> {
        lock(&self.metrics).iter().filter_map(|m| m.body.clone()).collect()
    }

    /// The newest metrics request kept: its encoding and the request.
    pub fn last_metrics(&self) -> Option<(Vec<u8>, ExportMetricsServiceRequest)> {
        let raw = lock(&self.metrics).iter().rev().find_map(|m| m.body.clone())?;
        let req = ExportMetricsServiceRequest::decode(raw.as_slice()).ok()?;
        Some((raw, req))
    }

    /// Every logs request taken, in order of arrival.
    pub fn logs(&self) -> Vec<LogsExport> {
        lock(&self.logs).clone()
    }

    /// The logs requests kept, in order of arrival.
    pub fn log_requests(&self) -> Vec<ExportLogsServiceRequest> {
        lock(&self.logs).iter().filter_map(|l| l.request.clone()).collect()
    }

    /// Log records in every logs request taken.
    pub fn log_records(&self) -> u64 {
        lock(&self.logs).iter().map(|l| l.records as u64).sum()
    }

    /// The event name of every log record kept, in order of arrival.
    pub fn event_names(&self) -> Vec<String> {
        lock(&self.logs)
            .iter()
            .filter_map(|l| l.request.as_ref())
            .flat_map(|r| &r.resource_logs)
            .flat_map(|r| &r.scope_logs)
            .flat_map(|s| &s.log_records)
            .map(|l| l.event_name.clone())
            .collect()
    }

    /// Requests of `signal` refused on purpose ([`CollectorBuilder::fail_first`]).
    pub fn refused(&self, signal: Signal) -> u64 {
        self.refusals(signal).load(Ordering::Relaxed)
    }

    fn refusals(&self, signal: Signal) -> &AtomicU64 {
        match signal {
            Signal::Metrics => &self.refused_metrics,
            Signal::Logs => &self.refused_logs,
        }
    }

    fn take_metrics(&self, req: &ExportMetricsServiceRequest, body: Option<Vec<u8>>, bytes: usize) {
        lock(&self.metrics).push(MetricsExport { bytes, points: points(req), body });
    }

    fn take_logs(&self, req: ExportLogsServiceRequest, keep: bool, bytes: usize) {
        let records = records(&req);
        lock(&self.logs).push(LogsExport { bytes, records, request: keep.then_some(req) });
    }
}

/// Data points in a metric, of whatever kind.
pub fn point_count(m: &Metric) -> usize {
    match &m.data {
        Some(metric::Data::Gauge(g)) => g.data_points.len(),
        Some(metric::Data::Sum(s)) => s.data_points.len(),
        Some(metric::Data::Histogram(h)) => h.data_points.len(),
        Some(metric::Data::ExponentialHistogram(h)) => h.data_points.len(),
        Some(metric::Data::Summary(s)) => s.data_points.len(),
        None => 0,
    }
}

/// Data points in a metrics request.
pub fn points(req: &ExportMetricsServiceRequest) -> usize {
    req.resource_metrics.iter().flat_map(|r| &r.scope_metrics).flat_map(|s| &s.metrics).map(point_count).sum()
}

/// Log records in a logs request.
pub fn records(req: &ExportLogsServiceRequest) -> usize {
    req.resource_logs.iter().flat_map(|r| &r.scope_logs).map(|s| s.log_records.len()).sum()
}

/// Refusals still to make, per signal, and with which status.
#[derive(Debug, Default)]
struct Failures {
    metrics: Option<(AtomicU64, Code)>,
    logs: Option<(AtomicU64, Code)>,
}

impl Failures {
    /// Whether to refuse this request of `signal`, and with what; counts the refusal.
    fn refuse(&self, signal: Signal, got: &Received) -> Option<Code> {
        let (left, code) = match signal {
            Signal::Metrics => self.metrics.as_ref()?,
            Signal::Logs => self.logs.as_ref()?,
        };
        left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).ok()?;
        got.refusals(signal).fetch_add(1, Ordering::Relaxed);
        Some(*code)
    }
}

/// What a collector's handlers share.
#[derive(Clone)]
struct State {
    got: Arc<Received>,
    keep: bool,
    failures: Arc<Failures>,
}

/// TLS settings, PEM.
#[derive(Clone, Debug)]
struct Tls {
    cert: String,
    key: String,
    client_ca: Option<String>,
}

/// How to start a [`Collector`]: [`Collector::grpc`] or [`Collector::http`], then the knobs.
#[derive(Debug)]
pub struct CollectorBuilder {
    protocol: Protocol,
    addr: SocketAddr,
    tls: Option<Tls>,
    client_ca: Option<String>,
    max_message_bytes: usize,
    keep: bool,
    failures: Failures,
    received: Option<Arc<Received>>,
}

impl CollectorBuilder {
    fn new(protocol: Protocol) -> Self {
        CollectorBuilder {
            protocol,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: None,
            client_ca: None,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            keep: true,
            failures: Failures::default(),
            received: None,
        }
    }

    /// Listen on `addr` (default `127.0.0.1:0`, a free port): a collector that comes back on the
    /// port of one that was stopped.
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.addr = addr;
        self
    }

    /// Serve TLS with this certificate (chain) and key, PEM. [`Collector::endpoint`] is then
    /// `https://localhost:PORT`, the name the certificate should carry.
    pub fn tls(mut self, cert_pem: &str, key_pem: &str) -> Self {
        self.tls = Some(Tls { cert: cert_pem.into(), key: key_pem.into(), client_ca: None });
        self
    }

    /// With TLS: require a client certificate signed by this CA (PEM); a client without one is
    /// refused in the handshake.
    pub fn client_ca(mut self, ca_pem: &str) -> Self {
        self.client_ca = Some(ca_pem.into());
        self
    }

    /// The largest request taken, in bytes (default [`DEFAULT_MAX_MESSAGE_BYTES`]): gRPC answers
    /// a larger one `RESOURCE_EXHAUSTED`, HTTP 413.
    pub fn max_message_bytes(mut self, n: usize) -> Self {
        self.max_message_bytes = n;
        self
    }

    /// Refuse the first `n` requests of `signal` with `code` (HTTP: the status OTLP/HTTP maps it
    /// to, e.g. 503 for `Unavailable`, 400 for `InvalidArgument`), then take them. The message
    /// is [`REFUSAL_MESSAGE`]; refusals are counted ([`Received::refused`]), not recorded.
    pub fn fail_first(mut self, signal: Signal, n: u64, code: Code) -> Self {
        let f = Some((AtomicU64::new(n), code));
        match signal {
            Signal::Metrics => self.failures.metrics = f,
            Signal::Logs => self.failures.logs = f,
        }
        self
    }

    /// Whether to keep each request (default yes), or only its size and count (a benchmark).
    pub fn keep_requests(mut self, keep: bool) -> Self {
        self.keep = keep;
        self
    }

    /// Record into `received` (e.g. the one of a collector stopped before) instead of a new one.
    pub fn record_into(mut self, received: Arc<Received>) -> Self {
        self.received = Some(received);
        self
    }

    /// Bind and serve, on a runtime of the collector's own.
    pub fn start(self) -> io::Result<Collector> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otlp-collector")
            .enable_all()
            .build()?;
        let listener = rt.block_on(tokio::net::TcpListener::bind(self.addr))?;
        let addr = listener.local_addr()?;
        let got = self.received.unwrap_or_default();
        let tls = self.tls.map(|t| Tls { client_ca: self.client_ca, ..t });
        let state = State { got: got.clone(), keep: self.keep, failures: Arc::new(self.failures) };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = match self.protocol {
            Protocol::Grpc => {
                let mut server = tonic::transport::Server::builder();
                if let Some(t) = &tls {
                    let mut config = tonic::transport::ServerTlsConfig::new()
                        .identity(tonic::transport::Identity::from_pem(&t.cert, &t.key));
                    if let Some(ca) = &t.client_ca {
                        config = config.client_ca_root(tonic::transport::Certificate::from_pem(ca));
                    }
                    server = server.tls_config(config).map_err(io::Error::other)?;
                }
                let max = self.max_message_bytes;
                let router = server
                    .add_service(MetricsServiceServer::new(state.clone()).max_decoding_message_size(max))
                    .add_service(LogsServiceServer::new(state).max_decoding_message_size(max));
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                rt.spawn(async move {
                    let _ = router.serve_with_incoming_shutdown(incoming, shutdown).await;
                })
            }
            Protocol::HttpProtobuf => {
                let acceptor = tls.as_ref().map(tls_acceptor).transpose()?;
                rt.spawn(http::serve(listener, acceptor, http::router(state, self.max_message_bytes), shutdown))
            }
        };
        Ok(Collector {
            rt: Some(rt),
            addr,
            protocol: self.protocol,
            tls: tls.is_some(),
            got,
            stop: Some(stop),
            task: Some(task),
        })
    }
}

/// A rustls acceptor for the HTTP receiver.
fn tls_acceptor(t: &Tls) -> io::Result<tokio_rustls::TlsAcceptor> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
    let bad =
        |what: &str, e: &dyn std::fmt::Display| io::Error::new(io::ErrorKind::InvalidInput, format!("{what}: {e}"));
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(t.cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| bad("the certificate", &e))?;
    let key = PrivateKeyDer::from_pem_slice(t.key.as_bytes()).map_err(|e| bad("the key", &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("TLS versions", &e))?;
    let builder = match &t.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots.add(c.map_err(|e| bad("the client CA", &e))?).map_err(|e| bad("the client CA", &e))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| bad("the client CA", &e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder.with_single_cert(chain, key).map_err(|e| bad("the certificate and key", &e))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

#[tonic::async_trait]
impl MetricsService for State {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        if let Some(code) = self.failures.refuse(Signal::Metrics, &self.got) {
            return Err(tonic::Status::new(code, REFUSAL_MESSAGE));
        }
        let req = request.into_inner();
        let bytes = req.encoded_len();
        self.got.take_metrics(&req, self.keep.then(|| req.encode_to_vec()), bytes);
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl LogsService for State {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        if let Some(code) = self.failures.refuse(Signal::Logs, &self.got) {
            return Err(tonic::Status::new(code, REFUSAL_MESSAGE));
        }
        let req = request.into_inner();
        let bytes = req.encoded_len();
        self.got.take_logs(req, self.keep, bytes);
        Ok(tonic::Response::new(ExportLogsServiceResponse::default()))
    }
}

/// The OTLP/HTTP receiver.
mod http {
    use std::future::Future;

    use axum::{
        Router,
        body::Bytes,
        extract::{DefaultBodyLimit, State as With},
        http::{StatusCode, header},
        response::{IntoResponse, Response},
        routing::post,
    };

    use super::*;

    const PROTOBUF: &str = "application/x-protobuf";

    /// The status OTLP/HTTP answers for a gRPC code.
    fn status_for(code: Code) -> StatusCode {
        match code {
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => StatusCode::BAD_REQUEST,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn protobuf(body: Vec<u8>) -> Response {
        ([(header::CONTENT_TYPE, PROTOBUF)], body).into_response()
    }

    fn refused(code: Code) -> Response {
        (status_for(code), REFUSAL_MESSAGE).into_response()
    }

    async fn metrics(With(s): With<State>, body: Bytes) -> Response {
        if let Some(code) = s.failures.refuse(Signal::Metrics, &s.got) {
            return refused(code);
        }
        let Ok(req) = ExportMetricsServiceRequest::decode(body.clone()) else {
            return (StatusCode::BAD_REQUEST, "not an ExportMetricsServiceRequest").into_response();
        };
        s.got.take_metrics(&req, s.keep.then(|| body.to_vec()), body.len());
        protobuf(ExportMetricsServiceResponse::default().encode_to_vec())
    }

    async fn logs(With(s): With<State>, body: Bytes) -> Response {
        if let Some(code) = s.failures.refuse(Signal::Logs, &s.got) {
            return refused(code);
        }
        let Ok(req) = ExportLogsServiceRequest::decode(body.clone()) else {
            return (StatusCode::BAD_REQUEST, "not an ExportLogsServiceRequest").into_response();
        };
        s.got.take_logs(req, s.keep, body.len());
        protobuf(ExportLogsServiceResponse::default().encode_to_vec())
    }

    pub(super) fn router(state: State, max_body: usize) -> Router {
        Router::new()
            .route("/v1/metrics", post(metrics))
            .route("/v1/logs", post(logs))
            .layer(DefaultBodyLimit::max(max_body))
            .with_state(state)
    }

    /// Accept connections (over TLS with `acceptor`) and serve `app` on each with HTTP/1.1 until
    /// `shutdown`; the connections go with the runtime.
    pub(super) async fn serve(
        listener: tokio::net::TcpListener,
        acceptor: Option<tokio_rustls::TlsAcceptor>,
        app: Router,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        loop {
            let tcp = tokio::select! {
                _ = &mut shutdown => return,
                accepted = listener.accept() => match accepted {
                    Ok((tcp, _)) => tcp,
                    Err(_) => continue,
                },
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let svc = hyper_util::service::TowerToHyperService::new(app);
                let http = hyper::server::conn::http1::Builder::new();
                match acceptor {
                    None => {
                        let _ = http.serve_connection(hyper_util::rt::TokioIo::new(tcp), svc).await;
                    }
                    Some(a) => {
                        // A failed handshake (no or a wrong client certificate) ends the connection.
                        let Ok(tls) = a.accept(tcp).await else { return };
                        let _ = http.serve_connection(hyper_util::rt::TokioIo::new(tls), svc).await;
                    }
                }
            });
        }
    }
}

/// A running OTLP receiver; stopped on drop.
pub struct Collector {
    rt: Option<tokio::runtime::Runtime>,
    addr: SocketAddr,
    protocol: Protocol,
    tls: bool,
    got: Arc<Received>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Collector {
    /// An OTLP/gRPC collector, to set up and [`CollectorBuilder::start`].
    pub fn grpc() -> CollectorBuilder {
        CollectorBuilder::new(Protocol::Grpc)
    }

    /// An OTLP/HTTP (protobuf) collector, to set up and [`CollectorBuilder::start`].
    pub fn http() -> CollectorBuilder {
        CollectorBuilder::new(Protocol::HttpProtobuf)
    }

    /// A collector speaking `protocol`.
    pub fn builder(protocol: Protocol) -> CollectorBuilder {
        CollectorBuilder::new(protocol)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The protocol it serves.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The exporter's endpoint for it: `http://ADDR`, or `https://localhost:PORT` with TLS (the
    /// name on a test certificate). OTLP/HTTP's paths (`/v1/metrics`, `/v1/logs`) are the
    /// exporter's to add.
    pub fn endpoint(&self) -> String {
        if self.tls { format!("https://localhost:{}", self.addr.port()) } else { format!("http://{}", self.addr) }
    }

    /// What it has received so far.
    pub fn received(&self) -> &Arc<Received> {
        &self.got
    }

    /// Stop serving: the listener and every connection close (within a couple of seconds, at
    /// most, of graceful closing first).
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        let Some(rt) = self.rt.take() else { return };
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = rt.block_on(async { tokio::time::timeout(GRACEFUL_STOP, t).await });
        }
        // Whatever is left (a connection the client keeps open) is dropped with the runtime.
        rt.shutdown_timeout(GRACEFUL_STOP);
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.shut_down();
    }
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("addr", &self.addr)
            .field("protocol", &self.protocol)
            .field("tls", &self.tls)
            .finish()
    }
}

#[cfg(test)]
mod tests;
