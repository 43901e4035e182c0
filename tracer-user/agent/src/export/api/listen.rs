//! Where the API listens: a Unix socket (the default, mode 0660) or TCP (TLS required off
//! loopback; connection limits and a handshake timeout, [`super::accept`]), with an optional
//! bearer token; and the server's start and bounded stop.
use std::{
    net::SocketAddr,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use gpu_tracer_proto::{
    tonic::{self, transport::Server},
    v1::gpu_tracer_server::GpuTracerServer,
};
use tokio::{
    sync::{mpsc, oneshot},
    task::JoinHandle,
};
use tokio_stream::{
    StreamExt as _,
    wrappers::{ReceiverStream, UnixListenerStream},
};

use super::{
    accept::{ApiLimits, accept_loop},
    authority::AuthorityFix,
    service::{ApiService, ApiState, BearerToken},
};
use crate::export::http::{TlsFileProblem, tls_server};
use tracer_core::config::api::ApiAddr;

/// The largest request the agent decodes (requests are filters: small).
const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// How the API is served.
#[derive(Clone, Debug)]
pub struct ListenSettings {
    pub addr: ApiAddr,
    /// PEM certificate chain and key for TLS (TCP only).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// The bearer token every call must carry.
    pub token: Option<String>,
}

/// Why the API could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot listen on {addr}: {source}\n  hint: {hint}")]
    Bind { addr: ApiAddr, source: std::io::Error, hint: String },
    #[error(
        "{0}: another process is serving on this socket (a second gpu-tracer agent?)\n  hint: stop it, or give this one another --grpc-listen"
    )]
    InUse(PathBuf),
    #[error("{0} exists and is not a socket; remove it or choose another --grpc-listen path")]
    NotASocket(PathBuf),
    #[error(
        "{0}: plain TCP off loopback would carry events and tokens in clear\n  hint: set api.tls_cert and api.tls_key, or listen on 127.0.0.1 / a unix socket"
    )]
    NeedsTls(SocketAddr),
    #[error("TLS setup: {0}")]
    Tls(String),
}

/// The running API server.
#[derive(Debug)]
pub struct ApiServer {
    /// Where it listens (the bound port for `tcp://…:0`).
    pub addr: ApiAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), String>>,
    socket: Option<PathBuf>,
}

impl ApiServer {
    /// Stops accepting, ends open streams (the hub must be closed by the caller), waits at most
    /// `deadline` for calls in flight, and removes the socket file.
    pub async fn shutdown(self, deadline: Duration) {
        let _ = self.stop.send(());
        let mut task = self.task;
        if tokio::time::timeout(deadline, &mut task).await.is_err() {
            tracing::warn!(?deadline, "API calls still open at the shutdown deadline: dropped");
            task.abort();
        }
        if let Some(p) = self.socket {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Binds `settings.addr` and serves the API over `state` until [`ApiServer::shutdown`]; a TCP
/// listener with the limits for the hub's `max_subscribers` ([`ApiLimits::for_subscribers`]).
pub async fn serve(settings: &ListenSettings, state: Arc<ApiState>) -> Result<ApiServer, ListenError> {
    let limits = ApiLimits::for_subscribers(state.hub.settings().max_subscribers);
    serve_with(settings, state, limits).await
}

/// [`serve`] with the given limits (TCP only: the Unix socket's mode is its guard).
pub(crate) async fn serve_with(
    settings: &ListenSettings,
    state: Arc<ApiState>,
    limits: ApiLimits,
) -> Result<ApiServer, ListenError> {
    let counters = state.connections.clone();
    let token = settings.token.as_deref().map(BearerToken::new);
    let server = GpuTracerServer::new(ApiService::new(state)).max_decoding_message_size(MAX_REQUEST_BYTES);
    let service = tonic::service::interceptor::InterceptedService::new(server, move |req| match &token {
        Some(t) => t.check(req),
        None => Ok(req),
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let signal = async {
        let _ = stopped.await;
    };
    let mut builder = Server::builder().http2_keepalive_interval(Some(Duration::from_secs(30)));
    match &settings.addr {
        ApiAddr::Unix(path) => {
            let listener = bind_unix(path)?;
            let router = builder.add_service(service);
            let task = tokio::spawn(async move {
                // Each connection read through `AuthorityFix`: grpcio and grpcurl send the socket
                // path as `:authority`, which h2 refuses (super::authority).
                let incoming = UnixListenerStream::new(listener).map(|c| c.map(AuthorityFix::new));
                router.serve_with_incoming_shutdown(incoming, signal).await.map_err(|e| e.to_string())
            });
            Ok(ApiServer { addr: settings.addr.clone(), stop, task, socket: Some(path.clone()) })
        }
        ApiAddr::Tcp(addr) => {
            let tls = match &settings.tls {
                Some((cert, key)) => Some(tokio_rustls::TlsAcceptor::from(tls_config(cert, key)?)),
                None if !addr.ip().is_loopback() => return Err(ListenError::NeedsTls(*addr)),
                None => None,
            };
            let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| ListenError::Bind {
                addr: settings.addr.clone(),
                hint: "choose a free port, or an address of this host".into(),
                source,
            })?;
            let bound = listener.local_addr().unwrap_or(*addr);
            // The listener is ours (limits, handshake timeout); tonic serves what passes.
            // It stops when tonic drops the incoming side (at shutdown, or if the server ends).
            let (conns, incoming) = mpsc::channel(64);
            tokio::spawn(accept_loop(listener, limits, tls, counters, conns));
            let router = builder.max_connection_age(limits.max_connection_age).add_service(service);
            let task = tokio::spawn(async move {
                router
                    .serve_with_incoming_shutdown(ReceiverStream::new(incoming), signal)
                    .await
                    .map_err(|e| e.to_string())
            });
            Ok(ApiServer { addr: ApiAddr::Tcp(bound), stop, task, socket: None })
        }
    }
}

/// The TLS server for `api.tls_cert` and `api.tls_key` (PEM), speaking HTTP/2 (ALPN `h2`).
fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, ListenError> {
    tls_server(cert, key, b"h2").map_err(|e| match e {
        TlsFileProblem::Cert(why) => ListenError::Tls(format!("api.tls_cert ({}): {why}", cert.display())),
        TlsFileProblem::Key(why) => ListenError::Tls(format!("api.tls_key ({}): {why}", key.display())),
    })
}

/// Binds the socket with mode 0660 from the start: bound under a temporary name, made 0660, then
/// renamed into place, so it is never reachable with the umask's mode. A stale socket (no one
/// listening) is replaced; a live one is an error.
fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener, ListenError> {
    let addr = ApiAddr::Unix(path.into());
    let bind_err = |source: std::io::Error, hint: String| ListenError::Bind { addr: addr.clone(), source, hint };
    if let Some(dir) = path.parent() {
        // Only the default socket's directory (/run/gpu-tracer, on a tmpfs that starts empty) is
        // made; any other must exist, so a typo makes no directories as root.
        if addr.to_string() == tracer_core::config::api::DEFAULT_LISTEN {
            std::fs::create_dir_all(dir).map_err(|e| {
                bind_err(
                    e,
                    format!(
                        "create {} (the agent runs as root on a node), or choose another --grpc-listen",
                        dir.display()
                    ),
                )
            })?;
        } else if !dir.is_dir() {
            return Err(bind_err(
                std::io::Error::new(std::io::ErrorKind::NotFound, format!("no directory {}", dir.display())),
                "create it first, or choose a socket path in a directory that exists (only the default's, /run/gpu-tracer, is made)"
                    .into(),
            ));
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Err(ListenError::InUse(path.into())),
            Err(_) => {
                let _ = std::fs::remove_file(path);
            }
        },
        Ok(_) => return Err(ListenError::NotASocket(path.into())),
        Err(_) => {}
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener =
        tokio::net::UnixListener::bind(&tmp).map_err(|e| bind_err(e, "check the directory's permissions".into()))?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o660))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(bind_err(e, "check the directory's permissions".into()));
    }
    Ok(listener)
}
