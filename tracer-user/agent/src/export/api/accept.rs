//! What the API's TCP listener lets in (issue 45 item 2): at most `max_connections` at once and
//! at most `max_connections_per_peer` from one client address (more are closed at accept, counted),
//! each connection's TLS handshake and HTTP/2 preface within `handshake_timeout` (a connection that
//! opens and says nothing is closed then, counted), and accept errors (out of file descriptors)
//! waited out instead of retried in a loop. Connections that pass go to tonic as [`ApiConn`]s,
//! which hold their slots until tonic drops them.
//!
//! The HTTP server's limits (`export::http`, [`PeerSlot`]) are the model; the difference is that a
//! gRPC connection is long-lived (a `Subscribe` stream), so there is no header timeout after the
//! preface: tonic closes a connection at `max_connection_age` (see [`ApiLimits`]) once its calls
//! end, and HTTP/2 pings find dead peers.
use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use gpu_tracer_proto::tonic::transport::server::{Connected, TcpConnectInfo};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore, mpsc},
    task::JoinSet,
};

use crate::export::http::{PeerCounts, PeerSlot};

/// The bytes every HTTP/2 connection starts with (RFC 9113 §3.4).
pub(crate) const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How much the API's TCP listener gives any one client, and how long it waits for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiLimits {
    /// Connections served at once; one more is closed at accept (counted).
    pub max_connections: usize,
    /// Connections served at once from one client address (IPv4-mapped IPv6 counts as the IPv4
    /// address); one more from it is closed at accept (counted).
    pub max_connections_per_peer: usize,
    /// The TLS handshake and the HTTP/2 connection preface must arrive within this.
    pub handshake_timeout: Duration,
    /// A connection is closed after this long, once the calls on it have ended (a `Subscribe`
    /// stream goes on; a client reconnects for its next call, as gRPC clients do on GOAWAY).
    pub max_connection_age: Duration,
}

impl ApiLimits {
    /// The limits for an agent serving `max_subscribers` (`api.max_subscribers`): one client
    /// address may hold every subscription and 16 connections more, the server four times that.
    /// At the default 128 subscribers: 144 per address, 576 in all (within the smallest soft
    /// file-descriptor limit, 1,024, beside the HTTP server's 64 and the agent's own).
    pub fn for_subscribers(max_subscribers: usize) -> ApiLimits {
        let per_peer = max_subscribers.saturating_add(16);
        ApiLimits {
            max_connections: per_peer.saturating_mul(4),
            max_connections_per_peer: per_peer,
            handshake_timeout: Duration::from_secs(10),
            max_connection_age: Duration::from_secs(600),
        }
    }
}

/// What the listener refused, since the agent started.
#[derive(Debug, Default)]
pub struct ConnCounters {
    pub(crate) refused_server_limit: AtomicU64,
    pub(crate) refused_peer_limit: AtomicU64,
    pub(crate) handshake_timeout: AtomicU64,
    pub(crate) handshake_failed: AtomicU64,
}

impl ConnCounters {
    /// The counts now.
    pub fn read(&self) -> tracer_core::model::ApiConnStats {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        tracer_core::model::ApiConnStats {
            refused_server_limit: r(&self.refused_server_limit),
            refused_peer_limit: r(&self.refused_peer_limit),
            handshake_timeout: r(&self.handshake_timeout),
            handshake_failed: r(&self.handshake_failed),
        }
    }
}

/// The transport under an [`ApiConn`].
enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// A connection the listener let in: its stream, the preface already read (handed to tonic
/// first), and the slots it holds until dropped.
pub struct ApiConn {
    io: Io,
    preface_left: usize,
    info: TcpConnectInfo,
    _slots: (OwnedSemaphorePermit, PeerSlot),
}

impl Connected for ApiConn {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for ApiConn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.preface_left > 0 {
            let from = H2_PREFACE.len() - this.preface_left;
            let n = this.preface_left.min(buf.remaining());
            buf.put_slice(&H2_PREFACE[from..from + n]);
            this.preface_left -= n;
            return Poll::Ready(Ok(()));
        }
        match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ApiConn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Counts a refusal, and logs the first and then every power of two.
fn count(counter: &AtomicU64, peer: SocketAddr, what: &str) {
    let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
    if n.is_power_of_two() {
        tracing::warn!(%peer, times = n, "gRPC API: {what}");
    }
}

/// Accepts on `listener` until tonic stops taking connections (drops the receiving side of
/// `out`), and sends each connection that finished its handshake in time to `out`.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    limits: ApiLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    counters: Arc<ConnCounters>,
    out: mpsc::Sender<io::Result<ApiConn>>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let peers = PeerCounts::default();
    let mut handshakes = JoinSet::new();
    let mut accept_errors = 0u64;
    loop {
        let (stream, peer) = tokio::select! {
            _ = out.closed() => break,
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => continue,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait, do not spin (tonic's own loop
                    // retries at once, ~190% CPU in the test).
                    accept_errors += 1;
                    if accept_errors.is_power_of_two() {
                        tracing::warn!(error = %e, times = accept_errors, "gRPC API: accepting a connection failed");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(peer_slot) = PeerSlot::take(&peers, peer.ip(), limits.max_connections_per_peer) else {
            count(
                &counters.refused_peer_limit,
                peer,
                "a client address is at its connection limit; closing its new ones",
            );
            continue;
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            count(&counters.refused_server_limit, peer, "at the connection limit; closing new connections");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let info = TcpConnectInfo { local_addr: stream.local_addr().ok(), remote_addr: Some(peer) };
        let (tls, counters, out) = (tls.clone(), Arc::clone(&counters), out.clone());
        handshakes.spawn(async move {
            match tokio::time::timeout(limits.handshake_timeout, handshake(stream, tls)).await {
                Ok(Ok(io)) => {
                    let conn = ApiConn { io, preface_left: H2_PREFACE.len(), info, _slots: (slot, peer_slot) };
                    let _ = out.send(Ok(conn)).await;
                }
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "gRPC API: handshake failed");
                    count(&counters.handshake_failed, peer, "a connection's handshake failed; closed");
                }
                Err(_) => count(&counters.handshake_timeout, peer, "a connection sent no handshake in time; closed"),
            }
        });
    }
    handshakes.abort_all();
}

/// TLS (when configured), then the HTTP/2 preface.
async fn handshake(stream: TcpStream, tls: Option<tokio_rustls::TlsAcceptor>) -> io::Result<Io> {
    let mut io = match tls {
        Some(acceptor) => Io::Tls(Box::new(acceptor.accept(stream).await?)),
        None => Io::Plain(stream),
    };
    let mut preface = [0u8; H2_PREFACE.len()];
    match &mut io {
        Io::Plain(s) => s.read_exact(&mut preface).await?,
        Io::Tls(s) => s.read_exact(&mut preface).await?,
    };
    if &preface != H2_PREFACE {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not an HTTP/2 connection (no gRPC preface)"));
    }
    Ok(io)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::AsyncWriteExt;

    use super::*;
    use crate::export::{
        api::{
            listen::{ListenSettings, serve_with},
            service::ApiState,
        },
        http::{HealthSettings, ServeState},
        metrics::MetricsRegistry,
    };
    use tracer_client::api::{self, ConnectSettings};
    use tracer_core::config::api::{ApiAddr, HubSettings};

    /// A TCP connection to `to` from the loopback address `from`.
    async fn open(from: [u8; 4], to: SocketAddr) -> TcpStream {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(SocketAddr::from((from, 0))).unwrap();
        s.connect(to).await.unwrap()
    }

    /// How long after `since` the server closed `s` (it reads end of stream or a reset), waiting at
    /// most `within`; `None` when it is still open then.
    async fn closed_after(s: &mut TcpStream, since: Instant, within: Duration) -> Option<Duration> {
        let mut buf = [0u8; 256];
        loop {
            match tokio::time::timeout(within.saturating_sub(since.elapsed()), s.read(&mut buf)).await {
                Err(_) => return None,
                Ok(Ok(0) | Err(_)) => return Some(since.elapsed()),
                // What an HTTP/2 server says first (its SETTINGS) is not an end.
                Ok(Ok(_)) => {}
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_over_the_caps_and_idle_ones_are_closed_and_counted() {
        let hub = Arc::new(crate::export::api::hub::EventHub::new(HubSettings::default()));
        let serve = Arc::new(ServeState::new(MetricsRegistry::new(), HealthSettings::default()));
        let state = Arc::new(ApiState::new(hub.clone(), serve, crate::probe::nvml_only_report()));
        let limits = ApiLimits {
            max_connections: 4,
            max_connections_per_peer: 2,
            handshake_timeout: Duration::from_millis(600),
            max_connection_age: Duration::from_secs(60),
        };
        let settings = ListenSettings { addr: ApiAddr::Tcp("127.0.0.1:0".parse().unwrap()), tls: None, token: None };
        let server = serve_with(&settings, state.clone(), limits).await.unwrap();
        let ApiAddr::Tcp(addr) = server.addr.clone() else { unreachable!() };
        let t0 = Instant::now();
        // One address's two are held (idle); its third is closed at once.
        let mut held = vec![open([127, 0, 0, 2], addr).await, open([127, 0, 0, 2], addr).await];
        let mut third = open([127, 0, 0, 2], addr).await;
        let at = Instant::now();
        let closed = closed_after(&mut third, at, Duration::from_millis(400)).await;
        assert!(closed.is_some(), "a client's third connection over its cap of 2 was not closed at accept");
        // Two from another address fill the server's four; one more from a third address is closed.
        held.push(open([127, 0, 0, 3], addr).await);
        held.push(open([127, 0, 0, 3], addr).await);
        let mut fifth = open([127, 0, 0, 4], addr).await;
        let at = Instant::now();
        assert!(
            closed_after(&mut fifth, at, Duration::from_millis(400)).await.is_some(),
            "a fifth connection over the server's cap of 4 was not closed at accept"
        );
        // The held ones said nothing: each is closed at the handshake timeout, not before.
        for s in &mut held {
            let after = closed_after(s, t0, Duration::from_secs(5)).await;
            assert!(
                after.is_some_and(|d| d >= Duration::from_millis(500)),
                "an idle connection was closed {after:?} after it opened (handshake timeout 600 ms)"
            );
        }
        // Something that is not HTTP/2 is closed as soon as its first 24 bytes are read.
        let mut http1 = open([127, 0, 0, 5], addr).await;
        http1.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let at = Instant::now();
        assert!(closed_after(&mut http1, at, Duration::from_millis(400)).await.is_some(), "HTTP/1 was not closed");
        // The slots are given back: a real client is served.
        let conn = ConnectSettings { addr: server.addr.clone(), token: None, tls_ca: None, tls_domain: None };
        let mut c = api::connect(&conn).await.unwrap();
        assert!(c.get_status(gpu_tracer_proto::v1::GetStatusRequest {}).await.is_ok());
        let s = state.stats().connections;
        assert_eq!(
            (s.refused_peer_limit, s.refused_server_limit, s.handshake_timeout, s.handshake_failed),
            (1, 1, 4, 1),
            "{s:?}"
        );
        drop(c);
        hub.close();
        server.shutdown(Duration::from_secs(2)).await;
    }
}
