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

mod handles;
mod ledger;
pub mod snapshot;
#[cfg(test)]
mod tests;
mod view;

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use tracer_common::nv::class;

pub use snapshot::{CgroupRow, Completeness, GpuRow, ProcessRow, Snapshot, StateCounters, Totals, Usage};

use crate::decode::{Device, DeviceKind, Event, Header, IoctlEvent, IoctlOp, Location, MemoryAlloc, MemoryKind};
use ledger::{AllocId, FdEntry, ManagedMapping, Object, Process};

/// Allocations larger than this (256 TiB, more than any GPU or host has) are garbage sizes read
/// from user memory: counted in `implausible_sizes` and charged as zero bytes.
pub(crate) const MAX_PLAUSIBLE_ALLOCATION_BYTES: u64 = 1 << 48;

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
    pub(crate) fn with_config(cfg: StateConfig) -> Self {
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

    /// The memory a tracked process holds through the driver now: device, system and VA
    /// reservations (what its RM allocations and frees move), if it is tracked.
    pub fn process_driver_bytes(&self, tgid: u32) -> Option<u64> {
        self.processes.get(&tgid).map(|p| p.usage.vidmem_bytes + p.usage.sysmem_bytes + p.usage.va_reserved_bytes)
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

    #[cfg(test)]
    /// Live usage of a process, if it is tracked.
    pub(crate) fn process_usage(&self, tgid: u32) -> Option<Usage> {
        self.processes.get(&tgid).map(|p| p.usage)
    }

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
}

impl Default for TracerState {
    fn default() -> Self {
        Self::with_config(StateConfig::default())
    }
}
