use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::export::metrics::tests::{parse, sample_snapshot, value};

/// One HTTP/1.1 request over a raw socket: (status, content type, body).
async fn get(addr: SocketAddr, path: &str, accept: Option<&str>) -> (u16, String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n{accept}Connection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.expect("read response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a header block");
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("a status code");
    let ctype = head
        .lines()
        .find_map(|l| l.strip_prefix("content-type: ").or_else(|| l.strip_prefix("Content-Type: ")))
        .unwrap_or_default()
        .to_owned();
    (status, ctype, body.to_owned())
}

fn state(stale_after: Duration) -> Arc<ServeState> {
    Arc::new(ServeState::new(MetricsRegistry::new(), HealthSettings { stale_after }))
}

const OPENMETRICS: &str = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";

/// Issue 13 item 6: a probe family that is switched on but failed to attach is not "probes
/// attached": /readyz answers 503 naming the family and why. Nothing to probe (no libcuda) and a
/// family switched off are ready.
#[tokio::test]
async fn readiness_names_a_family_that_failed_to_attach() {
    use tracer_core::model::probes::FamilyStatus;
    let st = state(Duration::from_secs(30));
    let srv = serve("127.0.0.1:0".parse().unwrap(), st.clone()).await.unwrap();
    st.mark_attached("driver-entry");
    let mut snap = sample_snapshot();
    snap.probe_families[0].status =
        FamilyStatus::Failed { error: "attach mode driver-entry is not implemented yet (it needs kprobes)".into() };
    st.publish(Arc::new(snap.clone()));
    let (code, _, body) = get(srv.local_addr, "/readyz", None).await;
    assert_eq!(
        (code, body.as_str()),
        (503, "not ready: driver family failed: attach mode driver-entry is not implemented yet (it needs kprobes)\n")
    );
    snap.probe_families[1].status = FamilyStatus::Failed { error: "attaching tracepoint/sched/x: EPERM".into() };
    st.publish(Arc::new(snap.clone()));
    let (_, _, body) = get(srv.local_addr, "/readyz", None).await;
    assert!(body.contains("driver family failed: ") && body.contains("; lifecycle family failed: attaching"), "{body}");
    // Still alive: the kubelet must not restart an agent for its configuration.
    assert_eq!(get(srv.local_addr, "/healthz", None).await.0, 200);
    st.publish(Arc::new(sample_snapshot()));
    assert_eq!(get(srv.local_addr, "/readyz", None).await.0, 200);
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn readiness_follows_attach_and_first_snapshot() {
    let st = state(Duration::from_secs(30));
    let srv = serve("127.0.0.1:0".parse().unwrap(), st.clone()).await.unwrap();
    let addr = srv.local_addr;
    assert_ne!(addr.port(), 0);

    let (code, _, body) = get(addr, "/readyz", None).await;
    assert_eq!(
        (code, body.as_str()),
        (503, "not ready: probes not attached yet (the agent is still loading its eBPF programs)\n")
    );
    st.mark_attached("tracepoint");
    let (code, _, body) = get(addr, "/readyz", None).await;
    assert_eq!(code, 503);
    assert!(body.contains("no snapshot published yet"), "{body}");
    let (code, _, body) = get(addr, "/metrics", None).await;
    assert_eq!(code, 503, "{body}");

    st.publish(Arc::new(sample_snapshot()));
    let (code, _, body) = get(addr, "/readyz", None).await;
    assert_eq!((code, body.as_str()), (200, "ready: probes attached (tracepoint), snapshot published\n"));
    let (code, _, body) = get(addr, "/healthz", None).await;
    assert_eq!(code, 200, "{body}");
    let (code, _, _) = get(addr, "/nope", None).await;
    assert_eq!(code, 404);
    srv.shutdown().await.unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "still listening after shutdown");
}

#[tokio::test]
async fn metrics_serves_the_latest_snapshot_in_the_negotiated_format() {
    let st = state(Duration::from_secs(30));
    let srv = serve("127.0.0.1:0".parse().unwrap(), st.clone()).await.unwrap();
    st.mark_attached("tracepoint");
    st.publish(Arc::new(sample_snapshot()));
    let (code, ctype, body) = get(srv.local_addr, "/metrics", Some(OPENMETRICS)).await;
    assert_eq!(code, 200);
    assert_eq!(ctype, ExpositionFormat::OpenMetrics.content_type());
    let p = parse(&body);
    assert_eq!(value(&p, "gpu_tracer_processes", &[]), 3.0);

    // A newer snapshot replaces the old one.
    let mut next = sample_snapshot();
    next.state.totals.processes = 7;
    st.publish(Arc::new(next));
    let (_, _, body) = get(srv.local_addr, "/metrics", Some(OPENMETRICS)).await;
    assert_eq!(value(&parse(&body), "gpu_tracer_processes", &[]), 7.0);

    // Without an Accept header: the classic text format.
    let (code, ctype, body) = get(srv.local_addr, "/metrics", None).await;
    assert_eq!(code, 200);
    assert_eq!(ctype, ExpositionFormat::Prometheus.content_type());
    let p = openmetrics_parser::prometheus::parse_prometheus(&body).expect("classic text parses");
    assert!(p.families.contains_key("gpu_tracer_processes"));
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_stale_heartbeat_fails_liveness_and_readiness() {
    let st = state(Duration::from_secs(1));
    let srv = serve("127.0.0.1:0".parse().unwrap(), st.clone()).await.unwrap();
    st.mark_attached("tracepoint");
    st.publish(Arc::new(sample_snapshot()));
    assert_eq!(get(srv.local_addr, "/healthz", None).await.0, 200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (code, _, body) = get(srv.local_addr, "/healthz", None).await;
    assert_eq!(code, 503);
    assert!(body.starts_with("agent loop stalled: no heartbeat for"), "{body}");
    let (code, _, body) = get(srv.local_addr, "/readyz", None).await;
    assert_eq!(code, 503);
    assert!(body.contains("agent loop stalled"), "{body}");
    st.heartbeat();
    assert_eq!(get(srv.local_addr, "/healthz", None).await.0, 200);
    assert_eq!(get(srv.local_addr, "/readyz", None).await.0, 200);
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn bind_error_names_the_address_and_the_fix() {
    let st = state(Duration::from_secs(30));
    let first = serve("127.0.0.1:0".parse().unwrap(), st.clone()).await.unwrap();
    let err = serve(first.local_addr, st).await.expect_err("second bind on the same port");
    let msg = err.to_string();
    assert_eq!(err.reason(), "bind");
    assert!(msg.contains(&first.local_addr.to_string()), "{msg}");
    assert!(msg.contains("already in use") && msg.contains("--listen"), "{msg}");
    first.shutdown().await.unwrap();
}

fn tight() -> ServeLimits {
    ServeLimits {
        max_connections: 4,
        max_connections_per_peer: 8,
        header_read_timeout: Duration::from_millis(300),
        max_connection_age: Duration::from_secs(1),
        shutdown_deadline: Duration::from_millis(500),
    }
}

/// Reads until the server closes the connection (or `within` passes): what it sent, and whether
/// it closed in time.
async fn until_closed(s: &mut tokio::net::TcpStream, within: Duration) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let closed = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (got, closed)
}

/// Slowloris: a client that sends half a request and waits is disconnected after the header
/// timeout, not kept for ever.
#[tokio::test]
async fn a_slow_header_is_cut_off_at_the_header_timeout() {
    let st = state(Duration::from_secs(30));
    st.publish(Arc::new(sample_snapshot()));
    let srv = serve_with("127.0.0.1:0".parse().unwrap(), st, tight()).await.unwrap();
    let mut s = tokio::net::TcpStream::connect(srv.local_addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.unwrap();
    let t = Instant::now();
    let (_, closed) = until_closed(&mut s, Duration::from_secs(3)).await;
    assert!(closed, "the connection was kept past the header timeout");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // The server still answers.
    assert_eq!(get(srv.local_addr, "/healthz", None).await.0, 200);
    srv.shutdown().await.unwrap();
}

/// A header larger than the bound is refused (431) without being buffered whole.
#[tokio::test]
async fn an_oversized_header_is_refused() {
    let st = state(Duration::from_secs(30));
    let srv = serve_with("127.0.0.1:0".parse().unwrap(), st, tight()).await.unwrap();
    let mut s = tokio::net::TcpStream::connect(srv.local_addr).await.unwrap();
    let big = format!("GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}", "a".repeat(64 * 1024));
    // The server may close before it has read it all; a failed write is part of the answer.
    let _ = s.write_all(big.as_bytes()).await;
    let (got, closed) = until_closed(&mut s, Duration::from_secs(3)).await;
    assert!(closed, "an unfinished 64 KiB header kept the connection open");
    let head = String::from_utf8_lossy(&got);
    assert!(head.is_empty() || head.starts_with("HTTP/1.1 431"), "{head}");
    srv.shutdown().await.unwrap();
}

/// At `max_connections` open, one more is closed at once and counted; connections that never
/// send a byte go at the header timeout (not at their age), and scrapes work again.
#[tokio::test]
async fn connections_past_the_limit_are_closed_and_counted() {
    let st = state(Duration::from_secs(30));
    let limits = ServeLimits { max_connection_age: Duration::from_secs(30), ..tight() };
    let srv = serve_with("127.0.0.1:0".parse().unwrap(), st.clone(), limits).await.unwrap();
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(tokio::net::TcpStream::connect(srv.local_addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut extra = tokio::net::TcpStream::connect(srv.local_addr).await.unwrap();
    let (got, closed) = until_closed(&mut extra, Duration::from_millis(500)).await;
    assert!(closed && got.is_empty(), "the connection past the limit was served");
    assert_eq!(st.http_stats(), HttpStats { refused_server_limit: 1, refused_peer_limit: 0, unauthorized: 0 });
    let t = Instant::now();
    for s in &mut idle {
        let (_, closed) = until_closed(s, Duration::from_secs(3)).await;
        assert!(closed, "an idle connection held its slot");
    }
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(get(srv.local_addr, "/healthz", None).await.0, 200, "served again once the idle connections went");
    srv.shutdown().await.unwrap();
}

/// A connection from `from` (a loopback address: every 127/8 address reaches the server).
async fn connect_from(from: &str, to: SocketAddr) -> tokio::net::TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
    sock.connect(to).await.unwrap()
}

/// One client address holding its share of the slots is refused past it (counted as `peer_limit`),
/// while another address is still served: a slow client cannot keep the scraper out.
#[tokio::test]
async fn one_client_cannot_take_every_slot() {
    let st = state(Duration::from_secs(30));
    st.publish(Arc::new(sample_snapshot()));
    let limits = ServeLimits { max_connections_per_peer: 2, max_connection_age: Duration::from_secs(30), ..tight() };
    let srv = serve_with("127.0.0.1:0".parse().unwrap(), st.clone(), limits).await.unwrap();
    let mut slow = Vec::new();
    for _ in 0..2 {
        let mut s = connect_from("127.0.0.2", srv.local_addr).await;
        s.write_all(b"GET /metr").await.unwrap();
        slow.push(s);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut third = connect_from("127.0.0.2", srv.local_addr).await;
    let (got, closed) = until_closed(&mut third, Duration::from_millis(500)).await;
    assert!(closed && got.is_empty(), "a third connection from the same address was served");
    assert_eq!(st.http_stats(), HttpStats { refused_server_limit: 0, refused_peer_limit: 1, unauthorized: 0 });
    // Another address is served while the first holds its two.
    assert_eq!(get(srv.local_addr, "/metrics", None).await.0, 200);
    assert_eq!(get(srv.local_addr, "/healthz", None).await.0, 200);
    // Once the slow ones are cut off at the header timeout, the address gets its slots back.
    for s in &mut slow {
        assert!(until_closed(s, Duration::from_secs(3)).await.1, "a slow connection was kept");
    }
    let mut again = connect_from("127.0.0.2", srv.local_addr).await;
    again.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let (got, _) = until_closed(&mut again, Duration::from_secs(3)).await;
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&got));
    srv.shutdown().await.unwrap();
}

/// Stopping with a client stuck in the middle of a request takes the shutdown deadline, not as
/// long as the client likes.
#[tokio::test]
async fn shutdown_does_not_wait_for_an_unfinished_request() {
    let st = state(Duration::from_secs(30));
    let limits = ServeLimits { header_read_timeout: Duration::from_secs(60), ..tight() };
    let srv = serve_with("127.0.0.1:0".parse().unwrap(), st, limits).await.unwrap();
    let mut s = tokio::net::TcpStream::connect(srv.local_addr).await.unwrap();
    s.write_all(b"GET /metr").await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t = Instant::now();
    srv.shutdown().await.unwrap();
    assert!(t.elapsed() < Duration::from_millis(1500), "shutdown took {:?}", t.elapsed());
    let (_, closed) = until_closed(&mut s, Duration::from_secs(1)).await;
    assert!(closed);
}

/// Slots are counted per address (an IPv4-mapped IPv6 peer is its IPv4 address) and given back
/// when dropped; no entry stays for an address with no connection.
#[test]
fn peer_slots_count_per_address_and_are_given_back() {
    let counts = PeerCounts::default();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let a = PeerSlot::take(&counts, ip("10.0.0.1"), 2).unwrap();
    let b = PeerSlot::take(&counts, ip("::ffff:10.0.0.1"), 2).unwrap();
    assert!(PeerSlot::take(&counts, ip("10.0.0.1"), 2).is_none(), "a third slot for the same address");
    assert!(PeerSlot::take(&counts, ip("10.0.0.2"), 2).is_some(), "another address has its own");
    drop(a);
    let c = PeerSlot::take(&counts, ip("10.0.0.1"), 2).expect("a slot given back is taken again");
    drop((b, c));
    assert!(counts.lock().unwrap().is_empty(), "{:?}", counts.lock().unwrap());
}

#[tokio::test]
async fn metrics_are_gzipped_when_the_scraper_asks() {
    use std::io::Read;
    let st = state(Duration::from_secs(30));
    let srv = serve("127.0.0.1:0".parse().unwrap(), st.clone()).await.unwrap();
    st.mark_attached("tracepoint");
    st.publish(Arc::new(sample_snapshot()));
    let raw = |accept_encoding: &'static str| async move {
        let mut s = tokio::net::TcpStream::connect(srv.local_addr).await.unwrap();
        let req = format!(
            "GET /metrics HTTP/1.1\r\nHost: t\r\nAccept: {OPENMETRICS}\r\n{accept_encoding}Connection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        let at = out.windows(4).position(|w| w == b"\r\n\r\n").expect("a header block");
        (String::from_utf8_lossy(&out[..at]).to_lowercase(), out[at + 4..].to_vec())
    };
    let (head, plain) = raw("").await;
    assert!(!head.contains("content-encoding"), "{head}");
    // As Prometheus asks.
    let (head, zipped) = raw("Accept-Encoding: gzip\r\n").await;
    assert!(head.contains("content-encoding: gzip") && head.contains("vary: accept-encoding"), "{head}");
    let mut unzipped = Vec::new();
    flate2::read::GzDecoder::new(&zipped[..]).read_to_end(&mut unzipped).expect("a gzip stream");
    assert_eq!(unzipped, plain, "the same exposition");
    assert!(zipped.len() * 4 < plain.len(), "{} bytes zipped of {}", zipped.len(), plain.len());
    // Refused (q=0) or another coding only: plain text.
    for h in ["Accept-Encoding: gzip;q=0\r\n", "Accept-Encoding: br, deflate\r\n"] {
        let (head, body) = raw(h).await;
        assert!(!head.contains("content-encoding"), "{h}: {head}");
        assert_eq!(body, plain);
    }
    srv.shutdown().await.unwrap();
}

/// `metrics.tls_cert`/`tls_key`/`token_file`: the endpoints answer over TLS only; /metrics wants
/// the bearer token (none or a wrong one: 401, counted in `http_unauthorized_requests_total`),
/// /healthz and /readyz do not.
#[tokio::test]
async fn tls_and_a_bearer_token_guard_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key, token) = (dir.path().join("tls.crt"), dir.path().join("tls.key"), dir.path().join("token"));
    std::fs::write(&cert, c.cert.pem()).unwrap();
    std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let sec = ServeSecurity::load(Some(&cert), Some(&key), Some(&token)).unwrap();
    assert_eq!(
        format!("{sec:?}"),
        "ServeSecurity { tls: true, token: Some(Secret(..)) }",
        "the token is never printed"
    );
    let st = Arc::new(
        ServeState::new(MetricsRegistry::new(), HealthSettings { stale_after: Duration::from_secs(30) })
            .with_token(sec.token.clone()),
    );
    let srv = serve_secure("127.0.0.1:0".parse().unwrap(), st.clone(), ServeLimits::default(), sec.tls.clone())
        .await
        .unwrap();
    st.mark_attached("tracepoint");
    st.publish(Arc::new(sample_snapshot()));

    let mut roots = rustls::RootCertStore::empty();
    roots.add(c.cert.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let addr = srv.local_addr;
    let get = |path: &'static str, auth: Option<&'static str>| {
        let connector = connector.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let mut s = connector.connect(name, tcp).await.expect("TLS handshake");
            let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
            s.write_all(
                format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
            let mut raw = Vec::new();
            let _ = s.read_to_end(&mut raw).await;
            let raw = String::from_utf8_lossy(&raw).into_owned();
            let status: u16 = raw.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
            (status, raw)
        }
    };
    let (code, body) = get("/metrics", None).await;
    assert_eq!(code, 401, "{body}");
    assert!(body.to_lowercase().contains("www-authenticate: bearer") && body.contains("metrics.token_file"));
    assert!(!body.contains("s3cret"));
    assert_eq!(get("/metrics", Some("Bearer wrong-token!")).await.0, 401);
    assert_eq!(get("/metrics", Some("Basic czNjcmV0LXRva2Vu")).await.0, 401);
    assert_eq!(st.http_stats().unauthorized, 3, "each refused scrape is counted");
    let (code, body) = get("/metrics", Some("Bearer s3cret-token")).await;
    assert_eq!(code, 200);
    assert_eq!(st.http_stats().unauthorized, 3);
    assert!(body.contains("gpu_tracer_processes"));
    assert_eq!(get("/healthz", None).await.0, 200);
    assert_eq!(get("/readyz", None).await.0, 200);

    // Plain HTTP to the TLS port gets no HTTP answer.
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    plain.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut raw)).await;
    assert!(!String::from_utf8_lossy(&raw).starts_with("HTTP/1.1 200"), "plain HTTP was served over the TLS port");
    srv.shutdown().await.unwrap();
}

#[test]
fn unusable_tls_or_token_files_are_errors_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, " \n").unwrap();
    let missing = dir.path().join("missing");
    let e = ServeSecurity::load(Some(&junk), Some(&junk), None).unwrap_err();
    assert_eq!(e.key, "metrics.tls_cert", "{e}");
    let e = ServeSecurity::load(None, None, Some(&empty)).unwrap_err();
    assert_eq!(e.key, "metrics.token_file", "{e}");
    assert!(e.why.starts_with("the file is empty"), "{e}");
    let e = ServeSecurity::load(None, None, Some(&missing)).unwrap_err();
    assert!(e.to_string().starts_with("metrics.token_file (") && e.to_string().contains("cannot read"), "{e}");
    let e = ServeSecurity::load(Some(&junk), None, None).unwrap_err();
    assert!(e.why.contains("both"), "{e}");
}
