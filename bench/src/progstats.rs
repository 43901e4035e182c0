//! Time spent inside this process's eBPF programs, from the kernel's own run-time statistics
//! (`BPF_ENABLE_STATS`): `run_time_ns` and `run_cnt` per program, read from `/proc/self/fdinfo`.
use std::collections::BTreeMap;

/// Per program id: (run_time_ns, run_cnt).
pub type Counts = BTreeMap<u32, (u64, u64)>;

/// Run statistics of every program fd this process holds.
pub fn read() -> Counts {
    let mut out = Counts::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fdinfo") else { return out };
    for e in dir.flatten() {
        let Ok(s) = std::fs::read_to_string(e.path()) else { continue };
        let field = |k: &str| s.lines().find_map(|l| l.strip_prefix(k)).and_then(|v| v.trim().parse::<u64>().ok());
        if let (Some(id), Some(t), Some(n)) = (field("prog_id:"), field("run_time_ns:"), field("run_cnt:")) {
            out.insert(id as u32, (t, n));
        }
    }
    out
}

/// Names of the given program ids (as loaded; at most 15 characters).
pub fn names(ids: impl IntoIterator<Item = u32>) -> BTreeMap<u32, String> {
    let want: std::collections::BTreeSet<u32> = ids.into_iter().collect();
    let mut out = BTreeMap::new();
    for info in aya::programs::loaded_programs().flatten() {
        if want.contains(&info.id()) {
            out.insert(info.id(), info.name_as_str().unwrap_or("?").to_string());
        }
    }
    out
}

/// One program's share of a measured window.
#[derive(Clone, Debug)]
pub struct ProgDelta {
    pub name: String,
    pub runs: u64,
    pub time_ns: u64,
}

/// What each program did between two readings, summed by name, busiest first.
pub fn delta(before: &Counts, after: &Counts, names: &BTreeMap<u32, String>) -> Vec<ProgDelta> {
    let mut by_name: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (id, (t1, n1)) in after {
        let (t0, n0) = before.get(id).copied().unwrap_or((0, 0));
        let e = by_name.entry(names.get(id).cloned().unwrap_or_else(|| format!("prog {id}"))).or_default();
        e.0 += t1.saturating_sub(t0);
        e.1 += n1.saturating_sub(n0);
    }
    let mut v: Vec<ProgDelta> = by_name
        .into_iter()
        .filter(|(_, (_, n))| *n > 0)
        .map(|(name, (time_ns, runs))| ProgDelta { name, runs, time_ns })
        .collect();
    v.sort_by_key(|p| std::cmp::Reverse(p.time_ns));
    v
}

/// Program ids held (as fds) by process `pid` ("self" for this one).
fn prog_ids_of(pid: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return vec![] };
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|s| s.lines().find_map(|l| l.strip_prefix("prog_id:")).and_then(|v| v.trim().parse().ok()))
        .collect()
}

/// Tracing programs (kprobe, tracepoint, perf_event, raw_tracepoint, tracing) loaded on the machine
/// by anyone but this process and `also_ours`: other tracers make every syscall slower while they
/// are attached, so a measurement taken meanwhile is not comparable.
///
/// `ours` accumulates the ids this process (and `also_ours`) held at any check: programs are freed
/// a little after their last fd closes, so a program detached a moment ago can still be listed.
pub fn foreign_tracers(also_ours: &[u32], ours: &mut std::collections::BTreeSet<u32>) -> Vec<String> {
    const TRACING_TYPES: [u32; 6] = [2, 5, 7, 17, 24, 26];
    ours.extend(prog_ids_of("self"));
    for pid in also_ours {
        ours.extend(prog_ids_of(&pid.to_string()));
    }
    aya::programs::loaded_programs()
        .flatten()
        .filter(|p| TRACING_TYPES.contains(&(p.program_type() as u32)) && !ours.contains(&p.id()))
        .map(|p| format!("{} (id {})", p.name_as_str().unwrap_or("?"), p.id()))
        .collect()
}
