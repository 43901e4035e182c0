//! `gpu-tracer cost`: the bill split per namespace, pod label, pod or node, from a running agent,
//! one agent's `/metrics`, a fleet's Prometheus, or a recorded events file.
use std::{
    io::Write,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use clap::Args;
use gpu_tracer_proto::v1;
use tracer_client::{
    api::{self as api_client, ConnectArgs},
    top,
};
use tracer_core::{config::api::DEFAULT_LISTEN, cost, wire::snapshot::snapshot_from_proto};

#[derive(Args)]
#[command(after_help = "\
Sources (one):
  --connect ADDR        a running agent's API: its bill since it started [default: unix:///run/gpu-tracer/api.sock]
  --metrics URL         an agent's /metrics (e.g. through kubectl port-forward): the same bill
  --prometheus URL      the Prometheus (Thanos, Mimir) that scrapes the agents: the fleet over --range
  --events FILE         a recording of `gpu-tracer events -o FILE`: the bill over the recording

The rows add up to the total to the cent (largest-remainder rounding of exact integer amounts); idle,
driver-reserved, unattributed and evicted cost are rows of their own, or spread over each node's
containers with --policy spread.

Examples:
  gpu-tracer cost
  gpu-tracer cost --by label:team --policy spread
  gpu-tracer cost --prometheus http://prometheus:9090 --range 30d --by namespace --format csv > bill.csv
  gpu-tracer cost --prometheus http://prometheus:9090 --range 7d --by node,namespace --matchers 'cluster=\"eu-1\"'
  gpu-tracer events -o week.pb --duration 604800 && gpu-tracer cost --events week.pb --by pod")]
pub(crate) struct CostArgs {
    /// Group by these, in order (comma-separated or repeated): namespace, pod, container, node,
    /// or label:KEY for a pod label the agents export (kubernetes.label_allow_list) [default: namespace].
    #[arg(long, value_delimiter = ',', value_name = "DIM")]
    pub(crate) by: Vec<cost::GroupBy>,
    /// Idle, driver-reserved, unattributed and evicted cost: rows of their own (`lines`), or spread
    /// over each node's containers in proportion to their cost (`spread`).
    #[arg(long, value_enum, default_value_t = cost::Policy::Lines)]
    pub(crate) policy: cost::Policy,
    /// table (for people), csv (spreadsheets) or json (scripts; exact nano-currency amounts too).
    #[arg(long, value_enum, default_value_t = CostFormat::Table)]
    pub(crate) format: CostFormat,
    /// The Prometheus server that scrapes the agents (its base URL): the fleet's bill over --range.
    #[arg(long, value_name = "URL", conflicts_with_all = ["metrics", "connect"])]
    pub(crate) prometheus: Option<String>,
    /// With --prometheus: the period's length, e.g. 30d, 12h, 90m, 3600s.
    #[arg(long, value_name = "DURATION", default_value = "30d", value_parser = parse_period)]
    pub(crate) range: f64,
    /// With --prometheus: the period's end, in seconds since the epoch [default: now].
    #[arg(long, value_name = "UNIX_SECONDS", requires = "prometheus")]
    pub(crate) end: Option<f64>,
    /// With --prometheus: label matchers added to every query, e.g. 'cluster="eu-1",job="gpu-tracer"'.
    #[arg(long, value_name = "MATCHERS", default_value = "", requires = "prometheus")]
    pub(crate) matchers: String,
    /// With --prometheus: a file holding a bearer token for it.
    #[arg(long, value_name = "FILE", requires = "prometheus")]
    pub(crate) prometheus_token_file: Option<PathBuf>,
    /// With an https:// --prometheus: trust this CA certificate (PEM) [default: the system's roots].
    #[arg(long, value_name = "PEM", requires = "prometheus")]
    pub(crate) prometheus_ca: Option<PathBuf>,
    /// An agent's /metrics URL: the bill since that agent started.
    #[arg(long, value_name = "URL", conflicts_with = "connect")]
    pub(crate) metrics: Option<String>,
    /// A file recorded by `gpu-tracer events -o FILE` (protobuf; `-` for stdin): the bill over the
    /// recording, from the Bill events the agent writes once a minute.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["prometheus", "metrics", "connect"])]
    pub(crate) events: Option<String>,
    /// With --metrics: a file holding the bearer token /metrics asks for (metrics.token_file).
    #[arg(long, value_name = "FILE", requires = "metrics")]
    pub(crate) metrics_token_file: Option<PathBuf>,
    /// The node's name in the report, for --metrics and --connect [default: the node the agent
    /// watches pods for, else the URL's host or this host's name].
    #[arg(long, value_name = "NAME")]
    pub(crate) node: Option<String>,
    /// [default --connect: unix:///run/gpu-tracer/api.sock]
    #[command(flatten)]
    pub(crate) connect: ConnectArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum CostFormat {
    Table,
    Csv,
    Json,
}

/// `30d`, `12h`, `90m`, `3600s` or `3600` as seconds.
fn parse_period(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let mult = match unit {
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        "w" => 604_800.0,
        _ => return Err(format!("`{s}`: the unit must be s, m, h, d or w (e.g. 30d)")),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("`{s}` is not a duration (e.g. 30d, 12h, 90m)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("`{s}`: the period must be longer than zero"));
    }
    Ok(v * mult)
}

/// How long `cost --connect` waits for a fresh agent's first complete attribution interval.
const COST_WAIT: Duration = Duration::from_secs(15);

pub(crate) async fn run_cost(a: CostArgs) -> Result<()> {
    let read = |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    let input = if let Some(url) = &a.prometheus {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs_f64();
        let token = match &a.prometheus_token_file {
            Some(p) => Some(String::from_utf8(read(p)?).context("the token file is not text")?.trim().to_owned()),
            None => None,
        };
        let source = tracer_client::cost::prometheus::PrometheusSource {
            url: url.clone(),
            token,
            ca_pem: a.prometheus_ca.as_ref().map(read).transpose()?,
            matchers: a.matchers.clone(),
            end_unix_s: a.end.unwrap_or(now),
            range_s: a.range,
            pod_labels: a.by.iter().any(|b| matches!(b, cost::GroupBy::Label(_))),
            timeout: Duration::from_secs(120),
        };
        tracer_client::cost::prometheus::fetch(&source).await?
    } else if let Some(path) = &a.events {
        tracer_client::cost::events::from_file(path)?
    } else if let Some(url) = &a.metrics {
        let node = a.node.clone().unwrap_or_else(|| {
            url.parse::<hyper::Uri>().ok().and_then(|u| u.host().map(str::to_owned)).unwrap_or_else(|| url.clone())
        });
        let token = match &a.metrics_token_file {
            Some(p) => Some(String::from_utf8(read(p)?).context("the token file is not text")?.trim().to_owned()),
            None => None,
        };
        let text = tracer_client::cost::prometheus::get_text(url, token, Duration::from_secs(30))
            .await
            .with_context(|| format!("reading the agent's metrics at {url}"))?;
        tracer_client::cost::series::from_exposition(&text, &node, &format!("the agent's /metrics at {url}"))?
    } else {
        let mut connect = a.connect.clone();
        connect.connect.get_or_insert_with(|| DEFAULT_LISTEN.to_string());
        let conn = connect.settings()?.context("an API address")?;
        let mut client = api_client::connect(&conn).await?;
        let start = Instant::now();
        let snap = loop {
            let r = client.get_snapshot(v1::GetSnapshotRequest {}).await.context("GetSnapshot")?;
            let proto = r.into_inner().snapshot.context("the agent's GetSnapshot response has no snapshot")?;
            let snap = snapshot_from_proto(proto).context("reading the agent's snapshot")?;
            if !snap.first_interval_pending() || start.elapsed() >= COST_WAIT {
                break snap;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let node = a
            .node
            .clone()
            .or_else(|| snap.kubernetes.watcher.as_ref().map(|w| w.node.clone()).filter(|n| !n.is_empty()))
            .unwrap_or_else(|| conn.addr.to_string());
        cost::from_snapshot(&snap, &node)?
    };
    let report = cost::Report::build(input, &a.by, a.policy);
    let text = match a.format {
        CostFormat::Table => tracer_client::cost::render::table(&report, top::terminal_width()),
        CostFormat::Csv => tracer_client::cost::render::csv(&report),
        CostFormat::Json => tracer_client::cost::render::json(&report),
    };
    let mut stdout = std::io::stdout();
    stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).context("writing the report to stdout")?;
    if a.format != CostFormat::Table {
        for w in &report.warnings {
            note!("warning: {w}");
        }
    }
    Ok(())
}
