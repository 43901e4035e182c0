//! Section 11: the agent's start-up scan of `/proc` (`source::procscan::scan`) and the per-process
//! facts the seed path reads for each process it finds (`Enricher::process_now`: `/proc/PID/stat`;
//! `Enricher::cgroup_id_of`: `/proc/PID/cgroup` and a stat of the cgroup directory), with
//! `PROCESSES` extra processes on the machine, each holding two fds on a simulated NVIDIA node
//! (one a dup of the other, so `kcmp` groups them) and one on `/dev/null`. Each against its
//! alternative in the same run, interleaved: the scan against the same walk through the procfs
//! crate's fd iterator, the facts (procfs-core's parsers) against the hand-written parsers they
//! replaced (issue 18). Reported: wall time per full pass and per process, median of the runs.
use std::{
    fmt::Write,
    path::Path,
    process::{Child, Command, Stdio},
    time::Instant,
};

use tracer_agent::{
    enrich::Enricher,
    probe::devcheck::{Accepted, simulated_files},
    source::procscan,
};
use tracer_common::NVIDIA_MAJOR;

use crate::sys;

/// Processes spawned for the scan (the figure).
pub const PROCESSES: usize = 2_000;

pub struct ScanMeasured {
    pub spawned: usize,
    /// Processes in `/proc` during the runs (the spawned ones and the machine's own).
    pub in_proc: usize,
    pub runs: usize,
    /// Full `/proc` scan, ms per run.
    pub scan_ms: Vec<f64>,
    /// The same walk through procfs's `Process::fd()`, ms per run.
    pub scan_procfs_ms: Vec<f64>,
    /// `process_now` + `cgroup_id_of` for every process found, ms per run.
    pub facts_ms: Vec<f64>,
    /// The same facts by the hand-written parsers the agent had before procfs, ms per run.
    pub facts_hand_ms: Vec<f64>,
    pub found_fds: usize,
    pub found_processes: usize,
    /// Found fds sharing a file id with another fd of their process (the dups).
    pub grouped: usize,
    pub unreadable: u64,
}

pub struct ScanSection {
    pub result: Result<ScanMeasured, String>,
}

impl ScanSection {
    pub fn skipped(why: &str) -> Self {
        Self { result: Err(why.into()) }
    }
}

/// Kills and reaps the spawned processes however the section ends.
struct Sleepers(Vec<Child>);

impl Drop for Sleepers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

pub fn section(fake_dir: &Path, quick: bool) -> ScanSection {
    ScanSection { result: measure(fake_dir, if quick { PROCESSES / 10 } else { PROCESSES }, if quick { 3 } else { 7 }) }
}

fn measure(fake_dir: &Path, n: usize, runs: usize) -> Result<ScanMeasured, String> {
    let node = fake_dir.join("nvidia0");
    std::fs::write(&node, b"").map_err(|e| format!("creating {}: {e}", node.display()))?;
    let mut sleepers = Sleepers(Vec::with_capacity(n));
    for i in 0..n {
        let f = std::fs::File::open(&node).map_err(|e| format!("opening {}: {e}", node.display()))?;
        let dup = f.try_clone().map_err(|e| format!("dup: {e}"))?;
        let child = Command::new("sleep")
            .arg("3600")
            .stdin(Stdio::from(f))
            .stdout(Stdio::from(dup))
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawning sleeper {i} of {n}: {e}"))?;
        sleepers.0.push(child);
    }
    let ours: std::collections::HashSet<u32> = sleepers.0.iter().map(|c| c.id()).collect();
    let prefix = format!("{}/nvidia", fake_dir.display());
    let accepted = Accepted {
        enabled: true,
        majors: vec![NVIDIA_MAJOR],
        simulated: simulated_files(fake_dir).into_iter().collect(),
    };
    let enrich = Enricher::new("/proc".into(), None);
    let me = std::process::id();
    let mut out = ScanMeasured {
        spawned: n,
        in_proc: 0,
        runs,
        scan_ms: vec![],
        scan_procfs_ms: vec![],
        facts_ms: vec![],
        facts_hand_ms: vec![],
        found_fds: 0,
        found_processes: 0,
        grouped: 0,
        unreadable: 0,
    };
    for _ in 0..runs {
        let t = Instant::now();
        let scan = procscan::scan(Path::new("/proc"), &prefix, &accepted, me);
        out.scan_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let tgids: Vec<u32> = procscan::per_process(&scan.found).into_keys().collect();
        let t = Instant::now();
        let mut facts = 0usize;
        for &tgid in &tgids {
            if enrich.process_now(tgid).is_some() && enrich.cgroup_id_of(tgid).is_some() {
                facts += 1;
            }
        }
        out.facts_ms.push(t.elapsed().as_secs_f64() * 1e3);
        if facts != tgids.len() {
            return Err(format!("process facts read for {facts} of {} processes found", tgids.len()));
        }
        let t = Instant::now();
        let via_procfs = scan_with_procfs(&prefix, &accepted, me);
        out.scan_procfs_ms.push(t.elapsed().as_secs_f64() * 1e3);
        if via_procfs != scan.found.len() {
            return Err(format!("procfs's fd iterator found {via_procfs} fds, the agent's scan {}", scan.found.len()));
        }
        let t = Instant::now();
        let hand = tgids.iter().filter(|&&tgid| facts_by_hand(enrich.cgroups.root(), tgid)).count();
        out.facts_hand_ms.push(t.elapsed().as_secs_f64() * 1e3);
        if hand != tgids.len() {
            return Err(format!("hand-parsed facts for {hand} of {} processes", tgids.len()));
        }
        out.found_fds = scan.found.iter().filter(|s| ours.contains(&s.tgid)).count();
        out.found_processes = tgids.iter().filter(|t| ours.contains(t)).count();
        out.grouped = scan
            .found
            .iter()
            .filter(|s| scan.found.iter().any(|o| o.tgid == s.tgid && o.fd != s.fd && o.dev.file_id == s.dev.file_id))
            .count();
        out.unreadable = scan.unreadable;
        out.in_proc = std::fs::read_dir("/proc")
            .map(|d| d.flatten().filter(|e| e.file_name().to_str().is_some_and(|s| s.parse::<u32>().is_ok())).count())
            .unwrap_or(0);
    }
    if out.found_processes != n || out.found_fds != 2 * n {
        return Err(format!(
            "the scan found {} of {n} processes and {} of {} fds",
            out.found_processes,
            out.found_fds,
            2 * n
        ));
    }
    Ok(out)
}

/// The scan's walk through procfs's fd iterator (an `O_PATH` open, `readlinkat` and `statat` per
/// fd): the alternative measured against. Returns the NVIDIA fds found.
fn scan_with_procfs(prefix: &str, accepted: &Accepted, skip: u32) -> usize {
    let Ok(all) = procfs::process::all_processes_with_root("/proc") else { return 0 };
    let mut found = 0;
    for p in all.flatten() {
        if p.pid as u32 == skip {
            continue;
        }
        let Ok(fds) = p.fd() else { continue };
        for f in fds.flatten() {
            let procfs::process::FDTarget::Path(target) = &f.target else { continue };
            let Some(dev) = procscan::classify_device_path(prefix, &target.to_string_lossy()) else { continue };
            if std::fs::metadata(format!("/proc/{}/fd/{}", p.pid, f.fd)).is_ok_and(|m| accepted.accepts(dev.kind, &m)) {
                found += 1;
            }
        }
    }
    found
}

/// Start time, comm and cgroup id as the agent read them before procfs (issue 18): the files read
/// whole and split by hand.
fn facts_by_hand(cgroup_root: Option<&Path>, tgid: u32) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(text) = std::fs::read_to_string(format!("/proc/{tgid}/stat")) else { return false };
    let (Some(open), Some(close)) = (text.find('('), text.rfind(')')) else { return false };
    let comm = text.get(open + 1..close).map(str::to_string);
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    let start: Option<u64> = rest.get(22 - 3).and_then(|v| v.parse().ok());
    let Ok(cg) = std::fs::read_to_string(format!("/proc/{tgid}/cgroup")) else { return false };
    let Some(rel) = cg.lines().find_map(|l| l.strip_prefix("0::")) else { return false };
    let ino = cgroup_root.and_then(|r| std::fs::metadata(r.join(rel.trim_start_matches('/'))).ok()).map(|m| m.ino());
    comm.is_some() && start.is_some() && ino.is_some()
}

impl ScanSection {
    pub fn render(&self, s: &mut String) {
        let _ = writeln!(s, "## 11. Start-up scan of /proc\n");
        let _ = writeln!(
            s,
            "**Method.** {PROCESSES} `sleep` processes each hold two fds on a simulated NVIDIA node (`nvidia0` in a \
             scratch directory, accepted as the fake driver's nodes are; the second fd a dup of the first) and one on \
             `/dev/null`. Timed: the agent's `source::procscan::scan` over all of `/proc` (every process's fd \
             links, a stat of each NVIDIA-named target, `kcmp` to group dups), then the facts the seed path reads \
             for each process found (`Enricher::process_now`: `/proc/PID/stat`; `cgroup_id_of`: \
             `/proc/PID/cgroup` and a stat of the cgroup). Median of the runs; warm dentry cache (every run after \
             the first reads the same files). Each row's alternative runs in the same run, interleaved with it: the scan \
             through the procfs crate's fd iterator (an `O_PATH` open, `readlinkat` and `statat` per fd), the facts \
             by the hand-written parsers procfs-core replaced (issue 18). Run alone with `cargo xtask bench --only 11`.\n"
        );
        let m = match &self.result {
            Err(e) => {
                let _ = writeln!(s, "not measured: {e}\n");
                return;
            }
            Ok(m) => m,
        };
        let scan = sys::median(&m.scan_ms);
        let facts = sys::median(&m.facts_ms);
        let _ = writeln!(s, "| step | median (ms) | min–max (ms) | per process (µs) | vs the agent's |");
        let _ = writeln!(s, "|---|---:|---:|---:|---:|");
        let row = |s: &mut String, name: String, v: &[f64], n: usize, base: f64| {
            let med = sys::median(v);
            let _ = writeln!(
                s,
                "| {name} | {med:.1} | {:.1}–{:.1} | {:.1} | {:.2}× |",
                sys::min(v),
                sys::max(v),
                med * 1e3 / n.max(1) as f64,
                med / base
            );
        };
        row(
            s,
            format!("agent: scan of /proc ({} processes; listing + readlink)", m.in_proc),
            &m.scan_ms,
            m.in_proc,
            scan,
        );
        row(s, "the same scan through procfs's fd iterator".into(), &m.scan_procfs_ms, m.in_proc, scan);
        row(
            s,
            format!("agent: stat + cgroup id of the {} processes found (procfs-core parsers)", m.found_processes),
            &m.facts_ms,
            m.found_processes,
            facts,
        );
        row(
            s,
            "the same facts by the hand-written parsers they replaced".into(),
            &m.facts_hand_ms,
            m.found_processes,
            facts,
        );
        let _ = writeln!(
            s,
            "\n{} runs; found {} of {} spawned processes and {} fds ({} of them grouped with a dup by kcmp); {} \
             processes unreadable (exited mid-scan).\n",
            m.runs, m.found_processes, m.spawned, m.found_fds, m.grouped, m.unreadable
        );
    }
}
