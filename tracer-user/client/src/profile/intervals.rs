//! What a recording says about time between launches: the idle gaps of each process
//! ([`idle_gaps`]) and the intervals a completed synchronisation bounds ([`bounded_intervals`]),
//! for the summary, the trace and the report.
use std::collections::BTreeMap;
use std::collections::HashMap;

use serde::Serialize;
use tracer_core::profile::Recording;

/// A stretch of the window in which a process submitted no launch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Gap {
    pub tgid: u32,
    pub start_ktime_ns: u64,
    pub end_ktime_ns: u64,
}

/// Every gap of at least `min_ns` between one process's launches, counting the window's start
/// and end (or the process's exit) as edges; a process that launched nothing is idle throughout.
pub(crate) fn idle_gaps(rec: &Recording, min_ns: u64) -> Vec<Gap> {
    let mut times: BTreeMap<u32, Vec<u64>> = rec.processes.keys().map(|&t| (t, Vec::new())).collect();
    for l in &rec.launches {
        times.entry(l.tgid).or_default().push(l.ktime_ns);
    }
    let mut gaps = Vec::new();
    for (tgid, mut ts) in times {
        ts.sort_unstable();
        let end =
            rec.processes.get(&tgid).and_then(|p| p.exited_ktime_ns).unwrap_or(rec.end_ktime_ns).min(rec.end_ktime_ns);
        let edges = std::iter::once(rec.start_ktime_ns).chain(ts.iter().copied()).chain(std::iter::once(end));
        let mut prev: Option<u64> = None;
        for t in edges {
            if let Some(p) = prev
                && t > p
                && t - p >= min_ns.max(1)
            {
                gaps.push(Gap { tgid, start_ktime_ns: p, end_ktime_ns: t });
            }
            prev = Some(prev.map_or(t, |p| p.max(t)));
        }
    }
    gaps
}

/// A stretch of one stream in which the kernels submitted to it ran: each was launched at or
/// after `start_ktime_ns` and a synchronisation that began after its launch returned at
/// `end_ktime_ns`. Not a measured kernel duration: a bound.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Bounded {
    pub tgid: u32,
    pub stream: u64,
    pub start_ktime_ns: u64,
    pub end_ktime_ns: u64,
    pub kernels: u64,
    /// The synchronisation entry point(s) that closed it.
    pub by: String,
}

/// The bounded intervals of every stream (overlapping ones merged, so each stream's are disjoint
/// and every kernel in one ran within it), and the launches no synchronisation in the window
/// bounded. `cuStreamSynchronize(S)` bounds S's launches submitted before it began;
/// `cuCtxSynchronize` every stream's of its process; an event seen complete
/// (`cuEventSynchronize(E)`, or `cuEventQuery(E)` returning success) bounds the launches on the
/// stream of E's latest record before that call, submitted before the record began.
pub(crate) fn bounded_intervals(rec: &Recording) -> (Vec<Bounded>, u64) {
    // Launch times per (process, stream), in order.
    let mut launches: BTreeMap<(u32, u64), Vec<u64>> = BTreeMap::new();
    for l in &rec.launches {
        launches.entry((l.tgid, l.stream)).or_default().push(l.ktime_ns);
    }
    for v in launches.values_mut() {
        v.sort_unstable();
    }
    // Each event's records, per (process, event), in order.
    let mut records: BTreeMap<(u32, u64), Vec<&tracer_core::profile::Call>> = BTreeMap::new();
    for c in rec.calls.iter().filter(|c| c.class == "record" && c.result == 0) {
        if let Some(e) = c.event {
            records.entry((c.tgid, e)).or_default().push(c);
        }
    }
    for v in records.values_mut() {
        v.sort_by_key(|c| c.start_ktime_ns);
    }
    // Calls that saw work complete: a stream or context synchronisation, an event
    // synchronisation, a query that found the event done (CUDA_SUCCESS).
    let mut syncs: Vec<&tracer_core::profile::Call> = rec
        .calls
        .iter()
        .filter(|c| c.result == 0 && (c.class == "synchronize" || (c.class == "query" && c.event.is_some())))
        .collect();
    syncs.sort_by_key(|c| c.end_ktime_ns);
    let mut cursor: HashMap<(u32, u64), usize> = HashMap::new();
    let mut raw: BTreeMap<(u32, u64), Vec<Bounded>> = BTreeMap::new();
    for c in syncs {
        // (stream key, launches submitted up to this time are bounded)
        let streams: Vec<((u32, u64), u64)> = match (c.event, c.stream) {
            (Some(e), _) => {
                // The event's latest record before this call: its stream's earlier launches.
                let Some(r) =
                    records.get(&(c.tgid, e)).and_then(|v| v.iter().rev().find(|r| r.end_ktime_ns <= c.start_ktime_ns))
                else {
                    continue;
                };
                vec![((c.tgid, r.stream.unwrap_or(0)), r.start_ktime_ns)]
            }
            (None, Some(st)) => vec![((c.tgid, st), c.start_ktime_ns)],
            (None, None) => {
                launches.range((c.tgid, 0)..=(c.tgid, u64::MAX)).map(|(k, _)| (*k, c.start_ktime_ns)).collect()
            }
        };
        for (key, before) in streams {
            let Some(ts) = launches.get(&key) else { continue };
            let from = cursor.get(&key).copied().unwrap_or(0);
            let to = from + ts[from..].partition_point(|&t| t <= before);
            if to > from {
                raw.entry(key).or_default().push(Bounded {
                    tgid: key.0,
                    stream: key.1,
                    start_ktime_ns: ts[from],
                    end_ktime_ns: c.end_ktime_ns,
                    kernels: (to - from) as u64,
                    by: c.entry_point.clone(),
                });
                cursor.insert(key, to);
            }
        }
    }
    let mut out = Vec::new();
    for (_, mut v) in raw {
        v.sort_by_key(|b| b.start_ktime_ns);
        let mut merged: Vec<Bounded> = Vec::new();
        for b in v {
            match merged.last_mut() {
                Some(m) if b.start_ktime_ns < m.end_ktime_ns => {
                    m.end_ktime_ns = m.end_ktime_ns.max(b.end_ktime_ns);
                    m.kernels += b.kernels;
                    if !m.by.split('+').any(|x| x == b.by) {
                        m.by = format!("{}+{}", m.by, b.by);
                    }
                }
                _ => merged.push(b),
            }
        }
        out.extend(merged);
    }
    let bounded: u64 = out.iter().map(|b| b.kernels).sum();
    (out, rec.launches.len() as u64 - bounded)
}

/// Total length of the union of `[start, end)` intervals.
pub(crate) fn union_ns(mut v: Vec<(u64, u64)>) -> u64 {
    v.sort_unstable();
    let (mut total, mut cur): (u64, Option<(u64, u64)>) = (0, None);
    for (s, e) in v {
        cur = match cur {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    total + cur.map_or(0, |(s, e)| e - s)
}
