//! `gpu-tracer agent`: the node agent (`tracer_agent::node`), serving `/metrics`, `/healthz`,
//! `/readyz` and the gRPC API until SIGINT/SIGTERM or `--duration`.
use anyhow::Result;
use clap::Args;
use tracer_agent::{
    node::{NodeAgent, NodeOptions},
    runner::Schedule,
};
use tracer_core::config::{Config, parse_seconds};

#[derive(Args)]
pub(crate) struct AgentArgs {
    /// Address to serve /metrics, /healthz and /readyz on.
    #[arg(long, default_value = "127.0.0.1:9400")]
    pub(crate) listen: std::net::SocketAddr,
    /// Stop after this many seconds (default: run until SIGINT/SIGTERM).
    #[arg(long, value_parser = parse_seconds)]
    pub(crate) duration: Option<f64>,
    /// Where to serve the gRPC API: unix:///PATH (mode 0660), tcp://IP:PORT (TLS: api.tls_cert and
    /// api.tls_key in the config), or `off` [default: api.listen, unix:///run/gpu-tracer/api.sock].
    #[arg(long, value_name = "ADDR")]
    pub(crate) grpc_listen: Option<String>,
}

/// The node agent: the pipeline, with /metrics, /healthz and /readyz served on `--listen` and the
/// gRPC API (events, snapshot, status) on `api.listen`.
pub(crate) async fn run_agent(mut cfg: Config, a: AgentArgs) -> Result<()> {
    if let Some(l) = &a.grpc_listen {
        cfg.api.listen = l.clone();
        cfg.validate()?;
    }
    let opts = NodeOptions { listen: a.listen, duration: a.duration.and_then(Schedule::duration_from_secs) };
    let agent = NodeAgent::start(cfg, opts).await?;
    note!("gpu-tracer agent: serving {}://{}/metrics", agent.metrics_scheme(), agent.metrics_addr());
    if let Some(addr) = agent.api_addr() {
        note!("gpu-tracer agent: serving the gRPC API on {addr}");
    }
    agent.run().await?;
    Ok(())
}
