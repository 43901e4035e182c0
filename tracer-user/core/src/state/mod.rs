//! The state stage: processes, their NVIDIA fds and RM handles, and the live-memory ledgers.
//!
//! [`TracerState::apply`] folds decoded [`Event`]s into:
//!
//! - a process table keyed by tgid and checked against the caller-supplied start time
//!   ([`ProcessKey`]): a reused pid with another start time is a different process, and the stale
//!   one is released;
//! - per process, an fd table (fd → [`Device`], with its `file_id`; dups share the `file_id`) and an
//!   RM handle ledger: objects per client with parent links, so freeing an object frees its
//!   descendants and freeing a client frees everything under it;
//! - allocations (the memory a handle refers to), each charged to exactly one process, one cgroup and
//!   one GPU bucket, so that for every byte bucket Σ processes = Σ cgroups = Σ GPUs = total, exactly.
//!
//! Lifecycle, and what releases memory:
//!
//! | event | effect |
//! |---|---|
//! | successful RM_ALLOC / ALLOC_MEMORY / VID_HEAP ALLOC_SIZE of memory | a new allocation, charged |
//! | failed or malformed calls | counted, no ledger change |
//! | RM_FREE of a handle, VID_HEAP FREE | the handle and its descendants are dropped |
//! | RM_FREE of the client | every object of the client is dropped |
//! | RM_DUP_OBJECT | a second reference to the same allocation (not new memory) |
//! | last fd of a `file_id` closed (or closed by exec, for `O_CLOEXEC` fds) | every client allocated through that file is dropped (the driver's `RmFreeUnusedClients`) |
//! | process exit, pid reuse, eviction | everything the process holds is dropped |
//! | cgroup removed | its row goes once it has no live processes and no live memory |
//!
//! Memory is released when its last reference is dropped. If the owner drops its last reference
//! while another process still holds a dup, the charge moves to that process (counted as an
//! ownership transfer), so nothing is charged to a process that no longer exists.
//!
//! GPU attribution: a process with exactly one `/dev/nvidiaN` minor open has all its memory on that
//! GPU; otherwise the device instance of the nearest device object (class 0x80) is used as the
//! minor and the bytes are marked inferred; otherwise (or for deviceless memory) the `unknown`
//! bucket. Managed (UVM `mmap`) memory always goes to the unknown bucket: it has no GPU until touched.
//!
//! Everything is bounded by [`StateConfig`]; what does not fit is counted in [`StateCounters`].

mod ledger;
pub mod snapshot;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use tracer_common::nv::class;

pub use snapshot::{CgroupRow, Completeness, GpuRow, ProcessRow, Snapshot, StateCounters, Totals, Usage};

use crate::decode::{Device, DeviceKind, Event, Header, IoctlEvent, IoctlOp, Location, MemoryAlloc, MemoryKind};
use ledger::{AllocId, FdEntry, ManagedMapping, Object, Process};

/// Allocations larger than this (256 TiB, more than any GPU or host has) are garbage sizes read
/// from user memory: counted in `implausible_sizes` and charged as zero bytes.
pub const MAX_PLAUSIBLE_ALLOCATION_BYTES: u64 = 1 << 48;

/// A process incarnation: a reused pid with another start time is a different process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ProcessKey {
    pub tgid: u32,
    /// Start time in clock ticks since boot (`/proc/PID/stat` field 22); 0 when unknown.
    pub start_time_ticks: u64,
}

/// Bounds of the state tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateConfig {
    /// Live processes tracked; the least recently active one is evicted (and released) for a new one.
    pub max_processes: usize,
    /// RM handles per process (clients included); further objects are not tracked.
    pub max_handles_per_process: usize,
    /// NVIDIA fds per process.
    pub max_fds_per_process: usize,
    /// Managed mappings per process.
    pub max_managed_per_process: usize,
    /// Cgroup rows; idle rows are evicted past this (rows with live memory never are).
    pub max_cgroups: usize,
    /// Distinct RM_CONTROL commands counted individually.
    pub max_control_cmds: usize,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            max_processes: 16384,
            max_handles_per_process: 65536,
            max_fds_per_process: 4096,
            max_managed_per_process: 65536,
            max_cgroups: 16384,
            max_control_cmds: 512,
        }
    }
}

/// Highest regular GPU minor (`NV_MINOR_DEVICE_NUMBER_REGULAR_MAX`); larger values are not GPUs.
const MAX_GPU_MINOR: u32 = 247;

fn gpu_key(minor: u32) -> Option<u32> {
    (minor <= MAX_GPU_MINOR).then_some(minor)
}

/// Which byte bucket an allocation is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bucket {
    Vidmem,
    Sysmem,
    VaOnly,
}

impl Bucket {
    /// Location `Any`/`Unknown` of a physical allocation counts as device memory: the classes and
    /// the VID_HEAP call are video-memory APIs, and RM prefers video memory when free to choose.
    fn of(m: &MemoryAlloc) -> Bucket {
        match (m.kind, m.location) {
            (MemoryKind::VirtualOnly, _) => Bucket::VaOnly,
            (MemoryKind::OsDescriptor, _) => Bucket::Sysmem,
            (MemoryKind::Fabric, _) => Bucket::Vidmem,
            (MemoryKind::Physical, Location::Sysmem) => Bucket::Sysmem,
            (MemoryKind::Physical, _) => Bucket::Vidmem,
        }
    }
}

/// Why an allocation was released (label of `StateCounters::released_by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    Free,
    ParentFree,
    ClientFree,
    FdRelease,
    ProcessExit,
    PidReuse,
    Evicted,
    Replaced,
}

impl Cause {
    fn as_str(self) -> &'static str {
        match self {
            Cause::Free => "free",
            Cause::ParentFree => "parent_free",
            Cause::ClientFree => "client_free",
            Cause::FdRelease => "fd_release",
            Cause::ProcessExit => "process_exit",
            Cause::PidReuse => "pid_reuse",
            Cause::Evicted => "evicted",
            Cause::Replaced => "replaced",
        }
    }
}

/// A handle referring to an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ObjRef {
    tgid: u32,
    client: u32,
    handle: u32,
}

/// Live memory, charged to one process, one cgroup and one GPU bucket.
#[derive(Debug, Clone)]
struct Allocation {
    bytes: u64,
    bucket: Bucket,
    gpu: Option<u32>,
    inferred: bool,
    owner: u32,
    cgroup_id: u64,
    refs: Vec<ObjRef>,
}

#[derive(Debug, Clone, Default)]
struct Cgroup {
    path: Option<String>,
    processes: usize,
    removed: bool,
    last_ktime: u64,
    usage: Usage,
}

/// The state of every tracked process, and the ledgers derived from it. See the module docs.
#[derive(Debug, Clone)]
pub struct TracerState {
    cfg: StateConfig,
    processes: HashMap<u32, Process>,
    cgroups: HashMap<u64, Cgroup>,
    gpus: BTreeMap<Option<u32>, Usage>,
    allocs: HashMap<AllocId, Allocation>,
    next_alloc: AllocId,
    /// Which process holds each client handle (client handles are unique system-wide).
    client_owner: HashMap<u32, u32>,
    totals: Usage,
    counters: StateCounters,
    /// Bytes released by the event being applied (vidmem, sysmem, managed).
    released_bytes: u64,
    released_any: bool,
    /// The last processes whose exit was applied: tgid → the exit record's ktime, oldest first in
    /// `exit_order` (at most [`RECENT_EXITS`]). A count-only record from the bulk ring that is
    /// older than its process's exit arrived late; it must not bring the process back.
    recent_exits: HashMap<u32, u64>,
    exit_order: std::collections::VecDeque<u32>,
}

/// How many exits [`TracerState`] remembers for late count-only records. The two rings are drained
/// every few milliseconds, so a late record follows its exit closely; 8,192 covers a fork storm.
const RECENT_EXITS: usize = 8192;

impl TracerState {
    /// A state with default bounds and at most `max_processes` processes.
    pub fn new(max_processes: usize) -> Self {
        Self::with_config(StateConfig { max_processes, ..StateConfig::default() })
    }

    /// A state with the given bounds.
    pub fn with_config(cfg: StateConfig) -> Self {
        TracerState {
            cfg,
            processes: HashMap::new(),
            cgroups: HashMap::new(),
            gpus: BTreeMap::new(),
            allocs: HashMap::new(),
            next_alloc: 1,
            client_owner: HashMap::new(),
            totals: Usage::default(),
            counters: StateCounters::default(),
            released_bytes: 0,
            released_any: false,
            recent_exits: HashMap::new(),
            exit_order: std::collections::VecDeque::new(),
        }
    }

    /// The bounds in use.
    pub fn config(&self) -> &StateConfig {
        &self.cfg
    }

    /// Apply one event. `start_time_ticks` is the start time of the event's process
    /// (`header.tgid`), read by the caller (0 if unknown: the live incarnation of the tgid is then
    /// assumed). A forked child is not created here: its fds are expected as seeded
    /// [`Event::FdOpened`] events from the caller's `/proc` scan.
    ///
    /// Returns the bytes (device, system and managed memory) this event released, if it released
    /// any allocation or mapping.
    pub fn apply(&mut self, event: &Event, start_time_ticks: u64) -> Option<u64> {
        self.released_bytes = 0;
        self.released_any = false;
        *self.counters.events.entry(event.kind_name()).or_default() += 1;
        let h = event.header();
        match event {
            Event::FdOpened { device, fd, open_flags, .. } => {
                if let Some(tgid) = self.touch(h, start_time_ticks, true) {
                    let cloexec = *open_flags & libc::O_CLOEXEC as u32 != 0;
                    let same_file = |p: &Process| p.fds.get(fd).is_some_and(|f| f.device.file_id == device.file_id);
                    if *fd as u32 >= tracer_common::FILE_SLOT_BASE && self.processes.get(&tgid).is_some_and(same_file) {
                        // Driver-entry mode registers a file at its first call in a process, and
                        // again when processes take turns with it: the same open file, no change.
                    } else {
                        if self.processes.get(&tgid).is_some_and(|p| p.fds.contains_key(fd)) {
                            self.counters.stale_fds_replaced += 1;
                            self.close_fd(tgid, *fd);
                        }
                        self.add_fd(tgid, *fd, *device, cloexec);
                    }
                }
            }
            Event::FdDuped { device, old_fd, new_fd, .. } => {
                if let Some(tgid) = self.touch(h, start_time_ticks, true)
                    && old_fd != new_fd
                {
                    if self.processes.get(&tgid).is_some_and(|p| p.fds.contains_key(new_fd)) {
                        // dup2/dup3 onto an NVIDIA fd closes it first.
                        self.close_fd(tgid, *new_fd);
                    }
                    // dup/dup2 clear FD_CLOEXEC; dup3(O_CLOEXEC) is not visible here.
                    self.add_fd(tgid, *new_fd, *device, false);
                }
            }
            Event::FdClosed { fd, device, .. } if *fd as u32 >= tracer_common::FILE_SLOT_BASE => {
                // Driver-entry mode: the driver released the file (its last reference went), so
                // it is closed in every process that used it, whichever task dropped it last.
                let users: Vec<u32> = self
                    .processes
                    .iter()
                    .filter(|(_, p)| p.fds.get(fd).is_some_and(|f| f.device.file_id == device.file_id))
                    .map(|(&t, _)| t)
                    .collect();
                for tgid in users {
                    self.close_fd(tgid, *fd);
                }
            }
            Event::FdClosed { fd, .. } => {
                if let Some(tgid) = self.touch(h, start_time_ticks, false) {
                    self.close_fd(tgid, *fd);
                } else {
                    self.counters.unknown_fd_closes += 1;
                }
            }
            Event::Ioctl(e) => {
                if self.is_after_exit(h.tgid, h.ktime_ns) {
                    self.counters.records_after_exit += 1;
                    self.ioctl(h.tgid, h.cgroup_id, e);
                } else if let Some(tgid) = self.touch(h, start_time_ticks, true) {
                    self.ioctl(tgid, h.cgroup_id, e);
                }
            }
            Event::UvmMapped { addr, len, ret, .. } => {
                let ok = !(-4095..0).contains(ret);
                if let Some(tgid) = self.touch(h, start_time_ticks, true)
                    && ok
                    && *len > 0
                {
                    self.map_managed(tgid, *addr, *len);
                }
            }
            Event::UvmUnmapped { addr, ret, .. } => {
                if let Some(tgid) = self.touch(h, start_time_ticks, false)
                    && *ret == 0
                {
                    self.unmap_managed(tgid, *addr);
                }
            }
            Event::ProcessExec { comm, .. } => {
                if let Some(tgid) = self.touch(h, start_time_ticks, false) {
                    if let Some(p) = self.processes.get_mut(&tgid) {
                        p.comm = Some(comm.clone());
                    }
                    // exec closes O_CLOEXEC fds without close(2).
                    let cloexec: Vec<i32> = self
                        .processes
                        .get(&tgid)
                        .map(|p| p.fds.iter().filter(|(_, f)| f.cloexec).map(|(&fd, _)| fd).collect())
                        .unwrap_or_default();
                    for fd in cloexec {
                        self.close_fd(tgid, fd);
                    }
                }
            }
            Event::ProcessExit { .. } => {
                // Whatever incarnation of the tgid is live has ended.
                self.remove_process(h.tgid, Cause::ProcessExit);
                self.remember_exit(h.tgid, h.ktime_ns);
            }
            Event::ProcessFork { .. } => {
                self.counters.forks += 1;
                self.touch(h, start_time_ticks, false);
            }
            // libcuda calls are accounted by the CUDA ledger (`cuda::ledger`), not the RM ledger.
            Event::CudaAlloc { .. }
            | Event::CudaFree { .. }
            | Event::CudaFunction { .. }
            | Event::CudaLaunch { .. }
            | Event::CudaTimed { .. } => {}
            Event::CgroupRemoved { cgroup_id, .. } => {
                if let Some(c) = self.cgroups.get_mut(cgroup_id) {
                    c.removed = true;
                }
                self.maybe_drop_cgroup(*cgroup_id);
            }
        }
        self.released_any.then_some(self.released_bytes)
    }

    /// Record the command name of a live process (from the caller's enrich step).
    pub fn set_comm(&mut self, tgid: u32, comm: &str) {
        if let Some(p) = self.processes.get_mut(&tgid)
            && p.comm.as_deref() != Some(comm)
        {
            p.comm = Some(comm.to_string());
        }
    }

    /// Record the path of a cgroup that has a row (from the caller's enrich step).
    pub fn set_cgroup_path(&mut self, cgroup_id: u64, path: &str) {
        if let Some(c) = self.cgroups.get_mut(&cgroup_id)
            && c.path.as_deref() != Some(path)
        {
            c.path = Some(path.to_string());
        }
    }

    /// Every tracked process: its incarnation and cgroup (for reconciliation against `/proc`).
    pub fn process_list(&self) -> Vec<(ProcessKey, u64)> {
        self.processes.values().map(|p| (p.key, p.cgroup_id)).collect()
    }

    /// The command name of a tracked process, if known.
    pub fn process_comm(&self, tgid: u32) -> Option<&str> {
        self.processes.get(&tgid).and_then(|p| p.comm.as_deref())
    }

    /// `tgid` was found running by the start-up scan: what it allocated before is unknown.
    pub fn mark_from_before_agent(&mut self, tgid: u32) {
        if let Some(p) = self.processes.get_mut(&tgid) {
            p.completeness.from_before_agent = 1;
        }
    }

    /// `tgid` lost a ledger record at `unix_ns` (the first loss is kept). Returns false when the
    /// process is not tracked.
    pub fn mark_records_lost(&mut self, tgid: u32, unix_ns: u64) -> bool {
        let Some(p) = self.processes.get_mut(&tgid) else { return false };
        let c = &mut p.completeness;
        c.records_lost_since_unix_ns = Some(c.records_lost_since_unix_ns.map_or(unix_ns, |t| t.min(unix_ns)));
        true
    }

    /// Live usage of a process, if it is tracked.
    pub fn process_usage(&self, tgid: u32) -> Option<Usage> {
        self.processes.get(&tgid).map(|p| p.usage)
    }

    /// The state at this moment.
    pub fn snapshot(&self) -> Snapshot {
        let mut processes: Vec<ProcessRow> = self
            .processes
            .values()
            .map(|p| ProcessRow {
                tgid: p.key.tgid,
                start_time_ticks: p.key.start_time_ticks,
                comm: p.comm.clone(),
                cgroup_id: p.cgroup_id,
                fds: p.fds.len(),
                gpu_minors: p.gpu_minors(),
                clients: p.clients.len(),
                handles: p.handles,
                usage: p.usage,
                completeness: p.completeness,
            })
            .collect();
        processes.sort_by_key(|p| p.tgid);
        // Completeness of cgroups, GPUs and the totals: over their live processes.
        let mut by_cgroup: HashMap<u64, Completeness> = HashMap::new();
        let mut by_gpu: HashMap<Option<u32>, Completeness> = HashMap::new();
        let mut total = Completeness::default();
        for p in &processes {
            by_cgroup.entry(p.cgroup_id).or_default().merge(&p.completeness);
            for m in &p.gpu_minors {
                by_gpu.entry(Some(*m)).or_default().merge(&p.completeness);
            }
            total.merge(&p.completeness);
        }
        by_gpu.insert(None, total);
        let mut cgroups: Vec<CgroupRow> = self
            .cgroups
            .iter()
            .map(|(&id, c)| CgroupRow {
                cgroup_id: id,
                path: c.path.clone(),
                processes: c.processes,
                removed: c.removed,
                usage: c.usage,
                completeness: by_cgroup.get(&id).copied().unwrap_or_default(),
            })
            .collect();
        cgroups.sort_by_key(|c| c.cgroup_id);
        let mut gpus: Vec<GpuRow> = self
            .gpus
            .iter()
            .map(|(&minor, &usage)| GpuRow {
                minor,
                usage,
                completeness: by_gpu.get(&minor).copied().unwrap_or_default(),
            })
            .collect();
        // A GPU whose ledger holds nothing yet, used by a process whose ledger is incomplete,
        // still gets a row: its zero is not known to be a zero.
        for (minor, c) in &by_gpu {
            if !c.exact() && !self.gpus.contains_key(minor) {
                gpus.push(GpuRow { minor: *minor, usage: Usage::default(), completeness: *c });
            }
        }
        // Minors in order, the unknown bucket last.
        gpus.sort_by_key(|g| (g.minor.is_none(), g.minor));
        Snapshot {
            totals: Totals {
                usage: self.totals,
                processes: self.processes.len(),
                cgroups: self.cgroups.len(),
                live_allocations: self.allocs.len(),
                completeness: total,
            },
            cgroups,
            processes,
            gpus,
            counters: self.counters.clone(),
        }
    }

    /// Check that every byte bucket adds up across processes, cgroups, GPUs and the total, and
    /// agrees with the live allocations. Returns the first discrepancy.
    pub fn check_invariants(&self) -> Result<(), String> {
        type Field = (&'static str, fn(&Usage) -> u64);
        let fields: [Field; 6] = [
            ("vidmem_bytes", |u| u.vidmem_bytes),
            ("sysmem_bytes", |u| u.sysmem_bytes),
            ("va_reserved_bytes", |u| u.va_reserved_bytes),
            ("managed_bytes", |u| u.managed_bytes),
            ("inferred_vidmem_bytes", |u| u.inferred_vidmem_bytes),
            ("live_allocations", |u| u.live_allocations),
        ];
        for (name, f) in fields {
            let total = f(&self.totals) as u128;
            let p: u128 = self.processes.values().map(|p| f(&p.usage) as u128).sum();
            let c: u128 = self.cgroups.values().map(|c| f(&c.usage) as u128).sum();
            let g: u128 = self.gpus.values().map(|u| f(u) as u128).sum();
            if p != total || c != total || g != total {
                return Err(format!("{name}: processes {p}, cgroups {c}, gpus {g}, total {total}"));
            }
        }
        let mut by_bucket = [0u128; 3];
        for a in self.allocs.values() {
            by_bucket[a.bucket as usize] += a.bytes as u128;
            if a.refs.is_empty() {
                return Err("a live allocation without references".into());
            }
            if !self.processes.contains_key(&a.owner) {
                return Err(format!("allocation charged to gone process {}", a.owner));
            }
        }
        let t = &self.totals;
        if by_bucket != [t.vidmem_bytes as u128, t.sysmem_bytes as u128, t.va_reserved_bytes as u128] {
            return Err(format!("allocations {by_bucket:?} vs totals {t:?}"));
        }
        if self.allocs.len() as u64 != t.live_allocations {
            return Err(format!("{} allocations vs {} live", self.allocs.len(), t.live_allocations));
        }
        let managed: u128 = self.processes.values().flat_map(|p| p.managed.values()).map(|m| m.len as u128).sum();
        if managed != t.managed_bytes as u128 {
            return Err(format!("managed mappings {managed} vs total {}", t.managed_bytes));
        }
        for (&id, c) in &self.cgroups {
            let n = self.processes.values().filter(|p| p.cgroup_id == id).count();
            if n != c.processes {
                return Err(format!("cgroup {id}: {} processes counted, {n} live", c.processes));
            }
        }
        Ok(())
    }

    // ---- processes and cgroups ----

    /// Is a record of `tgid` made at `ktime` from a process whose exit was already applied (a
    /// count-only record that left the bulk ring after the exit left the ledger ring)?
    pub fn is_after_exit(&self, tgid: u32, ktime: u64) -> bool {
        !self.processes.contains_key(&tgid) && self.recent_exits.get(&tgid).is_some_and(|&exit| ktime <= exit)
    }

    fn remember_exit(&mut self, tgid: u32, ktime: u64) {
        if self.recent_exits.insert(tgid, ktime).is_none() {
            self.exit_order.push_back(tgid);
        }
        while self.exit_order.len() > RECENT_EXITS {
            if let Some(old) = self.exit_order.pop_front() {
                self.recent_exits.remove(&old);
            }
        }
    }

    /// Find (or, if `create`, make) the process of an event; handles pid reuse and cgroup moves.
    fn touch(&mut self, h: &Header, start: u64, create: bool) -> Option<u32> {
        let tgid = h.tgid;
        if let Some(p) = self.processes.get(&tgid) {
            let known = p.key.start_time_ticks;
            if start != 0 && known != 0 && known != start {
                self.counters.pid_reuse += 1;
                self.remove_process(tgid, Cause::PidReuse);
            }
        }
        if !self.processes.contains_key(&tgid) {
            if !create {
                return None;
            }
            while self.processes.len() >= self.cfg.max_processes.max(1) {
                let Some(victim) =
                    self.processes.values().min_by_key(|p| (p.last_ktime, p.key.tgid)).map(|p| p.key.tgid)
                else {
                    break;
                };
                self.counters.evicted_processes += 1;
                self.remove_process(victim, Cause::Evicted);
            }
            let key = ProcessKey { tgid, start_time_ticks: start };
            self.processes.insert(tgid, Process::new(key, h.cgroup_id, h.ktime_ns));
            self.cgroup_mut(h.cgroup_id, h.ktime_ns).processes += 1;
        }
        let p = self.processes.get_mut(&tgid)?;
        if p.key.start_time_ticks == 0 {
            p.key.start_time_ticks = start;
        }
        p.last_ktime = p.last_ktime.max(h.ktime_ns);
        let old = p.cgroup_id;
        if old != h.cgroup_id {
            p.cgroup_id = h.cgroup_id;
            if let Some(c) = self.cgroups.get_mut(&old) {
                c.processes = c.processes.saturating_sub(1);
            }
            self.cgroup_mut(h.cgroup_id, h.ktime_ns).processes += 1;
            self.maybe_drop_cgroup(old);
        } else {
            let c = self.cgroup_mut(h.cgroup_id, h.ktime_ns);
            c.last_ktime = c.last_ktime.max(h.ktime_ns);
        }
        Some(tgid)
    }

    /// The row of a cgroup, created if needed (evicting an idle row past the cap).
    fn cgroup_mut(&mut self, id: u64, ktime: u64) -> &mut Cgroup {
        if !self.cgroups.contains_key(&id) && self.cgroups.len() >= self.cfg.max_cgroups {
            let victim = self
                .cgroups
                .iter()
                .filter(|(_, c)| c.processes == 0 && c.usage.is_idle())
                .min_by_key(|&(&id, c)| (c.last_ktime, id))
                .map(|(&id, _)| id);
            if let Some(v) = victim {
                self.cgroups.remove(&v);
                self.counters.evicted_cgroups += 1;
            }
        }
        self.cgroups.entry(id).or_insert_with(|| Cgroup { last_ktime: ktime, ..Cgroup::default() })
    }

    /// Drop a removed cgroup's row once nothing lives in it.
    fn maybe_drop_cgroup(&mut self, id: u64) {
        if self.cgroups.get(&id).is_some_and(|c| c.removed && c.processes == 0 && c.usage.is_idle()) {
            self.cgroups.remove(&id);
            self.counters.cgroups_removed += 1;
        }
    }

    /// Release everything a process holds and forget it.
    fn remove_process(&mut self, tgid: u32, cause: Cause) {
        let Some(p) = self.processes.get(&tgid) else { return };
        let allocs = p.all_allocs();
        let clients: Vec<u32> = p.clients.keys().copied().collect();
        for (client, handle, a) in allocs {
            self.drop_ref(a, ObjRef { tgid, client, handle }, cause);
        }
        let managed: Vec<(u64, ManagedMapping)> =
            self.processes.get_mut(&tgid).map(|p| p.managed.drain().collect()).unwrap_or_default();
        for (_, m) in managed {
            self.uncharge_managed(tgid, m);
        }
        for c in clients {
            if self.client_owner.get(&c) == Some(&tgid) {
                self.client_owner.remove(&c);
            }
        }
        if let Some(p) = self.processes.remove(&tgid) {
            debug_assert!(p.usage.is_idle(), "process {tgid} removed with live usage {:?}", p.usage);
            if let Some(c) = self.cgroups.get_mut(&p.cgroup_id) {
                c.processes = c.processes.saturating_sub(1);
            }
            self.maybe_drop_cgroup(p.cgroup_id);
        }
    }

    // ---- fds ----

    fn add_fd(&mut self, tgid: u32, fd: i32, device: Device, cloexec: bool) {
        let max = self.cfg.max_fds_per_process;
        let Some(p) = self.processes.get_mut(&tgid) else { return };
        if p.fds.len() >= max {
            self.counters.fd_table_full += 1;
            return;
        }
        p.fds.insert(fd, FdEntry { device, cloexec });
        *p.file_refs.entry(device.file_id).or_default() += 1;
    }

    /// Close an fd; when it was the last one on its file, release the clients created through it.
    fn close_fd(&mut self, tgid: u32, fd: i32) {
        let Some(p) = self.processes.get_mut(&tgid) else { return };
        let Some(entry) = p.fds.remove(&fd) else {
            self.counters.unknown_fd_closes += 1;
            return;
        };
        let file_id = entry.device.file_id;
        let last = match p.file_refs.get_mut(&file_id) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => {
                p.file_refs.remove(&file_id);
                true
            }
        };
        if !last {
            return;
        }
        let clients: Vec<u32> = p.clients.iter().filter(|(_, c)| c.file_id == Some(file_id)).map(|(&h, _)| h).collect();
        for client in clients {
            self.free_in(tgid, client, client, Some(Cause::FdRelease));
        }
    }

    // ---- managed memory ----

    fn map_managed(&mut self, tgid: u32, addr: u64, len: u64) {
        let max = self.cfg.max_managed_per_process;
        let Some(p) = self.processes.get_mut(&tgid) else { return };
        if let Some(old) = p.managed.remove(&addr) {
            self.uncharge_managed(tgid, old);
        }
        let Some(p) = self.processes.get_mut(&tgid) else { return };
        if p.managed.len() >= max {
            self.counters.managed_table_full += 1;
            return;
        }
        let m = ManagedMapping { len, cgroup_id: p.cgroup_id };
        p.managed.insert(addr, m);
        let f = |u: &mut Usage| {
            u.managed_bytes = u.managed_bytes.saturating_add(len);
            u.managed_mappings += 1;
        };
        self.rows(tgid, m.cgroup_id, None, f);
    }

    fn unmap_managed(&mut self, tgid: u32, addr: u64) {
        match self.processes.get_mut(&tgid).and_then(|p| p.managed.remove(&addr)) {
            Some(m) => self.uncharge_managed(tgid, m),
            None => self.counters.unknown_munmaps += 1,
        }
    }

    fn uncharge_managed(&mut self, tgid: u32, m: ManagedMapping) {
        self.released_any = true;
        self.released_bytes = self.released_bytes.saturating_add(m.len);
        let f = |u: &mut Usage| {
            u.managed_bytes = u.managed_bytes.saturating_sub(m.len);
            u.managed_mappings = u.managed_mappings.saturating_sub(1);
        };
        self.rows(tgid, m.cgroup_id, None, f);
        self.maybe_drop_cgroup(m.cgroup_id);
    }

    // ---- accounting ----

    /// Apply `f` to the rows of a process, a cgroup, a GPU bucket and the total.
    fn rows(&mut self, tgid: u32, cgroup_id: u64, gpu: Option<u32>, f: impl Fn(&mut Usage)) {
        if let Some(p) = self.processes.get_mut(&tgid) {
            f(&mut p.usage);
        }
        match self.processes.get(&tgid).map(|p| p.last_ktime) {
            Some(ktime) => f(&mut self.cgroup_mut(cgroup_id, ktime).usage),
            // A record read after its process's exit: its cgroup's row, if it still has one (a
            // row dropped with its removed cgroup is not brought back).
            None => {
                if let Some(c) = self.cgroups.get_mut(&cgroup_id) {
                    f(&mut c.usage);
                }
            }
        }
        f(self.gpus.entry(gpu).or_default());
        f(&mut self.totals);
    }

    fn charge(&mut self, a: &Allocation, new: bool) {
        let (bytes, bucket, inferred) = (a.bytes, a.bucket, a.inferred);
        let f = |u: &mut Usage| {
            match bucket {
                Bucket::Vidmem => u.vidmem_bytes = u.vidmem_bytes.saturating_add(bytes),
                Bucket::Sysmem => u.sysmem_bytes = u.sysmem_bytes.saturating_add(bytes),
                Bucket::VaOnly => u.va_reserved_bytes = u.va_reserved_bytes.saturating_add(bytes),
            }
            if inferred && bucket == Bucket::Vidmem {
                u.inferred_vidmem_bytes = u.inferred_vidmem_bytes.saturating_add(bytes);
            }
            u.live_allocations += 1;
            if new {
                u.allocations += 1;
            }
        };
        self.rows(a.owner, a.cgroup_id, a.gpu, f);
    }

    fn uncharge(&mut self, a: &Allocation, release: bool) {
        let (bytes, bucket, inferred) = (a.bytes, a.bucket, a.inferred);
        let f = |u: &mut Usage| {
            match bucket {
                Bucket::Vidmem => u.vidmem_bytes = u.vidmem_bytes.saturating_sub(bytes),
                Bucket::Sysmem => u.sysmem_bytes = u.sysmem_bytes.saturating_sub(bytes),
                Bucket::VaOnly => u.va_reserved_bytes = u.va_reserved_bytes.saturating_sub(bytes),
            }
            if inferred && bucket == Bucket::Vidmem {
                u.inferred_vidmem_bytes = u.inferred_vidmem_bytes.saturating_sub(bytes);
            }
            u.live_allocations = u.live_allocations.saturating_sub(1);
            if release {
                u.frees += 1;
            }
        };
        self.rows(a.owner, a.cgroup_id, a.gpu, f);
        self.maybe_drop_cgroup(a.cgroup_id);
    }

    /// Drop one reference to an allocation: release it with the last one, or move the charge if
    /// the owner no longer refers to it.
    fn drop_ref(&mut self, id: AllocId, r: ObjRef, cause: Cause) {
        let Some(a) = self.allocs.get_mut(&id) else { return };
        a.refs.retain(|x| *x != r);
        if a.refs.is_empty() {
            let Some(a) = self.allocs.remove(&id) else { return };
            self.uncharge(&a, true);
            self.counters.frees += 1;
            *self.counters.released_by.entry(cause.as_str()).or_default() += 1;
            self.released_any = true;
            if a.bucket != Bucket::VaOnly {
                self.released_bytes = self.released_bytes.saturating_add(a.bytes);
            }
            return;
        }
        if a.owner == r.tgid && !a.refs.iter().any(|x| x.tgid == a.owner) {
            let new_owner = a.refs[0].tgid;
            let old = a.clone();
            self.uncharge(&old, false);
            let cgroup_id = self.processes.get(&new_owner).map_or(old.cgroup_id, |p| p.cgroup_id);
            if let Some(a) = self.allocs.get_mut(&id) {
                a.owner = new_owner;
                a.cgroup_id = cgroup_id;
                let moved = a.clone();
                self.charge(&moved, false);
                self.counters.ownership_transfers += 1;
            }
        }
    }

    // ---- RM handles ----

    /// The process that holds `client`: the caller if it does, else the recorded owner.
    fn client_holder(&self, tgid: u32, client: u32) -> Option<u32> {
        if self.processes.get(&tgid).is_some_and(|p| p.clients.contains_key(&client)) {
            return Some(tgid);
        }
        let owner = *self.client_owner.get(&client)?;
        self.processes.get(&owner).filter(|p| p.clients.contains_key(&client)).map(|_| owner)
    }

    /// Free `handle` (and descendants) of `client` held by `owner`. `forced` overrides the cause.
    fn free_in(&mut self, owner: u32, client: u32, handle: u32, forced: Option<Cause>) -> bool {
        let Some(removed) = self.processes.get_mut(&owner).and_then(|p| p.remove_subtree(client, handle)) else {
            return false;
        };
        if handle == client && self.client_owner.get(&client) == Some(&owner) {
            self.client_owner.remove(&client);
        }
        for (h, a) in removed {
            let cause = forced.unwrap_or(if handle == client {
                Cause::ClientFree
            } else if h == handle {
                Cause::Free
            } else {
                Cause::ParentFree
            });
            self.drop_ref(a, ObjRef { tgid: owner, client, handle: h }, cause);
        }
        true
    }

    fn free_handle(&mut self, tgid: u32, client: u32, handle: u32) {
        let freed = match self.client_holder(tgid, client) {
            Some(owner) => self.free_in(owner, client, handle, None),
            None => false,
        };
        if !freed {
            self.counters.unknown_handle_frees += 1;
        }
    }

    /// Make room for a new `handle` in `client` of `tgid` (replacing a stale one) and make sure the
    /// client exists. Returns false if the handle table is full.
    fn prepare_object(&mut self, tgid: u32, dev: &Device, client: u32, handle: u32) -> bool {
        let file_id = (dev.kind == DeviceKind::Ctl).then_some(dev.file_id);
        let max = self.cfg.max_handles_per_process;
        let exists = self
            .processes
            .get(&tgid)
            .and_then(|p| p.clients.get(&client))
            .is_some_and(|c| c.objects.contains_key(&handle));
        if exists {
            self.counters.stale_handles_replaced += 1;
            self.free_in(tgid, client, handle, Some(Cause::Replaced));
        }
        let Some(p) = self.processes.get_mut(&tgid) else { return false };
        if !p.ensure_client(client, file_id, max) {
            return false;
        }
        self.client_owner.entry(client).or_insert(tgid);
        true
    }

    /// A new RM object, optionally with memory.
    #[allow(clippy::too_many_arguments)]
    fn new_object(
        &mut self,
        tgid: u32,
        dev: &Device,
        client: u32,
        parent: u32,
        handle: u32,
        class: Option<u32>,
        memory: Option<MemoryAlloc>,
        device_instance: Option<u32>,
    ) {
        if let Some(c) = class
            && class::is_root(c)
        {
            self.new_client(tgid, dev, handle, c);
            return;
        }
        // An object cannot be its own parent, nor replace its client.
        let parent = if parent == handle { client } else { parent };
        if handle == client {
            return;
        }
        let max = self.cfg.max_handles_per_process;
        let inserted = self.prepare_object(tgid, dev, client, handle)
            && self.processes.get_mut(&tgid).is_some_and(|p| {
                let mut o = Object::new(Some(parent), class);
                o.device_instance = device_instance;
                p.insert_object(client, parent, handle, o, max)
            });
        if !inserted {
            self.counters.handle_table_full += 1;
            if memory.is_some() {
                self.counters.untracked_allocations += 1;
            }
            return;
        }
        let Some(mut m) = memory else { return };
        if m.bytes > MAX_PLAUSIBLE_ALLOCATION_BYTES {
            // The size read back from user memory is garbage (e.g. rewritten by another thread
            // during the call): keep the object so its free matches, but charge nothing.
            self.counters.implausible_sizes += 1;
            m.bytes = 0;
        }
        let deviceless = class == Some(class::NV01_MEMORY_DEVICELESS);
        let (gpu, inferred) = self.attribute(tgid, client, handle, deviceless);
        let cgroup_id = self.processes.get(&tgid).map_or(0, |p| p.cgroup_id);
        let id = self.next_alloc;
        self.next_alloc += 1;
        let a = Allocation {
            bytes: m.bytes,
            bucket: Bucket::of(&m),
            gpu,
            inferred,
            owner: tgid,
            cgroup_id,
            refs: vec![ObjRef { tgid, client, handle }],
        };
        self.charge(&a, true);
        self.allocs.insert(id, a);
        self.counters.allocations += 1;
        if let Some(o) = self
            .processes
            .get_mut(&tgid)
            .and_then(|p| p.clients.get_mut(&client))
            .and_then(|c| c.objects.get_mut(&handle))
        {
            o.alloc = Some(id);
        }
    }

    fn new_client(&mut self, tgid: u32, dev: &Device, handle: u32, class: u32) {
        // A client handle still tracked (here or in another process) was freed unseen.
        if let Some(owner) = self.client_holder(tgid, handle) {
            self.counters.stale_handles_replaced += 1;
            self.free_in(owner, handle, handle, Some(Cause::Replaced));
        }
        let file_id = (dev.kind == DeviceKind::Ctl).then_some(dev.file_id);
        let max = self.cfg.max_handles_per_process;
        let Some(p) = self.processes.get_mut(&tgid) else { return };
        if !p.ensure_client(handle, file_id, max) {
            self.counters.handle_table_full += 1;
            return;
        }
        if let Some(root) = p.clients.get_mut(&handle).and_then(|c| c.objects.get_mut(&handle)) {
            root.class = Some(class);
        }
        self.client_owner.insert(handle, tgid);
    }

    /// Which GPU bucket memory under `handle` goes to, and whether that was inferred.
    fn attribute(&mut self, tgid: u32, client: u32, handle: u32, deviceless: bool) -> (Option<u32>, bool) {
        let Some(p) = self.processes.get(&tgid) else { return (None, false) };
        if !deviceless {
            let minors = p.gpu_minors();
            if let [only] = minors.as_slice()
                && let Some(m) = gpu_key(*only)
            {
                return (Some(m), false);
            }
            if let Some(Some(d)) = p.device_of(client, handle)
                && let Some(m) = gpu_key(d)
            {
                self.counters.inferred_gpu_attributions += 1;
                return (Some(m), true);
            }
        }
        self.counters.unknown_gpu_attributions += 1;
        (None, false)
    }

    fn dup_object(&mut self, tgid: u32, dev: &Device, client: u32, parent: u32, handle: u32, src: (u32, u32)) {
        let (src_client, src_handle) = src;
        let source = self.client_holder(tgid, src_client).and_then(|owner| {
            let o = self.processes.get(&owner)?.clients.get(&src_client)?.objects.get(&src_handle)?;
            Some((o.class, o.device_instance, o.alloc))
        });
        let (class, device_instance, alloc) = match source {
            Some(s) => s,
            None => {
                self.counters.dup_unknown_source += 1;
                (None, None, None)
            }
        };
        if class.is_some_and(class::is_root) || handle == client {
            return;
        }
        let parent = if parent == handle { client } else { parent };
        let max = self.cfg.max_handles_per_process;
        let inserted = self.prepare_object(tgid, dev, client, handle)
            && self.processes.get_mut(&tgid).is_some_and(|p| {
                let mut o = Object::new(Some(parent), class);
                o.device_instance = device_instance;
                p.insert_object(client, parent, handle, o, max)
            });
        if !inserted {
            self.counters.handle_table_full += 1;
            return;
        }
        // The source may have been the replaced handle itself (dup onto its own handle).
        let Some(id) = alloc.filter(|id| self.allocs.contains_key(id)) else { return };
        if let Some(a) = self.allocs.get_mut(&id) {
            a.refs.push(ObjRef { tgid, client, handle });
        }
        if let Some(o) = self
            .processes
            .get_mut(&tgid)
            .and_then(|p| p.clients.get_mut(&client))
            .and_then(|c| c.objects.get_mut(&handle))
        {
            o.alloc = Some(id);
        }
        self.counters.dup_references += 1;
    }

    /// Apply an ioctl of `tgid`, made in `record_cgroup` (the record's cgroup: used only when the
    /// process is not known, i.e. a count-only record read after the process's exit).
    fn ioctl(&mut self, tgid: u32, record_cgroup: u64, e: &IoctlEvent) {
        let op_name = e.op.kind_name();
        *self.counters.ioctls_by_op.entry(op_name).or_default() += 1;
        *self.counters.ioctls_by_device.entry(e.device.kind.as_str()).or_default() += 1;
        let gpu_row = if e.device.kind == DeviceKind::Gpu { gpu_key(e.device.minor) } else { None };
        let cgroup_id = self.processes.get(&tgid).map_or(record_cgroup, |p| p.cgroup_id);
        self.count_rows(tgid, cgroup_id, gpu_row, |u| u.ioctls += 1);
        if let IoctlOp::RmControl { cmd, .. } = e.op {
            let max = self.cfg.max_control_cmds;
            let table = &mut self.counters.rm_control_by_cmd;
            if let Some(n) = table.get_mut(&cmd) {
                *n += 1;
            } else if table.len() < max {
                table.insert(cmd, 1);
            } else {
                self.counters.rm_control_other += 1;
            }
        }
        if let IoctlOp::Malformed { reason, .. } = e.op {
            *self.counters.malformed_by_reason.entry(reason.as_str()).or_default() += 1;
            return;
        }
        if !e.succeeded() {
            *self.counters.failed_by_op.entry(op_name).or_default() += 1;
            self.count_rows(tgid, cgroup_id, gpu_row, |u| u.failed_calls += 1);
            return;
        }
        let dev = &e.device;
        match e.op {
            IoctlOp::RmAlloc { client, parent, handle, class, memory, device_instance, .. } => {
                self.new_object(tgid, dev, client, parent, handle, Some(class), memory, device_instance);
            }
            IoctlOp::AllocMemory { client, parent, handle, class, memory, .. } => {
                self.new_object(tgid, dev, client, parent, handle, Some(class), Some(memory), None);
            }
            IoctlOp::VidHeapAlloc { client, parent, handle, bytes, virtual_only, location, .. } => {
                let kind = if virtual_only { MemoryKind::VirtualOnly } else { MemoryKind::Physical };
                let m = MemoryAlloc { bytes, location, kind };
                self.new_object(tgid, dev, client, parent, handle, None, Some(m), None);
            }
            IoctlOp::RmFree { client, handle, .. } | IoctlOp::VidHeapFree { client, handle, .. } => {
                self.free_handle(tgid, client, handle);
            }
            IoctlOp::RmDupObject { client, parent, handle, src_client, src_handle, .. } => {
                self.dup_object(tgid, dev, client, parent, handle, (src_client, src_handle));
            }
            IoctlOp::UvmMapExternal { .. } => self.counters.uvm_map_external += 1,
            IoctlOp::UvmUnmapExternal { .. } => self.counters.uvm_unmap_external += 1,
            IoctlOp::UvmFree { .. } => self.counters.uvm_free += 1,
            _ => {}
        }
    }

    /// Count on the process, its current cgroup, a GPU row (only for ioctls on a GPU node) and the
    /// total (without a process: the cgroup's row if it has one, the GPU row and the total). Counts
    /// are not byte buckets: the GPU rows do not sum to the total.
    fn count_rows(&mut self, tgid: u32, cgroup_id: u64, gpu: Option<u32>, f: impl Fn(&mut Usage)) {
        if let Some(p) = self.processes.get_mut(&tgid) {
            f(&mut p.usage);
        }
        match self.processes.get(&tgid).map(|p| p.last_ktime) {
            Some(ktime) => f(&mut self.cgroup_mut(cgroup_id, ktime).usage),
            // A record read after its process's exit: its cgroup's row, if it still has one (a
            // row dropped with its removed cgroup is not brought back).
            None => {
                if let Some(c) = self.cgroups.get_mut(&cgroup_id) {
                    f(&mut c.usage);
                }
            }
        }
        if gpu.is_some() {
            f(self.gpus.entry(gpu).or_default());
        }
        f(&mut self.totals);
    }
}

impl Default for TracerState {
    fn default() -> Self {
        Self::with_config(StateConfig::default())
    }
}
