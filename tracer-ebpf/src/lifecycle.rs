//! The `lifecycle` family: exec, exit and fork of processes that hold NVIDIA fds, and cgroup v2
//! removal. Processes that never touched the GPU produce no records.
//!
//! Two sets of entry points share these handlers: `tracepoint` programs (they read the event's
//! record at offsets from its `format` file; attaching them opens a perf event, which kernels
//! with `perf_event_paranoid` ≥ 3 refuse without CAP_SYS_ADMIN) and `tp_btf` programs (they get
//! the kernel objects and read fields at BTF offsets; attached through a BPF link, no perf
//! event). Only where the values come from differs.
use aya_ebpf::{
    EbpfContext as _,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_probe_read_kernel,
        bpf_probe_read_kernel_str_bytes,
    },
    programs::{BtfTracePointContext, TracePointContext},
};
use tracer_common::{
    CGROUP_PATH_MAX, CgroupRmdirRecord, LifecycleLayout, ProcExecRecord, ProcExitRecord, ProcForkRecord, exit_by, probe,
};

use crate::{
    driver::{set_tracked, tracked},
    emit,
    maps::CONFIG,
};

pub fn exec() {
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

/// Whether the exiting thread is its process's last ([`LifecycleLayout::exit_by`]).
#[inline(always)]
fn group_dead(ctx: &TracePointContext, l: &LifecycleLayout, pid_tgid: u64) -> bool {
    match l.exit_by {
        // SAFETY: the offset is the field's, from the tracepoint's format file.
        exit_by::GROUP_DEAD => unsafe { ctx.read_at::<u8>(l.exit_group_dead as usize) }.unwrap_or(0) != 0,
        exit_by::SIGNAL_LIVE => signal_live_is_zero(l),
        _ => pid_tgid as u32 == (pid_tgid >> 32) as u32,
    }
}

/// `current->signal->live` is 0: the process's last thread is exiting (it is decremented
/// before `sched_process_exit` fires).
#[inline(always)]
fn signal_live_is_zero(l: &LifecycleLayout) -> bool {
    // SAFETY: kernel reads through bpf_probe_read_kernel at BTF offsets of the current task.
    unsafe {
        let task = bpf_get_current_task() as *const u8;
        let Ok(signal) = bpf_probe_read_kernel(task.add(l.task_signal as usize) as *const u64) else {
            return false;
        };
        bpf_probe_read_kernel((signal as *const u8).add(l.signal_live as usize) as *const i32) == Ok(0)
    }
}

/// `sched_process_exit` (tracepoint): reported once the last thread of a tracked process exits.
pub fn exit(ctx: &TracePointContext) {
    exit_when(|cfg, pid_tgid| group_dead(ctx, cfg, pid_tgid));
}

/// `sched_process_exit` (tp_btf): the last thread is known from `signal->live` (the event's
/// `group_dead` argument exists only from 6.16, and an argument past a kernel's own would be
/// refused by the verifier).
pub fn exit_btf() {
    exit_when(|cfg, _| signal_live_is_zero(cfg));
}

#[inline(always)]
fn exit_when(is_last: impl FnOnce(&LifecycleLayout, u64) -> bool) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !tracked(tgid) {
        return;
    }
    let Some(cfg) = CONFIG.get(0) else { return };
    if !is_last(&cfg.lifecycle, pid_tgid) {
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

/// `sched_process_fork` (tracepoint): `child_pid` from the record.
pub fn fork(ctx: &TracePointContext) {
    // SAFETY: the offset is `child_pid`'s, from the tracepoint's format file.
    fork_with(|l| unsafe { ctx.read_at::<i32>(l.fork_child_pid as usize) }.unwrap_or(0));
}

/// `sched_process_fork` (tp_btf): `child->pid`, the second argument being the child's task.
pub fn fork_btf(ctx: &BtfTracePointContext) {
    let child: *const u8 = ctx.arg(1);
    // SAFETY: a kernel read at the BTF offset of `task_struct.pid`.
    fork_with(|l| unsafe { bpf_probe_read_kernel(child.add(l.task_pid as usize) as *const i32) }.unwrap_or(0));
}

/// Runs in the parent, before the child first runs.
#[inline(always)]
fn fork_with(child_pid: impl FnOnce(&LifecycleLayout) -> i32) {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !tracked(tgid) {
        return;
    }
    let Some(cfg) = CONFIG.get(0) else { return };
    let child = child_pid(&cfg.lifecycle);
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

/// `cgroup_rmdir` (tracepoint): level, id and the `__data_loc char[] path` from the record.
pub fn cgroup_rmdir(ctx: &TracePointContext) {
    let Some(cfg) = CONFIG.get(0) else { return };
    let l = &cfg.lifecycle;
    // SAFETY: offsets from the tracepoint's format file.
    let (level, id, loc) = unsafe {
        (
            ctx.read_at::<i32>(l.rmdir_level as usize).unwrap_or(0),
            ctx.read_at::<u64>(l.rmdir_id as usize).unwrap_or(0),
            ctx.read_at::<u32>(l.rmdir_path as usize).unwrap_or(0),
        )
    };
    // SAFETY: the string's offset in the record, from its `__data_loc` word.
    let path = unsafe { (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize) };
    emit_rmdir(level, id, path);
}

/// `cgroup_rmdir` (tp_btf): `(struct cgroup *cgrp, const char *path)`; the id is `cgrp->kn->id`.
pub fn cgroup_rmdir_btf(ctx: &BtfTracePointContext) {
    let Some(cfg) = CONFIG.get(0) else { return };
    let l = &cfg.lifecycle;
    let cgrp: *const u8 = ctx.arg(0);
    let path: *const u8 = ctx.arg(1);
    // SAFETY: kernel reads at BTF offsets of `struct cgroup` and `struct kernfs_node`.
    let (level, id) = unsafe {
        let level = bpf_probe_read_kernel(cgrp.add(l.cgroup_level as usize) as *const i32).unwrap_or(0);
        let id = match bpf_probe_read_kernel(cgrp.add(l.cgroup_kn as usize) as *const u64) {
            Ok(kn) if kn != 0 => {
                bpf_probe_read_kernel((kn as *const u8).add(l.kernfs_id as usize) as *const u64).unwrap_or(0)
            }
            _ => 0,
        };
        (level, id)
    };
    emit_rmdir(level, id, path);
}

#[inline(always)]
fn emit_rmdir(level: i32, id: u64, path: *const u8) {
    if let Some(mut e) = emit::reserve::<CgroupRmdirRecord>(probe::CGROUP_RMDIR, 0) {
        let r = e.as_mut_ptr();
        // SAFETY: r points at a reserved record; the path is a kernel string.
        unsafe {
            (*r).id = id;
            (*r).level = level as u32;
            let n = match bpf_probe_read_kernel_str_bytes(path, &mut (*r).path) {
                Ok(s) => s.len(),
                Err(_) => 0,
            };
            (*r).path_len = if n > CGROUP_PATH_MAX { CGROUP_PATH_MAX as u32 } else { n as u32 };
        }
        emit::submit(probe::CGROUP_RMDIR, e);
    }
}
