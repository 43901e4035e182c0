//! Reconciliation: processes the state tracks that no longer exist. Every exit of a tracked
//! process should arrive as a record, but a record can be lost (a full ring buffer, counted) and a
//! process can die in the window before user space learned about it; without this, such a process
//! stays in the tables forever as a ghost, with its memory and its cgroup's process count. Every
//! few seconds each tracked process is checked against `/proc` (gone, a zombie, or its PID reused
//! by another process: start time differs); for each one found dead an exit record is made and fed
//! through the same chain as a kernel one, so every stage forgets it the usual way. Counted in
//! `PipelineStats::processes_reconciled`.
use std::path::Path;

use tracer_common::{EventHeader, ProcExitRecord, kind, record_as_bytes};

use super::{Agent, EventSink};
use tracer_core::clock;

/// What `/proc/<tgid>` says about a process the state tracks.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Liveness {
    Alive,
    /// No `/proc` entry, or a zombie: its exit has happened.
    Gone,
    /// The PID belongs to a newer process (another start time).
    Reused,
}

/// Is the process incarnation (`tgid`, `start_time_ticks`; 0: unknown) still running?
pub(super) fn liveness(proc_root: &Path, tgid: u32, start_time_ticks: u64) -> Liveness {
    use crate::proc::ProcError;
    match crate::proc::stat(proc_root, tgid) {
        // Text that does not parse is no proof of an exit.
        Err(ProcError::Incomplete(_) | ProcError::Other(_) | ProcError::InternalError(_)) => Liveness::Alive,
        // No entry (or one that cannot be read): its exit has happened.
        Err(_) => Liveness::Gone,
        Ok(s) if matches!(s.state, 'Z' | 'X') => Liveness::Gone,
        Ok(s) if start_time_ticks != 0 && s.starttime != start_time_ticks => Liveness::Reused,
        Ok(_) => Liveness::Alive,
    }
}

impl Agent {
    /// Make an exit for every tracked process that is no longer running. Records already in the
    /// ring buffer are applied first, so an exit the kernel did report is never made twice.
    /// Returns how many were reconciled.
    pub fn reconcile_processes(&mut self, sink: &mut EventSink<'_>) -> u64 {
        self.drain(sink);
        let mut reaped = 0;
        for (key, cgroup_id) in self.state.process_list() {
            let l = liveness(&self.cfg.proc_root, key.tgid, key.start_time_ticks);
            if l == Liveness::Alive {
                continue;
            }
            let mut rec = ProcExitRecord {
                hdr: EventHeader {
                    kind: kind::PROC_EXIT,
                    flags: 0,
                    size: size_of::<ProcExitRecord>() as u32,
                    ktime_ns: clock::monotonic_ns(),
                    tgid: key.tgid,
                    pid: key.tgid,
                    cgroup_id,
                },
                comm: [0; 16],
            };
            let c = self.state.process_comm(key.tgid).unwrap_or_default().as_bytes();
            let n = c.len().min(15);
            rec.comm[..n].copy_from_slice(&c[..n]);
            self.ingest(record_as_bytes(&rec), sink);
            if l == Liveness::Gone
                && let Some(k) = self.kernel.as_mut()
            {
                // Its exit was never seen by the kernel side as a tracked process's: clear the mark
                // so a future process with this PID starts untracked.
                k.untrack(key.tgid);
            }
            reaped += 1;
        }
        if reaped > 0 {
            tracing::info!(processes = reaped, "tracked processes found gone without an exit record: forgotten");
        }
        self.stats.processes_reconciled += reaped;
        reaped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_of_this_process_a_reused_pid_and_a_gone_one() {
        let me = std::process::id();
        let root = Path::new("/proc");
        let start = crate::proc::stat(root, me).unwrap().starttime;
        assert_eq!(liveness(root, me, start), Liveness::Alive);
        assert_eq!(liveness(root, me, 0), Liveness::Alive);
        assert_eq!(liveness(root, me, start + 1), Liveness::Reused);
        // A child that exited and was reaped.
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        assert_eq!(liveness(root, pid, 0), Liveness::Gone);
        // A zombie: exited, not yet waited for.
        let z = std::process::Command::new("true").spawn().unwrap();
        let zpid = z.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while liveness(root, zpid, 0) != Liveness::Gone {
            assert!(std::time::Instant::now() < deadline, "the child never became a zombie");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        drop(z);
    }
}
