//! The `cuda` family: uprobes on libcuda's exported entry points (placed by user space where the
//! kernel can emulate the probed instruction). The attach cookie is the `cuda_entry` id, so one
//! program serves every entry point of the same shape; where the kernel has no attach cookies
//! (before 5.15), one program per entry point with its id as a constant ([`on_entry`]). Launches are aggregated in the kernel;
//! allocations and frees are reported one by one, with the pointer read at return.
use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, generated},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{
    CUDA_NAME_MAX, CudaAllocInflight, CudaAllocRecord, CudaCount, CudaCountKey, CudaFreeRecord, CudaFunctionRecord,
    CudaLaunchRecord, CudaTimedInflight, CudaTimedRecord, PER_EVENT_CGROUP, PER_EVENT_TGID, PerEventKey, counter,
    cuda_entry, family, probe, timed,
};

use crate::{
    driver, emit,
    maps::{CONFIG, CUDA_COUNTS, CUDA_INFLIGHT, CUDA_PER_EVENT, CUDA_TIMED_INFLIGHT},
};

#[inline(always)]
fn cookie<C: aya_ebpf::EbpfContext>(ctx: &C) -> u32 {
    // SAFETY: the helper only reads the attachment's cookie.
    unsafe { generated::bpf_get_attach_cookie(ctx.as_ptr()) as u32 }
}

/// The entry probe of the entry point `ENTRY` without an attach cookie (kernels before 5.15 have no
/// `bpf_get_attach_cookie`): one program per entry point (`prog_names::CUDA_PER_ENTRY`), the id a
/// constant, the action chosen at compile time. The same work as the cookie programs, which user
/// space loads wherever the kernel has the helper.
#[inline(always)]
pub fn on_entry<const ENTRY: u32>(ctx: &ProbeContext) {
    match const { cuda_entry::ALL[ENTRY as usize].2 } {
        cuda_entry::Action::Count => on_call_as(ctx, ENTRY),
        cuda_entry::Action::Alloc | cuda_entry::Action::AllocPitch => on_alloc_enter_as(ctx, ENTRY),
        cuda_entry::Action::Free => on_free_as(ctx, ENTRY),
        cuda_entry::Action::Lookup => on_lookup_enter_as(ctx, ENTRY),
        cuda_entry::Action::Timed => on_timed_enter_as(ctx, ENTRY),
    }
}

/// Add one call (and `bytes`) to this process's row for `entry`.
#[inline(always)]
fn count(probe_id: u32, entry: u32, bytes: u64) {
    // SAFETY: bpf_get_current_cgroup_id takes no arguments and only reads the current task's cgroup.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    count_as(probe_id, entry, bytes, cgroup_id, bpf_get_current_pid_tgid());
}

/// [`count`] with the caller's cgroup id and `pid_tgid`.
#[inline(always)]
fn count_as(probe_id: u32, entry: u32, bytes: u64, cgroup_id: u64, pid_tgid: u64) {
    let key = CudaCountKey { cgroup_id, tgid: (pid_tgid >> 32) as u32, entry };
    emit::count(probe_id, counter::SEEN);
    // A CUDA process is a GPU process: track it so its exit is reported (its CUDA ledger and
    // counts are then released), even if it never opened a device node itself.
    if !driver::tracked(key.tgid) {
        driver::set_tracked(key.tgid, true);
    }
    if let Some(v) = CUDA_COUNTS.get_ptr_mut(&key) {
        // SAFETY: this CPU's copy of the value.
        unsafe {
            (*v).calls += 1;
            (*v).bytes += bytes;
        }
        emit::count(probe_id, counter::AGGREGATED);
        return;
    }
    let v = CudaCount { calls: 1, bytes };
    if CUDA_COUNTS.insert(&key, &v, 0).is_ok() {
        emit::count(probe_id, counter::AGGREGATED);
    } else {
        emit::count(probe_id, counter::DROP_COUNT_MAP);
    }
}

/// Launches, context creation: count; in per-event mode, launches are also sent one by one. The
/// cgroup id and `pid_tgid` are read once and shared by the count, the selection and the record.
pub fn on_call(ctx: &ProbeContext) {
    on_call_as(ctx, cookie(ctx));
}

/// [`on_call`] for the entry point `entry`.
#[inline(always)]
fn on_call_as(ctx: &ProbeContext, entry: u32) {
    // SAFETY: bpf_get_current_cgroup_id takes no arguments and only reads the current task's cgroup.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let pid_tgid = bpf_get_current_pid_tgid();
    count_as(probe::CUDA_CALL, entry, 0, cgroup_id, pid_tgid);
    if cuda_entry::is_launch(entry) && per_event_selected(cgroup_id, pid_tgid) {
        send_launch(ctx, entry, cgroup_id, pid_tgid);
    }
}

/// Is per-event mode on for the current process or its cgroup, and its deadline not passed? One
/// flag test when it is off; the clock is read only when a selection matched.
#[inline(always)]
fn per_event_selected(cgroup_id: u64, pid_tgid: u64) -> bool {
    let Some(cfg) = CONFIG.get(0) else { return false };
    if cfg.families & family::CUDA_PER_EVENT == 0 {
        return false;
    }
    let cg = PerEventKey { kind: PER_EVENT_CGROUP, _pad: 0, id: cgroup_id };
    let tg = PerEventKey { kind: PER_EVENT_TGID, _pad: 0, id: pid_tgid >> 32 };
    // SAFETY: HashMap::get is unsafe because the returned reference may see a concurrent update or
    // delete; the deadline is copied out at once (a torn read of a u64 cannot happen on 64-bit).
    let until = match unsafe { CUDA_PER_EVENT.get(&cg) } {
        Some(u) => *u,
        // SAFETY: as above.
        None => match unsafe { CUDA_PER_EVENT.get(&tg) } {
            Some(u) => *u,
            None => return false,
        },
    };
    // SAFETY: bpf_ktime_get_ns takes no arguments and only reads the monotonic clock.
    until == u64::MAX || unsafe { bpf_ktime_get_ns() } < until
}

/// cuLaunchKernel's 7th to 9th arguments (blockDimZ, sharedMemBytes, hStream). x86-64 (SysV): on
/// the stack at `rsp + 8`, `+ 16`, `+ 24`, in one read (the probe point has the function's entry
/// stack: placement never skips a push); faults give zeros.
#[cfg(not(bpf_target_arch = "aarch64"))]
#[inline(always)]
fn launch_args_7_to_9(ctx: &ProbeContext) -> [u64; 3] {
    // SAFETY: reads the saved user rsp, then user memory through the helper.
    unsafe {
        let sp = (*ctx.regs).rsp;
        bpf_probe_read_user((sp + 8) as *const [u64; 3]).unwrap_or([0; 3])
    }
}

/// arm64 (AAPCS64): the 7th and 8th in x6 and x7, the 9th at `[sp]` (the probe point is at the
/// function's entry, before any `stp`/`sub sp`: placement only steps over `bti`/`paciasp`, which
/// leave sp alone).
#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
fn launch_args_7_to_9(ctx: &ProbeContext) -> [u64; 3] {
    // SAFETY: fixed fields of the probe's saved user registers, then user memory through the helper.
    unsafe {
        let r = &*ctx.regs;
        [r.regs[6], r.regs[7], bpf_probe_read_user(r.sp as *const u64).unwrap_or(0)]
    }
}

/// The 2nd and 3rd arguments as two separate loads. Volatile: a select between two context offsets
/// would otherwise be folded into one load at a variable offset, which the verifier rejects.
#[inline(always)]
fn args_2_and_3(ctx: &ProbeContext) -> (u64, u64) {
    // SAFETY: fixed fields of the probe's saved user registers.
    unsafe {
        #[cfg(not(bpf_target_arch = "aarch64"))]
        let r = (core::ptr::read_volatile(&(*ctx.regs).rsi), core::ptr::read_volatile(&(*ctx.regs).rdx));
        #[cfg(bpf_target_arch = "aarch64")]
        let r = (core::ptr::read_volatile(&(*ctx.regs).regs[1]), core::ptr::read_volatile(&(*ctx.regs).regs[2]));
        r
    }
}

fn send_launch(ctx: &ProbeContext, entry: u32, cgroup_id: u64, pid_tgid: u64) {
    // SAFETY: bpf_ktime_get_ns takes no arguments and only reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(mut e) =
        emit::reserve_at::<CudaLaunchRecord>(emit::Ring::Bulk, probe::CUDA_LAUNCH, 0, pid_tgid, now, cgroup_id)
    else {
        return;
    };
    let r = e.as_mut_ptr();
    let a = |i: usize| -> u64 { ctx.arg(i).unwrap_or(0) };
    // SAFETY: r points at a reserved record.
    unsafe {
        (*r).entry = entry;
        match entry {
            cuda_entry::LAUNCH_KERNEL_EX | cuda_entry::LAUNCH_KERNEL_EX_PTSZ => {
                // (const CUlaunchConfig *config, CUfunction f, ...): grid@0, block@12, shmem@24,
                // stream@32: the first 40 bytes in one read.
                let cfg = a(0);
                let c: [u64; 5] = bpf_probe_read_user(cfg as *const [u64; 5]).unwrap_or([0; 5]);
                (*r).function = a(1);
                (*r).grid = [c[0] as u32, (c[0] >> 32) as u32, c[1] as u32];
                (*r).block = [(c[1] >> 32) as u32, c[2] as u32, (c[2] >> 32) as u32];
                (*r).shared_mem_bytes = c[3] as u32;
                (*r).stream = c[4];
            }
            cuda_entry::GRAPH_LAUNCH | cuda_entry::GRAPH_LAUNCH_PTSZ => {
                (*r).function = a(0);
                (*r).stream = a(1);
                (*r).grid = [0; 3];
                (*r).block = [0; 3];
                (*r).shared_mem_bytes = 0;
            }
            _ => {
                // (f, gx, gy, gz, bx, by, | bz, shmem, stream, ...): the last three beyond the first
                // six argument registers (see launch_args_7_to_9).
                let st = launch_args_7_to_9(ctx);
                (*r).function = a(0);
                (*r).grid = [a(1) as u32, a(2) as u32, a(3) as u32];
                (*r).block = [a(4) as u32, a(5) as u32, st[0] as u32];
                (*r).shared_mem_bytes = st[1] as u32;
                (*r).stream = st[2];
            }
        }
    }
    emit::submit(probe::CUDA_LAUNCH, e);
}

/// Handle lookups (cuModuleGetFunction, cuLibraryGetKernel: `(out, src, name)`;
/// cuKernelGetFunction: `(out, kernel)`): keep the out-parameter and the name or source.
pub fn on_lookup_enter(ctx: &ProbeContext) {
    on_lookup_enter_as(ctx, cookie(ctx));
}

#[inline(always)]
fn on_lookup_enter_as(ctx: &ProbeContext, entry: u32) {
    count(probe::CUDA_CALL, entry, 0);
    let out: u64 = ctx.arg(0).unwrap_or(0);
    let (second, third) = args_2_and_3(ctx);
    let extra: u64 = if entry == cuda_entry::KERNEL_GET_FUNCTION { second } else { third };
    let st = CudaAllocInflight { out, bytes: extra, start_ktime_ns: 0, entry, _pad: 0 };
    if CUDA_INFLIGHT.insert(&bpf_get_current_pid_tgid(), &st, 0).is_err() {
        emit::drop_event(probe::CUDA_FUNCTION, counter::DROP_INFLIGHT_FULL);
    }
}

/// Handle lookup return: report the handle with its name (or source handle).
pub fn on_lookup_return(ctx: &RetProbeContext) {
    let key = bpf_get_current_pid_tgid();
    // SAFETY: copied out immediately.
    let Some(st) = (unsafe { CUDA_INFLIGHT.get(&key) }).copied() else { return };
    let _ = CUDA_INFLIGHT.remove(&key);
    let result: u64 = ctx.ret();
    let Some(mut e) = emit::reserve_in::<CudaFunctionRecord>(emit::Ring::Bulk, probe::CUDA_FUNCTION, 0) else { return };
    let r = e.as_mut_ptr();
    // SAFETY: r points at a reserved record; user reads fault safely.
    unsafe {
        (*r).entry = st.entry;
        (*r).result = result as u32;
        (*r).handle = if result == 0 { bpf_probe_read_user(st.out as *const u64).unwrap_or(0) } else { 0 };
        (*r)._pad = 0;
        if st.entry == cuda_entry::KERNEL_GET_FUNCTION {
            (*r).source = st.bytes;
            (*r).name_len = 0;
        } else {
            (*r).source = 0;
            let n = match aya_ebpf::helpers::bpf_probe_read_user_str_bytes(st.bytes as *const u8, &mut (*r).name) {
                Ok(s) => s.len(),
                Err(_) => 0,
            };
            (*r).name_len = if n > CUDA_NAME_MAX { CUDA_NAME_MAX as u32 } else { n as u32 };
        }
    }
    emit::submit(probe::CUDA_FUNCTION, e);
}

/// Allocation entry: `(out, bytes, ...)` (or pitch: `(out, pitch*, width, height, ...)`).
pub fn on_alloc_enter(ctx: &ProbeContext) {
    on_alloc_enter_as(ctx, cookie(ctx));
}

#[inline(always)]
fn on_alloc_enter_as(ctx: &ProbeContext, entry: u32) {
    let out: u64 = ctx.arg(0).unwrap_or(0);
    let bytes: u64 = if entry == cuda_entry::MEM_ALLOC_PITCH {
        let w: u64 = ctx.arg(2).unwrap_or(0);
        let h: u64 = ctx.arg(3).unwrap_or(0);
        // Both clamped to 32 bits: the product fits in 64 (no 128-bit multiply in BPF).
        w.min(u32::MAX as u64) * h.min(u32::MAX as u64)
    } else {
        ctx.arg(1).unwrap_or(0)
    };
    count(probe::CUDA_CALL, entry, bytes);
    // SAFETY: bpf_ktime_get_ns takes no arguments and only reads the monotonic clock.
    let start_ktime_ns = unsafe { bpf_ktime_get_ns() };
    let st = CudaAllocInflight { out, bytes, start_ktime_ns, entry, _pad: 0 };
    if CUDA_INFLIGHT.insert(&bpf_get_current_pid_tgid(), &st, 0).is_err() {
        emit::drop_event(probe::CUDA_ALLOC, counter::DROP_INFLIGHT_FULL);
    }
}

/// Allocation return: report the result and the pointer written to the out-parameter.
pub fn on_alloc_return(ctx: &RetProbeContext) {
    let key = bpf_get_current_pid_tgid();
    // SAFETY: copied out immediately.
    let Some(st) = (unsafe { CUDA_INFLIGHT.get(&key) }).copied() else { return };
    let _ = CUDA_INFLIGHT.remove(&key);
    let result: u64 = ctx.ret();
    let ptr = if result == 0 && st.out != 0 {
        // SAFETY: a user pointer; faults are reported as 0.
        unsafe { bpf_probe_read_user(st.out as *const u64) }.unwrap_or(0)
    } else {
        0
    };
    if let Some(mut e) = emit::reserve::<CudaAllocRecord>(probe::CUDA_ALLOC, 0) {
        let r = e.as_mut_ptr();
        // SAFETY: r points at a reserved record.
        unsafe {
            (*r).entry = st.entry;
            (*r).result = result as u32;
            (*r).ptr = ptr;
            (*r).bytes = st.bytes;
            (*r).start_ktime_ns = st.start_ktime_ns;
        }
        emit::submit(probe::CUDA_ALLOC, e);
    }
}

/// Free: `(ptr_or_handle, ...)`.
pub fn on_free(ctx: &ProbeContext) {
    on_free_as(ctx, cookie(ctx));
}

#[inline(always)]
fn on_free_as(ctx: &ProbeContext, entry: u32) {
    let ptr: u64 = ctx.arg(0).unwrap_or(0);
    count(probe::CUDA_CALL, entry, 0);
    if let Some(mut e) = emit::reserve::<CudaFreeRecord>(probe::CUDA_FREE, 0) {
        let r = e.as_mut_ptr();
        // SAFETY: r points at a reserved record.
        unsafe {
            (*r).entry = entry;
            (*r)._pad = 0;
            (*r).ptr = ptr;
        }
        emit::submit(probe::CUDA_FREE, e);
    }
}

/// Timed call entry (synchronisation, events, copies, memsets): count it (copies and memsets with
/// their bytes); in per-event mode keep its entry time and first four arguments for the return.
pub fn on_timed_enter(ctx: &ProbeContext) {
    on_timed_enter_as(ctx, cookie(ctx));
}

#[inline(always)]
fn on_timed_enter_as(ctx: &ProbeContext, entry: u32) {
    let a = |i: usize| -> u64 { ctx.arg(i).unwrap_or(0) };
    let args = [a(0), a(1), a(2), a(3)];
    // SAFETY: bpf_get_current_cgroup_id takes no arguments and only reads the current task's cgroup.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let pid_tgid = bpf_get_current_pid_tgid();
    count_as(probe::CUDA_CALL, entry, timed::bytes(entry, &args), cgroup_id, pid_tgid);
    if !per_event_selected(cgroup_id, pid_tgid) {
        return;
    }
    // SAFETY: bpf_ktime_get_ns takes no arguments and only reads the monotonic clock.
    let st = CudaTimedInflight { start_ktime_ns: unsafe { bpf_ktime_get_ns() }, args, entry, _pad: 0 };
    if CUDA_TIMED_INFLIGHT.insert(&pid_tgid, &st, 0).is_err() {
        emit::drop_event(probe::CUDA_TIMED, counter::DROP_INFLIGHT_FULL);
    }
}

/// Timed call return: report it with its entry time, result and arguments.
pub fn on_timed_return(ctx: &RetProbeContext) {
    let key = bpf_get_current_pid_tgid();
    // SAFETY: copied out immediately.
    let Some(st) = (unsafe { CUDA_TIMED_INFLIGHT.get(&key) }).copied() else { return };
    let _ = CUDA_TIMED_INFLIGHT.remove(&key);
    let result: u64 = ctx.ret();
    let Some(mut e) = emit::reserve_in::<CudaTimedRecord>(emit::Ring::Bulk, probe::CUDA_TIMED, 0) else { return };
    let r = e.as_mut_ptr();
    // SAFETY: r points at a reserved record.
    unsafe {
        (*r).entry = st.entry;
        (*r).result = result as u32;
        (*r).start_ktime_ns = st.start_ktime_ns;
        (*r).args = st.args;
    }
    emit::submit(probe::CUDA_TIMED, e);
}
