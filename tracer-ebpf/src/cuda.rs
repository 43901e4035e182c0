//! The `cuda` family: uprobes on libcuda's exported entry points (placed by user space where the
//! kernel can emulate the probed instruction). The attach cookie is the `cuda_entry` id, so one
//! program serves every entry point of the same shape. Launches are aggregated in the kernel;
//! allocations and frees are reported one by one, with the pointer read at return.
use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_probe_read_user, generated},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{
    counter, cuda_entry, probe, CudaAllocInflight, CudaAllocRecord, CudaCount, CudaCountKey, CudaFreeRecord,
};

use crate::{
    driver, emit,
    maps::{CUDA_COUNTS, CUDA_INFLIGHT},
};

#[inline(always)]
fn cookie<C: aya_ebpf::EbpfContext>(ctx: &C) -> u32 {
    // SAFETY: the helper only reads the attachment's cookie.
    unsafe { generated::bpf_get_attach_cookie(ctx.as_ptr()) as u32 }
}

/// Add one call (and `bytes`) to this process's row for `entry`.
#[inline(always)]
fn count(probe_id: u32, entry: u32, bytes: u64) {
    let key = CudaCountKey {
        // SAFETY: helpers without preconditions.
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        tgid: (bpf_get_current_pid_tgid() >> 32) as u32,
        entry,
    };
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

/// Launches, context creation, module/kernel lookups: count only.
pub fn on_call(ctx: &ProbeContext) {
    count(probe::CUDA_CALL, cookie(ctx), 0);
}

/// Allocation entry: `(out, bytes, ...)` (or pitch: `(out, pitch*, width, height, ...)`).
pub fn on_alloc_enter(ctx: &ProbeContext) {
    let entry = cookie(ctx);
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
    let st = CudaAllocInflight { out, bytes, entry, _pad: 0 };
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
        }
        emit::submit(probe::CUDA_ALLOC, e);
    }
}

/// Free: `(ptr_or_handle, ...)`.
pub fn on_free(ctx: &ProbeContext) {
    let entry = cookie(ctx);
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
