//! Section 10: `gpu-tracer cost --prometheus` over a month of a fleet, against a real Prometheus
//! (Debian's package) holding the recorded series, backfilled with
//! `promtool tsdb create-blocks-from openmetrics` one day at a time.
//!
//! The fleet: every node's agent running from before the period, a rollout in the middle of it
//! (every agent restarts, counters from zero), one node restarting twice more, one node joining
//! late and one drained early; containers that come and go (their pods' label series stop when
//! they leave, their cost series stay, as the agent keeps them). The bill `cost` prints must equal,
//! to the nano, what the generator knows the recorded scrapes say.
//!
//! What is recorded at full density (a scrape every `SCRAPE_S`) over the whole month: the series the
//! bill reads over the whole period (`process_start_time_seconds`, the `containers` bill line,
//! the price). The other series (container cost, pod labels, the other bill lines) are read only
//! at instants (the period's ends, each agent process's last scrape; Prometheus looks back 5 min)
//! and through the series index: they are recorded at full density within `DENSE_S` of every such
//! instant and of every process start, and every `THIN_S` elsewhere, so that every block holds
//! them (its index is as large) without writing a month of samples nobody reads. A month of every
//! series at full density would be ~40× the samples (≈ 100 GB of OpenMetrics text).
//!
//! `GPU_TRACER_BENCH_COST_QUERY_LOG=FILE` keeps Prometheus' query log (each query's time and
//! samples read) for a look at where the time goes.
use std::{
    fmt::Write as _,
    io::{BufWriter, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, bail, ensure};

const SCRAPE_S: i64 = 60;
const DENSE_S: i64 = 3600;
const THIN_S: i64 = 3600;
const DAY: i64 = 86_400;
const TEAMS: usize = 6;
const NAMESPACES: usize = 12;
const PRICE: &str = "4";

/// A container of one agent process: alive (billing) in `[arrive, leave)`; its cost series from
/// `arrive` to the process's end, its pod's label series while it lives.
struct Container {
    pod: String,
    ns: usize,
    arrive: i64,
    leave: i64,
    /// nano-currency per second alive.
    rate: i128,
}

/// One agent process.
struct Process {
    node: usize,
    start: i64,
    first_scrape: i64,
    last_scrape: i64,
    containers: Vec<Container>,
    idle_per_s: i128,
    reserved_per_s: i128,
    unattributed_per_s: i128,
}

impl Process {
    fn scrapes(&self, from: i64, to: i64) -> impl Iterator<Item = i64> + '_ {
        // Scrapes on the process's grid within [from, to).
        let first = if from <= self.first_scrape {
            self.first_scrape
        } else {
            self.first_scrape + (from - self.first_scrape + SCRAPE_S - 1) / SCRAPE_S * SCRAPE_S
        };
        (first..to.min(self.last_scrape + 1)).step_by(SCRAPE_S as usize)
    }

    /// The last scrape at or before `t`, if any.
    fn last_scrape_upto(&self, t: i64) -> Option<i64> {
        (t >= self.first_scrape)
            .then(|| (self.first_scrape + (t - self.first_scrape) / SCRAPE_S * SCRAPE_S).min(self.last_scrape))
    }

    /// The scrape an instant query at `t` sees (within Prometheus' 5 min look-back), if any.
    fn scrape_at(&self, t: i64) -> Option<i64> {
        self.last_scrape_upto(t).filter(|s| t - s <= 300)
    }

    fn container_value(c: &Container, t: i64) -> i128 {
        c.rate * (t.min(c.leave) - c.arrive).max(0) as i128
    }

    /// (line, nano) of the bill at scrape `t`.
    fn lines(&self, t: i64) -> [(&'static str, i128); 5] {
        let age = (t - self.start) as i128;
        let containers = self.containers.iter().map(|c| Self::container_value(c, t)).sum();
        [
            ("containers", containers),
            ("idle", self.idle_per_s * age),
            ("driver_reserved", self.reserved_per_s * age),
            ("unattributed", self.unattributed_per_s * age),
            ("evicted", 0),
        ]
    }

    /// What the bill counts of this process at scrape `t` (every line but `containers`, which is
    /// their sum, plus the containers).
    fn billed(&self, t: i64) -> i128 {
        let l = self.lines(t);
        l[1..].iter().map(|(_, n)| n).sum::<i128>() + l[0].1
    }
}

/// The recorded fleet.
struct Fleet {
    nodes: usize,
    processes: Vec<Process>,
    /// The period `(t0, t1]`, and where the recording starts and ends.
    t0: i64,
    t1: i64,
    from: i64,
    to: i64,
    /// Merged, sorted windows of full density (see the module's comment).
    dense: Vec<(i64, i64)>,
}

fn node_name(n: usize) -> String {
    format!("gpu-node-{n:03}")
}

impl Fleet {
    fn new(nodes: usize, days: i64, containers: usize, now: i64) -> Fleet {
        // The period ends on a whole hour at least two hours ago (Prometheus' head is not involved).
        let t1 = (now - 2 * 3600) / 3600 * 3600;
        let t0 = t1 - days * DAY;
        let rollout = t0 + days * DAY * 2 / 5;
        let mut processes = Vec::new();
        let proc = |node: usize, start: i64, end: i64, tag: &str| -> Process {
            let first_scrape = start + 1 + (node as i64 * 7) % SCRAPE_S;
            let last_scrape = first_scrape + (end - first_scrape) / SCRAPE_S * SCRAPE_S;
            let life = last_scrape.min(t1) - start.max(t0 - DAY);
            let containers = (0..containers)
                .map(|k| {
                    let arrive = start.max(t0 - DAY) + life * k as i64 / containers as i64 + 17 * k as i64;
                    // A third live to the end, the others leave after a while.
                    let leave = if k % 3 == 0 { i64::MAX } else { arrive + life / (2 + (k % 5) as i64) };
                    Container {
                        pod: format!("job-{node}-{tag}-{k}"),
                        ns: (node + k) % NAMESPACES,
                        arrive,
                        leave,
                        rate: 100_003 + ((node * 131 + k * 977) % 400_000) as i128,
                    }
                })
                .collect();
            Process {
                node,
                start,
                first_scrape,
                last_scrape,
                containers,
                idle_per_s: 2_000_000 + (node as i128 * 3_001) % 1_000_000,
                reserved_per_s: 50_001,
                unattributed_per_s: 3_333 * (node % 3) as i128,
            }
        };
        let past_end = t1 + 1800;
        for n in 0..nodes {
            let stagger = n as i64 * 6;
            let joins_late = n + 1 == nodes;
            let drained = n + 2 == nodes;
            if !joins_late {
                processes.push(proc(n, t0 - 3 * DAY + n as i64 * 37, rollout + stagger, "a"));
            }
            let b_start = if joins_late { t0 + days * DAY * 2 / 3 } else { rollout + stagger + 20 };
            if n == 7 {
                // Two more restarts.
                let r2 = t0 + days * DAY / 2;
                let r3 = t0 + days * DAY * 5 / 6;
                processes.push(proc(n, b_start, r2, "b"));
                processes.push(proc(n, r2 + 30, r3, "c"));
                processes.push(proc(n, r3 + 45, past_end, "d"));
            } else if drained {
                processes.push(proc(n, b_start, t0 + days * DAY * 5 / 6, "b"));
            } else {
                processes.push(proc(n, b_start, past_end, "b"));
            }
        }
        let from = t0 - DENSE_S;
        let mut windows: Vec<(i64, i64)> = [t0, t1]
            .into_iter()
            .chain(processes.iter().flat_map(|p: &Process| [p.start, p.last_scrape]))
            .map(|x| (x - DENSE_S, x + DENSE_S))
            .collect();
        windows.sort();
        let mut dense: Vec<(i64, i64)> = Vec::new();
        for (a, b) in windows {
            match dense.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => dense.push((a, b)),
            }
        }
        Fleet { nodes, processes, t0, t1, from, to: past_end + SCRAPE_S, dense }
    }

    /// The bill over `(t0, t1]` as the recorded scrapes say: + each process's last scrape in the
    /// period, - its scrape at `t0` for the process running then.
    fn want_total(&self) -> i128 {
        let mut total = 0;
        for p in &self.processes {
            let Some(last) = p.last_scrape_upto(self.t1).filter(|&s| s > self.t0) else { continue };
            total += p.billed(last);
            if let Some(at0) = p.scrape_at(self.t0) {
                total -= p.billed(at0);
            }
        }
        total
    }

    /// The containers' part of that bill per team (`label_team` of their pods).
    fn want_by_team(&self) -> std::collections::BTreeMap<String, i128> {
        let mut out = std::collections::BTreeMap::new();
        for p in &self.processes {
            let Some(last) = p.last_scrape_upto(self.t1).filter(|&s| s > self.t0) else { continue };
            let at0 = p.scrape_at(self.t0);
            for c in &p.containers {
                let mut v = Process::container_value(c, last);
                if let Some(at0) = at0 {
                    v -= Process::container_value(c, at0);
                }
                *out.entry(format!("team-{}", c.ns % TEAMS)).or_default() += v;
            }
        }
        out.retain(|_, n| *n != 0);
        out
    }

    /// Is `t` within `DENSE_S` of an instant the bill reads or of a process start?
    fn dense(&self, t: i64) -> bool {
        let i = self.dense.partition_point(|w| w.0 <= t);
        i > 0 && t <= self.dense[i - 1].1
    }

    /// The OpenMetrics text of `[from, to)`; returns the number of samples.
    fn write_range(&self, out: &mut impl std::io::Write, from: i64, to: i64) -> Result<u64> {
        let mut n = 0u64;
        let mut line = String::with_capacity(256);
        let target = |p: &Process| {
            let node = node_name(p.node);
            format!("job=\"gpu-tracer\",instance=\"{node}:9400\",node=\"{node}\"")
        };
        // Families in turn, each series in time order (a node's processes follow each other).
        let thin = |p: &Process, t: i64| self.dense(t) || (t - p.first_scrape) % THIN_S < SCRAPE_S;
        writeln!(out, "# TYPE process_start_time_seconds gauge")?;
        for p in &self.processes {
            let l = target(p);
            for t in p.scrapes(from, to) {
                writeln!(out, "process_start_time_seconds{{{l}}} {} {t}", p.start)?;
                n += 1;
            }
        }
        writeln!(out, "# TYPE gpu_tracer_price_per_gpu_hour gauge")?;
        for p in &self.processes {
            let l = target(p);
            for t in p.scrapes(from, to) {
                writeln!(out, "gpu_tracer_price_per_gpu_hour{{{l}}} {PRICE} {t}")?;
                n += 1;
            }
        }
        writeln!(out, "# TYPE gpu_tracer_bill counter")?;
        for (i, name) in ["containers", "idle", "driver_reserved", "unattributed", "evicted"].iter().enumerate() {
            for p in &self.processes {
                let l = target(p);
                for t in p.scrapes(from, to) {
                    if i == 0 || thin(p, t) {
                        writeln!(
                            out,
                            "gpu_tracer_bill_total{{{l},line=\"{name}\"}} {} {t}",
                            nano_text(p.lines(t)[i].1)
                        )?;
                        n += 1;
                    }
                }
            }
        }
        writeln!(out, "# TYPE gpu_tracer_container_cost counter")?;
        for p in &self.processes {
            let l = target(p);
            for c in &p.containers {
                for t in p.scrapes(from.max(c.arrive), to).filter(|&t| thin(p, t)) {
                    line.clear();
                    let _ = write!(
                        line,
                        "gpu_tracer_container_cost_total{{{l},namespace=\"ns-{}\",pod=\"{}\",container=\"main\"}} {} {t}",
                        c.ns,
                        c.pod,
                        nano_text(Process::container_value(c, t))
                    );
                    writeln!(out, "{line}")?;
                    n += 1;
                }
            }
        }
        writeln!(out, "# TYPE gpu_tracer_pod_labels gauge")?;
        for p in &self.processes {
            let l = target(p);
            for c in &p.containers {
                for t in p.scrapes(from.max(c.arrive), to.min(c.leave)).filter(|&t| thin(p, t)) {
                    writeln!(
                        out,
                        "gpu_tracer_pod_labels{{{l},namespace=\"ns-{}\",pod=\"{}\",label_team=\"team-{}\"}} 1 {t}",
                        c.ns,
                        c.pod,
                        c.ns % TEAMS
                    )?;
                    n += 1;
                }
            }
        }
        writeln!(out, "# EOF")?;
        Ok(n)
    }

    fn series(&self) -> usize {
        // Per node: start time, price, five bill lines; per container: cost and labels.
        self.nodes * 7 + self.processes.iter().map(|p| p.containers.len() * 2).sum::<usize>()
    }
}

fn nano_text(n: i128) -> String {
    format!("{}.{:09}", n / 1_000_000_000, n % 1_000_000_000)
}

fn tool(name: &str) -> Result<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("{name} is not installed: Debian's `prometheus` package has it (`cargo xtask setup`)"))
}

fn dir_size(p: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
        match e.metadata() {
            Ok(m) if m.is_dir() => total += dir_size(&e.path()),
            Ok(m) => total += m.len(),
            Err(_) => {}
        }
    }
    total
}

fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 (1-based), 11 and 12 after the command.
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU time of the children waited for so far.
fn children_cpu_s() -> f64 {
    // SAFETY: rusage is plain data; all zeroes is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage only writes into the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    s(u.ru_utime) + s(u.ru_stime)
}

/// Query API requests Prometheus has answered so far (its own `/metrics`).
fn queries_answered(addr: &str) -> f64 {
    let (_, body) = gpu_tracer_tests::http::get(addr, "/metrics");
    body.lines()
        .filter(|l| l.starts_with("prometheus_http_requests_total{") && l.contains("handler=\"/api/v1/"))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

pub struct CostRun {
    pub wall_s: f64,
    pub tool_cpu_s: f64,
    pub prometheus_cpu_s: f64,
    pub queries: f64,
}

pub struct CostMeasured {
    pub nodes: usize,
    pub days: i64,
    pub containers: usize,
    pub processes: usize,
    pub series: usize,
    pub samples: u64,
    pub text_bytes: u64,
    pub tsdb_bytes: u64,
    pub backfill_s: f64,
    pub total: String,
    pub exact: bool,
    /// The per-team rows (pods' labels, also of pods gone before the end) equal the recorded ones.
    pub teams_exact: bool,
    pub warnings: usize,
    /// First run after Prometheus started, then warm runs, `--by namespace`.
    pub by_namespace: Vec<CostRun>,
    /// Warm runs, `--by label:team` (also reads the pods' labels).
    pub by_team: Vec<CostRun>,
}

pub struct CostSection {
    pub result: Result<CostMeasured, String>,
}

impl CostSection {
    pub fn skipped(why: &str) -> Self {
        Self { result: Err(why.into()) }
    }
}

pub fn section(quick: bool) -> CostSection {
    let (nodes, days, containers) = if quick { (20, 7, 40) } else { (100, 30, 40) };
    CostSection { result: measure(nodes, days, containers).map_err(|e| format!("{e:#}")) }
}

fn measure(nodes: usize, days: i64, containers: usize) -> Result<CostMeasured> {
    let promtool = tool("promtool")?;
    let prometheus = tool("prometheus")?;
    let tracer = gpu_tracer_tests::gpu_tracer_binary().context("gpu-tracer (cargo xtask build)")?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;
    let fleet = Fleet::new(nodes, days, containers, now);
    let work = std::env::temp_dir().join(format!("gpu-tracer-bench-cost-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    struct Cleanup(PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(work.clone());
    let data = work.join("data");

    // The history, one UTC day per file and per block; promtool converts one day while the next
    // is written.
    crate::progress(&format!(
        "10: recording {days} days of {nodes} nodes ({} agent processes, {containers} containers each) into a TSDB",
        fleet.processes.len()
    ));
    let started = Instant::now();
    let (mut samples, mut text_bytes) = (0u64, 0u64);
    let mut running: Option<(Child, PathBuf)> = None;
    let finish = |r: Option<(Child, PathBuf)>| -> Result<()> {
        if let Some((child, file)) = r {
            let out = child.wait_with_output()?;
            ensure!(
                out.status.success(),
                "promtool tsdb create-blocks-from openmetrics {}: {}",
                file.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::remove_file(&file).ok();
        }
        Ok(())
    };
    let first_day = fleet.from.div_euclid(DAY) * DAY;
    let mut day = first_day;
    while day < fleet.to {
        let file = work.join(format!("day-{day}.om"));
        let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(&file)?);
        samples += fleet.write_range(&mut w, day.max(fleet.from), (day + DAY).min(fleet.to))?;
        w.flush()?;
        drop(w);
        text_bytes += std::fs::metadata(&file)?.len();
        finish(running.take())?;
        let child = Command::new(&promtool)
            .args(["tsdb", "create-blocks-from", "openmetrics", "--quiet", "--max-block-duration=24h"])
            .arg(&file)
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting promtool")?;
        running = Some((child, file));
        if (day - first_day) / DAY % 5 == 4 {
            crate::progress(&format!("10: day {} of {}", (day - first_day) / DAY + 1, days + 2));
        }
        day += DAY;
    }
    finish(running.take())?;
    let backfill_s = started.elapsed().as_secs_f64();
    let tsdb_bytes = dir_size(&data);

    // Prometheus on the recorded blocks: no compaction beyond them (a day each), retention past them.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string();
    let config = work.join("prometheus.yml");
    let query_log = work.join("queries.log");
    std::fs::write(&config, format!("global:\n  query_log_file: {}\n", query_log.display()))?;
    let prom = gpu_tracer_tests::ChildGuard::new(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg("--storage.tsdb.retention.time=400d")
            .arg("--storage.tsdb.max-block-duration=24h")
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting prometheus")?,
    );
    let pid = prom.pid();
    let ready = Instant::now();
    loop {
        let (status, _) = gpu_tracer_tests::http::get(&addr, "/-/ready");
        if status == 200 {
            break;
        }
        ensure!(ready.elapsed() < Duration::from_secs(120), "Prometheus did not become ready on {addr}");
        std::thread::sleep(Duration::from_millis(200));
    }

    let want = fleet.want_total();
    let run = |by: &str| -> Result<(CostRun, serde_json::Value)> {
        let (cpu0, q0, child0) = (cpu_s(pid), queries_answered(&addr), children_cpu_s());
        let t = Instant::now();
        let out = Command::new(&tracer)
            .args(["cost", "--prometheus", &format!("http://{addr}"), "--range", &format!("{days}d")])
            .args(["--end", &fleet.t1.to_string(), "--format", "json", "--by", by])
            .output()
            .context("running gpu-tracer cost")?;
        let wall_s = t.elapsed().as_secs_f64();
        let (cpu1, q1, child1) = (cpu_s(pid), queries_answered(&addr), children_cpu_s());
        if !out.status.success() {
            bail!("gpu-tracer cost --by {by}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let tool_cpu_s = child1 - child0;
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).context("cost's JSON")?;
        // Its own query of Prometheus' /metrics counts as one request.
        Ok((CostRun { wall_s, tool_cpu_s, prometheus_cpu_s: cpu1 - cpu0, queries: q1 - q0 - 1.0 }, j))
    };
    crate::progress("10: gpu-tracer cost --prometheus, 5 runs by namespace, 3 by team");
    let mut by_namespace = Vec::new();
    let mut report = serde_json::Value::Null;
    for _ in 0..5 {
        let (r, j) = run("namespace")?;
        by_namespace.push(r);
        report = j;
    }
    let mut by_team = Vec::new();
    let nano = |v: &serde_json::Value| v.as_str().and_then(|s| s.parse::<i128>().ok());
    let want_teams = fleet.want_by_team();
    let mut teams_exact = true;
    for _ in 0..3 {
        let (r, j) = run("label:team")?;
        by_team.push(r);
        let got: std::collections::BTreeMap<String, i128> = j["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["line"] == "container")
            .filter_map(|r| Some((r["group"]["team"].as_str()?.to_owned(), nano(&r["nano"])?)))
            .filter(|(_, n)| *n != 0)
            .collect();
        teams_exact &= got == want_teams && j["total_nano"] == report["total_nano"];
    }
    if let Some(keep) = std::env::var_os("GPU_TRACER_BENCH_COST_QUERY_LOG") {
        std::fs::copy(&query_log, keep).ok();
    }
    let got = nano(&report["total_nano"]).context("total_nano")?;
    if got != want {
        crate::progress(&format!(
            "10: the bill is {got} nano, the recorded scrapes say {want}: {}",
            report["warnings"]
        ));
    }
    Ok(CostMeasured {
        nodes,
        days,
        containers,
        processes: fleet.processes.len(),
        series: fleet.series(),
        samples,
        text_bytes,
        tsdb_bytes,
        backfill_s,
        total: report["total"].as_str().unwrap_or_default().to_owned(),
        exact: got == want,
        teams_exact,
        warnings: report["warnings"].as_array().map(Vec::len).unwrap_or(0),
        by_namespace,
        by_team,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

impl CostSection {
    pub fn render(&self, s: &mut String) {
        let _ = writeln!(s, "## 10. The fleet's bill: `cost --prometheus` over a month\n");
        let m = match &self.result {
            Err(e) => {
                let _ = writeln!(s, "not measured: {e}\n");
                return;
            }
            Ok(m) => m,
        };
        let _ = writeln!(
            s,
            "A real Prometheus (Debian's package) holding {} days of {} nodes' agents, backfilled with `promtool tsdb \
             create-blocks-from openmetrics` (one block per day): {} agent processes (a rollout restarts every \
             agent in the period, one node restarts twice more, one joins late, one is drained), {} containers per \
             process coming and going, {} series, {:.1} M samples ({:.0} MiB of OpenMetrics text, {:.0} MiB of \
             TSDB; written and converted in {:.0} s). A scrape every {SCRAPE_S} s; the series the bill reads over \
             the whole period at full density, the others at full density within an hour of every instant the \
             bill reads them and hourly elsewhere (`bench/src/cost/mod.rs` says why).\n",
            m.days,
            m.nodes,
            m.processes,
            m.containers,
            m.series,
            m.samples as f64 / 1e6,
            m.text_bytes as f64 / 1048576.0,
            m.tsdb_bytes as f64 / 1048576.0,
            m.backfill_s,
        );
        let _ = writeln!(
            s,
            "The bill: {} — {} the recorded scrapes to the nano; per team (the pods' labels, also of pods gone before \
             the end) {}; {} warnings (the restarts named).\n",
            m.total,
            if m.exact { "equal to" } else { "**NOT equal to**" },
            if m.teams_exact { "equal too" } else { "**NOT equal**" },
            m.warnings
        );
        let _ = writeln!(
            s,
            "| `gpu-tracer cost --prometheus URL --range {}d` | wall (median) | runs | gpu-tracer CPU | Prometheus CPU | \
             queries |\n|---|---|---|---|---|---|",
            m.days
        );
        for (name, runs) in [("`--by namespace`", &m.by_namespace), ("`--by label:team`", &m.by_team)] {
            if runs.is_empty() {
                continue;
            }
            let walls: Vec<String> = runs.iter().map(|r| format!("{:.2}", r.wall_s)).collect();
            let _ = writeln!(
                s,
                "| {name} | {:.2} s | {} s | {:.2} s | {:.2} s | {:.0} |",
                median(runs.iter().map(|r| r.wall_s).collect()),
                walls.join(", "),
                median(runs.iter().map(|r| r.tool_cpu_s).collect()),
                median(runs.iter().map(|r| r.prometheus_cpu_s).collect()),
                median(runs.iter().map(|r| r.queries).collect()),
            );
        }
        let _ = writeln!(
            s,
            "\nThe first `--by namespace` run is the first query after Prometheus started (its caches cold). \
             Goal: < 2 s, the query time of Prometheus included.\n"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_history_is_valid_openmetrics_with_each_series_in_time_order() {
        let f = Fleet::new(4, 2, 6, 2_000_000_000);
        let mut out = Vec::new();
        let n = f.write_range(&mut out, f.from, f.to).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with("# EOF\n"));
        let mut last: std::collections::BTreeMap<&str, i64> = Default::default();
        let mut lines = 0;
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let (series, rest) = l.rsplit_once("} ").unwrap();
            let t: i64 = rest.rsplit_once(' ').unwrap().1.parse().unwrap();
            if let Some(prev) = last.insert(series, t) {
                assert!(t > prev, "{series}: {t} after {prev}");
            }
            lines += 1;
        }
        assert_eq!(lines, n);
        // The bill is positive, and the restarts are in the period.
        assert!(f.want_total() > 0);
        assert!(f.processes.iter().filter(|p| p.last_scrape > f.t0 && p.last_scrape <= f.t1).count() >= 4);
    }
}
