//! Sending OTLP requests: gRPC over a tonic channel (metrics as the bytes `wire` wrote, through
//! tonic's client with a codec that passes them on; logs through the generated client of
//! `opentelemetry-proto`), or HTTP/protobuf (`POST {endpoint}/v1/metrics`, `/v1/logs`) through hyper; both with
//! rustls for `https://` endpoints (the configured CA file, else the system's roots; optionally a
//! client certificate). Built inside the export thread's runtime (the connection tasks run there);
//! nothing connects until the first export, and a connection that breaks is made again by the
//! next one.
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use opentelemetry_proto::tonic::collector::{
    logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse, logs_service_client::LogsServiceClient},
    metrics::v1::ExportMetricsServiceResponse,
};
use prost::Message as _;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use tracer_core::{
    config::otlp::{OtlpProtocol, OtlpSettingError, OtlpSettings, OtlpTls},
    tls::http_tls,
};

/// The largest answer body read from an HTTP collector (an answer is a few bytes; an error page
/// is cut here).
const MAX_ANSWER: usize = 64 * 1024;

/// What the collector said about a request it accepted: items it rejected anyway (OTLP's
/// `partial_success`) and why.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Accepted {
    pub rejected: u64,
    pub message: String,
}

/// A request that did not go through: why, and whether sending it again may work (the OTLP
/// specification's retryable cases: gRPC `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `ABORTED`,
/// `DEADLINE_EXCEEDED`, `CANCELLED`, `OUT_OF_RANGE`, `DATA_LOSS`; HTTP 429, 502, 503, 504; no
/// connection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SendError {
    pub message: String,
    pub retryable: bool,
    /// The collector did not answer in time (a connect or request timeout of the client):
    /// counted as `timeout`, not `export_failed`.
    pub timed_out: bool,
}

/// Whether `e` or an error under it is a timeout: an I/O `TimedOut` (a connect timeout), tonic's
/// `Timeout expired`, tower's or tokio's elapsed deadline.
fn is_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut) {
            return true;
        }
        let text = err.to_string().to_ascii_lowercase();
        if ["timed out", "timeout expired", "deadline has elapsed"].iter().any(|t| text.contains(t)) {
            return true;
        }
        cur = err.source();
    }
    false
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The connection to the collector, for the chosen protocol.
pub(super) enum Transport {
    Grpc {
        /// Metrics go as the bytes `wire` wrote ([`EncodedRequest`]), logs through the generated client.
        metrics: tonic::client::Grpc<Channel>,
        logs: LogsServiceClient<Channel>,
        metadata: tonic::metadata::MetadataMap,
    },
    Http {
        client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
        metrics: hyper::Uri,
        logs: hyper::Uri,
        headers: hyper::HeaderMap,
    },
}

impl Transport {
    /// Set up the client (no connection yet). Must run inside a tokio runtime.
    pub(super) fn build(s: &OtlpSettings) -> Result<Transport, OtlpSettingError> {
        let err = |why: String| OtlpSettingError { key: s.endpoint_source, value: s.endpoint.clone(), why };
        match s.protocol {
            OtlpProtocol::Grpc => {
                let mut endpoint = Endpoint::from_shared(s.endpoint.clone())
                    .map_err(|e| err(format!("not a URL ({e})")))?
                    .connect_timeout(s.timeout.min(Duration::from_secs(10)))
                    .timeout(s.timeout)
                    .http2_keep_alive_interval(Duration::from_secs(30))
                    .keep_alive_while_idle(false);
                if let Some(tls) = &s.tls {
                    // The same checks as the HTTP side's (a CA file that holds nothing, a system
                    // without roots, a key that does not parse), now rather than at each export.
                    http_tls(Some(tls)).map_err(|why| err(format!("TLS: {why}")))?;
                    endpoint = endpoint.tls_config(grpc_tls(tls)).map_err(|e| err(format!("TLS: {e}")))?;
                }
                let channel = endpoint.connect_lazy();
                // Requests are bounded by MAX_POINTS_PER_REQUEST and the log batch; a collector's
                // default limit is 4 MiB, ours to receive its answers is tonic's default.
                Ok(Transport::Grpc {
                    metrics: tonic::client::Grpc::new(channel.clone()).max_encoding_message_size(64 << 20),
                    logs: LogsServiceClient::new(channel).max_encoding_message_size(64 << 20),
                    metadata: metadata(s)?,
                })
            }
            OtlpProtocol::HttpProtobuf => {
                let mut http = HttpConnector::new();
                http.enforce_http(false);
                http.set_connect_timeout(Some(s.timeout.min(Duration::from_secs(10))));
                let tls = http_tls(s.tls.as_ref()).map_err(|why| err(format!("TLS: {why}")))?;
                let connector = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(tls)
                    .https_or_http()
                    .enable_http1()
                    .wrap_connector(http);
                let client = Client::builder(TokioExecutor::new())
                    .pool_idle_timeout(Duration::from_secs(90))
                    .pool_max_idle_per_host(2)
                    .build(connector);
                let uri = |path: &str| -> Result<hyper::Uri, OtlpSettingError> {
                    format!("{}{path}", s.endpoint).parse().map_err(|e| err(format!("not a URL ({e})")))
                };
                Ok(Transport::Http {
                    client,
                    metrics: uri("/v1/metrics")?,
                    logs: uri("/v1/logs")?,
                    headers: headers(s)?,
                })
            }
        }
    }

    /// Send one metrics request: the bytes of an `ExportMetricsServiceRequest`.
    pub(super) async fn metrics(&mut self, body: Bytes) -> Result<Accepted, SendError> {
        match self {
            Transport::Grpc { metrics, metadata, .. } => {
                // What the generated client does, with a codec that sends the bytes as they are.
                metrics.ready().await.map_err(|e| {
                    let timed_out = is_timeout(&e);
                    let mut se = grpc_error(tonic::Status::unknown(format!("Service was not ready: {e}")));
                    se.timed_out |= timed_out;
                    se
                })?;
                let mut r = tonic::Request::new(body);
                *r.metadata_mut() = metadata.clone();
                let path = http::uri::PathAndQuery::from_static(METRICS_EXPORT);
                let answer = metrics.unary(r, path, EncodedRequest).await.map_err(grpc_error)?.into_inner();
                Ok(answer.partial_success.map_or_else(Accepted::default, |p| Accepted {
                    rejected: p.rejected_data_points.max(0) as u64,
                    message: p.error_message,
                }))
            }
            Transport::Http { client, metrics, headers, .. } => {
                let body = post(client, metrics, headers, body).await?;
                let answer = ExportMetricsServiceResponse::decode(body).unwrap_or_default();
                Ok(answer.partial_success.map_or_else(Accepted::default, |p| Accepted {
                    rejected: p.rejected_data_points.max(0) as u64,
                    message: p.error_message,
                }))
            }
        }
    }

    /// Send one logs request.
    pub(super) async fn logs(&mut self, req: ExportLogsServiceRequest) -> Result<Accepted, SendError> {
        match self {
            Transport::Grpc { logs, metadata, .. } => {
                let mut r = tonic::Request::new(req);
                *r.metadata_mut() = metadata.clone();
                let answer = logs.export(r).await.map_err(grpc_error)?.into_inner();
                Ok(answer.partial_success.map_or_else(Accepted::default, |p| Accepted {
                    rejected: p.rejected_log_records.max(0) as u64,
                    message: p.error_message,
                }))
            }
            Transport::Http { client, logs, headers, .. } => {
                let body = post(client, logs, headers, Bytes::from(req.encode_to_vec())).await?;
                let answer = ExportLogsServiceResponse::decode(body).unwrap_or_default();
                Ok(answer.partial_success.map_or_else(Accepted::default, |p| Accepted {
                    rejected: p.rejected_log_records.max(0) as u64,
                    message: p.error_message,
                }))
            }
        }
    }
}

/// The gRPC method metrics are exported with (`opentelemetry/proto/collector/metrics/v1`).
const METRICS_EXPORT: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";

/// The gRPC codec of a metrics export whose request is already encoded: it writes the bytes as
/// they are and decodes the answer with prost.
#[derive(Clone, Copy, Debug, Default)]
struct EncodedRequest;

impl tonic::codec::Codec for EncodedRequest {
    type Encode = Bytes;
    type Decode = ExportMetricsServiceResponse;
    type Encoder = EncodedRequest;
    type Decoder = EncodedRequest;

    fn encoder(&mut self) -> Self::Encoder {
        EncodedRequest
    }

    fn decoder(&mut self) -> Self::Decoder {
        EncodedRequest
    }
}

impl tonic::codec::Encoder for EncodedRequest {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        bytes::BufMut::put(dst, item);
        Ok(())
    }
}

impl tonic::codec::Decoder for EncodedRequest {
    type Item = ExportMetricsServiceResponse;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<ExportMetricsServiceResponse>, tonic::Status> {
        ExportMetricsServiceResponse::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(format!("decoding the collector's answer: {e}")))
    }
}

fn grpc_error(s: tonic::Status) -> SendError {
    use tonic::Code;
    let mut message = format!("gRPC {:?}: {}", s.code(), s.message());
    if let Some(src) = std::error::Error::source(&s) {
        message.push_str(&format!(" ({src})"));
    }
    let timed_out = s.code() == Code::DeadlineExceeded || is_timeout(&s);
    let retryable = matches!(
        s.code(),
        Code::Unavailable
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::OutOfRange
            | Code::DataLoss
    );
    SendError { message, retryable, timed_out }
}

/// POST a protobuf body; the answer's body on a 2xx status, else an error naming the status.
async fn post(
    client: &Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    uri: &hyper::Uri,
    headers: &hyper::HeaderMap,
    body: Bytes,
) -> Result<Bytes, SendError> {
    let mut req = hyper::Request::post(uri.clone())
        .header(hyper::header::CONTENT_TYPE, "application/x-protobuf")
        .body(Full::new(body))
        .map_err(|e| SendError { message: format!("building the request: {e}"), retryable: false, timed_out: false })?;
    req.headers_mut().extend(headers.clone());
    let resp = client.request(req).await.map_err(|e| {
        let mut m = format!("HTTP POST {uri}: {e}");
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            m.push_str(&format!(": {s}"));
            src = s.source();
        }
        // No connection, or it broke: the collector may be back for the next attempt.
        SendError { message: m, retryable: true, timed_out: is_timeout(&e) }
    })?;
    let status = resp.status();
    let body = Limited::new(resp.into_body(), MAX_ANSWER).collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    if status.is_success() {
        return Ok(body);
    }
    // The error body is a google.rpc.Status; its message field (2) is what people need.
    let why =
        rpc_status_message(&body).unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
    Err(SendError {
        message: format!(
            "HTTP POST {uri}: {status}{}",
            if why.is_empty() { String::new() } else { format!(": {why}") }
        ),
        retryable: matches!(status.as_u16(), 429 | 502 | 503 | 504),
        // A gateway that gave up waiting for the collector.
        timed_out: status.as_u16() == 504,
    })
}

/// `google.rpc.Status.message` from an error body.
fn rpc_status_message(body: &[u8]) -> Option<String> {
    #[derive(Clone, PartialEq, prost::Message)]
    struct RpcStatus {
        #[prost(int32, tag = "1")]
        code: i32,
        #[prost(string, tag = "2")]
        message: String,
    }
    RpcStatus::decode(body).ok().map(|s| s.message).filter(|m| !m.is_empty())
}

fn grpc_tls(tls: &OtlpTls) -> ClientTlsConfig {
    let mut c = ClientTlsConfig::new();
    c = match &tls.ca_pem {
        Some(pem) => c.ca_certificate(Certificate::from_pem(pem)),
        None => c.with_native_roots(),
    };
    if let Some((cert, key)) = &tls.identity {
        c = c.identity(Identity::from_pem(cert, key));
    }
    c
}

/// The headers as gRPC metadata; a name or value gRPC cannot carry is a setting error.
fn metadata(s: &OtlpSettings) -> Result<tonic::metadata::MetadataMap, OtlpSettingError> {
    let mut map = tonic::metadata::MetadataMap::new();
    for (k, v) in &s.headers {
        let bad = |why: &str| OtlpSettingError { key: "otlp.headers", value: format!("{k}={v}"), why: why.to_owned() };
        let key = tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
            .map_err(|_| bad("not a valid header name; use letters, digits and -"))?;
        let value = v.parse().map_err(|_| bad("not a valid header value; use printable ASCII"))?;
        map.insert(key, value);
    }
    Ok(map)
}

/// The headers for HTTP; a name or value HTTP cannot carry is a setting error.
fn headers(s: &OtlpSettings) -> Result<hyper::HeaderMap, OtlpSettingError> {
    let mut map = hyper::HeaderMap::new();
    for (k, v) in &s.headers {
        let bad = |why: &str| OtlpSettingError { key: "otlp.headers", value: format!("{k}={v}"), why: why.to_owned() };
        let name = hyper::header::HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| bad("not a valid header name; use letters, digits and -"))?;
        let value = hyper::header::HeaderValue::from_str(v)
            .map_err(|_| bad("not a valid header value; use printable ASCII"))?;
        map.insert(name, value);
    }
    Ok(map)
}
