//! The CUDA-level view: live allocations made through libcuda (pointer → bytes) per process, and
//! the in-kernel call counts (launches, graph launches, allocation calls) per process and cgroup.
//!
//! This is a second ledger beside the driver's RM ledger (`state`), and the two differ on purpose:
//! a caching allocator (PyTorch) reserves big blocks through libcuda and sub-allocates them itself,
//! so both see the same few big blocks; `cuMemAllocManaged` is address space, not device memory
//! until touched (the RM ledger shows it as managed `mmap`s); and the driver may back several
//! libcuda allocations with one RM allocation, or round sizes up.
use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use tracer_common::{CudaCount, CudaCountKey, cuda_entry};

/// What kind of memory an allocation entry point returns.
fn memory_class(entry: u32) -> MemClass {
    match entry {
        cuda_entry::MEM_ALLOC_MANAGED => MemClass::Managed,
        cuda_entry::MEM_ALLOC_HOST => MemClass::Host,
        _ => MemClass::Device,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MemClass {
    Device,
    Managed,
    Host,
}

#[derive(Clone, Copy, Debug)]
struct Live {
    bytes: u64,
    class: MemClass,
    cgroup_id: u64,
}

/// CUDA numbers of one row (a process or a cgroup).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CudaUsage {
    /// Live bytes allocated through cuMemAlloc_v2/Async/Pitch and cuMemCreate.
    pub device_bytes: u64,
    /// Live bytes of cuMemAllocManaged.
    pub managed_bytes: u64,
    /// Live bytes of cuMemAllocHost_v2 (pinned host memory).
    pub host_bytes: u64,
    /// Kernel launches (cuLaunchKernel*, cuLaunchCooperativeKernel*) since start.
    pub launches: u64,
    /// Graph launches (cuGraphLaunch*) since start: one may run many kernels.
    pub graph_launches: u64,
    /// Launches per second over the last interval (graph launches included).
    pub launch_rate: f64,
    /// Successful allocation calls / free calls since start.
    pub allocs: u64,
    pub frees: u64,
    /// Allocation calls that returned an error.
    pub failed_allocs: u64,
}

/// Field by field: the sum of several rows (a cgroup's processes, cgroups into one container).
impl std::ops::AddAssign<&CudaUsage> for CudaUsage {
    fn add_assign(&mut self, o: &CudaUsage) {
        // Destructured, so that a new field cannot be left out of the sum.
        let CudaUsage {
            device_bytes,
            managed_bytes,
            host_bytes,
            launches,
            graph_launches,
            launch_rate,
            allocs,
            frees,
            failed_allocs,
        } = *o;
        self.device_bytes += device_bytes;
        self.managed_bytes += managed_bytes;
        self.host_bytes += host_bytes;
        self.launches += launches;
        self.graph_launches += graph_launches;
        self.launch_rate += launch_rate;
        self.allocs += allocs;
        self.frees += frees;
        self.failed_allocs += failed_allocs;
    }
}

/// One process's CUDA row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CudaProcessRow {
    pub tgid: u32,
    pub cgroup_id: u64,
    pub usage: CudaUsage,
}

/// One cgroup's CUDA row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CudaCgroupRow {
    pub cgroup_id: u64,
    pub path: Option<String>,
    pub usage: CudaUsage,
}

/// The CUDA part of a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CudaSnapshot {
    pub cgroups: Vec<CudaCgroupRow>,
    pub processes: Vec<CudaProcessRow>,
    pub totals: CudaUsage,
    /// Calls per entry point (symbol name) since start.
    pub calls_by_entry: BTreeMap<&'static str, u64>,
    /// Frees of pointers the ledger did not know (allocated before the agent started, or failed).
    pub unknown_frees: u64,
}

/// Shortest window a launch rate is computed over, seconds.
const MIN_RATE_WINDOW_S: f64 = 0.2;

/// The CUDA ledger and counts.
#[derive(Default)]
pub struct CudaLedger {
    live: HashMap<u32, HashMap<u64, Live>>,
    /// Counts read from the kernel, per key (cumulative for live processes).
    counts: BTreeMap<CudaCountKey, CudaCount>,
    /// Counts of processes that exited, folded per (cgroup, entry) so cgroup totals never go down.
    exited: BTreeMap<(u64, u32), CudaCount>,
    /// Launch totals at the previous `update_counts`, for rates.
    prev_launches: HashMap<(u64, u32), u64>,
    rates: HashMap<(u64, u32), f64>,
    allocs: HashMap<u32, (u64, u64, u64)>,
    unknown_frees: u64,
    last_update: Option<std::time::Instant>,
    /// Kernel names by (tgid, function or kernel handle).
    names: HashMap<(u32, u64), String>,
    /// Launch counts already reported as batches.
    batched: HashMap<CudaCountKey, u64>,
    /// The cgroup of each process's latest allocation call, and exited processes' allocation
    /// counts folded per cgroup (so a cgroup's ALLOC/FREE never goes down).
    alloc_cgroup: HashMap<u32, u64>,
    exited_allocs: HashMap<u64, (u64, u64, u64)>,
    /// Removed cgroups that still had a process in the ledger: retired when the last one exits.
    removed: HashSet<u64>,
    /// What removed cgroups counted (calls per entry point; allocations, frees, failures): in the
    /// totals and the per-entry counts, which never go down, but in no cgroup row.
    retired: BTreeMap<u32, CudaCount>,
    retired_allocs: (u64, u64, u64),
}

impl CudaLedger {
    /// A libcuda allocation returned.
    pub fn alloc(&mut self, tgid: u32, cgroup_id: u64, entry: u32, result: u32, ptr: u64, bytes: u64) {
        self.alloc_cgroup.insert(tgid, cgroup_id);
        let a = self.allocs.entry(tgid).or_default();
        if result != 0 || ptr == 0 {
            a.2 += 1;
            return;
        }
        a.0 += 1;
        self.live.entry(tgid).or_default().insert(ptr, Live { bytes, class: memory_class(entry), cgroup_id });
    }

    /// The live bytes of `tgid`'s allocations the ledger knows (device, host and managed).
    pub fn live_bytes(&self, tgid: u32) -> u64 {
        self.live.get(&tgid).map_or(0, |m| m.values().map(|l| l.bytes).sum())
    }

    /// The processes with live allocations, each with the cgroup of its latest allocation call.
    pub fn live_processes(&self) -> Vec<(u32, u64)> {
        self.live
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(&tgid, _)| (tgid, self.alloc_cgroup.get(&tgid).copied().unwrap_or(0)))
            .collect()
    }

    /// A libcuda free was called; returns the bytes released if the pointer was known.
    pub fn free(&mut self, tgid: u32, ptr: u64) -> Option<u64> {
        self.allocs.entry(tgid).or_default().1 += 1;
        let l = self.live.get_mut(&tgid).and_then(|m| m.remove(&ptr));
        if l.is_none() {
            self.unknown_frees += 1;
        }
        l.map(|l| l.bytes)
    }

    /// A handle lookup returned: remember the name (or inherit it from the source kernel handle).
    pub fn function(&mut self, tgid: u32, handle: u64, source: u64, name: &str) {
        if handle == 0 {
            return;
        }
        let name = if name.is_empty() { self.names.get(&(tgid, source)).cloned() } else { Some(name.to_string()) };
        if let Some(n) = name {
            self.names.insert((tgid, handle), n);
        }
    }

    /// The kernel name of a function handle of `tgid`, if a lookup named it.
    pub fn name_of(&self, tgid: u32, handle: u64) -> Option<String> {
        self.names.get(&(tgid, handle)).cloned()
    }

    /// The process exited: everything it held is released; its counts are folded per cgroup.
    pub fn process_exit(&mut self, tgid: u32) {
        self.names.retain(|(t, _), _| *t != tgid);
        // A process that is gone launches nothing: its rate would otherwise stay (and keep a row of
        // its cgroup) until the next window.
        self.rates.retain(|(_, t), _| *t != tgid);
        self.prev_launches.retain(|(_, t), _| *t != tgid);
        self.live.remove(&tgid);
        if let Some((a, f, failed)) = self.allocs.remove(&tgid) {
            let cg = self.alloc_cgroup.get(&tgid).copied().unwrap_or(0);
            let e = self.exited_allocs.entry(cg).or_default();
            e.0 += a;
            e.1 += f;
            e.2 += failed;
        }
        self.alloc_cgroup.remove(&tgid);
        let keys: Vec<CudaCountKey> = self.counts.keys().filter(|k| k.tgid == tgid).copied().collect();
        for k in keys {
            if let Some(c) = self.counts.remove(&k) {
                let e = self.exited.entry((k.cgroup_id, k.entry)).or_default();
                e.calls += c.calls;
                e.bytes += c.bytes;
            }
        }
        // A removed cgroup whose last process this was goes now.
        let done: Vec<u64> = self.removed.iter().copied().filter(|cg| !self.has_processes_in(*cg)).collect();
        for cg in done {
            self.retire(cg);
        }
    }

    /// The cgroup was removed: its row goes (what it counted stays in the totals) once no process
    /// of it is left in the ledger; until then it is remembered, and retired at the last exit.
    pub fn cgroup_removed(&mut self, cgroup_id: u64) {
        if self.has_processes_in(cgroup_id) {
            self.removed.insert(cgroup_id);
        } else {
            self.retire(cgroup_id);
        }
    }

    /// Does a live process of the ledger (counts, live allocations, allocation calls) belong to it?
    fn has_processes_in(&self, cgroup_id: u64) -> bool {
        self.counts.keys().any(|k| k.cgroup_id == cgroup_id)
            || self.live.values().flat_map(|m| m.values()).any(|l| l.cgroup_id == cgroup_id)
            || self.alloc_cgroup.values().any(|cg| *cg == cgroup_id)
    }

    /// Fold a removed cgroup's exited counts into the retired totals and forget its row.
    fn retire(&mut self, cgroup_id: u64) {
        self.removed.remove(&cgroup_id);
        let keys: Vec<(u64, u32)> =
            self.exited.range((cgroup_id, 0)..=(cgroup_id, u32::MAX)).map(|(k, _)| *k).collect();
        for k in keys {
            if let Some(c) = self.exited.remove(&k) {
                let r = self.retired.entry(k.1).or_default();
                r.calls += c.calls;
                r.bytes += c.bytes;
            }
        }
        if let Some((a, f, failed)) = self.exited_allocs.remove(&cgroup_id) {
            self.retired_allocs.0 += a;
            self.retired_allocs.1 += f;
            self.retired_allocs.2 += failed;
        }
    }

    #[cfg(test)]
    /// Cgroups removed while a process of theirs was still in the ledger (see
    /// [`CudaLedger::cgroup_removed`]).
    pub(crate) fn removed_pending(&self) -> usize {
        self.removed.len()
    }

    /// Replace the kernel counts with a fresh read (`CUDA_COUNTS` summed over CPUs).
    pub fn update_counts(&mut self, fresh: Vec<(CudaCountKey, CudaCount)>) {
        let now = std::time::Instant::now();
        let dt = self.last_update.map(|t| now.duration_since(t).as_secs_f64()).unwrap_or(0.0);
        for (k, c) in fresh {
            self.counts.insert(k, c);
        }
        // Reads closer together than this keep the rates of the last window (a rate over a few
        // microseconds between two reads of one snapshot would be 0 or noise).
        if self.last_update.is_some() && dt < MIN_RATE_WINDOW_S {
            return;
        }
        self.last_update = Some(now);
        // Launch rate per (cgroup, tgid).
        let mut launches: HashMap<(u64, u32), u64> = HashMap::new();
        for (k, c) in &self.counts {
            if cuda_entry::is_launch(k.entry) {
                *launches.entry((k.cgroup_id, k.tgid)).or_default() += c.calls;
            }
        }
        self.rates.clear();
        if dt > 0.0 {
            for (key, n) in &launches {
                let prev = self.prev_launches.get(key).copied().unwrap_or(0);
                self.rates.insert(*key, n.saturating_sub(prev) as f64 / dt);
            }
        }
        self.prev_launches = launches;
    }

    /// The CUDA snapshot; `path` resolves cgroup ids.
    pub fn snapshot(&self, path: &mut dyn FnMut(u64) -> Option<String>) -> CudaSnapshot {
        let mut procs: BTreeMap<u32, CudaProcessRow> = BTreeMap::new();
        let mut cgroups: BTreeMap<u64, CudaUsage> = BTreeMap::new();
        let mut by_entry: BTreeMap<&'static str, u64> = BTreeMap::new();
        let add_count = |u: &mut CudaUsage, entry: u32, c: &CudaCount| {
            if cuda_entry::is_graph_launch(entry) {
                u.graph_launches += c.calls;
            } else if cuda_entry::is_launch(entry) {
                u.launches += c.calls;
            }
        };
        for (k, c) in &self.counts {
            let row = procs.entry(k.tgid).or_insert(CudaProcessRow {
                tgid: k.tgid,
                cgroup_id: k.cgroup_id,
                usage: CudaUsage::default(),
            });
            add_count(&mut row.usage, k.entry, c);
            add_count(cgroups.entry(k.cgroup_id).or_default(), k.entry, c);
            if let Some(e) = cuda_entry::ALL.get(k.entry as usize) {
                *by_entry.entry(e.1).or_default() += c.calls;
            }
        }
        for ((cg, entry), c) in &self.exited {
            add_count(cgroups.entry(*cg).or_default(), *entry, c);
            if let Some(e) = cuda_entry::ALL.get(*entry as usize) {
                *by_entry.entry(e.1).or_default() += c.calls;
            }
        }
        for ((cg, tgid), r) in &self.rates {
            if let Some(p) = procs.get_mut(tgid) {
                p.usage.launch_rate += r;
            }
            cgroups.entry(*cg).or_default().launch_rate += r;
        }
        for (tgid, m) in &self.live {
            for l in m.values() {
                let row = procs.entry(*tgid).or_insert(CudaProcessRow {
                    tgid: *tgid,
                    cgroup_id: l.cgroup_id,
                    usage: CudaUsage::default(),
                });
                let cg = cgroups.entry(l.cgroup_id).or_default();
                for u in [&mut row.usage, cg] {
                    match l.class {
                        MemClass::Device => u.device_bytes += l.bytes,
                        MemClass::Managed => u.managed_bytes += l.bytes,
                        MemClass::Host => u.host_bytes += l.bytes,
                    }
                }
            }
        }
        for (tgid, (a, f, failed)) in &self.allocs {
            if let Some(p) = procs.get_mut(tgid) {
                p.usage.allocs += a;
                p.usage.frees += f;
                p.usage.failed_allocs += failed;
                let cg = cgroups.entry(p.cgroup_id).or_default();
                cg.allocs += a;
                cg.frees += f;
                cg.failed_allocs += failed;
            }
        }
        for (cg, (a, f, failed)) in &self.exited_allocs {
            let u = cgroups.entry(*cg).or_default();
            u.allocs += a;
            u.frees += f;
            u.failed_allocs += failed;
        }
        let mut totals = CudaUsage::default();
        for u in cgroups.values() {
            totals += u;
        }
        // Removed cgroups: in the totals and per entry point, in no row.
        for (entry, c) in &self.retired {
            add_count(&mut totals, *entry, c);
            if let Some(e) = cuda_entry::ALL.get(*entry as usize) {
                *by_entry.entry(e.1).or_default() += c.calls;
            }
        }
        totals.allocs += self.retired_allocs.0;
        totals.frees += self.retired_allocs.1;
        totals.failed_allocs += self.retired_allocs.2;
        CudaSnapshot {
            cgroups: cgroups
                .into_iter()
                .map(|(cgroup_id, usage)| CudaCgroupRow { cgroup_id, path: path(cgroup_id), usage })
                .collect(),
            processes: procs.into_values().collect(),
            totals,
            calls_by_entry: by_entry,
            unknown_frees: self.unknown_frees,
        }
    }

    /// Launch calls per (cgroup, tgid, entry) since the previous call (for launch-batch events).
    pub fn take_launch_batches(&mut self) -> Vec<(CudaCountKey, u64)> {
        let mut out = Vec::new();
        for (k, c) in &self.counts {
            if !cuda_entry::is_launch(k.entry) {
                continue;
            }
            let prev = self.batched.insert(*k, c.calls).unwrap_or(0);
            if c.calls > prev {
                out.push((*k, c.calls - prev));
            }
        }
        let live = &self.counts;
        self.batched.retain(|k, _| live.contains_key(k));
        out
    }

    /// Is there anything to show?
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty() && self.exited.is_empty() && self.live.is_empty()
    }
}

#[cfg(test)]
mod tests;
