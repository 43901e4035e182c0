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
//! Queries: a handful over all targets (two range functions over the period on one series per
//! target, instant queries at the end and the start); per target that restarted or stopped
//! being scraped within the period, a few more (its start-time series in windows, then the
//! scrape that ended each incarnation).
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

use super::{
    CostInput,
    series::{self, BILL, CONTAINER_COST, Labels, POD_LABELS, PRICE, PodLabels},
};

const START_TIME: &str = "process_start_time_seconds";
/// The largest answer read (a month of a fleet's container series at one instant is a few MB).
const MAX_ANSWER: usize = 256 << 20;
/// Windows the period is cut into when an agent's processes are told apart.
const WINDOWS: f64 = 500.0;

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
pub struct Incarnation {
    pub start: f64,
    pub last_scrape: f64,
}

/// The incarnations in raw `(timestamp, start time)` samples: one per distinct start time, with
/// its last sample. Samples outside `(from, to]` are ignored.
pub fn incarnations(samples: &[(f64, f64)], from: f64, to: f64) -> Vec<Incarnation> {
    let mut by_start: BTreeMap<u64, Incarnation> = BTreeMap::new();
    for &(ts, v) in samples.iter().filter(|(ts, v)| *ts > from && *ts <= to && v.is_finite()) {
        let e = by_start.entry(v.to_bits()).or_insert(Incarnation { start: v, last_scrape: ts });
        e.last_scrape = e.last_scrape.max(ts);
    }
    let mut v: Vec<Incarnation> = by_start.into_values().collect();
    v.sort_by(|a, b| a.start.total_cmp(&b.start));
    v
}

/// The windows worth reading raw, from per-window `(window end, min, max)` of the start time:
/// those holding more than one process, and for each start time the last window that holds it
/// (its last scrape is there). A start time strictly between a window's min and max belongs to a
/// process that lived only in that window (start times grow), so these windows see every one.
pub fn windows_to_read(windows: &[(f64, f64, f64)]) -> Vec<f64> {
    let mut last_of: BTreeMap<u64, f64> = BTreeMap::new();
    let mut out: BTreeSet<u64> = BTreeSet::new();
    for &(t, min, max) in windows {
        for v in [min, max] {
            let e = last_of.entry(v.to_bits()).or_insert(t);
            *e = e.max(t);
        }
        if min != max {
            out.insert(t.to_bits());
        }
    }
    out.extend(last_of.values().map(|t| t.to_bits()));
    let mut v: Vec<f64> = out.into_iter().map(f64::from_bits).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// Read the bill over the period from Prometheus.
pub async fn fetch(s: &PrometheusSource) -> Result<CostInput, PrometheusError> {
    if !(s.range_s > 0.0 && s.end_unix_s > s.range_s && s.range_s.is_finite()) {
        return Err(PrometheusError::Period { range_s: s.range_s, end_unix_s: s.end_unix_s });
    }
    let api = Api::new(s)?;
    let (t1, t0) = (s.end_unix_s, s.end_unix_s - s.range_s);
    let range = duration(s.range_s);
    let sel = |metric: &str, extra: &str| selector(metric, &[&s.matchers, extra]);
    let mut warnings = Vec::new();

    // The targets with a bill in the period, and the range of their processes' start times.
    let agents = format!(" and on (job, instance) max_over_time({}[{range}])", sel(BILL, "line=\"containers\""));
    let lo = api.instant(&format!("min_over_time({}[{range}]){agents}", sel(START_TIME, "")), t1).await?;
    let hi = api.instant(&format!("max_over_time({}[{range}]){agents}", sel(START_TIME, "")), t1).await?;
    if lo.is_empty() {
        let matchers = if s.matchers.is_empty() { String::new() } else { format!(" matching {{{}}}", s.matchers) };
        return Err(PrometheusError::NoAgents { url: s.url.clone(), matchers });
    }
    let lo: BTreeMap<Target, f64> = lo.into_iter().map(|(l, v)| (target_of(&l), v)).collect();
    let hi: BTreeMap<Target, f64> = hi.into_iter().map(|(l, v)| (target_of(&l), v)).collect();
    // Which process each target runs at the end and at the start.
    let at_end: BTreeMap<Target, f64> =
        api.instant(&sel(START_TIME, ""), t1).await?.into_iter().map(|(l, v)| (target_of(&l), v)).collect();
    let at_start: BTreeMap<Target, f64> =
        api.instant(&sel(START_TIME, ""), t0).await?.into_iter().map(|(l, v)| (target_of(&l), v)).collect();

    // Each target's processes in the period. One process still scraped at the end: its last
    // scrape is read at the end with everyone else's. Otherwise, read its start times in windows.
    let mut ends_at_t1: BTreeSet<Target> = BTreeSet::new();
    let mut ends: Vec<(Target, f64)> = Vec::new();
    let mut first_start: BTreeMap<Target, f64> = BTreeMap::new();
    for (t, &min) in &lo {
        let max = hi.get(t).copied().unwrap_or(min);
        if min == max && at_end.get(t) == Some(&min) {
            ends_at_t1.insert(t.clone());
            first_start.insert(t.clone(), min);
            continue;
        }
        let inc = scan(&api, &s.matchers, t, t0, t1).await?;
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
                ends.push((t.clone(), i.last_scrape));
            }
        }
    }

    // Series values: + each process's last scrape, - the start for the process running then.
    let mut acc: BTreeMap<(bool, Labels), i128> = BTreeMap::new();
    let mut pods = PodLabels::new();
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
    for (t, at) in &ends {
        let m = target_matchers(t);
        add(&mut acc, false, api.instant(&selector(CONTAINER_COST, &[&s.matchers, &m]), *at).await?, 1);
        add(&mut acc, true, api.instant(&selector(BILL, &[&s.matchers, &m]), *at).await?, 1);
        if s.pod_labels {
            let rows = api.instant(&selector(POD_LABELS, &[&s.matchers, &m]), *at).await?;
            series::add_pod_labels(&mut pods, rows.iter().map(|(l, _)| l));
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
        for (ns, names) in missing {
            let re = names.iter().map(|p| regex_quote(p)).collect::<Vec<_>>().join("|");
            let m = format!("namespace=\"{}\",pod=~\"{}\"", escape(&ns), escape(&re));
            let q = format!("last_over_time({}[{range}])", selector(POD_LABELS, &[&s.matchers, &m]));
            let rows = api.instant(&q, t1).await?;
            series::add_pod_labels(&mut pods, rows.iter().map(|(l, _)| l));
        }
    }

    let prices: BTreeSet<u64> = api
        .instant(&format!("last_over_time({}[{range}])", sel(PRICE, "")), t1)
        .await?
        .into_iter()
        .filter(|(_, v)| v.is_finite())
        .map(|(_, v)| v.to_bits())
        .collect();
    let node_of =
        |l: &Labels| l.get("node").filter(|n| !n.is_empty()).or_else(|| l.get("instance")).cloned().unwrap_or_default();
    let charges = series::charges(&containers, &bill, &pods, &node_of, &mut warnings);
    Ok(CostInput {
        source: format!(
            "Prometheus at {} ({} agents{})",
            s.url,
            lo.len(),
            if s.matchers.is_empty() { String::new() } else { format!(", {{{}}}", s.matchers) }
        ),
        period: format!(
            "for the {} to {}",
            human_duration(s.range_s),
            crate::export::format::unix_time((t1.max(0.0) * 1e9) as u64)
        ),
        start_unix_s: Some(t0),
        end_unix_s: Some(t1),
        prices_per_gpu_hour: prices.into_iter().map(f64::from_bits).collect(),
        charges,
        warnings,
    })
}

/// A target's processes in `(t0, t1]`: the start time's min and max in windows, then the raw
/// samples of the windows that hold a change or a process's last scrape.
async fn scan(api: &Api, matchers: &str, t: &Target, t0: f64, t1: f64) -> Result<Vec<Incarnation>, PrometheusError> {
    let step = ((t1 - t0) / WINDOWS).ceil().max(1.0);
    let series = selector(START_TIME, &[matchers, &target_matchers(t)]);
    let w = duration(step);
    let first = t1 - step * ((t1 - t0) / step).floor();
    let first = if first <= t0 { first + step } else { first };
    let mins = api.range(&format!("min_over_time({series}[{w}])"), first, t1, step).await?;
    let maxs = api.range(&format!("max_over_time({series}[{w}])"), first, t1, step).await?;
    let max_at: BTreeMap<u64, f64> =
        maxs.into_iter().flat_map(|(_, pts)| pts).map(|(ts, v)| (ts.to_bits(), v)).collect();
    let windows: Vec<(f64, f64, f64)> = mins
        .into_iter()
        .flat_map(|(_, pts)| pts)
        .map(|(ts, min)| (ts, min, max_at.get(&ts.to_bits()).copied().unwrap_or(min)))
        .collect();
    let mut raw = Vec::new();
    for end in windows_to_read(&windows) {
        for (_, pts) in api.raw(&format!("{series}[{w}]"), end).await? {
            raw.extend(pts);
        }
    }
    Ok(incarnations(&raw, t0, t1))
}

fn target_matchers(t: &Target) -> String {
    format!("job=\"{}\",instance=\"{}\"", escape(&t.0), escape(&t.1))
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
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<Data>,
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
        let tls = crate::export::otlp::http_client_tls(s.ca_pem.as_deref(), uri.scheme_str() == Some("https"))
            .map_err(req)?;
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

    async fn call(&self, path: &str, form: &[(&str, String)]) -> Result<Data, PrometheusError> {
        let url = format!("{}{path}", self.base);
        let query = form.iter().find(|(k, _)| *k == "query").map(|(_, v)| v.clone()).unwrap_or_default();
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
        let answer: Answer = serde_json::from_slice(&body).map_err(|e| {
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

    /// An instant query's vector: labels (without `__name__`) and value.
    async fn instant(&self, q: &str, at: f64) -> Result<Vec<(Labels, f64)>, PrometheusError> {
        let d = self.call("/api/v1/query", &[("query", q.to_owned()), ("time", format!("{at:.3}"))]).await?;
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
        let d = self.call("/api/v1/query_range", &form).await?;
        if d.result_type != "matrix" {
            return Err(self.unexpected(q, &d.result_type, "matrix"));
        }
        Ok(matrix(d))
    }

    /// Raw samples: an instant query of a range selector.
    async fn raw(&self, q: &str, at: f64) -> Result<Vec<(Labels, Points)>, PrometheusError> {
        let d = self.call("/api/v1/query", &[("query", q.to_owned()), ("time", format!("{at:.3}"))]).await?;
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
    fn windows_read_are_the_changes_and_each_start_times_last_window() {
        // Process 100 until window 30, 200 in 30..50 (hidden 150 inside window 30), 300 from 60.
        let w = [
            (10.0, 100.0, 100.0),
            (20.0, 100.0, 100.0),
            (30.0, 100.0, 200.0),
            (40.0, 200.0, 200.0),
            (50.0, 200.0, 200.0),
            (70.0, 300.0, 300.0),
            (80.0, 300.0, 300.0),
        ];
        assert_eq!(windows_to_read(&w), vec![30.0, 50.0, 80.0]);
        assert!(windows_to_read(&[]).is_empty());
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
