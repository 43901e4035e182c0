use std::io::{Read as _, Write as _};

use opentelemetry_proto::tonic::{
    collector::{
        logs::v1::logs_service_client::LogsServiceClient, metrics::v1::metrics_service_client::MetricsServiceClient,
    },
    logs::v1::{LogRecord, ResourceLogs, ScopeLogs},
    metrics::v1::{Gauge, NumberDataPoint, ResourceMetrics, ScopeMetrics},
};

use super::*;

/// A request with one gauge of `n` points.
fn metrics_request(n: usize) -> ExportMetricsServiceRequest {
    let gauge = Metric {
        name: "g".into(),
        data: Some(metric::Data::Gauge(Gauge { data_points: vec![NumberDataPoint::default(); n] })),
        ..Default::default()
    };
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics { metrics: vec![gauge], ..Default::default() }],
            ..Default::default()
        }],
    }
}

/// A request of `n` log records named `name`.
fn logs_request(name: &str, n: usize) -> ExportLogsServiceRequest {
    let record = LogRecord { event_name: name.into(), ..Default::default() };
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs { log_records: vec![record; n], ..Default::default() }],
            ..Default::default()
        }],
    }
}

fn client_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// `POST path` with `body` over plain HTTP/1.1: (status, body).
fn post(addr: SocketAddr, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let split = answer.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete answer") + 4;
    let head = String::from_utf8_lossy(&answer[..split]).into_owned();
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("a status line");
    (status, answer[split..].to_vec())
}

#[test]
fn grpc_records_metrics_and_logs_and_a_restart_on_the_same_port_records_into_the_same_place() {
    let collector = Collector::grpc().start().unwrap();
    let rt = client_rt();
    let endpoint = collector.endpoint();
    rt.block_on(async {
        let mut m = MetricsServiceClient::connect(endpoint.clone()).await.unwrap();
        m.export(metrics_request(3)).await.unwrap();
        m.export(metrics_request(2)).await.unwrap();
        let mut l = LogsServiceClient::connect(endpoint.clone()).await.unwrap();
        l.export(logs_request("gputracer.rm_alloc", 4)).await.unwrap();
    });
    let got = collector.received().clone();
    assert_eq!((got.metric_requests(), got.metric_points()), (2, 5));
    let (raw, last) = got.last_metrics().unwrap();
    assert_eq!(last, metrics_request(2));
    assert_eq!(raw, metrics_request(2).encode_to_vec());
    assert_eq!(got.metrics()[0].bytes, metrics_request(3).encoded_len());
    assert_eq!(got.log_records(), 4);
    assert_eq!(got.event_names(), vec!["gputracer.rm_alloc"; 4]);

    // Gone: the client's export fails. Back on the same port: recorded into the same place.
    let addr = collector.addr();
    collector.stop();
    assert!(rt.block_on(MetricsServiceClient::connect(endpoint.clone())).is_err(), "nothing listens");
    let again = Collector::grpc().bind(addr).record_into(got.clone()).start().unwrap();
    rt.block_on(async { MetricsServiceClient::connect(endpoint).await.unwrap().export(metrics_request(1)).await })
        .unwrap();
    assert_eq!((again.received().metric_requests(), got.metric_points()), (3, 6));
}

#[test]
fn refusals_come_first_are_counted_and_name_themselves() {
    let collector = Collector::grpc().fail_first(Signal::Logs, 2, Code::Unavailable).start().unwrap();
    let rt = client_rt();
    let codes: Vec<Code> = rt.block_on(async {
        let mut l = LogsServiceClient::connect(collector.endpoint()).await.unwrap();
        let mut codes = Vec::new();
        for _ in 0..3 {
            codes.push(match l.export(logs_request("x", 1)).await {
                Ok(_) => Code::Ok,
                Err(s) => {
                    assert_eq!(s.message(), REFUSAL_MESSAGE);
                    s.code()
                }
            });
        }
        // Metrics are not refused.
        MetricsServiceClient::connect(collector.endpoint()).await.unwrap().export(metrics_request(1)).await.unwrap();
        codes
    });
    assert_eq!(codes, [Code::Unavailable, Code::Unavailable, Code::Ok]);
    let got = collector.received();
    assert_eq!((got.refused(Signal::Logs), got.log_records(), got.refused(Signal::Metrics)), (2, 1, 0));

    // HTTP maps the code to OTLP/HTTP's status.
    let http = Collector::http().fail_first(Signal::Metrics, 1, Code::InvalidArgument).start().unwrap();
    let body = metrics_request(2).encode_to_vec();
    assert_eq!(post(http.addr(), "/v1/metrics", &body).0, 400);
    assert_eq!(post(http.addr(), "/v1/metrics", &body).0, 200);
    assert_eq!((http.received().refused(Signal::Metrics), http.received().metric_points()), (1, 2));
}

#[test]
fn http_keeps_the_body_as_sent_and_refuses_what_does_not_decode_or_is_too_large() {
    let collector = Collector::http().max_message_bytes(1024).start().unwrap();
    let body = metrics_request(2).encode_to_vec();
    let (status, answer) = post(collector.addr(), "/v1/metrics", &body);
    assert_eq!(status, 200);
    assert_eq!(ExportMetricsServiceResponse::decode(answer.as_slice()).unwrap(), Default::default());
    assert_eq!(post(collector.addr(), "/v1/logs", &logs_request("e", 3).encode_to_vec()).0, 200);
    assert_eq!(post(collector.addr(), "/v1/logs", b"\xff\xff\xff").0, 400);
    assert_eq!(post(collector.addr(), "/v1/metrics", &metrics_request(2000).encode_to_vec()).0, 413);
    let got = collector.received();
    assert_eq!(got.metric_bodies(), vec![body.clone()]);
    assert_eq!(got.metrics()[0].bytes, body.len());
    assert_eq!((got.log_records(), got.event_names().len()), (3, 3));

    // Sizes and counts only.
    let lean = Collector::http().keep_requests(false).start().unwrap();
    assert_eq!(post(lean.addr(), "/v1/metrics", &body).0, 200);
    let m = lean.received().metrics();
    assert_eq!((m.len(), m[0].points, m[0].body.is_none()), (1, 2, true));
    assert!(lean.received().last_metrics().is_none());
}

#[test]
fn tls_with_a_client_ca_takes_only_clients_with_a_certificate() {
    let server = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let client = rcgen::generate_simple_self_signed(vec!["agent".to_string()]).unwrap();
    let (cert, key) = (server.cert.pem(), server.signing_key.serialize_pem());
    let (client_cert, client_key) = (client.cert.pem(), client.signing_key.serialize_pem());
    let collector = Collector::grpc().tls(&cert, &key).client_ca(&client_cert).start().unwrap();
    assert!(collector.endpoint().starts_with("https://localhost:"), "{}", collector.endpoint());
    let rt = client_rt();
    let export = |identity: bool| {
        rt.block_on(async {
            let mut tls = tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&cert))
                .domain_name("localhost");
            if identity {
                tls = tls.identity(tonic::transport::Identity::from_pem(&client_cert, &client_key));
            }
            let channel = tonic::transport::Channel::from_shared(collector.endpoint())
                .unwrap()
                .tls_config(tls)
                .unwrap()
                .connect()
                .await
                .map_err(|e| e.to_string())?;
            MetricsServiceClient::new(channel).export(metrics_request(1)).await.map_err(|e| e.to_string())
        })
    };
    assert!(export(false).is_err(), "no client certificate: refused");
    export(true).unwrap();
    assert_eq!(collector.received().metric_points(), 1);
}

#[test]
fn https_serves_with_the_certificate_given() {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject as _};
    let server = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (server.cert.pem(), server.signing_key.serialize_pem());
    let collector = Collector::http().tls(&cert, &key).start().unwrap();
    let body = metrics_request(4).encode_to_vec();
    let rt = client_rt();
    let head = rt.block_on(async {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(collector.addr()).await.unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        let request = format!(
            "POST /v1/metrics HTTP/1.1\r\nhost: localhost\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        tls.write_all(request.as_bytes()).await.unwrap();
        tls.write_all(&body).await.unwrap();
        let mut answer = Vec::new();
        let _ = tls.read_to_end(&mut answer).await;
        String::from_utf8_lossy(&answer).lines().next().unwrap_or_default().to_string()
    });
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(collector.received().metric_points(), 4);
}
