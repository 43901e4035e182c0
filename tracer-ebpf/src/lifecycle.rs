//! The `lifecycle` family: exec, exit and fork of processes that hold NVIDIA fds, and cgroup v2
//! removal. Processes that never touched the GPU produce no records.
use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel_str_bytes},
    programs::TracePointContext,
};
use tracer_common::{CGROUP_PATH_MAX, CgroupRmdirRecord, ProcExecRecord, ProcExitRecord, ProcForkRecord, probe};

use crate::{
    driver::{set_tracked, tracked},
    emit,
};

pub fn exec(_ctx: &TracePointContext) {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !tracked(tgid) {
        return;
    }
    if let Some(mut e) = emit::reserve::<ProcExecRecord>(probe::EXEC, 0) {
        let r = e.as_mut_ptr();
        // SAFETY: r points at a reserved record.
        unsafe { (*r).comm = bpf_get_current_comm().unwrap_or([0; 16]) };
        emit::submit(probe::EXEC, e);
    }
}

/// `sched_process_exit`: `group_dead` (offset 32) is set when the last thread of the process exits.
pub fn exit(ctx: &TracePointContext) {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: offsets from the tracepoint's format file.
    let group_dead: u8 = unsafe { ctx.read_at(32) }.unwrap_or(0);
    if group_dead == 0 || !tracked(tgid) {
        return;
    }
    set_tracked(tgid, false);
    if let Some(mut e) = emit::reserve::<ProcExitRecord>(probe::EXIT, 0) {
        let r = e.as_mut_ptr();
        // SAFETY: r points at a reserved record.
        unsafe { (*r).comm = bpf_get_current_comm().unwrap_or([0; 16]) };
        emit::submit(probe::EXIT, e);
    }
}

/// `sched_process_fork` runs in the parent, before the child first runs; `child_pid` is at offset 20.
pub fn fork(ctx: &TracePointContext) {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !tracked(tgid) {
        return;
    }
    // SAFETY: offsets from the tracepoint's format file.
    let child: i32 = unsafe { ctx.read_at(20) }.unwrap_or(0);
    // The child inherits the parent's NVIDIA fds: track it before it runs, so that its exit is
    // seen even if it dies before user space has scanned it (a fork storm left ghosts otherwise).
    // `child` may be a thread; user space clears the byte of threads when it reads this record.
    if child > 0 {
        set_tracked(child as u32, true);
    }
    if let Some(mut e) = emit::reserve::<ProcForkRecord>(probe::FORK, 0) {
        let r = e.as_mut_ptr();
        // SAFETY: r points at a reserved record.
        unsafe {
            (*r).child_pid = child as u32;
            (*r)._pad = 0;
        }
        emit::submit(probe::FORK, e);
    }
}

/// `cgroup_rmdir`: root@8, level@12, id@16, `__data_loc char[] path`@24.
pub fn cgroup_rmdir(ctx: &TracePointContext) {
    // SAFETY: offsets from the tracepoint's format file.
    let (level, id, loc) = unsafe {
        (ctx.read_at::<i32>(12).unwrap_or(0), ctx.read_at::<u64>(16).unwrap_or(0), ctx.read_at::<u32>(24).unwrap_or(0))
    };
    if let Some(mut e) = emit::reserve::<CgroupRmdirRecord>(probe::CGROUP_RMDIR, 0) {
        let r = e.as_mut_ptr();
        let off = (loc & 0xffff) as usize;
        // SAFETY: r points at a reserved record; the path is read from the tracepoint record.
        unsafe {
            (*r).id = id;
            (*r).level = level as u32;
            let src = (ctx.as_ptr() as *const u8).add(off);
            let n = match bpf_probe_read_kernel_str_bytes(src, &mut (*r).path) {
                Ok(s) => s.len(),
                Err(_) => 0,
            };
            (*r).path_len = if n > CGROUP_PATH_MAX { CGROUP_PATH_MAX as u32 } else { n as u32 };
        }
        emit::submit(probe::CGROUP_RMDIR, e);
    }
}
