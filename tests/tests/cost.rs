//! `gpu-tracer cost --prometheus` against a real Prometheus holding a recorded history (made with
//! `promtool tsdb create-blocks-from openmetrics`, so the history can hold what two live agents
//! cannot show in a test: an agent that restarted within the period, one that started and stopped
//! within it, one that was already running at its start). The bill over the period must be, to
//! the nano, what the recorded scrapes say: per series, the value in the last scrape of each agent
//! process in the period, minus its value at the period's start for the process running then.
//!
//! Needs Debian's `prometheus` package (`cargo xtask setup`); fails, never skips, without it.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use gpu_tracer_tests::{ChildGuard, gpu_tracer, http, prometheus_tool};
use serde_json::Value;

const SCRAPE_S: i64 = 15;
const RANGE_S: i64 = 3600;

/// A series in one scrape: metric, labels, value (nano).
type Recorded = (String, Vec<(&'static str, String)>, i128);

/// One agent process: its target, when it started, the scrapes it answered, and what it bills
/// per second of its life, per series.
struct Process {
    node: &'static str,
    start: i64,
    first_scrape: i64,
    last_scrape: i64,
    /// (namespace, pod, team) and nano per second.
    containers: Vec<((&'static str, &'static str, &'static str), i128)>,
    idle_per_s: i128,
}

impl Process {
    fn scrapes(&self) -> impl Iterator<Item = i64> + '_ {
        (self.first_scrape..=self.last_scrape).step_by(SCRAPE_S as usize)
    }

    /// Every series' value (nano) at scrape `t`: (metric, labels) → value.
    fn values(&self, t: i64) -> Vec<Recorded> {
        let age = (t - self.start) as i128;
        let target = |extra: Vec<(&'static str, String)>| {
            let mut l = vec![("job", "gpu-tracer".to_string()), ("instance", format!("{}:9400", self.node))];
            l.push(("node", self.node.to_string()));
            l.extend(extra);
            l
        };
        let mut v = Vec::new();
        let mut sum = 0;
        for ((ns, pod, _), rate) in &self.containers {
            let x = rate * age;
            sum += x;
            v.push((
                "gpu_tracer_container_cost_total".into(),
                target(vec![("namespace", ns.to_string()), ("pod", pod.to_string()), ("container", "main".into())]),
                x,
            ));
        }
        for (line, x) in [("containers", sum), ("idle", self.idle_per_s * age), ("driver_reserved", 0)] {
            v.push(("gpu_tracer_bill_total".into(), target(vec![("line", line.into())]), x));
        }
        v
    }
}

fn nano_text(n: i128) -> String {
    format!("{}.{:09}", n / 1_000_000_000, n % 1_000_000_000)
}

#[test]
fn the_fleet_bill_over_a_period_is_exact_across_restarts_and_agents_that_come_and_go() {
    let promtool = prometheus_tool("promtool");
    let prometheus = prometheus_tool("prometheus");
    let tracer = gpu_tracer();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    // The period: the hour that ended 30 min ago, scrapes on a 15 s grid.
    let t1 = (now - 1800) / SCRAPE_S * SCRAPE_S;
    let t0 = t1 - RANGE_S;
    let ml = ("ml", "train-0", "vision");
    let web = ("web", "infer-0", "search");
    let batch = ("ml", "batch-7", "vision");
    let procs = [
        // node-a: one process, running before and after the period.
        Process {
            node: "node-a",
            start: t0 - 7200,
            first_scrape: t0 - 7200 + SCRAPE_S,
            last_scrape: t1 + 600,
            containers: vec![(ml, 1_000_003), (web, 333_331)],
            idle_per_s: 2_000_001,
        },
        // node-b: running at the start, gone 20 min in (last scrape), restarted 5 min later (its
        // counters from zero), with a pod the first process never saw.
        Process {
            node: "node-b",
            start: t0 - 600,
            first_scrape: t0 - 600 + SCRAPE_S,
            last_scrape: t0 + 1200,
            containers: vec![(ml, 700_001), (web, 123_457)],
            idle_per_s: 1_500_000,
        },
        Process {
            node: "node-b",
            start: t0 + 1500,
            first_scrape: t0 + 1500 + SCRAPE_S,
            last_scrape: t1 + 600,
            containers: vec![(ml, 700_001), (batch, 999_999)],
            idle_per_s: 900_001,
        },
        // node-c: started and stopped within the period.
        Process {
            node: "node-c",
            start: t0 + 900,
            first_scrape: t0 + 900 + SCRAPE_S,
            last_scrape: t0 + 2400,
            containers: vec![(web, 2_222_223)],
            idle_per_s: 111_111,
        },
    ];

    // The recorded history as OpenMetrics, one family at a time, samples in time order.
    let mut families: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
    for p in &procs {
        for t in p.scrapes() {
            let mut push = |metric: &str, labels: &[(&str, String)], value: String| {
                let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
                families
                    .entry(metric.to_string())
                    .or_default()
                    .push((t, format!("{metric}{{{}}} {value} {t}", l.join(","))));
            };
            let target =
                [("job", "gpu-tracer".to_string()), ("instance", format!("{}:9400", p.node)), ("node", p.node.into())];
            push("process_start_time_seconds", &target, format!("{}", p.start));
            push("gpu_tracer_price_per_gpu_hour", &target, "4".into());
            for (metric, labels, v) in p.values(t) {
                push(&metric, &labels, nano_text(v));
            }
            for ((ns, pod, team), _) in &p.containers {
                let mut l = target.to_vec();
                l.extend([("namespace", ns.to_string()), ("pod", pod.to_string()), ("label_team", team.to_string())]);
                push("gpu_tracer_pod_labels", &l, "1".into());
            }
        }
    }
    let mut om = String::new();
    for (metric, mut samples) in families {
        let (family, kind) = match metric.strip_suffix("_total") {
            Some(f) => (f.to_string(), "counter"),
            None => (metric.clone(), "gauge"),
        };
        writeln!(om, "# TYPE {family} {kind}").unwrap();
        samples.sort_by_key(|(t, _)| *t);
        for (_, line) in samples {
            writeln!(om, "{line}").unwrap();
        }
    }
    om.push_str("# EOF\n");

    // What the bill must be: + each process's last scrape in (t0, t1] (latest at or before t1),
    // - the scrape at t0 of the process running then (it also has scrapes in the period).
    let mut want_total: i128 = 0;
    let mut want_ns: BTreeMap<String, i128> = BTreeMap::new();
    let mut want_team: BTreeMap<String, i128> = BTreeMap::new();
    let teams: BTreeMap<&str, &str> =
        procs.iter().flat_map(|p| p.containers.iter().map(|((_, pod, team), _)| (*pod, *team))).collect();
    let mut add = |p: &Process, at: i64, sign: i128| {
        for (metric, labels, v) in p.values(at) {
            let get = |k: &str| labels.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()).unwrap_or_default();
            if metric == "gpu_tracer_bill_total" && get("line") == "containers" {
                continue;
            }
            want_total += sign * v;
            if metric == "gpu_tracer_container_cost_total" {
                *want_ns.entry(get("namespace")).or_default() += sign * v;
                *want_team.entry(teams[get("pod").as_str()].to_string()).or_default() += sign * v;
            }
        }
    };
    for p in &procs {
        let in_period: Vec<i64> = p.scrapes().filter(|t| *t > t0 && *t <= t1).collect();
        let Some(&last) = in_period.last() else { continue };
        add(p, last, 1);
        if let Some(at_t0) = p.scrapes().filter(|t| *t <= t0 && *t > t0 - 300).last() {
            add(p, at_t0, -1);
        }
    }

    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("history.om");
    std::fs::write(&input, &om).unwrap();
    let data = tmp.path().join("data");
    let out = Command::new(&promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics", "--quiet"])
        .arg(&input)
        .arg(&data)
        .output()
        .expect("running promtool");
    assert!(out.status.success(), "promtool tsdb create-blocks-from: {}", String::from_utf8_lossy(&out.stderr));
    let addr = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).unwrap().to_string();
    let config = tmp.path().join("prometheus.yml");
    std::fs::write(&config, "global: {}\n").unwrap();
    let _prom = ChildGuard::new(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting prometheus"),
    );
    let started = Instant::now();
    loop {
        let (status, body) = http::post_form(
            &addr,
            "/api/v1/query",
            &[("query", "count(process_start_time_seconds)"), ("time", &t1.to_string())],
        );
        if status == 200 && body.contains("\"value\"") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "Prometheus did not load the recorded history: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    let cost = |extra: &[&str]| -> Value {
        let out = Command::new(&tracer)
            .args(["cost", "--prometheus", &format!("http://{addr}"), "--range", "1h", "--end", &t1.to_string()])
            .args(["--format", "json"])
            .args(extra)
            .output()
            .expect("running gpu-tracer cost");
        assert!(out.status.success(), "gpu-tracer cost {extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let nano = |v: &Value| v.as_str().and_then(|s| s.parse::<i128>().ok()).unwrap_or_else(|| panic!("not nano: {v}"));
    let rows = |r: &Value, key: &str| -> BTreeMap<String, i128> {
        r["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["line"] == "container")
            .map(|r| (r["group"][key].as_str().unwrap().to_string(), nano(&r["nano"])))
            .collect()
    };

    let by_ns = cost(&["--by", "namespace"]);
    assert_eq!(nano(&by_ns["total_nano"]), want_total, "the fleet's bill: {by_ns}");
    assert_eq!(rows(&by_ns, "namespace"), want_ns, "per namespace: {by_ns}");
    let warnings = by_ns["warnings"].to_string();
    assert!(warnings.contains("node-b:9400: 2 agent processes"), "the restart is reported: {warnings}");
    let by_team = cost(&["--by", "label:team"]);
    assert_eq!(rows(&by_team, "team"), want_team, "per team: {by_team}");
    // Each node alone; they add up to the fleet.
    let nodes: i128 = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|n| nano(&cost(&["--matchers", &format!("node=\"{n}\"")])["total_nano"]))
        .sum();
    assert_eq!(nodes, want_total);
    // A period in which nothing ran: a clear error, not an empty bill.
    let out = Command::new(&tracer)
        .args(["cost", "--prometheus", &format!("http://{addr}"), "--range", "1h", "--end", &(t0 - 20_000).to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("no agent's bill in the period"), "{err}");
    eprintln!(
        "cost --prometheus over a recorded hour: {} = the recorded scrapes to the nano (restart, start and stop within it)",
        by_ns["total"]
    );
}
