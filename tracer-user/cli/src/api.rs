//! `gpu-tracer api`: one call to a running agent's gRPC API (no probes loaded here).
use std::io::Write;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use gpu_tracer_proto::v1;
use tracer_client::{
    api::{self as api_client, ConnectArgs},
    top,
};
use tracer_core::{config::api::DEFAULT_LISTEN, wire::snapshot::snapshot_from_proto};

#[derive(Args)]
pub(crate) struct ApiArgs {
    #[command(subcommand)]
    pub(crate) call: ApiCall,
}

#[derive(Subcommand)]
pub(crate) enum ApiCall {
    /// The latest interval's snapshot: as `top` prints it, or the `gputracer.v1.Snapshot` message as
    /// JSON (field names of snapshot.proto, enums as numbers).
    GetSnapshot {
        #[arg(long)]
        json: bool,
        /// Also list processes under each cgroup (table only).
        #[arg(long)]
        per_process: bool,
        /// [default --connect: unix:///run/gpu-tracer/api.sock]
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Where the agent stands (probe families, NVML, Kubernetes, counters): the
    /// `gputracer.v1.AgentStatus` message as JSON.
    GetStatus {
        /// [default --connect: unix:///run/gpu-tracer/api.sock]
        #[command(flatten)]
        connect: ConnectArgs,
    },
}

/// `gpu-tracer api …`: one call to a running agent.
pub(crate) async fn run_api(a: ApiArgs) -> Result<()> {
    let (ApiCall::GetSnapshot { connect, .. } | ApiCall::GetStatus { connect }) = &a.call;
    let mut connect = connect.clone();
    connect.connect.get_or_insert_with(|| DEFAULT_LISTEN.to_string());
    let conn = connect.settings()?.context("an API address")?;
    let mut client = api_client::connect(&conn).await?;
    let mut stdout = std::io::stdout();
    match a.call {
        ApiCall::GetSnapshot { json, per_process, .. } => {
            let r = client.get_snapshot(v1::GetSnapshotRequest {}).await.context("GetSnapshot")?;
            let proto = r.into_inner().snapshot.context("the agent's GetSnapshot response has no snapshot")?;
            if json {
                writeln!(stdout, "{}", serde_json::to_string_pretty(&proto)?)?;
            } else {
                let snap = snapshot_from_proto(proto).context("reading the agent's snapshot")?;
                let o = top::RenderOptions { per_process, width: top::terminal_width() };
                write!(stdout, "{}", top::render(&snap, &o))?;
            }
        }
        ApiCall::GetStatus { .. } => {
            let r = client.get_status(v1::GetStatusRequest {}).await.context("GetStatus")?;
            writeln!(stdout, "{}", serde_json::to_string_pretty(&r.into_inner().status)?)?;
        }
    }
    stdout.flush()?;
    Ok(())
}
