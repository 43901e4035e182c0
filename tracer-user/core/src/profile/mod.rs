//! `gpu-tracer profile`: a deep-dive recording of one workload's GPU activity over a window, from
//! the event stream (per-event launches, CUDA allocations and frees, the driver's allocations),
//! recorded here ([`Recorder`] → [`Recording`]); the client writes it as a Perfetto trace and a
//! summary (`tracer_client::profile`), the agent records it (`tracer_agent::profile`).
//!
//! The recorder reads `gputracer.v1.Event`s, the stream's own messages, so a session fed by this
//! process's probes and one fed by a running agent's `Subscribe` stream are recorded the same way.
use std::collections::{BTreeMap, BTreeSet};

use gpu_tracer_proto::v1::{self, event::Payload};

pub mod gpus;

/// Which workload a session records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// One process (its threads included).
    Pid(u32),
    /// Every process of these cgroups (a container, a pod's containers), by cgroup id.
    Cgroups(BTreeSet<u64>),
}

impl Target {
    /// Is an event of process `tgid` in cgroup `cgroup_id` this workload's?
    pub fn selects(&self, tgid: u32, cgroup_id: u64) -> bool {
        match self {
            Target::Pid(p) => tgid == *p,
            Target::Cgroups(ids) => ids.contains(&cgroup_id),
        }
    }

    /// One cgroup.
    pub fn cgroup(id: u64) -> Target {
        Target::Cgroups([id].into())
    }

    /// `pid N`, `cgroup N`, `cgroups N, M`.
    pub fn describe(&self) -> String {
        match self {
            Target::Pid(p) => format!("pid {p}"),
            Target::Cgroups(ids) if ids.len() == 1 => format!("cgroup {}", ids.first().unwrap_or(&0)),
            Target::Cgroups(ids) => {
                format!("cgroups {}", ids.iter().map(u64::to_string).collect::<Vec<_>>().join(", "))
            }
        }
    }
}

/// The workload, as the user named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    /// A host PID.
    Pid(u32),
    /// A cgroup path relative to the cgroup2 mount (as in `/proc/PID/cgroup`) or a cgroup id.
    Cgroup(String),
    /// A pod's containers: all of them, or the one named.
    Pod { namespace: String, name: String, container: Option<String> },
}

impl TargetSpec {
    /// `NS/NAME` (and `--container`) as a [`TargetSpec::Pod`].
    pub fn pod(ns_name: &str, container: Option<&str>) -> Result<TargetSpec, String> {
        match ns_name.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => Ok(TargetSpec::Pod {
                namespace: ns.to_string(),
                name: name.to_string(),
                container: container.filter(|c| !c.is_empty()).map(str::to_string),
            }),
            _ => Err(format!("--pod {ns_name}: give NAMESPACE/NAME, e.g. --pod ml/trainer-0")),
        }
    }

    /// How the user wrote it.
    pub fn describe(&self) -> String {
        match self {
            TargetSpec::Pid(p) => format!("pid {p}"),
            TargetSpec::Cgroup(c) => format!("cgroup {c}"),
            TargetSpec::Pod { namespace, name, container: Some(c) } => format!("pod {namespace}/{name} container {c}"),
            TargetSpec::Pod { namespace, name, container: None } => format!("pod {namespace}/{name}"),
        }
    }
}

/// What a session keeps at most; what a limit cut is said in the summary, never silently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Events kept (launches, allocations, frees); later ones are counted, not kept.
    pub max_events: u64,
}

impl Default for Limits {
    fn default() -> Self {
        // About 60 bytes each in the trace: ~2 M events stay well under the 200 MB a trace may take.
        Limits { max_events: 2_000_000 }
    }
}

/// One kernel (or graph) launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub ktime_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    pub entry_point: String,
    /// The kernel's name, or `function 0x…` when the lookup that named it was not seen.
    pub name: String,
    pub named: bool,
    pub function: u64,
    pub stream: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
}

/// A CUDA allocation (successful or not) or free, or a driver-side (RM) allocation or free.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryCall {
    /// When the call was entered (libcuda allocations and the driver's calls, measured by entry
    /// and return probes; never before the window's start); `ktime_ns` for frees seen at entry only.
    pub start_ktime_ns: u64,
    /// When it returned (or, for a free seen at entry only, when it was called).
    pub ktime_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    pub entry_point: String,
    pub kind: MemoryKind,
    /// The pointer (or handle) allocated or freed; for driver calls the RM handle.
    pub ptr: u64,
    /// Requested (allocations) or released (frees, per the agent's ledger; 0 when unknown).
    pub bytes: u64,
    pub success: bool,
}

/// Which ledger a [`MemoryCall`] belongs to, and which way it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryKind {
    CudaAlloc,
    CudaFree,
    DriverAlloc,
    DriverFree,
}

/// A timed libcuda call: synchronisation, an event record, query or wait, a copy, a memset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub start_ktime_ns: u64,
    pub end_ktime_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    pub entry_point: String,
    /// `synchronize`, `query`, `wait`, `record`, `copy`, `memset`.
    pub class: String,
    pub stream: Option<u64>,
    pub event: Option<u64>,
    pub bytes: u64,
    pub direction: String,
    pub is_async: bool,
    pub result: u32,
}

/// What is known of one recorded process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Process {
    pub comm: String,
    /// `namespace/pod/container` when the agent knew the container, else empty.
    pub pod: String,
    pub cgroup_path: String,
    /// Threads seen, with the first time each was seen.
    pub threads: BTreeMap<u32, u64>,
    /// When its last thread exited, if inside the window.
    pub exited_ktime_ns: Option<u64>,
}

impl Process {
    /// The name the trace gives the process: the pod's identity when known, then the command.
    pub fn display_name(&self, tgid: u32) -> String {
        match (self.pod.is_empty(), self.comm.is_empty()) {
            (false, false) => format!("{} ({})", self.pod, self.comm),
            (false, true) => self.pod.clone(),
            (true, false) => format!("{} [{tgid}]", self.comm),
            (true, true) => format!("process {tgid}"),
        }
    }
}

/// Everything one session recorded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recording {
    /// The window, on the events' clock (`ktime_ns`, CLOCK_MONOTONIC).
    pub start_ktime_ns: u64,
    pub end_ktime_ns: u64,
    pub processes: BTreeMap<u32, Process>,
    pub launches: Vec<Launch>,
    pub memory: Vec<MemoryCall>,
    pub calls: Vec<Call>,
    /// Events of the workload seen (kept or not).
    pub events_seen: u64,
    /// Events not kept because [`Limits::max_events`] was reached.
    pub events_over_limit: u64,
    /// Events the tracer dropped during the window (its own accounting: ring buffer full, …).
    pub tracer_dropped: u64,
    /// Launch counts from count mode (batches) seen in the window, per process: what the kernel
    /// counted, against which the per-event launches are checked.
    pub counted_launches: BTreeMap<u32, u64>,
    /// Why the session ended (`duration`, `signal`, `workload exited`, `event limit`, `agent
    /// stopped`).
    pub ended_by: String,
    /// The workload as a person reads it (`ns/pod/container`, `pid 4242 (python)`).
    pub workload: String,
    /// NVML's passes over the node's GPUs during the window (all GPUs; [`gpus`] picks those the
    /// workload used).
    pub gpu_samples: Vec<v1::GpuSample>,
    /// Where the events came from: `standalone` (this process's probes) or `agent ADDR`.
    pub source: String,
    /// What the user should know about the recording (calls not probed, how the end was known).
    pub notes: Vec<String>,
    /// What each process held when the window began (from the agent's ledgers, `profile
    /// --connect`): the memory counters start there. `None` where it is not known (a standalone
    /// session's probes start with it, so the allocations made before are not in its ledger).
    pub held_at_start: Option<BTreeMap<u32, HeldAtStart>>,
}

/// A process's memory when the window began, as the agent's ledgers booked it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeldAtStart {
    /// Through the driver: device, system and VA reservations (what RM allocations move).
    pub driver_bytes: u64,
    /// Live CUDA allocations (device, host, managed).
    pub cuda_bytes: u64,
}

/// Takes the event stream of a session and keeps the target's events.
pub struct Recorder {
    target: Target,
    limits: Limits,
    rec: Recording,
    kept: u64,
}

impl Recorder {
    /// A session on `target` starting at `start_ktime_ns`.
    pub fn new(target: Target, limits: Limits, start_ktime_ns: u64) -> Self {
        let rec = Recording { start_ktime_ns, end_ktime_ns: start_ktime_ns, ..Default::default() };
        Recorder { target, limits, rec, kept: 0 }
    }

    /// The target.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// What is recorded so far.
    pub fn recording(&self) -> &Recording {
        &self.rec
    }

    /// Has the event limit cut the recording?
    pub fn limit_reached(&self) -> bool {
        self.rec.events_over_limit > 0
    }

    /// Has the target process exited (only for [`Target::Pid`])?
    pub fn target_exited(&self) -> bool {
        match self.target {
            Target::Pid(p) => self.rec.processes.get(&p).is_some_and(|p| p.exited_ktime_ns.is_some()),
            Target::Cgroups(_) => false,
        }
    }

    /// Take one event; events of other workloads and from before the window are ignored.
    pub fn event(&mut self, ev: &v1::Event) {
        let (Some(h), Some(p)) = (ev.header.as_ref(), ev.payload.as_ref()) else { return };
        if !self.target.selects(h.tgid, h.cgroup_id) || h.ktime_ns < self.rec.start_ktime_ns {
            return;
        }
        let keep = match p {
            Payload::CudaLaunch(_)
            | Payload::CudaCall(_)
            | Payload::CudaAlloc(_)
            | Payload::CudaFree(_)
            | Payload::RmAlloc(_)
            | Payload::VidHeapAlloc(_)
            | Payload::AllocMemory(_)
            | Payload::RmFree(_)
            | Payload::VidHeapFree(_) => true,
            Payload::CudaLaunchBatch(b) => {
                *self.rec.counted_launches.entry(h.tgid).or_default() += b.launches;
                false
            }
            Payload::ProcessExit(_) => {
                self.process(h).exited_ktime_ns = Some(h.ktime_ns);
                false
            }
            _ => false,
        };
        if !keep {
            return;
        }
        self.rec.events_seen += 1;
        if self.kept >= self.limits.max_events {
            self.rec.events_over_limit += 1;
            return;
        }
        self.kept += 1;
        self.rec.end_ktime_ns = self.rec.end_ktime_ns.max(h.ktime_ns);
        self.process(h).threads.entry(h.pid).or_insert(h.ktime_ns);
        // A call that began before the window is drawn from the window's start.
        let start_ktime_ns = h.ktime_ns.saturating_sub(h.duration_ns).max(self.rec.start_ktime_ns);
        let call = |kind, entry_point: &str, ptr, bytes, success| MemoryCall {
            start_ktime_ns,
            ktime_ns: h.ktime_ns,
            tgid: h.tgid,
            tid: h.pid,
            entry_point: entry_point.to_string(),
            kind,
            ptr,
            bytes,
            success,
        };
        match p {
            Payload::CudaLaunch(l) => {
                let named = !l.kernel_name.is_empty();
                self.rec.launches.push(Launch {
                    ktime_ns: h.ktime_ns,
                    tgid: h.tgid,
                    tid: h.pid,
                    entry_point: l.entry_point.clone(),
                    name: if named { l.kernel_name.clone() } else { format!("function {:#x}", l.function) },
                    named,
                    function: l.function,
                    stream: l.stream,
                    grid: three(&l.grid),
                    block: three(&l.block),
                    shared_mem_bytes: l.shared_mem_bytes,
                });
            }
            Payload::CudaCall(c) => self.rec.calls.push(Call {
                start_ktime_ns,
                end_ktime_ns: h.ktime_ns,
                tgid: h.tgid,
                tid: h.pid,
                entry_point: c.entry_point.clone(),
                class: c.class.clone(),
                stream: c.stream,
                event: c.event,
                bytes: c.bytes,
                direction: c.direction.clone(),
                is_async: c.r#async,
                result: c.result,
            }),
            Payload::CudaAlloc(a) => {
                self.rec.memory.push(call(MemoryKind::CudaAlloc, &a.entry_point, a.ptr, a.bytes, a.success))
            }
            Payload::CudaFree(f) => {
                self.rec.memory.push(call(MemoryKind::CudaFree, &f.entry_point, f.ptr, f.bytes_released, true))
            }
            Payload::RmAlloc(a) => self.rec.memory.push(call(
                MemoryKind::DriverAlloc,
                "NV_ESC_RM_ALLOC",
                a.handle.into(),
                a.bytes,
                a.success,
            )),
            Payload::VidHeapAlloc(a) => {
                self.rec.memory.push(call(MemoryKind::DriverAlloc, "NVOS32 ALLOC", a.handle.into(), a.bytes, a.success))
            }
            Payload::AllocMemory(a) => self.rec.memory.push(call(
                MemoryKind::DriverAlloc,
                "NV_ESC_RM_ALLOC_MEMORY",
                a.handle.into(),
                a.bytes,
                a.success,
            )),
            Payload::RmFree(f) => self.rec.memory.push(call(
                MemoryKind::DriverFree,
                "NV_ESC_RM_FREE",
                f.handle.into(),
                f.bytes_released,
                f.success,
            )),
            Payload::VidHeapFree(f) => self.rec.memory.push(call(
                MemoryKind::DriverFree,
                "NVOS32 FREE",
                f.handle.into(),
                f.bytes_released,
                f.success,
            )),
            _ => {}
        }
    }

    /// One NVML pass (the node's GPUs); a pass already taken (same time) is ignored.
    pub fn nvml(&mut self, gpus: &[v1::GpuSample]) {
        let last = self.rec.gpu_samples.last().map_or(0, |g| g.ktime_ns);
        self.rec.gpu_samples.extend(gpus.iter().filter(|g| g.ktime_ns > last).cloned());
    }

    /// Launches the in-kernel counts saw for (`tgid`, `cgroup_id`) since the last call.
    pub fn counted(&mut self, tgid: u32, cgroup_id: u64, launches: u64) {
        if self.target.selects(tgid, cgroup_id) {
            *self.rec.counted_launches.entry(tgid).or_default() += launches;
        }
    }

    fn process(&mut self, h: &v1::Header) -> &mut Process {
        let p = self.rec.processes.entry(h.tgid).or_default();
        if p.comm.is_empty() && !h.comm.is_empty() {
            p.comm = h.comm.clone();
        }
        if p.cgroup_path.is_empty() && !h.cgroup_path.is_empty() {
            p.cgroup_path = h.cgroup_path.clone();
        }
        if p.pod.is_empty()
            && let Some(c) = h.container.as_ref().filter(|c| !c.pod.is_empty())
        {
            p.pod = format!("{}/{}/{}", c.namespace, c.pod, c.container);
        }
        p
    }

    /// End the session at `end_ktime_ns`, for `reason`, with the tracer's drops during it.
    pub fn finish(mut self, end_ktime_ns: u64, reason: &str, tracer_dropped: u64) -> Recording {
        self.rec.end_ktime_ns = self.rec.end_ktime_ns.max(end_ktime_ns);
        self.rec.ended_by = reason.to_string();
        self.rec.tracer_dropped = tracer_dropped;
        self.rec
    }
}

fn three(v: &[u32]) -> [u32; 3] {
    [v.first().copied().unwrap_or(0), v.get(1).copied().unwrap_or(0), v.get(2).copied().unwrap_or(0)]
}
