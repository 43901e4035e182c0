//! Ingest: one ring-buffer record through the stages, as a chain of small named steps —
//! decode → track fds → apply to the ledgers → enrich → emit → after (exit cleanup, fork seeding,
//! cgroup removal). Also the `/proc` seeding, which feeds synthetic open records through the same
//! chain.
use tracer_common::record_as_bytes;

use super::Agent;
use crate::{enrich::ProcessInfo, source::procscan};
use tracer_core::{
    clock,
    decode::{self, Event, Header},
    model::EventContext,
};

/// Where events go after the pipeline applied them (the event stream, a test, or nowhere).
pub(crate) type EventSink<'a> = dyn FnMut(&Event, &EventContext) + 'a;

/// What applying an event to the ledgers said about it.
#[derive(Default)]
struct Applied {
    /// Bytes an RM free, a cuMemFree or a process exit released.
    released_bytes: Option<u64>,
    /// For a launch: the kernel name of its function handle, when a lookup named it.
    kernel_name: Option<String>,
}

impl Agent {
    /// One record, from bytes to the sink.
    pub(super) fn ingest(&mut self, bytes: &[u8], sink: &mut EventSink<'_>) {
        let Some(ev) = self.decode(bytes) else { return };
        let h = *ev.header();
        let process = self.enrich.process(h.tgid);
        self.track_fds(&ev);
        let applied = self.apply(&ev, process.as_ref());
        let ctx = self.context(&h, process, applied);
        sink(&ev, &ctx);
        self.after(&ev, sink);
    }

    /// Bytes → event; a record that does not decode is counted by reason, never dropped silently.
    fn decode(&mut self, bytes: &[u8]) -> Option<Event> {
        match decode::decode(bytes, &self.abi) {
            Ok(ev) => {
                self.stats.decoded += 1;
                Some(ev)
            }
            Err(e) => {
                *self.stats.decode_errors.entry(e.reason()).or_insert(0) += 1;
                None
            }
        }
    }

    /// Keep user space's copy of the kernel's fd and managed-mapping maps in step (so exit can
    /// clean them); the first
    /// device open of a process is when its own libcuda copy can be found and probed.
    fn track_fds(&mut self, ev: &Event) {
        let Some(k) = self.kernel.as_mut() else { return };
        let tgid = ev.header().tgid;
        match ev {
            Event::FdOpened { fd, .. } if *fd >= 0 => {
                k.fd_opened(tgid, *fd as u32);
                self.probe_libcuda_of(tgid);
            }
            Event::FdDuped { new_fd, .. } if *new_fd >= 0 => k.fd_opened(tgid, *new_fd as u32),
            Event::FdClosed { fd, .. } if *fd >= 0 => k.fd_closed(tgid, *fd as u32),
            // The kernel keeps each managed mapping's length (`UVM_MAPS`) until its munmap; one
            // never unmapped is removed at its process's exit.
            Event::UvmMapped { ret, .. } if !(-4095..0).contains(ret) => k.uvm_mapped(tgid, *ret as u64),
            Event::UvmUnmapped { addr, .. } => k.uvm_unmapped(tgid, *addr),
            _ => {}
        }
    }

    /// Apply the event to the driver ledger (state) and the CUDA ledger.
    fn apply(&mut self, ev: &Event, process: Option<&ProcessInfo>) -> Applied {
        let h = ev.header();
        let start_time = process.map_or(0, |p| p.start_time_ticks);
        let mut applied = Applied { released_bytes: self.state.apply(ev, start_time), kernel_name: None };
        match ev {
            // A lookup read after its process's exit (the bulk ring is not ordered with the
            // ledger ring) would leave a name behind for a process that is gone.
            Event::CudaFunction { result, handle, source, name, .. }
                if *result == 0 && !self.state.is_after_exit(h.tgid, h.ktime_ns) =>
            {
                self.cuda.function(h.tgid, *handle, *source, name)
            }
            Event::CudaLaunch { function, .. } => applied.kernel_name = self.cuda.name_of(h.tgid, *function),
            Event::CudaAlloc { entry, result, ptr, bytes, .. } => {
                self.cuda.alloc(h.tgid, h.cgroup_id, *entry, *result, *ptr, *bytes)
            }
            Event::CudaFree { ptr, .. } => applied.released_bytes = self.cuda.free(h.tgid, *ptr),
            _ => {}
        }
        applied
    }

    /// What is known about the event beyond its bytes: wall time, process, cgroup path and
    /// container; the names also go into the state's rows.
    fn context(&mut self, h: &Header, process: Option<ProcessInfo>, applied: Applied) -> EventContext {
        let cgroup_path = self.enrich.cgroups.resolve(h.cgroup_id);
        if let Some(p) = &cgroup_path {
            self.state.set_cgroup_path(h.cgroup_id, p);
        }
        if let Some(p) = &process {
            self.state.set_comm(h.tgid, &p.comm);
        }
        EventContext {
            wall_time_unix_ns: self.wall_clock.wall_ns(h.ktime_ns),
            process_start_time_ns: clock::ticks_to_ns(process.as_ref().map_or(0, |p| p.start_time_ticks)),
            comm: process.map(|p| p.comm),
            cgroup_path,
            released_bytes: applied.released_bytes,
            kernel_name: applied.kernel_name,
            container: self.identities.cached(h.cgroup_id, &mut self.enrich.cgroups, &self.kube),
        }
    }

    /// After the event is out: a process exit cleans up everything kept for it, a fork registers
    /// the child's inherited NVIDIA fds, a removed cgroup is forgotten.
    fn after(&mut self, ev: &Event, sink: &mut EventSink<'_>) {
        match ev {
            Event::ProcessExit { header, .. } => self.process_exited(header.tgid),
            // A new process (not a thread) inherits the parent's NVIDIA fds: register them.
            Event::ProcessFork { child_pid, .. } => {
                if self.enrich.is_process(*child_pid) {
                    self.seed_from_proc(Some(*child_pid), sink)
                } else if let Some(k) = self.kernel.as_mut() {
                    // A thread (or a child already gone, whose exit the kernel has seen): the
                    // kernel marked it at fork; only processes stay marked.
                    k.untrack(*child_pid);
                }
            }
            Event::CgroupRemoved { cgroup_id, .. } => {
                self.enrich.cgroups.forget(*cgroup_id);
                self.cuda.cgroup_removed(*cgroup_id);
            }
            _ => {}
        }
    }

    /// Forget an exited process everywhere it is kept; its final launch counts are folded into
    /// its cgroup first.
    fn process_exited(&mut self, tgid: u32) {
        self.late_libcuda.process_exited(self.kernel.as_mut().map(|k| &mut k.probes.ebpf), tgid, &mut self.stats);
        if let Some(k) = self.kernel.as_mut() {
            self.stats.fd_map_cleanups += k.forget_process(tgid);
        }
        self.enrich.process_exited(tgid);
        self.refresh_cuda_counts();
        self.cuda.process_exit(tgid);
        if let Some(k) = self.kernel.as_mut() {
            k.forget_cuda_counts(tgid);
        }
    }

    /// Scan `/proc` (all processes, or one) for NVIDIA fds, register them with the kernel and feed
    /// synthetic open records through the chain.
    pub(super) fn seed_from_proc(&mut self, only: Option<u32>, sink: &mut EventSink<'_>) {
        if self.kernel.is_none() {
            return;
        }
        let prefix = self.cfg.dev_prefix();
        let Some(accepted) = self.kernel.as_ref().map(|k| &k.probes.accepted) else { return };
        let procscan::Scan { found, unreadable, not_devices } = match only {
            None => procscan::scan(&self.cfg.proc_root, &prefix, accepted, std::process::id()),
            Some(pid) => procscan::scan_one(&self.cfg.proc_root, &prefix, accepted, pid),
        };
        self.stats.scan_unreadable += unreadable;
        if not_devices > 0 {
            tracing::warn!(
                fds = not_devices,
                "fds named like NVIDIA device nodes that are not NVIDIA devices: not traced \
                 (a file in a process's own mount namespace, or a test double without simulated_devices)"
            );
        }
        self.stats.scan_not_devices += not_devices;
        if found.is_empty() {
            return;
        }
        let now = clock::monotonic_ns();
        // One cgroup read per process, not per fd (a CUDA process holds five or more).
        let mut cgroups = std::collections::HashMap::new();
        for s in &found {
            let tracked = self.kernel.as_mut().map(|k| k.track(procscan::key(s), s.dev));
            if let Some(Err(e)) = tracked {
                tracing::warn!(tgid = s.tgid, fd = s.fd, error = %e, "cannot register seeded fd with the kernel");
                self.stats.fd_map_errors += 1;
            }
            let cgroup_id = *cgroups.entry(s.tgid).or_insert_with(|| self.enrich.cgroup_id_of(s.tgid).unwrap_or(0));
            let rec = procscan::seeded_record(s, cgroup_id, now);
            self.stats.seeded_fds += 1;
            self.ingest(record_as_bytes(&rec), sink);
        }
        if only.is_none() {
            // Running before the agent: what they allocated until now never reached the ledger.
            for tgid in procscan::per_process(&found).keys() {
                self.state.mark_from_before_agent(*tgid);
            }
        }
        tracing::info!(
            fds = found.len(),
            processes = procscan::per_process(&found).len(),
            "seeded NVIDIA fds from /proc"
        );
    }
}
