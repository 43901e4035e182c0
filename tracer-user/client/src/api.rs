//! The API's client side, for `events --connect`, `top --connect` and `gpu-tracer api`.
use std::{path::PathBuf, time::Duration};

use gpu_tracer_proto::{
    EncodedSubscribeResponse, prost,
    tonic::{
        self, Request, Status,
        metadata::AsciiMetadataValue,
        service::{Interceptor, interceptor::InterceptedService},
        transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
    },
    v1::{self, gpu_tracer_client::GpuTracerClient},
};
use hyper_util::rt::TokioIo;

use tracer_core::config::api::ApiAddr;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest response decoded (a snapshot of a large node is a few MB).
const MAX_RESPONSE_BYTES: usize = 256 << 20;

/// How to reach a running agent.
#[derive(Clone, Debug)]
pub struct ConnectSettings {
    pub addr: ApiAddr,
    /// Sent as `authorization: Bearer <token>`.
    pub token: Option<String>,
    /// With TCP: speak TLS, trusting this CA certificate (PEM) for the agent's certificate.
    pub tls_ca: Option<PathBuf>,
    /// With TLS: the name the agent's certificate is for (default: the address's IP).
    pub tls_domain: Option<String>,
}

/// Why a client could not talk to the agent.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to the gpu-tracer agent at {addr}: {source}\n  hint: {hint}")]
    Connect { addr: ApiAddr, source: tonic::transport::Error, hint: String },
    #[error("the token is not valid in a gRPC header (printable ASCII only)")]
    BadToken,
    #[error("reading the CA certificate {path}: {source}")]
    Ca { path: PathBuf, source: std::io::Error },
    #[error("TLS setup: {0}")]
    Tls(tonic::transport::Error),
}

/// Adds the bearer token to every call.
#[derive(Clone, Debug)]
pub struct AddToken(Option<AsciiMetadataValue>);

impl Interceptor for AddToken {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A connected client.
pub type Client = GpuTracerClient<InterceptedService<Channel, AddToken>>;

/// Connects to the agent (fails at once when nothing listens there).
pub async fn connect(s: &ConnectSettings) -> Result<Client, ClientError> {
    let channel = channel(s).await?;
    Ok(GpuTracerClient::with_interceptor(channel, token(s)?).max_decoding_message_size(MAX_RESPONSE_BYTES))
}

fn token(s: &ConnectSettings) -> Result<AddToken, ClientError> {
    Ok(AddToken(match &s.token {
        Some(t) => Some(AsciiMetadataValue::try_from(format!("Bearer {t}")).map_err(|_| ClientError::BadToken)?),
        None => None,
    }))
}

/// One `Subscribe` response as it arrived: an event stays the bytes the agent encoded (shared, not
/// decoded); a `LostEvents` notice is decoded.
#[derive(Clone, Debug, PartialEq)]
pub enum Received {
    Event(EncodedSubscribeResponse),
    Lost(v1::LostEvents),
}

/// Subscribes to the agent's events without decoding them ([`Received`]): `events --connect`
/// writes the agent's bytes to its output as they are.
pub async fn subscribe_raw(
    s: &ConnectSettings,
    request: v1::SubscribeRequest,
) -> Result<tonic::Streaming<Received>, SubscribeError> {
    let channel = channel(s).await?;
    let mut grpc = tonic::client::Grpc::new(InterceptedService::new(channel, token(s)?))
        .max_decoding_message_size(MAX_RESPONSE_BYTES);
    grpc.ready().await.map_err(|e| SubscribeError::Status(Status::unavailable(e.to_string())))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/gputracer.v1.GpuTracer/Subscribe");
    Ok(grpc.server_streaming(Request::new(request), path, RawCodec).await?.into_inner())
}

/// Why [`subscribe_raw`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("the agent refused the subscription: {0}")]
    Status(#[from] Status),
}

/// `SubscribeRequest` out, [`Received`] in.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = v1::SubscribeRequest;
    type Decode = Received;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = v1::SubscribeRequest;
    type Error = Status;
    fn encode(&mut self, item: Self::Item, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), Self::Error> {
        prost::Message::encode(&item, dst).map_err(|e| Status::internal(e.to_string()))
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Received;
    type Error = Status;
    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Received>, Self::Error> {
        use prost::bytes::Buf;
        let bytes = src.copy_to_bytes(src.remaining());
        let encoded = EncodedSubscribeResponse(bytes);
        if encoded.event_length_delimited().is_some() {
            return Ok(Some(Received::Event(encoded)));
        }
        match <v1::SubscribeResponse as prost::Message>::decode(&encoded.0[..]) {
            Ok(v1::SubscribeResponse { response: Some(v1::subscribe_response::Response::LostEvents(l)) }) => {
                Ok(Some(Received::Lost(l)))
            }
            Ok(_) => Err(Status::internal("a Subscribe response that is neither an event nor LostEvents")),
            Err(e) => Err(Status::internal(format!("a Subscribe response that does not decode: {e}"))),
        }
    }
}

/// The connection itself, for callers that speak gRPC below the generated client (the bench's
/// frame-counting reader). [`connect`] adds the token.
pub async fn channel(s: &ConnectSettings) -> Result<Channel, ClientError> {
    let connect_err = |source, hint: &str| ClientError::Connect { addr: s.addr.clone(), source, hint: hint.into() };
    let channel = match &s.addr {
        ApiAddr::Unix(path) => {
            // The URI is required by tonic but unused: the connector dials the socket.
            let socket = path.clone();
            Endpoint::from_static("http://[::]:9401")
                .connect_timeout(CONNECT_TIMEOUT)
                .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                    let socket = socket.clone();
                    async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
                }))
                .await
                .map_err(|e| {
                    connect_err(e, "is `gpu-tracer agent` running with this --grpc-listen? (reading the socket needs root or its group)")
                })?
        }
        ApiAddr::Tcp(addr) => {
            let scheme = if s.tls_ca.is_some() { "https" } else { "http" };
            let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
                .map_err(|e| connect_err(e, "not a valid address"))?
                .connect_timeout(CONNECT_TIMEOUT);
            if let Some(ca) = &s.tls_ca {
                let pem = std::fs::read(ca).map_err(|source| ClientError::Ca { path: ca.clone(), source })?;
                let domain = s.tls_domain.clone().unwrap_or_else(|| addr.ip().to_string());
                endpoint = endpoint
                    .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)).domain_name(domain))
                    .map_err(ClientError::Tls)?;
            }
            endpoint.connect().await.map_err(|e| connect_err(e, "is the agent listening there (api.listen)?"))?
        }
    };
    Ok(channel)
}

/// The flags of every command that talks to a running agent (`--connect` and how).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ConnectArgs {
    /// Read from a running `gpu-tracer agent` instead of loading probes here: unix:///PATH or
    /// tcp://IP:PORT (the agent's api.listen; on a node: unix:///run/gpu-tracer/api.sock).
    #[arg(long, value_name = "ADDR")]
    pub connect: Option<String>,
    /// File holding the agent's bearer token (its api.token_file).
    #[arg(long, value_name = "FILE", requires = "connect")]
    pub token_file: Option<PathBuf>,
    /// TLS to a tcp:// agent, trusting this CA certificate (PEM).
    #[arg(long, value_name = "PEM", requires = "connect")]
    pub tls_ca: Option<PathBuf>,
    /// With --tls-ca: the name in the agent's certificate [default: the address's IP].
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    pub tls_domain: Option<String>,
}

/// A `--connect` flag that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConnectArgsError {
    #[error("--connect {0}")]
    Addr(String),
    #[error("{0}")]
    Token(tracer_core::config::TokenFileError),
}

impl ConnectArgs {
    /// `None` without `--connect`.
    pub fn settings(&self) -> Result<Option<ConnectSettings>, ConnectArgsError> {
        let Some(addr) = &self.connect else { return Ok(None) };
        let addr = addr.parse().map_err(ConnectArgsError::Addr)?;
        let token = match &self.token_file {
            Some(p) => Some(tracer_core::config::read_token_file("--token-file", p).map_err(ConnectArgsError::Token)?),
            None => None,
        };
        Ok(Some(ConnectSettings { addr, token, tls_ca: self.tls_ca.clone(), tls_domain: self.tls_domain.clone() }))
    }
}

/// Which events to keep, as flags (one include filter and its exclusions); the same for a
/// standalone `events` and for `events --connect` (there the agent applies them).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct FilterArgs {
    /// Only events of pods in this namespace. Repeatable (any of them).
    #[arg(long = "namespace", value_name = "NS")]
    pub namespace: Vec<String>,
    /// Only events of this pod (name). Repeatable.
    #[arg(long = "pod", value_name = "NAME")]
    pub pod: Vec<String>,
    /// Only events of this container (name). Repeatable.
    #[arg(long = "container", value_name = "NAME")]
    pub container: Vec<String>,
    /// Only events of this cgroup id. Repeatable.
    #[arg(long = "cgroup-id", value_name = "ID")]
    pub cgroup_id: Vec<u64>,
    /// Only events whose cgroup path starts with this ("/kubepods.slice"). Repeatable.
    #[arg(long = "cgroup-prefix", value_name = "PATH")]
    pub cgroup_prefix: Vec<String>,
    /// Only events on this GPU: a /dev/nvidiaN minor ("0"), or a UUID or its prefix (violations).
    #[arg(long = "gpu", value_name = "MINOR|UUID")]
    pub gpu: Vec<String>,
    /// Only events of this kind (rm_alloc, vid_heap_free, process_exec, cuda_launch_batch,
    /// violation, ...: the EventKind names of events.proto without EVENT_KIND_). Repeatable.
    #[arg(long = "kind", value_name = "KIND", value_parser = parse_kind)]
    pub kind: Vec<i32>,
    /// Only guardrail violations.
    #[arg(long)]
    pub violations_only: bool,
    /// Leave out events of this kind. Repeatable.
    #[arg(long = "exclude-kind", value_name = "KIND", value_parser = parse_kind)]
    pub exclude_kind: Vec<i32>,
    /// Leave out events of pods in this namespace. Repeatable.
    #[arg(long = "exclude-namespace", value_name = "NS")]
    pub exclude_namespace: Vec<String>,
}

pub use tracer_core::filter::parse_kind;

impl FilterArgs {
    /// The include and exclude filters of a `SubscribeRequest`.
    pub fn filters(&self) -> (Vec<v1::EventFilter>, Vec<v1::EventFilter>) {
        let include = v1::EventFilter {
            namespace: self.namespace.clone(),
            pod: self.pod.clone(),
            container: self.container.clone(),
            cgroup_id: self.cgroup_id.clone(),
            cgroup_path_prefix: self.cgroup_prefix.clone(),
            gpu: self.gpu.clone(),
            kind: self.kind.clone(),
            violations_only: self.violations_only,
        };
        let include = if include == v1::EventFilter::default() { Vec::new() } else { vec![include] };
        let mut exclude = Vec::new();
        if !self.exclude_kind.is_empty() {
            exclude.push(v1::EventFilter { kind: self.exclude_kind.clone(), ..Default::default() });
        }
        if !self.exclude_namespace.is_empty() {
            exclude.push(v1::EventFilter { namespace: self.exclude_namespace.clone(), ..Default::default() });
        }
        (include, exclude)
    }
}
