//! The `[api]` section: where the agent's gRPC API listens ([`ApiAddr`]) and how much its event hub
//! holds ([`HubSettings`]).
use std::{net::SocketAddr, path::PathBuf, str::FromStr};

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// The default: a Unix socket the chart shares with node-local consumers.
pub const DEFAULT_LISTEN: &str = "unix:///run/gpu-tracer/api.sock";
/// An API address: `unix:///path/to/api.sock` or `tcp://host:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiAddr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl FromStr for ApiAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix://") {
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                return Err(format!("`{s}`: a unix socket path must be absolute (unix:///run/gpu-tracer/api.sock)"));
            }
            return Ok(ApiAddr::Unix(path));
        }
        if let Some(addr) = s.strip_prefix("tcp://") {
            return addr
                .parse()
                .map(ApiAddr::Tcp)
                .map_err(|e| format!("`{s}`: {e} (expected tcp://IP:PORT, e.g. tcp://127.0.0.1:9401)"));
        }
        Err(format!("`{s}`: expected unix:///PATH or tcp://IP:PORT"))
    }
}

impl std::fmt::Display for ApiAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiAddr::Unix(p) => write!(f, "unix://{}", p.display()),
            ApiAddr::Tcp(a) => write!(f, "tcp://{a}"),
        }
    }
}

/// How much the hub holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HubSettings {
    /// Events kept for replay (`since`, `number`); 0 keeps none.
    pub history: usize,
    /// Events a subscriber may fall behind before it loses the oldest.
    pub subscriber_buffer: usize,
    /// Subscribers served at once; one more is refused (RESOURCE_EXHAUSTED).
    pub max_subscribers: usize,
}

impl Default for HubSettings {
    fn default() -> Self {
        HubSettings { history: 10_000, subscriber_buffer: 16_384, max_subscribers: 128 }
    }
}

/// The agent's gRPC API (`gputracer.v1.GpuTracer`, docs/api.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ApiSettings {
    /// `unix:///PATH` (mode 0660), `tcp://IP:PORT`, or `off`. Default
    /// `unix:///run/gpu-tracer/api.sock`.
    #[schemars(regex(pattern = r"^(off|unix:///.*|tcp://.+)$"))]
    pub listen: String,
    /// PEM certificate chain and private key: TLS on a TCP listener (required off loopback).
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// File holding the bearer token every call must carry (`authorization: Bearer <token>`);
    /// surrounding whitespace is ignored. Default: no token (the socket's mode is the guard).
    pub token_file: Option<PathBuf>,
    /// Recent events kept for `Subscribe` replays (`since`, `number`). Default 10000.
    #[schemars(range(max = 1_000_000))]
    pub history: usize,
    /// Event kinds the history keeps while no subscriber is connected (names as in
    /// `events --json`; `["all"]` for every kind). Default: [`DEFAULT_HISTORY_KINDS`] — every kind
    /// but the high-rate ones (RM controls, map-memory, other and UVM-other ioctls, per-event
    /// launches), which are published only while someone subscribes.
    #[schemars(schema_with = "crate::filter::kinds_or_all_schema")]
    pub history_kinds: Vec<String>,
    /// Events a subscriber may fall behind before it loses the oldest (told by `LostEvents`).
    /// Default 16384.
    #[schemars(range(min = 1, max = 1 << 20))]
    pub subscriber_buffer: usize,
    /// Subscribers served at once. Default 128.
    #[schemars(range(min = 1, max = 10_000))]
    pub max_subscribers: usize,
}

impl Default for ApiSettings {
    fn default() -> Self {
        let hub = HubSettings::default();
        Self {
            listen: DEFAULT_LISTEN.into(),
            tls_cert: None,
            tls_key: None,
            token_file: None,
            history: hub.history,
            history_kinds: DEFAULT_HISTORY_KINDS.iter().map(|k| (*k).to_string()).collect(),
            subscriber_buffer: hub.subscriber_buffer,
            max_subscribers: hub.max_subscribers,
        }
    }
}

/// The default `api.history_kinds`.
pub(crate) const DEFAULT_HISTORY_KINDS: &[&str] = &[
    "violation",
    "bill",
    "process_exec",
    "process_exit",
    "process_fork",
    "cgroup_removed",
    "fd_opened",
    "fd_closed",
    "fd_duped",
    "rm_alloc",
    "rm_free",
    "vid_heap_alloc",
    "vid_heap_free",
    "alloc_memory",
    "rm_dup_object",
    "uvm_register_gpu",
    "uvm_map_external",
    "uvm_free",
    "managed_map",
    "managed_unmap",
    "malformed",
    "cuda_alloc",
    "cuda_free",
    "cuda_function",
    "cuda_launch_batch",
];

impl ApiSettings {
    /// `history_kinds` as `EventKind` numbers (`None`: every kind).
    pub fn history_kinds(&self) -> Result<Option<std::collections::BTreeSet<i32>>, ConfigError> {
        if self.history_kinds.iter().any(|k| k == "all") {
            return Ok(None);
        }
        self.history_kinds
            .iter()
            .map(|k| crate::filter::parse_kind(k))
            .collect::<Result<_, _>>()
            .map(Some)
            .map_err(|why| ConfigError::Invalid { key: "api.history_kinds", why })
    }

    /// Where to listen, or `None` for `off`.
    pub fn addr(&self) -> Result<Option<ApiAddr>, ConfigError> {
        if self.listen == "off" {
            return Ok(None);
        }
        self.listen.parse().map(Some).map_err(|why| ConfigError::Invalid { key: "api.listen", why })
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.addr()?;
        self.history_kinds()?;
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConfigError::Invalid {
                key: "api.tls_cert",
                why: "TLS needs both api.tls_cert and api.tls_key".into(),
            });
        }
        let bounded = |key, v: usize, max: usize| {
            if v > max {
                return Err(ConfigError::Invalid { key, why: format!("{v} is above the limit {max}") });
            }
            Ok(())
        };
        bounded("api.history", self.history, 1_000_000)?;
        bounded("api.max_subscribers", self.max_subscribers, 10_000)?;
        bounded("api.subscriber_buffer", self.subscriber_buffer, 1 << 20)?;
        if self.max_subscribers == 0 {
            return Err(ConfigError::Invalid {
                key: "api.max_subscribers",
                why: "must be at least 1 (api.listen = \"off\" turns the API off)".into(),
            });
        }
        if self.subscriber_buffer == 0 {
            return Err(ConfigError::Invalid { key: "api.subscriber_buffer", why: "must be at least 1".into() });
        }
        Ok(())
    }
}
