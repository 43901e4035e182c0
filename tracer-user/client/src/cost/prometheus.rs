//! The fleet's bill over a period from a Prometheus server (or Thanos, Mimir: anything that
//! answers Prometheus' HTTP query API) that scrapes the agents.
//!
//! The agents' cost series are counters whose lines add up to each GPU's price in every scrape.
//! The bill over `(start, end]` is therefore, per series, its value in the last scrape of each
//! agent process (an *incarnation*) in the period, minus its value at `start` for the
//! incarnation that was already running then: differences of whole scrapes, so the rows still
//! add up, with no extrapolation (`increase()` would scale each series differently) and with
//! restarts handled exactly. An agent process is told apart by `process_start_time_seconds`
//! (targets by `job` and `instance`); a restart resets the counters to zero.
//!
//! Queries, all over every target at once, so their number does not grow with the fleet: the
//! targets from the series index; the start time's min and max in 500 windows (the only reads
//! of the whole period, one series per target); instant queries at the end and the start; for
//! the targets whose process changed, the start time raw in the windows that hold a change or a
//! process's last scrape (one query per such window), then the series at those last scrapes, one
//! query per series and cluster of ends within 15 min (a rollout is one cluster); pods' labels
//! from the series index.
use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use serde::Deserialize;

use super::series::{self, BILL, CONTAINER_COST, Labels, POD_LABELS, PRICE, PodLabels};
use tracer_core::cost::CostInput;

const START_TIME: &str = "process_start_time_seconds";
/// The largest answer read (a month of a fleet's container series at one instant is a few MB).
const MAX_ANSWER: usize = 256 << 20;
/// Windows the period is cut into when an agent's processes are told apart.
const WINDOWS: f64 = 500.0;
/// Processes that ended within this many seconds of each other are read together.
const END_CLUSTER_S: f64 = 900.0;
/// Windows searched backwards for the last labels of a pod whose labels changed in the period.
const LABEL_WINDOWS: u32 = 64;

/// Where to ask, and for which period.
#[derive(Clone, Debug)]
pub struct PrometheusSource {
    /// The server's base URL (`http://prometheus:9090`, or Thanos/Mimir's query path prefix).
    pub url: String,
    /// Sent as `Authorization: Bearer …`.
    pub token: Option<String>,
    /// PEM CA certificate(s) for an `https://` URL (default: the system's roots).
    pub ca_pem: Option<Vec<u8>>,
    /// Extra label matchers for every series, e.g. `cluster="eu-1",job="gpu-tracer"`.
    pub matchers: String,
    /// The period: `(end - range_s, end]`, seconds since the epoch.
    pub end_unix_s: f64,
    pub range_s: f64,
    /// Also fetch the pods' labels (for `--by label:KEY`).
    pub pod_labels: bool,
    pub timeout: Duration,
}

/// Why the bill could not be read from Prometheus.
#[derive(Debug, thiserror::Error)]
pub enum PrometheusError {
    #[error("{url}: {why}")]
    Request { url: String, why: String },
    #[error("{url}: the query failed: {why}\n  query: {query}")]
    Query { url: String, query: String, why: String },
    #[error(
        "{url}: no agent's bill in the period (no {BILL} series with a {START_TIME} beside them{matchers}); is this \
         the Prometheus that scrapes the gpu-tracer agents, with attribution.price_per_gpu_hour set?"
    )]
    NoAgents { url: String, matchers: String },
    #[error("the period must be longer than 0 s and end after the epoch (range {range_s} s, end {end_unix_s})")]
    Period { range_s: f64, end_unix_s: f64 },
}

/// A scrape target: `(job, instance)`.
type Target = (String, String);

fn target_of(l: &Labels) -> Target {
    (l.get("job").cloned().unwrap_or_default(), l.get("instance").cloned().unwrap_or_default())
}

/// One agent process of a target, as seen in the period: its start time (the value of its
/// `process_start_time_seconds`) and the time of its last scrape in the period.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Incarnation {
    pub start: f64,
    pub last_scrape: f64,
}

/// The incarnations in raw `(timestamp, start time)` samples: one per distinct start time, with
/// its last sample. Samples outside `(from, to]` are ignored.
pub(crate) fn incarnations(samples: &[(f64, f64)], from: f64, to: f64) -> Vec<Incarnation> {
    let mut by_start: BTreeMap<u64, Incarnation> = BTreeMap::new();
    for &(ts, v) in samples.iter().filter(|(ts, v)| *ts > from && *ts <= to && v.is_finite()) {
        let e = by_start.entry(v.to_bits()).or_insert(Incarnation { start: v, last_scrape: ts });
        e.last_scrape = e.last_scrape.max(ts);
    }
    let mut v: Vec<Incarnation> = by_start.into_values().collect();
    v.sort_by(|a, b| a.start.total_cmp(&b.start));
    v
}

/// The windows worth reading raw, from per-window `(window end, min)` of the start time in time
/// order (windows without samples absent) and the windows' length: each window whose next one
/// has another minimum, is absent or does not exist. Start times only grow, so a window holding
/// a process's last scrape is one of them: the next process (started in that window or later)
/// raises the next window's minimum, and without a next process the series stops. A process
/// that lived inside one window is seen in that window's raw samples.
pub(crate) fn windows_to_read(windows: &[(f64, f64)], step: f64) -> Vec<f64> {
    windows
        .iter()
        .enumerate()
        .filter(|&(i, &(t, min))| match windows.get(i + 1) {
            Some(&(next_t, next_min)) => next_min != min || next_t - t > step * 1.5,
            None => true,
        })
        .map(|(_, &(t, _))| t)
        .collect()
}

/// Read the bill over the period from Prometheus.
pub async fn fetch(s: &PrometheusSource) -> Result<CostInput, PrometheusError> {
    if !(s.range_s > 0.0 && s.end_unix_s > s.range_s && s.range_s.is_finite()) {
        return Err(PrometheusError::Period { range_s: s.range_s, end_unix_s: s.end_unix_s });
    }
    let api = Api::new(s)?;
    let (t1, t0) = (s.end_unix_s, s.end_unix_s - s.range_s);
    let sel = |metric: &str, extra: &str| selector(metric, &[&s.matchers, extra]);
    let mut warnings = Vec::new();

    // The targets with a bill in the period, from the series index (no sample read).
    let billed: BTreeSet<Target> =
        api.series(&sel(BILL, "line=\"containers\""), t0, t1).await?.iter().map(target_of).collect();
    if billed.is_empty() {
        let matchers = if s.matchers.is_empty() { String::new() } else { format!(" matching {{{}}}", s.matchers) };
        return Err(PrometheusError::NoAgents { url: s.url.clone(), matchers });
    }
    // Every target's start time as its minimum in windows over the period: the one query that
    // reads the whole period, once, for all targets.
    let step = ((t1 - t0) / WINDOWS).ceil().max(1.0);
    let w = duration(step);
    let first = t1 - step * ((t1 - t0) / step).floor();
    let first = if first <= t0 { first + step } else { first };
    let start_sel = sel(START_TIME, "");
    let mins = api.range(&format!("min_over_time({start_sel}[{w}])"), first, t1, step).await?;
    let mut windows: BTreeMap<Target, Vec<(f64, f64)>> = BTreeMap::new();
    for (l, pts) in mins {
        let t = target_of(&l);
        if billed.contains(&t) {
            windows.entry(t).or_default().extend(pts);
        }
    }
    for t in billed.iter().filter(|t| !windows.contains_key(*t)) {
        warnings.push(format!(
            "{}: its bill has no {START_TIME} beside it (not scraped by the same job?): not counted",
            t.1
        ));
    }
    // Which process each target runs at the end and at the start.
    let at_end: BTreeMap<Target, f64> =
        api.instant(&start_sel, t1).await?.into_iter().map(|(l, v)| (target_of(&l), v)).collect();
    let at_start: BTreeMap<Target, f64> =
        api.instant(&start_sel, t0).await?.into_iter().map(|(l, v)| (target_of(&l), v)).collect();

    // Each target's processes in the period. One process still scraped at the end: its last
    // scrape is read at the end with everyone else's. Otherwise, its start times raw in the
    // windows that hold a change or a process's last scrape (one query per window for all
    // targets that need it).
    let mut ends_at_t1: BTreeSet<Target> = BTreeSet::new();
    let mut first_start: BTreeMap<Target, f64> = BTreeMap::new();
    let mut reads: BTreeMap<u64, BTreeSet<Target>> = BTreeMap::new();
    for (t, ws) in &windows {
        // One process throughout (start times only grow: one minimum everywhere, and it runs at the end).
        if let Some(&(_, min)) = ws.first()
            && ws.iter().all(|w| w.1 == min)
            && at_end.get(t) == Some(&min)
        {
            ends_at_t1.insert(t.clone());
            first_start.insert(t.clone(), min);
            continue;
        }
        for end in windows_to_read(ws, step) {
            reads.entry(end.to_bits()).or_default().insert(t.clone());
        }
    }
    let mut raw: BTreeMap<Target, Vec<(f64, f64)>> = BTreeMap::new();
    for (end, targets) in &reads {
        let q = format!("{}[{w}]", selector(START_TIME, &[&s.matchers, &targets_matchers(targets)]));
        for (l, pts) in api.raw(&q, f64::from_bits(*end)).await? {
            let t = target_of(&l);
            if targets.contains(&t) {
                raw.entry(t).or_default().extend(pts);
            }
        }
    }
    let mut ends: Vec<(f64, Target)> = Vec::new();
    for (t, samples) in &raw {
        let inc = incarnations(samples, t0, t1);
        let Some(first) = inc.first() else { continue };
        first_start.insert(t.clone(), first.start);
        if inc.len() > 1 {
            warnings.push(format!(
                "{}: {} agent processes in the period (restarts); each one's last scrape is counted, the cost between \
                 a process's last scrape and its end is not in Prometheus",
                t.1,
                inc.len()
            ));
        }
        for i in &inc {
            if at_end.get(t) == Some(&i.start) {
                ends_at_t1.insert(t.clone());
            } else {
                ends.push((i.last_scrape, t.clone()));
            }
        }
    }

    // Series values: + each process's last scrape, - the start for the process running then.
    let mut acc: BTreeMap<(bool, Labels), i128> = BTreeMap::new();
    let mut pods = PodLabels::new();
    let mut prices: BTreeSet<u64> = BTreeSet::new();
    let mut add = |acc: &mut BTreeMap<(bool, Labels), i128>, is_bill: bool, rows: Vec<(Labels, f64)>, sign: i128| {
        for (l, v) in rows {
            match series::to_nano(v) {
                Some(n) => *acc.entry((is_bill, l)).or_default() += sign * n,
                None => warnings.push(format!("ignored a sample whose value is {v}: {l:?}")),
            }
        }
    };
    let keep = |rows: Vec<(Labels, f64)>, set: &dyn Fn(&Target) -> bool| -> Vec<(Labels, f64)> {
        rows.into_iter().filter(|(l, _)| set(&target_of(l))).collect()
    };
    let in_end_batch = |t: &Target| ends_at_t1.contains(t);
    add(&mut acc, false, keep(api.instant(&sel(CONTAINER_COST, ""), t1).await?, &in_end_batch), 1);
    add(&mut acc, true, keep(api.instant(&sel(BILL, ""), t1).await?, &in_end_batch), 1);
    if s.pod_labels {
        let rows = keep(api.instant(&sel(POD_LABELS, ""), t1).await?, &in_end_batch);
        series::add_pod_labels(&mut pods, rows.iter().map(|(l, _)| l));
    }
    prices.extend(api.instant(&sel(PRICE, ""), t1).await?.into_iter().map(|(_, v)| v.to_bits()));
    // The processes that ended within the period, in clusters of nearby ends (a rollout restarts
    // every agent within minutes): per cluster and series, its raw samples over the cluster's
    // span, of which each process's last scrape (the samples with that scrape's timestamp: what
    // an instant query there returns, as Prometheus marks series gone from a scrape stale).
    ends.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut clusters: Vec<Vec<(f64, Target)>> = Vec::new();
    for e in ends {
        match clusters.last_mut() {
            Some(c) if e.0 - c[0].0 <= END_CLUSTER_S => c.push(e),
            _ => clusters.push(vec![e]),
        }
    }
    for c in &clusters {
        let (lo, hi) = (c[0].0, c[c.len() - 1].0);
        let targets: BTreeSet<Target> = c.iter().map(|(_, t)| t.clone()).collect();
        let m = targets_matchers(&targets);
        let span = duration(hi - lo + 1.0);
        let mut metrics = vec![(CONTAINER_COST, Some(false)), (BILL, Some(true)), (PRICE, None)];
        if s.pod_labels {
            metrics.push((POD_LABELS, None));
        }
        for (metric, is_bill) in metrics {
            let q = format!("{}[{span}]", selector(metric, &[&s.matchers, &m]));
            let mut rows = Vec::new();
            for (l, pts) in api.raw(&q, hi).await? {
                let t = target_of(&l);
                for (end, _) in c.iter().filter(|(_, et)| *et == t) {
                    if let Some(&(_, v)) = pts.iter().find(|(ts, _)| (ts - end).abs() < 5e-4) {
                        rows.push((l.clone(), v));
                    }
                }
            }
            match (metric, is_bill) {
                (_, Some(b)) => add(&mut acc, b, rows, 1),
                (PRICE, None) => prices.extend(rows.iter().map(|(_, v)| v.to_bits())),
                _ => series::add_pod_labels(&mut pods, rows.iter().map(|(l, _)| l)),
            }
        }
    }
    let running_at_start =
        |t: &Target| at_start.get(t).is_some_and(|v| first_start.get(t).is_some_and(|f| f.to_bits() == v.to_bits()));
    add(&mut acc, false, keep(api.instant(&sel(CONTAINER_COST, ""), t0).await?, &running_at_start), -1);
    add(&mut acc, true, keep(api.instant(&sel(BILL, ""), t0).await?, &running_at_start), -1);

    let containers: Vec<(Labels, i128)> =
        acc.iter().filter(|((b, _), _)| !b).map(|((_, l), n)| (l.clone(), *n)).collect();
    let bill: Vec<(Labels, i128)> = acc.iter().filter(|((b, _), _)| *b).map(|((_, l), n)| (l.clone(), *n)).collect();

    if s.pod_labels {
        // Pods gone before the end: their labels from the last time they were exported.
        let mut missing: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (l, _) in &containers {
            if let (Some(ns), Some(pod)) = (l.get("namespace"), l.get("pod"))
                && !pod.is_empty()
                && !pods.contains_key(&(ns.clone(), pod.clone()))
            {
                missing.entry(ns.clone()).or_default().insert(pod.clone());
            }
        }
        // From the series index, one query for all (no sample read: a month of samples of a
        // fleet's gone pods would exceed what Prometheus loads for one query; no per-pod regex
        // for it to match in every block).
        let found = if missing.is_empty() {
            Vec::new()
        } else {
            let re = missing.keys().map(|ns| regex_quote(ns)).collect::<Vec<_>>().join("|");
            let m = format!("namespace=~\"{}\"", escape(&re));
            api.series(&selector(POD_LABELS, &[&s.matchers, &m]), t0, t1).await?
        };
        let mut sets: BTreeMap<(String, String), BTreeSet<Labels>> = BTreeMap::new();
        for l in found {
            if let (Some(ns), Some(pod)) = (l.get("namespace"), l.get("pod"))
                && missing.get(ns).is_some_and(|p| p.contains(pod))
            {
                sets.entry((ns.clone(), pod.clone())).or_default().insert(l);
            }
        }
        {
            for ((ns, pod), set) in sets {
                if set.len() == 1 {
                    series::add_pod_labels(&mut pods, set.iter());
                    continue;
                }
                // Its labels changed within the period: the last ones, from the latest window
                // that holds the pod's series.
                let m = format!("namespace=\"{}\",pod=\"{}\"", escape(&ns), escape(&pod));
                let sel = selector(POD_LABELS, &[&s.matchers, &m]);
                let mut last = None;
                for k in 0..LABEL_WINDOWS {
                    let hi = t1 - s.range_s * k as f64 / LABEL_WINDOWS as f64;
                    let lo = t1 - s.range_s * (k + 1) as f64 / LABEL_WINDOWS as f64;
                    let mut got = api.series(&sel, lo, hi).await?;
                    if !got.is_empty() {
                        got.sort();
                        last = got.pop();
                        break;
                    }
                }
                series::add_pod_labels(&mut pods, last.iter());
            }
        }
    }

    let node_of =
        |l: &Labels| l.get("node").filter(|n| !n.is_empty()).or_else(|| l.get("instance")).cloned().unwrap_or_default();
    let charges = series::charges(&containers, &bill, &pods, &node_of, &mut warnings);
    Ok(CostInput {
        source: format!(
            "Prometheus at {} ({} agents{})",
            s.url,
            windows.len(),
            if s.matchers.is_empty() { String::new() } else { format!(", {{{}}}", s.matchers) }
        ),
        period: format!(
            "for the {} to {}",
            human_duration(s.range_s),
            tracer_core::format::unix_time((t1.max(0.0) * 1e9) as u64)
        ),
        start_unix_s: Some(t0),
        end_unix_s: Some(t1),
        prices_per_gpu_hour: prices.into_iter().map(f64::from_bits).collect(),
        charges,
        warnings,
    })
}

/// Matchers that select these targets (and perhaps others with the same jobs and instances in
/// other combinations: callers keep only theirs).
fn targets_matchers(ts: &BTreeSet<Target>) -> String {
    let alt = |f: fn(&Target) -> &String| {
        let v: BTreeSet<String> = ts.iter().map(|t| regex_quote(f(t))).collect();
        escape(&v.into_iter().collect::<Vec<_>>().join("|"))
    };
    format!("job=~\"{}\",instance=~\"{}\"", alt(|t| &t.0), alt(|t| &t.1))
}

/// `metric{a,b}` from matcher lists (empty ones skipped).
fn selector(metric: &str, matchers: &[&str]) -> String {
    let m: Vec<&str> = matchers.iter().map(|m| m.trim().trim_matches(',')).filter(|m| !m.is_empty()).collect();
    if m.is_empty() { metric.to_owned() } else { format!("{metric}{{{}}}", m.join(",")) }
}

/// A string inside a PromQL double-quoted literal.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A literal inside an RE2 regular expression.
fn regex_quote(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

/// Seconds as a PromQL duration (milliseconds).
fn duration(s: f64) -> String {
    format!("{}ms", (s * 1000.0).round() as u64)
}

fn human_duration(s: f64) -> String {
    match s {
        s if s >= 86_400.0 && (s % 86_400.0) == 0.0 => format!("{} d", s / 86_400.0),
        s if s >= 3_600.0 && (s % 3_600.0) == 0.0 => format!("{} h", s / 3_600.0),
        s if s >= 60.0 && (s % 60.0) == 0.0 => format!("{} min", s / 60.0),
        s => format!("{s} s"),
    }
}

/// GET `url` as text (an agent's `/metrics` for `cost --metrics`), with the same client.
pub async fn get_text(url: &str, token: Option<String>, timeout: Duration) -> Result<String, PrometheusError> {
    let s = PrometheusSource {
        url: url.to_owned(),
        token,
        ca_pem: None,
        matchers: String::new(),
        end_unix_s: 0.0,
        range_s: 0.0,
        pod_labels: false,
        timeout,
    };
    let api = Api::new(&s)?;
    let err = |why: String| PrometheusError::Request { url: url.to_owned(), why };
    let mut req = hyper::Request::get(url).body(Full::new(Bytes::new())).map_err(|e| err(e.to_string()))?;
    if let Some(a) = &api.auth {
        req.headers_mut().insert(hyper::header::AUTHORIZATION, a.clone());
    }
    let resp = tokio::time::timeout(timeout, api.client.request(req))
        .await
        .map_err(|_| err(format!("no answer within {} s", timeout.as_secs_f64())))?
        .map_err(|e| err(chain(&e)))?;
    let status = resp.status();
    let body = tokio::time::timeout(timeout, Limited::new(resp.into_body(), MAX_ANSWER).collect())
        .await
        .map_err(|_| err(format!("the answer did not arrive within {} s", timeout.as_secs_f64())))?
        .map_err(|e| err(format!("reading the answer: {e}")))?
        .to_bytes();
    if !status.is_success() {
        return Err(err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)]))));
    }
    String::from_utf8(body.to_vec()).map_err(|_| err("the answer is not UTF-8 text".into()))
}

/// The query API over HTTP(S).
struct Api {
    base: String,
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    auth: Option<hyper::header::HeaderValue>,
    timeout: Duration,
}

#[derive(Deserialize)]
struct Answer<T> {
    status: String,
    #[serde(default = "Option::default")]
    data: Option<T>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<ResultSeries>,
}

#[derive(Deserialize)]
struct ResultSeries {
    metric: Labels,
    #[serde(default)]
    value: Option<(f64, String)>,
    #[serde(default)]
    values: Vec<(f64, String)>,
}

type Points = Vec<(f64, f64)>;

impl Api {
    fn new(s: &PrometheusSource) -> Result<Api, PrometheusError> {
        let req = |why: String| PrometheusError::Request { url: s.url.clone(), why };
        let uri: hyper::Uri = s.url.parse().map_err(|e| req(format!("not a URL ({e})")))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return Err(req("not an http:// or https:// URL".into()));
        }
        let tls =
            tracer_core::tls::http_client_tls(s.ca_pem.as_deref(), uri.scheme_str() == Some("https")).map_err(req)?;
        let https =
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http().enable_http1().build();
        let auth = match &s.token {
            Some(t) => Some(
                hyper::header::HeaderValue::from_str(&format!("Bearer {}", t.trim()))
                    .map_err(|_| req("the token holds characters an HTTP header cannot carry".into()))?,
            ),
            None => None,
        };
        Ok(Api {
            base: s.url.trim_end_matches('/').to_owned(),
            client: Client::builder(TokioExecutor::new()).build(https),
            auth,
            timeout: s.timeout,
        })
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        form: &[(&str, String)],
    ) -> Result<T, PrometheusError> {
        let url = format!("{}{path}", self.base);
        let query =
            form.iter().find(|(k, _)| matches!(*k, "query" | "match[]")).map(|(_, v)| v.clone()).unwrap_or_default();
        let req_err = |why: String| PrometheusError::Request { url: url.clone(), why };
        let body = form.iter().map(|(k, v)| format!("{k}={}", url_encode(v))).collect::<Vec<_>>().join("&");
        let mut req = hyper::Request::post(&url)
            .header(hyper::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| req_err(format!("building the request: {e}")))?;
        if let Some(a) = &self.auth {
            req.headers_mut().insert(hyper::header::AUTHORIZATION, a.clone());
        }
        let resp = tokio::time::timeout(self.timeout, self.client.request(req))
            .await
            .map_err(|_| req_err(format!("no answer within {} s", self.timeout.as_secs_f64())))?
            .map_err(|e| req_err(chain(&e)))?;
        let status = resp.status();
        let body = tokio::time::timeout(self.timeout, Limited::new(resp.into_body(), MAX_ANSWER).collect())
            .await
            .map_err(|_| req_err(format!("the answer did not arrive within {} s", self.timeout.as_secs_f64())))?
            .map_err(|e| req_err(format!("reading the answer: {e}")))?
            .to_bytes();
        let answer: Answer<T> = serde_json::from_slice(&body).map_err(|e| {
            req_err(format!(
                "HTTP {status}, not an answer of Prometheus' query API ({e}): {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            ))
        })?;
        if answer.status != "success" {
            return Err(PrometheusError::Query {
                url,
                query,
                why: answer.error.unwrap_or_else(|| format!("HTTP {status}")),
            });
        }
        answer.data.ok_or_else(|| req_err("a successful answer without data".into()))
    }

    /// The label sets (without `__name__`) of the series matching `sel` with samples in
    /// `[start, end]`: from the index, reading no sample.
    async fn series(&self, sel: &str, start: f64, end: f64) -> Result<Vec<Labels>, PrometheusError> {
        let form = [("match[]", sel.to_owned()), ("start", format!("{start:.3}")), ("end", format!("{end:.3}"))];
        let mut v: Vec<Labels> = self.call("/api/v1/series", &form).await?;
        for l in &mut v {
            l.remove("__name__");
        }
        Ok(v)
    }

    /// An instant query's vector: labels (without `__name__`) and value.
    async fn instant(&self, q: &str, at: f64) -> Result<Vec<(Labels, f64)>, PrometheusError> {
        let d: Data = self.call("/api/v1/query", &[("query", q.to_owned()), ("time", format!("{at:.3}"))]).await?;
        if d.result_type != "vector" {
            return Err(self.unexpected(q, &d.result_type, "vector"));
        }
        Ok(d.result
            .into_iter()
            .filter_map(|mut r| {
                r.metric.remove("__name__");
                let v = r.value?.1.parse::<f64>().ok()?;
                Some((r.metric, v))
            })
            .collect())
    }

    /// A range query's matrix.
    async fn range(&self, q: &str, start: f64, end: f64, step: f64) -> Result<Vec<(Labels, Points)>, PrometheusError> {
        let form = [
            ("query", q.to_owned()),
            ("start", format!("{start:.3}")),
            ("end", format!("{end:.3}")),
            ("step", format!("{step:.3}")),
        ];
        let d: Data = self.call("/api/v1/query_range", &form).await?;
        if d.result_type != "matrix" {
            return Err(self.unexpected(q, &d.result_type, "matrix"));
        }
        Ok(matrix(d))
    }

    /// Raw samples: an instant query of a range selector.
    async fn raw(&self, q: &str, at: f64) -> Result<Vec<(Labels, Points)>, PrometheusError> {
        let d: Data = self.call("/api/v1/query", &[("query", q.to_owned()), ("time", format!("{at:.3}"))]).await?;
        if d.result_type != "matrix" {
            return Err(self.unexpected(q, &d.result_type, "matrix"));
        }
        Ok(matrix(d))
    }

    fn unexpected(&self, q: &str, got: &str, want: &str) -> PrometheusError {
        PrometheusError::Query {
            url: self.base.clone(),
            query: q.to_owned(),
            why: format!("the answer is a {got}, not a {want}"),
        }
    }
}

fn matrix(d: Data) -> Vec<(Labels, Points)> {
    d.result
        .into_iter()
        .map(|mut r| {
            r.metric.remove("__name__");
            let pts = r.values.into_iter().filter_map(|(t, v)| Some((t, v.parse::<f64>().ok()?))).collect();
            (r.metric, pts)
        })
        .collect()
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut m = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        m.push_str(&format!(": {s}"));
        src = s.source();
    }
    m
}

/// `application/x-www-form-urlencoded` value encoding.
fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3 / 2);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incarnations_are_the_distinct_start_times_with_their_last_sample_in_the_period() {
        let s = [(5.0, 100.0), (10.0, 100.0), (15.0, 100.0), (20.0, 200.0), (25.0, 200.0), (30.0, 300.0)];
        let inc = incarnations(&s, 7.0, 25.0);
        assert_eq!(
            inc,
            vec![Incarnation { start: 100.0, last_scrape: 15.0 }, Incarnation { start: 200.0, last_scrape: 25.0 }]
        );
        assert!(incarnations(&s, 30.0, 40.0).is_empty());
    }

    #[test]
    fn windows_read_are_each_minimums_last_window_and_those_before_a_gap() {
        // Process 100 until window 30, then 150 (hidden inside window 30) and 200 until 50, none
        // in 60, 300 from 70 to 90, 400 from inside window 90 on.
        let w = [
            (10.0, 100.0),
            (20.0, 100.0),
            (30.0, 100.0),
            (40.0, 200.0),
            (50.0, 200.0),
            (70.0, 300.0),
            (80.0, 300.0),
            (90.0, 300.0),
            (100.0, 400.0),
        ];
        assert_eq!(windows_to_read(&w, 10.0), vec![30.0, 50.0, 90.0, 100.0]);
        assert!(windows_to_read(&[], 10.0).is_empty());
        // Every process's last scrape is in a window read (its raw samples name it): checked
        // against a simulation of scrapes every second with random restarts.
        let mut seed = 7u64;
        let mut rnd = |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for _ in 0..200 {
            let (step, n) = (10.0, 300u64);
            let mut scrapes: Vec<(f64, f64)> = Vec::new();
            let mut start = 0.0;
            for ts in 1..=n {
                if rnd(20) == 0 {
                    start = ts as f64; // a restart
                }
                if rnd(8) != 0 {
                    scrapes.push((ts as f64, start));
                }
            }
            let windows: Vec<(f64, f64)> = (1..=n / 10)
                .filter_map(|k| {
                    let end = k as f64 * step;
                    let inside = scrapes.iter().filter(|(ts, _)| *ts > end - step && *ts <= end);
                    inside.map(|(_, v)| *v).reduce(f64::min).map(|m| (end, m))
                })
                .collect();
            let read = windows_to_read(&windows, step);
            let raw: Vec<(f64, f64)> = scrapes
                .iter()
                .copied()
                .filter(|(ts, _)| read.iter().any(|end| *ts > end - step && *ts <= *end))
                .collect();
            assert_eq!(incarnations(&raw, 0.0, n as f64), incarnations(&scrapes, 0.0, n as f64));
        }
    }

    #[test]
    fn selectors_quote_and_join_matchers() {
        assert_eq!(selector("m", &["", " "]), "m");
        assert_eq!(selector("m", &["a=\"1\",", "b=\"2\""]), "m{a=\"1\",b=\"2\"}");
        assert_eq!(escape("a\"b\\"), "a\\\"b\\\\");
        assert_eq!(regex_quote("web-1.x"), "web-1\\.x");
        assert_eq!(duration(2592000.0), "2592000000ms");
        assert_eq!(url_encode("a b{c=\"d\"}"), "a+b%7Bc%3D%22d%22%7D");
    }
}
