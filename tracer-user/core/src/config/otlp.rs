//! Where and how the OTLP exporter sends: the `[otlp]` config section ([`OtlpConfig`]), the
//! standard `OTEL_*` environment variables and the `--otlp-*` flags, resolved into
//! [`OtlpSettings`] with flag > environment > file > default. Export is off unless an endpoint is
//! set somewhere.
use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use gpu_tracer_proto::v1::EventKind;
use serde::{Deserialize, Serialize};

/// `OTEL_EXPORTER_OTLP_ENDPOINT`: the collector's base URL.
pub const ENV_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// `OTEL_EXPORTER_OTLP_PROTOCOL`: `grpc` or `http/protobuf`.
pub const ENV_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
/// `OTEL_EXPORTER_OTLP_HEADERS`: `key=value,key2=value2` (values percent-decoded).
pub const ENV_HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
/// `OTEL_EXPORTER_OTLP_TIMEOUT`: per export, milliseconds.
pub(crate) const ENV_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TIMEOUT";
/// `OTEL_RESOURCE_ATTRIBUTES`: `key=value,...` added to the resource.
pub const ENV_RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";
/// `OTEL_METRIC_EXPORT_INTERVAL`: milliseconds between metric exports.
pub const ENV_METRIC_EXPORT_INTERVAL: &str = "OTEL_METRIC_EXPORT_INTERVAL";
/// `OTEL_EXPORTER_OTLP_CERTIFICATE`: PEM file of the CA(s) that signed the collector's certificate
/// (`https://` endpoints; default: the system's roots).
pub const ENV_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_CERTIFICATE";
/// `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`, `OTEL_EXPORTER_OTLP_CLIENT_KEY`: PEM files of the
/// certificate and key the agent presents (mutual TLS).
pub(crate) const ENV_CLIENT_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE";
pub(crate) const ENV_CLIENT_KEY: &str = "OTEL_EXPORTER_OTLP_CLIENT_KEY";
/// `OTEL_SDK_DISABLED=true` turns export off whatever else says.
pub const ENV_SDK_DISABLED: &str = "OTEL_SDK_DISABLED";

/// The OTLP transport.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, clap::ValueEnum)]
pub enum OtlpProtocol {
    /// OTLP/gRPC (usually port 4317).
    #[default]
    #[serde(rename = "grpc")]
    #[value(name = "grpc")]
    Grpc,
    /// OTLP/HTTP with protobuf bodies (usually port 4318; `/v1/metrics`, `/v1/logs`).
    #[serde(rename = "http/protobuf")]
    #[value(name = "http/protobuf")]
    HttpProtobuf,
}

impl OtlpProtocol {
    /// The port OTLP uses with this protocol when the endpoint names none.
    pub fn default_port(self) -> u16 {
        match self {
            OtlpProtocol::Grpc => 4317,
            OtlpProtocol::HttpProtobuf => 4318,
        }
    }

    /// The name used by the config file, the flag and `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub fn as_str(self) -> &'static str {
        match self {
            OtlpProtocol::Grpc => "grpc",
            OtlpProtocol::HttpProtobuf => "http/protobuf",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "grpc" => Some(OtlpProtocol::Grpc),
            "http/protobuf" => Some(OtlpProtocol::HttpProtobuf),
            _ => None,
        }
    }
}

/// The event kinds exported as log records by default: violations, the process and cgroup
/// lifecycle, device fds, and allocations and frees (RM, vid-heap, CUDA) — not every ioctl,
/// control call or launch.
pub const DEFAULT_EVENT_KINDS: &[&str] = &[
    "violation",
    "process_exec",
    "process_exit",
    "process_fork",
    "cgroup_removed",
    "fd_opened",
    "fd_closed",
    "rm_alloc",
    "rm_free",
    "alloc_memory",
    "vid_heap_alloc",
    "vid_heap_free",
    "cuda_alloc",
    "cuda_free",
];

/// The `[otlp]` section of the config file. Every key is optional; the environment and the flags
/// override it (flag > environment > file).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OtlpConfig {
    /// The collector's base URL, `http://HOST:PORT` or `https://HOST:PORT`
    /// (`OTEL_EXPORTER_OTLP_ENDPOINT`, `--otlp-endpoint`). Unset: no OTLP export.
    #[schemars(regex(pattern = r"^https?://[^/?#]+"))]
    pub endpoint: Option<String>,
    /// With an `https://` endpoint: a PEM file of the CA certificate(s) the collector's
    /// certificate is checked against (`OTEL_EXPORTER_OTLP_CERTIFICATE`). Unset: the system's roots.
    pub certificate: Option<std::path::PathBuf>,
    /// With an `https://` endpoint: PEM files of the certificate and private key the agent
    /// presents, for a collector that requires client certificates
    /// (`OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`, `OTEL_EXPORTER_OTLP_CLIENT_KEY`). Both or neither.
    pub client_certificate: Option<std::path::PathBuf>,
    pub client_key: Option<std::path::PathBuf>,
    /// `grpc` (default) or `http/protobuf` (`OTEL_EXPORTER_OTLP_PROTOCOL`, `--otlp-protocol`).
    pub protocol: OtlpProtocol,
    /// Headers sent with every export, e.g. an API key (`OTEL_EXPORTER_OTLP_HEADERS` adds to and
    /// overrides these).
    pub headers: BTreeMap<String, String>,
    /// Attributes added to the resource (`OTEL_RESOURCE_ATTRIBUTES` adds to and overrides these).
    pub resource_attributes: BTreeMap<String, String>,
    /// Milliseconds between metric exports (`OTEL_METRIC_EXPORT_INTERVAL`). Default 60000.
    #[schemars(range(min = 100, max = 86_400_000))]
    pub metric_export_interval_ms: u64,
    /// Longest one export may take, ms (`OTEL_EXPORTER_OTLP_TIMEOUT`); past it the batch is
    /// counted as dropped. Default 10000.
    #[schemars(range(min = 10, max = 600_000))]
    pub timeout_ms: u64,
    /// Event kinds exported as log records (`violation`, `process_exec`, ...; `all` for every
    /// kind; empty for no logs). Default: [`DEFAULT_EVENT_KINDS`].
    #[schemars(schema_with = "crate::filter::kinds_or_all_schema")]
    pub events: Vec<String>,
    /// Of those kinds, only the events that match one of these filters (none: all of them) and
    /// none of `exclude` — the `Subscribe` filters (docs/api.md) in TOML, kinds by name:
    /// `[[otlp.exclude]]` / `namespace = ["kube-system"]`.
    pub include: Vec<crate::filter::FilterConfig>,
    pub exclude: Vec<crate::filter::FilterConfig>,
    /// Events waiting for export at most; a full queue drops (counted). Default 8192.
    #[schemars(range(min = 1, max = 1 << 20))]
    pub log_queue: usize,
    /// Log records per export request at most. Default 512.
    #[schemars(range(min = 1, max = 65_536))]
    pub log_batch: usize,
    /// Milliseconds between log exports when a batch is not full. Default 1000.
    #[schemars(range(min = 10, max = 3_600_000))]
    pub log_export_interval_ms: u64,
    /// Series one metric may have at most; the rest are summed into one series with
    /// `otel.metric.overflow=true` (as the OpenTelemetry SDKs do). Default 20000.
    #[schemars(range(min = 10, max = 1_000_000))]
    pub max_series_per_metric: usize,
    /// The flags' values (`config::Overrides`), kept apart so the environment can sit between
    /// them and the file.
    #[serde(skip)]
    pub flags: OtlpFlags,
}

/// What `--otlp-endpoint` and `--otlp-protocol` said.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OtlpFlags {
    pub endpoint: Option<String>,
    pub protocol: Option<OtlpProtocol>,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            endpoint: None,
            certificate: None,
            client_certificate: None,
            client_key: None,
            protocol: OtlpProtocol::Grpc,
            headers: BTreeMap::new(),
            resource_attributes: BTreeMap::new(),
            metric_export_interval_ms: 60_000,
            timeout_ms: 10_000,
            events: DEFAULT_EVENT_KINDS.iter().map(|s| (*s).to_owned()).collect(),
            include: Vec::new(),
            exclude: Vec::new(),
            log_queue: 8192,
            log_batch: 512,
            log_export_interval_ms: 1000,
            max_series_per_metric: 20_000,
            flags: OtlpFlags::default(),
        }
    }
}

/// A setting that cannot be used: which key (file key, environment variable or flag), its value,
/// and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid OTLP setting {key} = {value:?}: {why}")]
pub struct OtlpSettingError {
    /// `otlp.endpoint`, `OTEL_EXPORTER_OTLP_ENDPOINT`, `--otlp-endpoint`, ...
    pub key: &'static str,
    pub value: String,
    /// What is wrong and the fix.
    pub why: String,
}

impl OtlpSettingError {
    /// A short reason for a metric label or a test.
    pub fn reason(&self) -> &'static str {
        "invalid_setting"
    }
}

/// The resolved settings the exporter runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct OtlpSettings {
    /// Base URL without a trailing `/`.
    pub endpoint: String,
    /// Where the endpoint came from (a flag, an environment variable or the file key).
    pub endpoint_source: &'static str,
    pub protocol: OtlpProtocol,
    /// TLS to the collector (`https://` endpoints only).
    pub tls: Option<OtlpTls>,
    pub headers: BTreeMap<String, String>,
    pub resource_attributes: BTreeMap<String, String>,
    pub metric_export_interval: Duration,
    pub timeout: Duration,
    /// Event kinds (`EventKind` values) exported as log records.
    pub event_kinds: BTreeSet<i32>,
    /// Of those, the events exported (`otlp.include` / `otlp.exclude`).
    pub filters: crate::filter::Filters,
    pub log_queue: usize,
    pub log_batch: usize,
    pub log_export_interval: Duration,
    pub max_series_per_metric: usize,
}

/// The TLS material of an `https://` endpoint, read when the settings are resolved (a file that
/// cannot be read is a setting error then, not a failed export later).
#[derive(Clone, PartialEq, Eq)]
pub struct OtlpTls {
    /// PEM CA certificate(s); `None`: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM certificate chain and private key the agent presents.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for OtlpTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpTls")
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

impl OtlpConfig {
    /// Check the file's values (the environment and flags are checked by [`OtlpSettings::resolve`]).
    pub fn validate(&self) -> Result<(), OtlpSettingError> {
        if let Some(e) = &self.endpoint {
            check_endpoint("otlp.endpoint", e)?;
        }
        check_range("otlp.metric_export_interval_ms", self.metric_export_interval_ms, 100, 86_400_000)?;
        check_range("otlp.timeout_ms", self.timeout_ms, 10, 600_000)?;
        check_range("otlp.log_export_interval_ms", self.log_export_interval_ms, 10, 3_600_000)?;
        check_range("otlp.log_queue", self.log_queue as u64, 1, 1 << 20)?;
        check_range("otlp.log_batch", self.log_batch as u64, 1, 65_536)?;
        check_range("otlp.max_series_per_metric", self.max_series_per_metric as u64, 10, 1_000_000)?;
        event_kinds(&self.events)?;
        event_filters(self)?;
        for k in self.headers.keys().chain(self.resource_attributes.keys()) {
            if k.trim().is_empty() {
                return Err(OtlpSettingError {
                    key: "otlp.headers",
                    value: k.clone(),
                    why: "an empty key; write key = \"value\"".into(),
                });
            }
        }
        Ok(())
    }
}

impl OtlpSettings {
    /// The settings from the file section, the environment (`env`: e.g. `|k| std::env::var(k).ok()`)
    /// and the flags kept in `cfg.flags`; `None` when no endpoint is set (or
    /// `OTEL_SDK_DISABLED=true`).
    pub fn resolve(cfg: &OtlpConfig, env: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, OtlpSettingError> {
        cfg.validate()?;
        let env = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        if env(ENV_SDK_DISABLED).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let (endpoint, endpoint_source) = if let Some(e) = &cfg.flags.endpoint {
            (e.clone(), "--otlp-endpoint")
        } else if let Some(e) = env(ENV_ENDPOINT) {
            (e, ENV_ENDPOINT)
        } else if let Some(e) = &cfg.endpoint {
            (e.clone(), "otlp.endpoint")
        } else {
            return Ok(None);
        };
        check_endpoint(endpoint_source, &endpoint)?;
        let protocol = match (cfg.flags.protocol, env(ENV_PROTOCOL)) {
            (Some(p), _) => p,
            (None, Some(p)) => OtlpProtocol::parse(&p).ok_or_else(|| OtlpSettingError {
                key: ENV_PROTOCOL,
                value: p.clone(),
                why: "not a protocol gpu-tracer speaks; use `grpc` or `http/protobuf`".into(),
            })?,
            (None, None) => cfg.protocol,
        };
        let tls = tls_settings(cfg, &env, endpoint_source, &endpoint)?;
        let mut headers = cfg.headers.clone();
        if let Some(h) = env(ENV_HEADERS) {
            headers.extend(parse_key_values(ENV_HEADERS, &h)?);
        }
        let mut resource_attributes = cfg.resource_attributes.clone();
        if let Some(r) = env(ENV_RESOURCE_ATTRIBUTES) {
            resource_attributes.extend(parse_key_values(ENV_RESOURCE_ATTRIBUTES, &r)?);
        }
        let ms = |key: &'static str, file: u64, lo: u64, hi: u64| -> Result<u64, OtlpSettingError> {
            match env(key) {
                None => Ok(file),
                Some(v) => {
                    let n = v.trim().parse::<u64>().map_err(|_| OtlpSettingError {
                        key,
                        value: v.clone(),
                        why: "not a whole number of milliseconds; write e.g. 15000".into(),
                    })?;
                    check_range(key, n, lo, hi)?;
                    Ok(n)
                }
            }
        };
        let interval_ms = ms(ENV_METRIC_EXPORT_INTERVAL, cfg.metric_export_interval_ms, 100, 86_400_000)?;
        let timeout_ms = ms(ENV_TIMEOUT, cfg.timeout_ms, 10, 600_000)?;
        Ok(Some(OtlpSettings {
            endpoint: endpoint.trim().trim_end_matches('/').to_owned(),
            endpoint_source,
            protocol,
            tls,
            headers,
            resource_attributes,
            metric_export_interval: Duration::from_millis(interval_ms),
            timeout: Duration::from_millis(timeout_ms),
            event_kinds: event_kinds(&cfg.events)?,
            filters: event_filters(cfg)?,
            log_queue: cfg.log_queue,
            log_batch: cfg.log_batch,
            log_export_interval: Duration::from_millis(cfg.log_export_interval_ms),
            max_series_per_metric: cfg.max_series_per_metric,
        }))
    }
}

/// The TLS material for `endpoint`: files from the environment, else the file section; any of
/// them with an `http://` endpoint is an error (it would be silently unused).
fn tls_settings(
    cfg: &OtlpConfig,
    env: &impl Fn(&str) -> Option<String>,
    endpoint_source: &'static str,
    endpoint: &str,
) -> Result<Option<OtlpTls>, OtlpSettingError> {
    let pick = |env_key: &'static str, file_key: &'static str, file: &Option<std::path::PathBuf>| {
        env(env_key)
            .map(|v| (env_key, std::path::PathBuf::from(v.trim())))
            .or_else(|| file.clone().map(|p| (file_key, p)))
    };
    let ca = pick(ENV_CERTIFICATE, "otlp.certificate", &cfg.certificate);
    let cert = pick(ENV_CLIENT_CERTIFICATE, "otlp.client_certificate", &cfg.client_certificate);
    let key = pick(ENV_CLIENT_KEY, "otlp.client_key", &cfg.client_key);
    if !endpoint.trim().starts_with("https://") {
        if let Some((k, p)) = ca.or(cert).or(key) {
            return Err(OtlpSettingError {
                key: k,
                value: p.display().to_string(),
                why: format!(
                    "a TLS file with a plain-text endpoint ({endpoint_source} = {endpoint}); use https://HOST:PORT, or remove it"
                ),
            });
        }
        return Ok(None);
    }
    let read = |(k, p): (&'static str, std::path::PathBuf)| {
        std::fs::read(&p).map_err(|e| OtlpSettingError {
            key: k,
            value: p.display().to_string(),
            why: format!("cannot read it ({e}); give the path of a PEM file the agent can read"),
        })
    };
    let identity = match (cert, key) {
        (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
        (None, None) => None,
        (Some((k, p)), None) | (None, Some((k, p))) => {
            return Err(OtlpSettingError {
                key: k,
                value: p.display().to_string(),
                why: "a client certificate needs its key and a key its certificate; set both or neither".into(),
            });
        }
    };
    Ok(Some(OtlpTls { ca_pem: ca.map(read).transpose()?, identity }))
}

fn event_filters(cfg: &OtlpConfig) -> Result<crate::filter::Filters, OtlpSettingError> {
    crate::filter::FilterConfig::filters(&cfg.include, &cfg.exclude).map_err(|why| OtlpSettingError {
        key: "otlp.include/otlp.exclude",
        value: String::new(),
        why: format!("{why}; the fields are those of an EventFilter (docs/api.md), kinds by name"),
    })
}

fn check_range(key: &'static str, v: u64, lo: u64, hi: u64) -> Result<(), OtlpSettingError> {
    if v < lo || v > hi {
        return Err(OtlpSettingError { key, value: v.to_string(), why: format!("must be between {lo} and {hi}") });
    }
    Ok(())
}

/// An endpoint is `http://HOST[:PORT][/PATH]` or `https://...`: a bare `HOST:PORT` is ambiguous
/// (the OTLP specification requires the scheme).
fn check_endpoint(key: &'static str, e: &str) -> Result<(), OtlpSettingError> {
    let bad = |why: &str| OtlpSettingError { key, value: e.to_owned(), why: why.to_owned() };
    let e = e.trim();
    let Some(rest) = e.strip_prefix("http://").or_else(|| e.strip_prefix("https://")) else {
        return Err(bad(
            "the scheme is missing or unknown; write http://HOST:PORT or https://HOST:PORT (e.g. http://otel-collector:4317)",
        ));
    };
    let uri: http::Uri = e.parse().map_err(|err| bad(&format!("not a URL ({err}); write http://HOST:PORT")))?;
    if uri.host().is_none_or(str::is_empty) || rest.starts_with('/') {
        return Err(bad("no host; write http://HOST:PORT"));
    }
    if uri.query().is_some() {
        return Err(bad("a query string is not allowed; write http://HOST:PORT"));
    }
    Ok(())
}

/// The W3C-baggage-like `key=value,key2=value2` list of `OTEL_EXPORTER_OTLP_HEADERS` and
/// `OTEL_RESOURCE_ATTRIBUTES` (values percent-decoded, whitespace around entries ignored).
pub(crate) fn parse_key_values(key: &'static str, s: &str) -> Result<BTreeMap<String, String>, OtlpSettingError> {
    let mut out = BTreeMap::new();
    for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((k, v)) = entry.split_once('=') else {
            return Err(OtlpSettingError {
                key,
                value: s.to_owned(),
                why: format!("entry {entry:?} has no `=`; write key=value,key2=value2"),
            });
        };
        let k = k.trim();
        if k.is_empty() {
            return Err(OtlpSettingError {
                key,
                value: s.to_owned(),
                why: format!("entry {entry:?} has an empty key; write key=value"),
            });
        }
        let v = percent_decode(v.trim()).ok_or_else(|| OtlpSettingError {
            key,
            value: s.to_owned(),
            why: format!("entry {entry:?} has a bad percent escape; write %XX with two hex digits"),
        })?;
        out.insert(k.to_owned(), v);
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The lower-case name of an event kind (`rm_alloc`), as in the JSON events and the config.
pub fn event_kind_name(kind: EventKind) -> String {
    kind.as_str_name().strip_prefix("EVENT_KIND_").unwrap_or(kind.as_str_name()).to_ascii_lowercase()
}

fn event_kinds(names: &[String]) -> Result<BTreeSet<i32>, OtlpSettingError> {
    let mut out = BTreeSet::new();
    for n in names {
        if n == "all" {
            out.extend((1..).map_while(|v| EventKind::try_from(v).ok()).map(|k| k as i32));
            continue;
        }
        let k = EventKind::from_str_name(&format!("EVENT_KIND_{}", n.to_ascii_uppercase()))
            .filter(|k| *k != EventKind::Unspecified)
            .ok_or_else(|| {
                let known: Vec<String> =
                    (1..).map_while(|v| EventKind::try_from(v).ok()).map(event_kind_name).collect();
                OtlpSettingError {
                    key: "otlp.events",
                    value: n.clone(),
                    why: format!("not an event kind; use `all` or some of: {}", known.join(", ")),
                }
            })?;
        out.insert(k as i32);
    }
    Ok(out)
}
