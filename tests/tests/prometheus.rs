//! The Prometheus rules and Grafana dashboards the chart ships (deploy/helm/gpu-tracer/files),
//! checked by a real Prometheus (Debian's `prometheus` package, which `cargo xtask setup`
//! installs) scraping two simulated GPU nodes, each watched by the real `gpu-tracer agent`
//! (`gpu-tracer-sim --agent`: fake driver, fake NVML, fake API server and kubelet, five pods — one
//! holding memory and running nothing, one using a GPU it was not allocated).
//!
//! Through Prometheus' HTTP API: every rule group loads and evaluates; every query of every
//! dashboard panel and variable returns series; the attribution lines add up per GPU on both
//! nodes; the dcgm-exporter series count each GPU once and carry dcgm's labels; the alerts for
//! the violating and the idle pod are raised, and none of the agent-health alerts is;
//! `gpu-tracer cost --prometheus` bills the fleet to the nano of the agents' stored bill lines,
//! per node, namespace and team, and one agent's own bill (its `/metrics`, its API) agrees. Before that,
//! `promtool` checks and unit-tests the rule files and parses every dashboard query.
//!
//! And `/metrics` protected (`[metrics] tls_cert`, `tls_key`, `token_file`; `gpu-tracer-sim
//! --metrics-tls-cert/--metrics-tls-key/--metrics-token-file`): a real Prometheus, configured as the
//! chart's ServiceMonitor/PodMonitor are with `metricsTls` and `metricsToken` (https, a CA and server
//! name or the chart's default skip-verify, `authorization: Bearer` from a file), scrapes one
//! simulated node's agent over TLS with the token and stores its series, and is refused without the
//! token or with a wrong one (401), over plain HTTP, and under a name the certificate lacks.
//!
//! Root: the simulated nodes need eBPF, FUSE and cgroups. The tests fail, never skip, without them
//! or without Prometheus, and run one at a time.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use gpu_tracer_tests::{ChildGuard, gpu_tracer, http, prometheus_tool, require_root, spawn_sim};
use serde_json::{Value, json};

/// Each test runs simulated nodes (eBPF probes, FUSE, cgroups) on a two-core machine: one test at
/// a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// The target labels the chart's monitors drop (the agent pod's, which would land on every series
/// without a pod of its own); deploy.rs checks the chart renders the same regex.
const TARGET_LABELS_DROPPED: &str = "(namespace|pod|container|service|endpoint)";

/// The simulated nodes: (node name, its agent's port).
const NODES: [&str; 2] = ["sim-a", "sim-b"];
/// Memory holds still this long after each agent serves (launches go on), so that device memory
/// and its attribution can be compared across series.
const QUIET_AFTER_S: &str = "8";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

fn files() -> PathBuf {
    repo_root().join("deploy/helm/gpu-tracer/files")
}

/// Prometheus serving on `addr` with `config` (JSON is YAML), its data and log under `dir`.
fn start_prometheus(prometheus: &Path, config: &Value, dir: &Path, addr: String) -> (ChildGuard, Prom, PathBuf) {
    let config_file = dir.join("prometheus.yml");
    std::fs::write(&config_file, config.to_string()).unwrap();
    let log = dir.join("prometheus.log");
    let child = ChildGuard::new(
        Command::new(prometheus)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting prometheus"),
    )
    .named("prometheus")
    .grace(Duration::from_secs(20));
    (child, Prom { addr }, log)
}

/// A loopback port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

fn run_tool(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{text}", out.status);
    text
}

/// Every dashboard under files/grafana: (file name, JSON).
fn dashboards() -> Vec<(String, Value)> {
    let dir = files().join("grafana");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            let text = std::fs::read_to_string(&p).unwrap();
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", p.display()));
            out.push((p.file_name().unwrap().to_string_lossy().into_owned(), v));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 2, "the dashboards are missing from {}", dir.display());
    out
}

/// One query of a dashboard: where it is and its PromQL.
#[derive(Debug)]
struct Query {
    at: String,
    expr: String,
}

/// The structural checks of a dashboard (problems, as messages) and its queries: panel targets
/// and `label_values(...)` variables (as `label_values` calls).
fn dashboard_queries(name: &str, d: &Value) -> (Vec<String>, Vec<Query>) {
    let mut problems = Vec::new();
    let mut queries = Vec::new();
    let ds = json!({"type": "prometheus", "uid": "${datasource}"});
    let vars = d["templating"]["list"].as_array().cloned().unwrap_or_default();
    if !vars.iter().any(|v| v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus") {
        problems.push(format!("{name}: no `datasource` variable of type datasource (prometheus)"));
    }
    for v in vars.iter().filter(|v| v["type"] == "query") {
        let at = format!("{name}: variable {}", v["name"]);
        if v["datasource"] != ds {
            problems.push(format!("{at}: datasource is {} (want {ds})", v["datasource"]));
        }
        match v["query"]["query"].as_str() {
            Some(q) => queries.push(Query { at, expr: q.to_string() }),
            None => problems.push(format!("{at}: no query")),
        }
    }
    let mut ids = BTreeSet::new();
    for p in d["panels"].as_array().cloned().unwrap_or_default() {
        let title = p["title"].as_str().unwrap_or("?").to_string();
        if !ids.insert(p["id"].as_u64().unwrap_or(0)) {
            problems.push(format!("{name}: panel {title:?}: id {} used twice (or missing)", p["id"]));
        }
        if p["type"] == "row" {
            continue;
        }
        if p["datasource"] != ds {
            problems.push(format!("{name}: panel {title:?}: datasource is {} (want {ds})", p["datasource"]));
        }
        let targets = p["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            problems.push(format!("{name}: panel {title:?} has no query"));
        }
        for t in targets {
            if t["datasource"] != ds {
                problems.push(format!("{name}: panel {title:?}: a target's datasource is {}", t["datasource"]));
            }
            match t["expr"].as_str().filter(|e| !e.trim().is_empty()) {
                Some(e) => queries.push(Query { at: format!("{name}: panel {title:?}"), expr: e.to_string() }),
                None => problems.push(format!("{name}: panel {title:?}: a target without an expression")),
            }
        }
    }
    (problems, queries)
}

/// A dashboard query as Grafana sends it with every variable at "All" and a 5-minute range.
fn as_grafana_sends(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__range", "5m")
        .replace("${datasource}", "")
        .replace("$namespace", ".*")
        .replace("$node", ".*")
}

/// `label_values(SELECTOR, LABEL)` → (selector, label).
fn label_values(q: &str) -> Option<(&str, &str)> {
    let inner = q.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (sel, label) = inner.rsplit_once(',')?;
    Some((sel.trim(), label.trim()))
}

/// One series of a query's answer: its labels and value.
type Sample = (BTreeMap<String, String>, f64);

/// Prometheus' HTTP API on `addr`.
struct Prom {
    addr: String,
}

impl Prom {
    fn api(&self, path: &str, form: &[(&str, &str)]) -> Result<Value, String> {
        let (status, body) =
            if form.is_empty() { http::get(&self.addr, path) } else { http::post_form(&self.addr, path, form) };
        let v: Value =
            serde_json::from_str(&body).map_err(|e| format!("{path}: HTTP {status}, not JSON ({e}): {body}"))?;
        if v["status"] != "success" {
            return Err(format!("{path}: HTTP {status}: {} {}", v["errorType"], v["error"]));
        }
        Ok(v["data"].clone())
    }

    /// An instant query's series: (labels, value).
    fn query(&self, q: &str) -> Result<Vec<Sample>, String> {
        self.query_at(q, None)
    }

    /// An instant query at `time` (seconds since the epoch; `None`: now).
    fn query_at(&self, q: &str, time: Option<f64>) -> Result<Vec<Sample>, String> {
        let time = time.map(|t| format!("{t:.3}"));
        let mut form = vec![("query", q)];
        if let Some(t) = &time {
            form.push(("time", t));
        }
        let data = self.api("/api/v1/query", &form)?;
        Ok(data["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|s| {
                let labels = s["metric"]
                    .as_object()
                    .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
                    .unwrap_or_default();
                let value = s["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
                (labels, value)
            })
            .collect())
    }

    fn wait_for(&self, what: &str, q: &str, n: usize, timeout: Duration) {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < timeout {
            match self.query(q) {
                Ok(r) if r.len() >= n => return,
                Ok(r) => last = format!("{} series", r.len()),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!("Prometheus: {what} ({q}) did not come within {timeout:?}; last: {last}");
    }
}

#[test]
fn rules_and_dashboards_hold_on_a_real_prometheus_scraping_two_simulated_nodes() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let promtool = prometheus_tool("promtool");
    let prometheus = prometheus_tool("prometheus");
    let rules_dir = files().join("prometheus");
    let rule_files: Vec<PathBuf> =
        ["recording", "dcgm-compat", "alerts"].iter().map(|f| rules_dir.join(format!("{f}.rules.yml"))).collect();

    // promtool: the rule files are valid and their unit tests pass.
    run_tool(Command::new(&promtool).arg("check").arg("rules").args(&rule_files));
    let unit = run_tool(Command::new(&promtool).current_dir(&rules_dir).args(["test", "rules", "rules.test.yml"]));
    assert!(unit.contains("SUCCESS"), "promtool test rules:\n{unit}");

    // The dashboards: structure, then every query parsed by promtool (as recording rules).
    let mut problems = Vec::new();
    let mut queries = Vec::new();
    for (name, d) in dashboards() {
        let (p, q) = dashboard_queries(&name, &d);
        problems.extend(p);
        queries.extend(q);
    }
    assert!(problems.is_empty(), "dashboard problems:\n{}", problems.join("\n"));
    let panel_queries: Vec<&Query> = queries.iter().filter(|q| label_values(&q.expr).is_none()).collect();
    let tmp = tempfile::tempdir().unwrap();
    let parse_rules = json!({"groups": [{"name": "dashboard-queries", "rules": panel_queries.iter().enumerate()
        .map(|(i, q)| json!({"record": format!("dashboard_query_{i}"), "expr": as_grafana_sends(&q.expr)}))
        .collect::<Vec<_>>()}]});
    // JSON is YAML: promtool reads it as a rule file.
    let parse_file = tmp.path().join("dashboard-queries.rules.yml");
    std::fs::write(&parse_file, parse_rules.to_string()).unwrap();
    run_tool(Command::new(&promtool).arg("check").arg("rules").arg(&parse_file));
    eprintln!("promtool: rules valid, unit tests pass, {} dashboard queries parse", panel_queries.len());

    // Two simulated nodes, each with its agent.
    let tracer = gpu_tracer();
    let mut nodes = Vec::new();
    for node in NODES {
        let addr = format!("127.0.0.1:{}", free_port());
        let grpc = format!("unix://{}", tmp.path().join(format!("{node}.sock")).display());
        let args = ["--duration", "600", "--quiet-after", QUIET_AFTER_S, "--grpc-listen", &grpc];
        let child = spawn_sim(node, &addr, &tmp.path().join(format!("{node}.log")), &args);
        nodes.push((node, addr, child));
    }
    let sim_log = |node: &str| std::fs::read_to_string(tmp.path().join(format!("{node}.log"))).unwrap_or_default();
    // Each agent serves what every panel needs: the attribution, the idle pod and the violation.
    for (node, addr, child) in &mut nodes {
        let start = Instant::now();
        loop {
            let (status, body) = http::get(&*addr, "/metrics");
            if status == 200
                && [
                    "gpu_tracer_attribution_memory_bytes{",
                    "gpu_tracer_violation_info{",
                    "gpu_tracer_container_idle_reservation_bytes{",
                ]
                .iter()
                .all(|m| body.contains(m))
            {
                break;
            }
            assert!(child.running(), "gpu-tracer-sim {node} exited:\n{}", sim_log(node));
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "{node}'s agent did not serve the attribution, the idle reservation and the violation within 120 s \
                 (last answer {status}):\n{}",
                sim_log(node)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        eprintln!("{node}: its agent on {addr} serves the attribution, an idle reservation and a violation");
    }

    // Prometheus: 1 s scrapes and rule evaluations, each target labelled as the Prometheus
    // operator labels it (the node, and the agent pod's own namespace, pod, container, service and
    // endpoint), relabelled as the chart's ServiceMonitor/PodMonitor relabel it
    // (deploy/helm/gpu-tracer/templates/_helpers.tpl; deploy.rs checks the chart renders this).
    let prom_addr = format!("127.0.0.1:{}", free_port());
    let targets: Vec<Value> = nodes
        .iter()
        .map(|(node, addr, _)| {
            json!({"targets": [addr], "labels": {
                "__meta_kubernetes_pod_node_name": node, "namespace": "gpu-tracer",
                "pod": format!("gpu-tracer-{node}"), "container": "gpu-tracer", "service": "gpu-tracer",
                "endpoint": "metrics"}})
        })
        .collect();
    let config = json!({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": rule_files,
        "scrape_configs": [{"job_name": "gpu-tracer", "honor_labels": true, "static_configs": targets,
            "relabel_configs": [
                {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
                {"action": "labeldrop", "regex": TARGET_LABELS_DROPPED},
            ]}],
    });
    let (mut prom_child, prom, prom_log) = start_prometheus(&prometheus, &config, tmp.path(), prom_addr);
    let waited = Instant::now();
    prom.wait_for("both agents up", "up{job=\"gpu-tracer\"} == 1", 2, Duration::from_secs(60));
    // The recorded series of every rule file, from both nodes.
    prom.wait_for("dcgm-compatible series", "count by (node) (DCGM_FI_DEV_FB_USED)", 2, Duration::from_secs(60));
    prom.wait_for("recorded rates", "namespace_pod:gpu_tracer_cuda_launches:rate5m", 1, Duration::from_secs(60));
    prom.wait_for(
        "the violation alert",
        "ALERTS{alertname=\"GpuTracerGuardrailViolation\"}",
        2,
        Duration::from_secs(60),
    );
    // Memory has held still since QUIET_AFTER_S; let the rate windows fill a little more.
    std::thread::sleep(Duration::from_secs(10));
    eprintln!(
        "prometheus on {}: both nodes scraped, rules evaluated ({:.1} s)",
        prom.addr,
        waited.elapsed().as_secs_f64()
    );

    let mut failures: Vec<String> = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failures.push(what);
        }
    };

    // Every rule group loaded and evaluates without error.
    let rules = prom.api("/api/v1/rules", &[]).expect("/api/v1/rules");
    let groups = rules["groups"].as_array().cloned().unwrap_or_default();
    check(groups.len() == 3, format!("{} rule groups loaded, want 3", groups.len()));
    for g in &groups {
        for r in g["rules"].as_array().cloned().unwrap_or_default() {
            check(
                r["health"] == "ok",
                format!("rule {} of group {}: health {} {}", r["name"], g["name"], r["health"], r["lastError"]),
            );
        }
    }

    // Every dashboard query returns series; every variable has values.
    for q in &queries {
        match label_values(&q.expr) {
            Some((selector, label)) => {
                let path = format!("/api/v1/label/{label}/values?match[]={}", http::encode(selector));
                match prom.api(&path, &[]) {
                    Ok(v) => check(
                        v.as_array().is_some_and(|a| !a.is_empty()),
                        format!("{}: `{}` has no values", q.at, q.expr),
                    ),
                    Err(e) => check(false, format!("{}: {e}", q.at)),
                }
            }
            // A panel that draws only what is not zero (`… > 0`: losses, on a healthy node none):
            // what it filters must return series, and what it draws must all be above 0.
            None if q.expr.ends_with(" > 0") => {
                let all = q.expr.trim_end_matches(" > 0");
                match (prom.query(&as_grafana_sends(all)), prom.query(&as_grafana_sends(&q.expr))) {
                    (Ok(all_series), Ok(drawn)) => {
                        check(!all_series.is_empty(), format!("{}: no series from `{all}`", q.at));
                        let zero = drawn
                            .iter()
                            .filter(|(_, v)| v.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater))
                            .count();
                        check(zero == 0, format!("{}: `{}` draws a series at 0", q.at, q.expr));
                        println!("{}: {} series, {} drawn (above 0)", q.at, all_series.len(), drawn.len());
                    }
                    (Err(e), _) | (_, Err(e)) => check(false, format!("{}: `{}`: {e}", q.at, q.expr)),
                }
            }
            None => match prom.query(&as_grafana_sends(&q.expr)) {
                Ok(r) => check(!r.is_empty(), format!("{}: no series from `{}`", q.at, q.expr)),
                Err(e) => check(false, format!("{}: `{}`: {e}", q.at, q.expr)),
            },
        }
    }

    // Choosing one node leaves only that node's series, in every panel: each query filters by
    // $node, and what it returns for one node carries that node (or, aggregated, no node at all).
    // And no panel draws only zeros: many series all at 0 (a label set per probe, per reason)
    // belong behind `> 0`.
    let one = NODES[0];
    for q in queries.iter().filter(|q| label_values(&q.expr).is_none()) {
        check(q.expr.contains("$node"), format!("{}: `{}` ignores the node selector ($node)", q.at, q.expr));
        let chosen = as_grafana_sends(&q.expr.replace("$node", one));
        match prom.query(&chosen) {
            Ok(r) => {
                let others: Vec<_> = r.iter().filter_map(|(l, _)| l.get("node").filter(|n| *n != one)).collect();
                check(others.is_empty(), format!("{}: with node {one}, `{chosen}` returns nodes {others:?}", q.at));
                check(
                    !r.is_empty() || q.expr.ends_with(" > 0"),
                    format!("{}: with node {one}, `{chosen}` returns nothing", q.at),
                );
            }
            Err(e) => check(false, format!("{}: `{chosen}`: {e}", q.at)),
        }
        if let Ok(all) = prom.query(&as_grafana_sends(&q.expr)) {
            check(
                all.len() <= NODES.len() || all.iter().any(|(_, v)| *v != 0.0),
                format!("{}: `{}` draws {} series, all 0", q.at, q.expr, all.len()),
            );
        }
    }

    // No series is given the agent's own pod: the device, agent and bill series have no pod, the
    // workloads' series keep theirs.
    let sums = |q: &str| prom.query(q).unwrap_or_else(|e| panic!("{q}: {e}"));
    let agent_pod = sums("count by (__name__, pod) ({job=\"gpu-tracer\", pod=~\"gpu-tracer-.*\"})");
    check(agent_pod.is_empty(), format!("series labelled with the agent's own pod: {agent_pod:?}"));
    let bill = sums("gpu_tracer_bill_total");
    check(
        !bill.is_empty() && bill.iter().all(|(l, _)| !l.contains_key("pod") && !l.contains_key("namespace")),
        format!("gpu_tracer_bill_total carries a pod or namespace: {bill:?}"),
    );
    let workloads = sums("count by (pod) (gpu_tracer_attribution_memory_bytes{line=\"container\"})");
    check(workloads.len() >= 3, format!("the workloads' pods on the attribution lines: {workloads:?}"));

    // The attribution lines add up to each GPU's total, and SM shares to 1, on both nodes.
    let memory = sums(
        "sum by (node, gpu) (gpu_tracer_attribution_memory_bytes) \
         - on (node, gpu) sum by (node, gpu) (gpu_tracer_attribution_memory_total_bytes)",
    );
    check(memory.len() == 4, format!("memory lines vs totals: {} (node, GPU) pairs, want 4: {memory:?}", memory.len()));
    for (l, v) in &memory {
        check(*v == 0.0, format!("memory lines of {l:?} are {v} bytes off the device total"));
    }
    let sm = sums("sum by (node, gpu) (gpu_tracer_attribution_sm_share_ratio)");
    check(sm.len() == 4, format!("SM shares: {} (node, GPU) pairs, want 4", sm.len()));
    for (l, v) in &sm {
        check((v - 1.0).abs() < 1e-9, format!("SM shares of {l:?} sum to {v}, not 1"));
    }

    // dcgm-exporter's FB_USED counts each GPU once: summed over pods it is NVML's used memory.
    let fb = sums(
        "sum by (node, device) (DCGM_FI_DEV_FB_USED) \
         - on (node, device) sum by (node, device) (gpu_tracer_gpu_memory_used_bytes{mig_profile=\"\"} / 1048576)",
    );
    check(fb.len() == 4, format!("FB_USED vs NVML used: {} (node, device) pairs, want 4", fb.len()));
    for (l, v) in &fb {
        check(v.abs() < 1e-6, format!("sum of DCGM_FI_DEV_FB_USED on {l:?} is {v} MiB off NVML's used memory"));
    }
    let per_pod = sums("DCGM_FI_DEV_FB_USED{pod=\"train-a\"}");
    check(per_pod.len() == 2, format!("DCGM_FI_DEV_FB_USED of train-a: {} series, want one per node", per_pod.len()));
    for (l, _) in &per_pod {
        let has = |k: &str, ok: &dyn Fn(&str) -> bool| l.get(k).is_some_and(|v| ok(v));
        check(
            has("gpu", &|v| v == "0")
                && has("UUID", &|v| v.starts_with("GPU-"))
                && has("device", &|v| v == "nvidia0")
                && has("modelName", &|v| !v.is_empty())
                && has("Hostname", &|v| NODES.contains(&v))
                && has("namespace", &|v| v == "ml")
                && has("container", &|v| v == "main"),
            format!("DCGM_FI_DEV_FB_USED lacks dcgm-exporter's labels: {l:?}"),
        );
    }

    // Cost per team, through the pods' allow-listed labels.
    let teams: BTreeSet<String> = sums("label_team:gpu_tracer_container_cost:per_hour")
        .into_iter()
        .filter_map(|(l, v)| (v > 0.0).then(|| l.get("label_team").cloned()).flatten())
        .collect();
    check(
        ["ml", "serving", "research"].iter().all(|t| teams.contains(*t)),
        format!("cost per team: {teams:?}, want ml, serving and research"),
    );

    // Alerts: the violating pod's fires and the idle pod's is pending (for: 1h) on both nodes;
    // none about the agents' health.
    let alerts = prom.api("/api/v1/alerts", &[]).expect("/api/v1/alerts");
    let alerts = alerts["alerts"].as_array().cloned().unwrap_or_default();
    let of = |name: &str, state: &str, pod: &str| {
        alerts
            .iter()
            .filter(|a| a["labels"]["alertname"] == name && a["state"] == state && a["labels"]["pod"] == pod)
            .filter_map(|a| a["labels"]["node"].as_str().map(str::to_string))
            .collect::<BTreeSet<String>>()
    };
    let both: BTreeSet<String> = NODES.iter().map(|n| n.to_string()).collect();
    check(
        of("GpuTracerGuardrailViolation", "firing", "rogue-e") == both,
        format!("GpuTracerGuardrailViolation for scratch/rogue-e is not firing on both nodes: {alerts:?}"),
    );
    check(
        of("GpuTracerIdleGpuReservation", "pending", "holder-d") == both,
        format!("GpuTracerIdleGpuReservation for research/holder-d is not pending on both nodes: {alerts:?}"),
    );
    for a in &alerts {
        let name = a["labels"]["alertname"].as_str().unwrap_or("");
        check(
            ["GpuTracerGuardrailViolation", "GpuTracerIdleGpuReservation"].contains(&name),
            format!("unexpected alert on a healthy node: {a}"),
        );
    }

    // `gpu-tracer cost --prometheus`: the fleet's bill over the hour to `end` is the agents' own bill
    // lines as Prometheus stored them (both started within the hour: nothing to subtract), to the
    // nano; each node's bill alone adds up to the fleet's; the namespaces are their containers'.
    let end = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64() - 1.0;
    let end_arg = format!("{end:.3}");
    let prom_url = format!("http://{}", prom.addr);
    let cost = |extra: &[&str]| -> Value {
        let started = Instant::now();
        let out = Command::new(&tracer)
            .args(["cost", "--prometheus", &prom_url, "--range", "1h", "--end", &end_arg, "--format", "json"])
            .args(extra)
            .output()
            .expect("running gpu-tracer cost");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "gpu-tracer cost {extra:?}: {}\n{text}", String::from_utf8_lossy(&out.stderr));
        eprintln!("gpu-tracer cost --prometheus {extra:?}: {:.2} s", started.elapsed().as_secs_f64());
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("cost JSON ({e}):\n{text}"))
    };
    let nano = |v: &Value| v.as_str().and_then(|s| s.parse::<i128>().ok()).unwrap_or_else(|| panic!("not nano: {v}"));
    let cents = |v: &Value| {
        let s = v.as_str().unwrap_or_else(|| panic!("not an amount: {v}"));
        let (units, c) = s.split_once('.').unwrap_or_else(|| panic!("not an amount: {s}"));
        units.trim_start_matches('-').parse::<i128>().unwrap() * 100 + c.parse::<i128>().unwrap()
    };
    let stored = |q: &str| -> BTreeMap<String, i128> {
        let mut m = BTreeMap::new();
        for (l, v) in prom.query_at(q, Some(end)).unwrap() {
            let key = l.get("namespace").or_else(|| l.get("node")).cloned().unwrap_or_default();
            *m.entry(key).or_default() += (v * 1e9).round() as i128;
        }
        m
    };
    let fleet = cost(&["--by", "node"]);
    let fleet_total = nano(&fleet["total_nano"]);
    let bill_lines: i128 = stored("gpu_tracer_bill_total").values().sum();
    check(
        fleet_total == bill_lines && fleet_total > 0,
        format!("fleet bill {fleet_total} nano, the agents' stored bill lines add up to {bill_lines}"),
    );
    let rows = fleet["rows"].as_array().cloned().unwrap_or_default();
    check(
        rows.iter().map(|r| cents(&r["amount"])).sum::<i128>() == cents(&fleet["total"]),
        format!("the fleet's rows do not add up to its total to the cent: {fleet}"),
    );
    let per_node: i128 = NODES
        .iter()
        .map(|n| nano(&cost(&["--matchers", &format!("node=\"{n}\""), "--by", "namespace"])["total_nano"]))
        .sum();
    check(per_node == fleet_total, format!("the nodes' bills add up to {per_node} nano, the fleet's is {fleet_total}"));
    let by_ns = cost(&["--by", "namespace"]);
    let want = stored("sum by (namespace) (gpu_tracer_container_cost_total)");
    for r in by_ns["rows"].as_array().cloned().unwrap_or_default().iter().filter(|r| r["line"] == "container") {
        let ns = r["group"]["namespace"].as_str().unwrap_or_default().to_string();
        check(
            want.get(&ns) == Some(&nano(&r["nano"])),
            format!("namespace {ns}: {} nano in the bill, {:?} stored", r["nano"], want.get(&ns)),
        );
    }
    let by_team = cost(&["--by", "label:team", "--policy", "spread"]);
    let teams: Vec<&str> = by_team["rows"]
        .as_array()
        .map(|r| r.iter().filter_map(|r| r["group"]["team"].as_str()).collect())
        .unwrap_or_default();
    check(
        teams.contains(&"ml") && teams.contains(&"research") && nano(&by_team["total_nano"]) == fleet_total,
        format!("per team, spread: {by_team}"),
    );
    // One agent's own bill read from its /metrics: a little later than Prometheus' last scrape, so
    // at least as much, and no more than its GPUs' price for the time since `end`.
    let (node_a, addr_a, _) = &nodes[0];
    let before = stored("gpu_tracer_bill_total{node=\"sim-a\"}").values().sum::<i128>();
    let socket = format!("unix://{}", tmp.path().join(format!("{node_a}.sock")).display());
    let metrics_url = format!("http://{addr_a}/metrics");
    for source in [vec!["--metrics", &metrics_url, "--node", node_a], vec!["--connect", &socket]] {
        let out = Command::new(&tracer)
            .arg("cost")
            .args(&source)
            .args(["--format", "json", "--by", "node,namespace"])
            .output()
            .expect("running gpu-tracer cost");
        let direct: Value = serde_json::from_str(&String::from_utf8_lossy(&out.stdout))
            .unwrap_or_else(|e| panic!("cost {source:?}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
        let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64() - end + 2.0;
        let price = direct["prices_per_gpu_hour"][0].as_f64().unwrap_or(0.0);
        let gpus = memory.len() as f64 / NODES.len() as f64;
        let most = (price * gpus * since / 3600.0 * 1e9) as i128;
        let got = nano(&direct["total_nano"]);
        check(
            got >= before && got - before <= most,
            format!(
                "{node_a} {source:?}: bill {got} nano, Prometheus had {before} at the end, at most {most} more allowed"
            ),
        );
        let rows = direct["rows"].as_array().cloned().unwrap_or_default();
        check(
            rows.iter().map(|r| cents(&r["amount"])).sum::<i128>() == cents(&direct["total"])
                && rows.iter().any(|r| r["group"]["node"] == *node_a && r["group"]["namespace"] == "ml"),
            format!("cost {source:?}: rows do not add up or do not name {node_a}: {direct}"),
        );
    }
    eprintln!(
        "cost: fleet {} = the stored bill lines to the nano, = the sum of the nodes' bills; {} namespaces match",
        fleet["total"],
        want.len()
    );

    for (_, _, child) in &mut nodes {
        check(child.running(), format!("{} exited during the test", child.what()));
    }
    if !failures.is_empty() {
        let logs: Vec<String> = NODES.iter().map(|n| format!("--- {n}:\n{}", sim_log(n))).collect();
        panic!(
            "{} check(s) failed:\n{}\n--- prometheus:\n{}\n{}",
            failures.len(),
            failures.join("\n"),
            std::fs::read_to_string(&prom_log).unwrap_or_default(),
            logs.join("\n")
        );
    }
    eprintln!(
        "{} dashboard queries return series; lines add up on {} GPUs; dcgm series count each GPU once; alerts raised",
        queries.len(),
        memory.len()
    );
    prom_child.stop();
    // The simulated nodes clean up after SIGTERM (workloads, cgroups, the fake driver).
    for (node, _, mut child) in nodes {
        let status = child.stop();
        assert!(
            status.is_some_and(|s| s.code() == Some(130)),
            "gpu-tracer-sim {node} did not stop cleanly on SIGTERM ({status:?}):\n{}",
            sim_log(node)
        );
    }
}

/// The name on the agent's certificate, as the chart's `metricsTls.prometheusTlsConfig` example
/// has it (`serverName: gpu-tracer`): Prometheus dials an address, the certificate names the service.
const SERVER_NAME: &str = "gpu-tracer";

/// A CA and a server certificate for [`SERVER_NAME`] it signed, written as PEM under `dir`:
/// (CA certificate, server certificate, server key).
fn tls_files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.distinguished_name.push(DnType::CommonName, "gpu-tracer test CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut server = CertificateParams::new(vec![SERVER_NAME.to_string()]).unwrap();
    server.distinguished_name.push(DnType::CommonName, SERVER_NAME);
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = server.signed_by(&key, &Issuer::new(ca, &ca_key)).unwrap();
    let paths = (dir.join("ca.crt"), dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&paths.0, ca_cert.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    (paths.0, paths.1, paths.2)
}

/// `[metrics] tls_cert`, `tls_key` and `token_file` against a real Prometheus, configured as the
/// chart's ServiceMonitor configures it when `metricsTls.secretName` and `metricsToken.secretName`
/// are set (`scheme: https`, a `tls_config`, `authorization: Bearer` from a file): one simulated
/// node's agent serves /metrics over TLS with a token. Verified against the CA by name, and with
/// the chart's default `insecureSkipVerify`, Prometheus scrapes it and stores its series; the same
/// target without the token or with a wrong one is refused (401), over plain HTTP it gets no HTTP
/// answer, and under a name the certificate does not carry the handshake fails. None of those
/// stores a series, and the failing scrapes cost the good ones no connection slot.
#[test]
fn a_real_prometheus_scrapes_an_agent_over_tls_with_its_token_and_is_refused_without() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let prometheus = prometheus_tool("prometheus");
    let tmp = tempfile::tempdir().unwrap();
    let (ca, cert, key) = tls_files(tmp.path());
    let token = format!("gpu-tracer-scrape-{:x}", SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos());
    let token_file = tmp.path().join("token");
    // As a Kubernetes Secret usually holds it: with a newline (both sides trim it).
    std::fs::write(&token_file, format!("{token}\n")).unwrap();

    let node = "sim-tls";
    let addr = format!("127.0.0.1:{}", free_port());
    let sim_log_path = tmp.path().join(format!("{node}.log"));
    let args: [&std::ffi::OsStr; 8] = [
        "--duration".as_ref(),
        "600".as_ref(),
        "--metrics-tls-cert".as_ref(),
        cert.as_os_str(),
        "--metrics-tls-key".as_ref(),
        key.as_os_str(),
        "--metrics-token-file".as_ref(),
        token_file.as_os_str(),
    ];
    let mut child = spawn_sim(node, &addr, &sim_log_path, &args);
    let sim_log = || std::fs::read_to_string(&sim_log_path).unwrap_or_default();
    let start = Instant::now();
    while !sim_log().contains(&format!("serving https://{addr}/metrics")) {
        assert!(child.running(), "gpu-tracer-sim {node} exited:\n{}", sim_log());
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{node}'s agent did not say it serves https://{addr}/metrics within 120 s:\n{}",
            sim_log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("{node}: its agent serves https://{addr}/metrics with a token ({:.1} s)", start.elapsed().as_secs_f64());

    // One target, six ways to scrape it. (job, scheme, tls_config, authorization, scraped?)
    let verified = json!({"ca_file": ca, "server_name": SERVER_NAME});
    let with_token = json!({"type": "Bearer", "credentials_file": token_file});
    let jobs = [
        ("verified", "https", Some(verified.clone()), Some(with_token.clone()), true),
        ("skip-verify", "https", Some(json!({"insecure_skip_verify": true})), Some(with_token.clone()), true),
        ("no-token", "https", Some(verified.clone()), None, false),
        (
            "wrong-token",
            "https",
            Some(verified.clone()),
            Some(json!({"type": "Bearer", "credentials": "not-it"})),
            false,
        ),
        ("plain-http", "http", None, Some(with_token.clone()), false),
        ("wrong-name", "https", Some(json!({"ca_file": ca})), Some(with_token), false),
    ];
    let scrape_configs: Vec<Value> = jobs
        .iter()
        .map(|(job, scheme, tls, auth, _)| {
            let mut c = json!({"job_name": job, "scheme": scheme, "static_configs": [{"targets": [addr]}]});
            if let Some(t) = tls {
                c["tls_config"] = t.clone();
            }
            if let Some(a) = auth {
                c["authorization"] = a.clone();
            }
            c
        })
        .collect();
    let config = json!({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": scrape_configs,
    });
    let prom_addr = format!("127.0.0.1:{}", free_port());
    let (mut prom_child, prom, prom_log) = start_prometheus(&prometheus, &config, tmp.path(), prom_addr);

    // Every job's target has been scraped as it should: up, or down with an error.
    // job → (health, lastError, scrapeUrl)
    let mut targets: BTreeMap<String, (String, String, String)> = BTreeMap::new();
    let settled = |t: &BTreeMap<String, (String, String, String)>| {
        jobs.iter().all(|(job, _, _, _, ok)| {
            t.get(*job).is_some_and(|(h, e, _)| if *ok { h == "up" } else { h == "down" && !e.is_empty() })
        })
    };
    let waited = Instant::now();
    while !settled(&targets) {
        assert!(child.running(), "gpu-tracer-sim {node} exited:\n{}", sim_log());
        assert!(prom_child.running(), "prometheus exited:\n{}", std::fs::read_to_string(&prom_log).unwrap_or_default());
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the scrapes did not settle within 60 s: {targets:#?}\n--- prometheus:\n{}\n--- {node}:\n{}",
            std::fs::read_to_string(&prom_log).unwrap_or_default(),
            sim_log()
        );
        std::thread::sleep(Duration::from_millis(500));
        if let Ok(data) = prom.api("/api/v1/targets?state=active", &[]) {
            targets = data["activeTargets"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|t| {
                    let s = |k: &str| t[k].as_str().unwrap_or_default().to_string();
                    (
                        t["labels"]["job"].as_str().unwrap_or_default().to_string(),
                        (s("health"), s("lastError"), s("scrapeUrl")),
                    )
                })
                .collect();
        }
    }
    for (job, (health, error, url)) in &targets {
        eprintln!("job {job}: {url} {health} {error}");
    }
    // Some series need the pods to have worked a while (the bill needs a priced interval).
    prom.wait_for(
        "the agent's series",
        "gpu_tracer_attribution_memory_bytes{job=\"verified\"}",
        1,
        Duration::from_secs(60),
    );
    prom.wait_for("the agent's bill", "gpu_tracer_bill_total{job=\"skip-verify\"}", 1, Duration::from_secs(60));
    eprintln!("prometheus on {}: the scrapes settled ({:.1} s)", prom.addr, waited.elapsed().as_secs_f64());

    let mut failures: Vec<String> = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failures.push(what);
        }
    };
    let query = |q: &str| prom.query(q).unwrap_or_else(|e| panic!("{q}: {e}"));
    for (job, scheme, _, _, ok) in &jobs {
        let (_, error, url) = &targets[*job];
        check(url.starts_with(&format!("{scheme}://{addr}/")), format!("job {job}: scrape URL {url}"));
        let up: Vec<f64> = query(&format!("up{{job=\"{job}\"}}")).into_iter().map(|(_, v)| v).collect();
        check(up == [if *ok { 1.0 } else { 0.0 }], format!("job {job}: up is {up:?}"));
        let stored = query(&format!("count({{__name__=~\"gpu_tracer_.+\", job=\"{job}\"}})"));
        check(
            stored.first().is_some_and(|(_, n)| *n > 0.0) == *ok,
            format!("job {job}: {stored:?} gpu_tracer series stored"),
        );
        // Why each one failed: the token is checked after the handshake, and only there.
        let why_ok = match *job {
            "no-token" | "wrong-token" => error.contains("401"),
            "plain-http" => !error.is_empty() && !error.contains("401"),
            // Go: "x509: cannot validate certificate for 127.0.0.1 because it doesn't contain any IP SANs".
            "wrong-name" => error.contains("x509:"),
            _ => error.is_empty(),
        };
        check(why_ok, format!("job {job}: last error {error:?}"));
    }
    // The refused scrapes took no connection slot from the good ones (each job keeps one connection).
    let refused = query("sum(gpu_tracer_http_connections_refused_total{job=\"verified\"})");
    check(refused.first().is_some_and(|(_, n)| *n == 0.0), format!("connections refused by the agent: {refused:?}"));
    // The token is in no log.
    let prom_text = std::fs::read_to_string(&prom_log).unwrap_or_default();
    check(!sim_log().contains(&token) && !prom_text.contains(&token), "the token appears in a log".into());
    check(child.running(), format!("{} exited during the test", child.what()));
    if !failures.is_empty() {
        panic!(
            "{} check(s) failed:\n{}\n--- prometheus:\n{prom_text}\n--- {node}:\n{}",
            failures.len(),
            failures.join("\n"),
            sim_log()
        );
    }
    eprintln!(
        "TLS and the token hold: verified and skip-verify scrapes up; no token, a wrong token, plain HTTP and a \
         wrong server name refused ({:.1} s in all)",
        start.elapsed().as_secs_f64()
    );
    prom_child.stop();
    let status = child.stop();
    assert!(
        status.is_some_and(|s| s.code() == Some(130)),
        "gpu-tracer-sim {node} did not stop cleanly on SIGTERM ({status:?}):\n{}",
        sim_log()
    );
}
