//! The `driver` family: NVIDIA fd tracking (open/close/dup), ioctls on NVIDIA fds, and
//! managed-memory mmap/munmap of UVM fds. One handler for every attach mode: the entry points in
//! `main.rs` only extract the syscall number and arguments.
use aya_ebpf::helpers::{
    bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel,
    bpf_probe_read_user, bpf_probe_read_user_str_bytes, generated,
};
use aya_log_ebpf::{info, warn};
use tracer_common::{
    DeviceCheck, DeviceRef, FdCloseRecord, FdDupRecord, FdKey, FdOpenRecord, IOCTL_MAIN_MAX, IOCTL_NESTED_MAX,
    IOCTL_TAIL_MAX, Inflight, IoctlRecord, NO_NESTED, SPACE_FRONTEND, SPACE_UVM, SimDeviceKey, UvmMapKey,
    UvmMmapRecord, UvmMunmapRecord, counter, device_kind, flags, nv, probe, sysno,
};

use crate::{
    emit,
    maps::{
        ALLOC_PARAM_SIZES, CAPTURE_PLANS, CONFIG, INFLIGHT, IOCTL_ENTRY, NV_FDS, SIM_DEVICES, TRACKED_TGIDS, UVM_MAPS,
    },
};

/// Arguments of the syscall being entered, however the attach mode exposes them.
pub trait SyscallArgs {
    /// Whether the exit program sees the same registers (btf and raw tracepoints get the
    /// syscall's `pt_regs`, whose argument registers still hold the arguments at exit on x86_64),
    /// so an ioctl's fd, command and argument are read there and need no entry state.
    const AT_EXIT: bool;
    fn arg(&self, i: usize) -> u64;
}

/// Is `nr` a syscall this family handles? Checked first, so other syscalls pay one comparison chain.
#[inline(always)]
pub fn interesting(nr: u32) -> bool {
    matches!(
        nr,
        sysno::OPENAT
            | sysno::OPEN
            | sysno::CLOSE
            | sysno::IOCTL
            | sysno::MMAP
            | sysno::MUNMAP
            | sysno::DUP
            | sysno::DUP2
            | sysno::DUP3
            | sysno::FCNTL
    )
}

#[inline(always)]
fn tgid_of(pid_tgid: u64) -> u32 {
    (pid_tgid >> 32) as u32
}

#[inline(always)]
fn lookup_fd(tgid: u32, fd: u64) -> Option<DeviceRef> {
    let fd = fd as i64;
    if !(0..=i32::MAX as i64).contains(&fd) {
        return None;
    }
    // SAFETY: the value is copied out immediately.
    unsafe { NV_FDS.get(&FdKey { tgid, fd: fd as u32 }) }.copied()
}

#[inline(always)]
fn stash(probe_id: u32, pid_tgid: u64, state: &Inflight) {
    if INFLIGHT.insert(&pid_tgid, state, 0).is_err() {
        emit::drop_event(probe_id, counter::DROP_INFLIGHT_FULL);
    }
}

/// Does `tgid` hold (or has it held) NVIDIA fds? An inlined array lookup and a byte test.
#[inline(always)]
pub fn tracked(tgid: u32) -> bool {
    const PER: u32 = tracer_common::TRACKED_TGIDS_PER_ENTRY as u32;
    match TRACKED_TGIDS.get(tgid / PER) {
        Some(page) => page[(tgid % PER) as usize] != 0,
        // Beyond the map (pid_max grew after load): treat as tracked, the hash lookups decide.
        None => true,
    }
}

/// Mark or unmark `tgid` as tracked.
#[inline(always)]
pub fn set_tracked(tgid: u32, on: bool) {
    const PER: u32 = tracer_common::TRACKED_TGIDS_PER_ENTRY as u32;
    if let Some(page) = TRACKED_TGIDS.get_ptr_mut(tgid / PER) {
        // SAFETY: a byte inside the map value; single-byte store.
        unsafe { (*page)[(tgid % PER) as usize] = on as u8 };
    }
}

/// Syscall entry.
#[inline(always)]
pub fn on_enter<A: SyscallArgs>(nr: u32, a: &A) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = tgid_of(pid_tgid);
    // Only opens can make an untracked process interesting.
    if nr != sysno::OPENAT && nr != sysno::OPEN && !tracked(tgid) {
        return;
    }
    match nr {
        sysno::OPENAT | sysno::OPEN => {
            let Some(cfg) = CONFIG.get(0) else { return };
            if tgid == cfg.agent_tgid || cfg.dev_prefix_len == 0 {
                return;
            }
            let path = if nr == sysno::OPENAT { a.arg(1) } else { a.arg(0) };
            let open_flags = if nr == sysno::OPENAT { a.arg(2) } else { a.arg(1) };
            // Match the path now (the string is almost always resident); if it cannot be read,
            // keep the pointer and retry at exit, when the kernel has faulted it in.
            match match_device_path(path) {
                PathMatch::NotNvidia => {}
                m => {
                    let mut st = Inflight { sysno: nr, fd: -1, ..Default::default() };
                    st.args[0] = path;
                    st.args[1] = open_flags;
                    // SAFETY: bpf_ktime_get_ns takes no arguments and only reads the monotonic clock.
                    st.enter_ktime = unsafe { bpf_ktime_get_ns() };
                    if let PathMatch::Device(dev) = m {
                        st.dev = dev;
                    }
                    stash(probe::OPEN, pid_tgid, &st);
                }
            }
        }
        sysno::CLOSE => {
            let fd = a.arg(0);
            if let Some(dev) = lookup_fd(tgid, fd) {
                let _ = NV_FDS.remove(&FdKey { tgid, fd: fd as u32 });
                emit_close(dev, fd as i32, 0);
            }
        }
        sysno::IOCTL if A::AT_EXIT => {
            // Only the time, and only if asked for: the exit program reads the arguments and the
            // fd's device itself.
            if !durations() {
                return;
            }
            if let Some(slot) = IOCTL_ENTRY.get_ptr_mut(ioctl_slot(pid_tgid)) {
                // SAFETY: a map value of this program's array; two plain stores.
                unsafe {
                    (*slot)[0] = pid_tgid;
                    (*slot)[1] = bpf_ktime_get_ns();
                }
            }
        }
        sysno::IOCTL => {
            let fd = a.arg(0);
            let Some(dev) = lookup_fd(tgid, fd) else { return };
            let mut st = Inflight { sysno: nr, fd: fd as i32, dev, ..Default::default() };
            st.args[0] = a.arg(1);
            st.args[1] = a.arg(2);
            // SAFETY: bpf_ktime_get_ns takes no arguments and only reads the monotonic clock.
            st.enter_ktime = unsafe { bpf_ktime_get_ns() };
            stash(probe::IOCTL, pid_tgid, &st);
        }
        sysno::MMAP => {
            let fd = a.arg(4);
            let Some(dev) = lookup_fd(tgid, fd) else { return };
            if dev.kind != device_kind::UVM {
                return;
            }
            let mut st = Inflight { sysno: nr, fd: fd as i32, dev, ..Default::default() };
            st.args = [a.arg(0), a.arg(1), a.arg(2) | (a.arg(3) << 32), a.arg(5)];
            // SAFETY: bpf_ktime_get_ns takes no arguments and only reads the monotonic clock.
            st.enter_ktime = unsafe { bpf_ktime_get_ns() };
            stash(probe::MMAP, pid_tgid, &st);
        }
        sysno::MUNMAP => unmapped(tgid, a.arg(0), a.arg(1)),
        sysno::DUP | sysno::DUP2 | sysno::DUP3 | sysno::FCNTL => {
            let old = a.arg(0);
            if nr == sysno::FCNTL {
                let cmd = a.arg(1);
                if cmd != sysno::F_DUPFD && cmd != sysno::F_DUPFD_CLOEXEC {
                    return;
                }
            }
            let dev = lookup_fd(tgid, old).unwrap_or_default();
            let mut replaced = DeviceRef::default();
            if nr == sysno::DUP2 || nr == sysno::DUP3 {
                let new = a.arg(1);
                if new == old {
                    return;
                }
                replaced = lookup_fd(tgid, new).unwrap_or_default();
            }
            if dev.kind == device_kind::UNKNOWN && replaced.kind == device_kind::UNKNOWN {
                return;
            }
            let mut st = Inflight { sysno: nr, fd: old as i32, dev, replaced, ..Default::default() };
            st.args[0] = old;
            st.args[1] = a.arg(1);
            // SAFETY: bpf_ktime_get_ns takes no arguments and only reads the monotonic clock.
            st.enter_ktime = unsafe { bpf_ktime_get_ns() };
            stash(probe::DUP, pid_tgid, &st);
        }
        _ => {}
    }
}

/// Are NVIDIA ioctls timed (`TracerConfig::ioctl_durations`)? In the btf and raw modes this is
/// all their entry program would do for them.
#[inline(always)]
fn durations() -> bool {
    CONFIG.get(0).is_some_and(|c| c.ioctl_durations != 0)
}

/// `IOCTL_ENTRY` slot of a thread.
#[inline(always)]
fn ioctl_slot(pid_tgid: u64) -> u32 {
    (pid_tgid as u32) & (tracer_common::capacity::IOCTL_ENTRY - 1)
}

/// Syscall exit. `regs`: the syscall's arguments where the attach mode still sees them at exit.
#[inline(always)]
pub fn on_exit<A: SyscallArgs>(nr: u32, ret: i64, regs: Option<&A>) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = tgid_of(pid_tgid);
    if nr != sysno::OPENAT && nr != sysno::OPEN && !tracked(tgid) {
        return;
    }
    if nr == sysno::IOCTL
        && let Some(a) = regs
    {
        let fd = a.arg(0);
        let Some(dev) = lookup_fd(tgid, fd) else { return };
        let mut st = Inflight { sysno: nr, fd: fd as i32, dev, ..Default::default() };
        st.args[0] = a.arg(1);
        st.args[1] = a.arg(2);
        if durations()
            && let Some(slot) = IOCTL_ENTRY.get_ptr_mut(ioctl_slot(pid_tgid))
        {
            // SAFETY: a map value of this program's array. The time counts only if this thread
            // wrote it (a missed entry or a thread sharing the slot leaves the duration 0).
            unsafe {
                if (*slot)[0] == pid_tgid {
                    st.enter_ktime = (*slot)[1];
                    (*slot)[0] = 0;
                }
            }
        }
        exit_ioctl(&st, ret, pid_tgid);
        return;
    }
    // SAFETY: copied out immediately.
    let st = unsafe { INFLIGHT.get(&pid_tgid) }.copied();
    let Some(st) = st else {
        // A successful open of some other file may reuse an fd number a tracked process had for
        // an NVIDIA node (e.g. after close_range, which we do not trace): forget the stale entry.
        if (nr == sysno::OPENAT || nr == sysno::OPEN) && ret >= 0 {
            // SAFETY: presence check only.
            if tracked(tgid) {
                let _ = NV_FDS.remove(&FdKey { tgid, fd: ret as u32 });
            }
        }
        return;
    };
    let _ = INFLIGHT.remove(&pid_tgid);
    if st.sysno != nr {
        return;
    }
    match nr {
        sysno::OPENAT | sysno::OPEN => exit_open(&st, pid_tgid, ret),
        sysno::IOCTL => exit_ioctl(&st, ret, pid_tgid),
        sysno::MMAP => exit_mmap(&st, tgid, ret),
        sysno::DUP | sysno::DUP2 | sysno::DUP3 | sysno::FCNTL => exit_dup(&st, tgid, ret),
        _ => {}
    }
}

fn exit_open(st: &Inflight, pid_tgid: u64, ret: i64) {
    let tgid = tgid_of(pid_tgid);
    let mut dev = st.dev;
    if dev.kind == device_kind::UNKNOWN {
        // The path could not be read at entry; it is resident now.
        match match_device_path(st.args[0]) {
            PathMatch::Device(d) => dev = d,
            _ => return,
        }
    }
    if ret < 0 {
        return;
    }
    if !is_nvidia_device(ret as u32, dev.kind) {
        emit::drop_event(probe::OPEN, counter::DROP_NOT_A_DEVICE);
        return;
    }
    // An id for this open file description, shared by its dups.
    // SAFETY: bpf_ktime_get_ns takes no arguments and only reads the monotonic clock.
    dev.file_id = (pid_tgid << 24) ^ unsafe { bpf_ktime_get_ns() } ^ (ret as u64);
    let key = FdKey { tgid, fd: ret as u32 };
    if NV_FDS.insert(&key, &dev, 0).is_err() {
        emit::drop_event(probe::OPEN, counter::DROP_FD_MAP);
        return;
    }
    set_tracked(tgid, true);
    if let Some(mut e) = emit::reserve::<FdOpenRecord>(probe::OPEN, 0) {
        let r = e.as_mut_ptr();
        // SAFETY: r points at a reserved FdOpenRecord.
        unsafe {
            (*r).dev = dev;
            (*r).fd = ret as i32;
            (*r).open_flags = st.args[1] as u32;
        }
        emit::submit(probe::OPEN, e);
    }
}

pub fn emit_close(dev: DeviceRef, fd: i32, fl: u16) {
    if let Some(mut e) = emit::reserve::<FdCloseRecord>(probe::CLOSE, fl) {
        let r = e.as_mut_ptr();
        // SAFETY: r points at a reserved FdCloseRecord.
        unsafe {
            (*r).dev = dev;
            (*r).fd = fd;
            (*r)._pad = 0;
        }
        emit::submit(probe::CLOSE, e);
    }
}

fn exit_dup(st: &Inflight, tgid: u32, ret: i64) {
    if ret < 0 {
        return;
    }
    let key = FdKey { tgid, fd: ret as u32 };
    if st.replaced.kind != device_kind::UNKNOWN {
        // dup2/dup3 onto an NVIDIA fd closes it first.
        emit_close(st.replaced, ret as i32, flags::DUP_REPLACED);
        if st.dev.kind == device_kind::UNKNOWN {
            let _ = NV_FDS.remove(&key);
            return;
        }
    }
    if NV_FDS.insert(&key, &st.dev, 0).is_err() {
        emit::drop_event(probe::DUP, counter::DROP_FD_MAP);
        return;
    }
    if let Some(mut e) = emit::reserve::<FdDupRecord>(probe::DUP, 0) {
        let r = e.as_mut_ptr();
        // SAFETY: r points at a reserved FdDupRecord.
        unsafe {
            (*r).dev = st.dev;
            (*r).old_fd = st.fd;
            (*r).new_fd = ret as i32;
        }
        emit::submit(probe::DUP, e);
    }
}

/// A mapping at `addr` of process `tgid` is going away (`munmap`, or in driver-entry mode the
/// managed VMA's close): if it is a UVM mapping recorded at its mmap, it is forgotten and reported
/// (`len` 0: the length it was mapped with).
#[inline(always)]
pub fn unmapped(tgid: u32, addr: u64, len: u64) {
    let key = UvmMapKey { tgid, _pad: 0, addr };
    // SAFETY: copied out immediately.
    let Some(mapped) = (unsafe { UVM_MAPS.get(&key) }).copied() else { return };
    let _ = UVM_MAPS.remove(&key);
    if let Some(mut e) = emit::reserve::<UvmMunmapRecord>(probe::MUNMAP, 0) {
        let r = e.as_mut_ptr();
        // SAFETY: r points at a reserved UvmMunmapRecord.
        unsafe {
            (*r).addr = addr;
            (*r).len = if len != 0 { len } else { mapped };
            (*r).ret = 0;
        }
        emit::submit(probe::MUNMAP, e);
    }
}

/// A UVM mmap returned `ret` (the address, or -errno): a mapping to remember, and its record.
pub fn exit_mmap(st: &Inflight, tgid: u32, ret: i64) {
    let ok = !(-4095..0).contains(&ret);
    if ok {
        let key = UvmMapKey { tgid, _pad: 0, addr: ret as u64 };
        if UVM_MAPS.insert(&key, &st.args[1], 0).is_err() {
            emit::drop_event(probe::MMAP, counter::DROP_FD_MAP);
            return;
        }
    }
    if let Some(mut e) = emit::reserve::<UvmMmapRecord>(probe::MMAP, 0) {
        let r = e.as_mut_ptr();
        // SAFETY: r points at a reserved UvmMmapRecord.
        unsafe {
            (*r).dev = st.dev;
            (*r).fd = st.fd;
            (*r).prot = st.args[2] as u32;
            (*r).map_flags = st.args[2] >> 32;
            (*r).addr = st.args[0];
            (*r).len = st.args[1];
            (*r).offset = st.args[3];
            (*r).ret = ret;
        }
        emit::submit(probe::MMAP, e);
    }
}

/// Copy `len` (clamped to `cap`) bytes of user memory at `src` to `dst`. False on a fault.
#[inline(always)]
unsafe fn read_user_into(dst: *mut u8, cap: u32, len: u32, src: u64) -> bool {
    let mut n = len;
    if n > cap {
        n = cap;
    }
    if n == 0 {
        return true;
    }
    // SAFETY: dst has room for `cap` bytes; the helper faults safely on bad `src`.
    unsafe { generated::bpf_probe_read_user(dst as *mut _, n, src as *const _) == 0 }
}

pub fn exit_ioctl(st: &Inflight, ret: i64, pid_tgid: u64) {
    let cmd = st.args[0] as u32;
    let arg = st.args[1];
    let is_uvm = st.dev.kind == device_kind::UVM || st.dev.kind == device_kind::UVM_TOOLS;
    let mut fl: u16 = 0;
    let (mut nr, mut size, mut ptr) = if is_uvm { (cmd, 0u32, arg) } else { (nv::ioc_nr(cmd), nv::ioc_size(cmd), arg) };
    if !is_uvm && nr == nv::esc::IOCTL_XFER_CMD && size == nv::size::XFER {
        // SAFETY: faults are reported, not taken.
        match unsafe { bpf_probe_read_user(arg as *const [u64; 2]) } {
            Ok(x) => {
                nr = (x[0] as u32) & 0xff;
                size = (x[0] >> 32) as u32;
                ptr = x[1];
                fl |= flags::XFER;
            }
            Err(_) => fl |= flags::FAULT_XFER,
        }
    }
    let space = if is_uvm { SPACE_UVM } else { SPACE_FRONTEND };
    let plan = match CAPTURE_PLANS.get(tracer_common::plan_slot(space, nr)) {
        Some(s) if s.present != 0 && s.cmd == nr => Some(s.plan),
        _ => None,
    };
    let mut main_len = match plan {
        Some(p) if is_uvm => p.main_len,
        Some(p) if p.main_len < size => p.main_len,
        _ if is_uvm => 0,
        _ => size,
    };
    if main_len > IOCTL_MAIN_MAX as u32 {
        main_len = IOCTL_MAIN_MAX as u32;
        fl |= flags::TRUNCATED;
    }

    // Records the memory ledger needs go through the ledger ring; count-only ones (RM_CONTROL,
    // most of a workload's calls) through the bulk ring, where a flood cannot crowd them out.
    let ring = match plan {
        Some(p) if p.ledger != 0 => emit::Ring::Ledger,
        _ => emit::Ring::Bulk,
    };
    // SAFETY: bpf_ktime_get_ns takes no arguments and only reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: bpf_get_current_cgroup_id takes no arguments and only reads the current task's cgroup.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let Some(mut e) = emit::reserve_at::<IoctlRecord>(ring, probe::IOCTL, 0, pid_tgid, now, cgroup_id) else { return };
    let r = e.as_mut_ptr();
    // An RM_ALLOC class whose parameter size no plan knows (its nested block is not captured).
    let mut unknown_class: Option<u32> = None;
    // SAFETY: r points at a reserved IoctlRecord; every write stays inside it.
    unsafe {
        (*r).dev = st.dev;
        (*r).fd = st.fd;
        (*r).cmd = cmd;
        (*r).arg = arg;
        (*r).ret = ret;
        (*r).duration_ns = if st.enter_ktime != 0 { now.wrapping_sub(st.enter_ktime) } else { 0 };
        (*r).nr = nr;
        (*r).size = size;
        (*r).data_ptr = ptr;
        (*r).nested_ptr = 0;
        (*r)._pad = 0;
        (*r)._pad2 = 0;

        if fl & flags::FAULT_XFER != 0 || !read_user_into((*r).main.as_mut_ptr(), IOCTL_MAIN_MAX as u32, main_len, ptr)
        {
            fl |= flags::FAULT_MAIN;
            main_len = 0;
        }
        (*r).main_len = main_len as u16;

        let mut tail_len = 0u32;
        let mut tail_off = 0u32;
        let mut nested_len = 0u32;
        if let Some(p) = plan {
            if p.tail_len > 0 && fl & flags::FAULT_MAIN == 0 {
                tail_off = p.tail_off;
                tail_len = if p.tail_len > IOCTL_TAIL_MAX as u32 { IOCTL_TAIL_MAX as u32 } else { p.tail_len };
                if !read_user_into((*r).tail.as_mut_ptr(), IOCTL_TAIL_MAX as u32, tail_len, ptr + tail_off as u64) {
                    fl |= flags::FAULT_TAIL;
                    tail_len = 0;
                }
            }
            let noff = p.nested_ptr_off;
            if noff != NO_NESTED && main_len >= noff.saturating_add(8) {
                // RM_ALLOC (pointer @16, class @12, the only nested plan today): take both from the
                // copy just made — constant offsets the verifier can check — so the nested block is
                // read through exactly the pointer user space sees in `main`. Other layouts re-read
                // the fields from user memory.
                let main = (*r).main.as_ptr();
                let nptr = if noff == 16 {
                    core::ptr::read_unaligned(main.add(16) as *const u64)
                } else {
                    bpf_probe_read_user((ptr + noff as u64) as *const u64).unwrap_or(0)
                };
                let want = if p.nested_by_class != 0 {
                    let class = if p.class_off == 12 {
                        Ok(core::ptr::read_unaligned(main.add(12) as *const u32))
                    } else {
                        bpf_probe_read_user((ptr + p.class_off as u64) as *const u32)
                    };
                    match class {
                        Ok(class) => match ALLOC_PARAM_SIZES.get(tracer_common::class_slot(class)) {
                            Some(c) if c.class == class => c.size,
                            _ => {
                                unknown_class = Some(class);
                                0
                            }
                        },
                        Err(_) => 0,
                    }
                } else {
                    p.nested_len
                };
                if want > 0 {
                    (*r).nested_ptr = nptr;
                    if nptr == 0 {
                        fl |= flags::FAULT_NESTED;
                    } else {
                        nested_len = if want > IOCTL_NESTED_MAX as u32 { IOCTL_NESTED_MAX as u32 } else { want };
                        if !read_user_into((*r).nested.as_mut_ptr(), IOCTL_NESTED_MAX as u32, nested_len, nptr) {
                            fl |= flags::FAULT_NESTED;
                            nested_len = 0;
                        }
                    }
                }
            }
        }
        (*r).tail_len = tail_len as u16;
        (*r).tail_off = tail_off;
        (*r).nested_len = nested_len as u16;
        (*r).hdr.flags = fl;
    }
    emit::submit(probe::IOCTL, e);
    diagnose_ioctl(pid_tgid, is_uvm, nr, fl, ptr, plan.is_some(), unknown_class);
}

/// Kernel-side diagnostics of one NVIDIA ioctl (aya-log, read by user space into its log), only
/// while `TracerConfig::diagnostics` is on: off, this is one load and a branch. The same facts reach
/// user space as record flags and counters; these lines add where and what, as it happens.
#[inline(always)]
fn diagnose_ioctl(pid_tgid: u64, is_uvm: bool, nr: u32, fl: u16, ptr: u64, planned: bool, unknown_class: Option<u32>) {
    const FAULTS: u16 = flags::FAULT_XFER | flags::FAULT_MAIN | flags::FAULT_TAIL | flags::FAULT_NESTED;
    let interesting = fl & FAULTS != 0 || (is_uvm && !planned) || unknown_class.is_some();
    if !interesting || !CONFIG.get(0).is_some_and(|c| c.diagnostics != 0) {
        return;
    }
    let tgid = (pid_tgid >> 32) as u32;
    if fl & FAULTS != 0 {
        warn!(&(), "ioctl copy faulted: tgid {} nr 0x{:x} flags 0x{:x} user pointer 0x{:x}", tgid, nr, fl, ptr);
    }
    if is_uvm && !planned {
        info!(&(), "no capture plan for UVM command {} (tgid {}): nothing of it is copied", nr, tgid);
    }
    if let Some(class) = unknown_class {
        info!(
            &(),
            "RM_ALLOC of class 0x{:x} (tgid {}): no parameter size known, its parameters are not copied", class, tgid
        );
    }
}

enum PathMatch {
    NotNvidia,
    /// The path could not be read yet.
    Unreadable,
    Device(DeviceRef),
}

/// Does `path` (a user pointer) name an NVIDIA node under the configured device directory?
#[inline(always)]
fn match_device_path(path: u64) -> PathMatch {
    let Some(cfg) = CONFIG.get(0) else { return PathMatch::NotNvidia };
    let plen = cfg.dev_prefix_len as usize;
    if plen == 0 || plen > cfg.dev_prefix.len() {
        return PathMatch::NotNvidia;
    }
    let mut head = [0u8; tracer_common::DEV_PREFIX_MAX];
    // SAFETY: bounded read into a stack buffer.
    let Ok(s) = (unsafe { bpf_probe_read_user_str_bytes(path as *const u8, &mut head) }) else {
        return PathMatch::Unreadable;
    };
    if s.len() < plen {
        return PathMatch::NotNvidia;
    }
    let mut i = 0;
    while i < tracer_common::DEV_PREFIX_MAX {
        if i >= plen {
            break;
        }
        if head[i] != cfg.dev_prefix[i] {
            return PathMatch::NotNvidia;
        }
        i += 1;
    }
    // The suffix after ".../nvidia", read separately so it is parsed at fixed offsets.
    let mut sfx = [0u8; 16];
    // SAFETY: bounded read into a stack buffer.
    if unsafe { bpf_probe_read_user_str_bytes((path + plen as u64) as *const u8, &mut sfx) }.is_err() {
        return PathMatch::Unreadable;
    }
    let mut dev = DeviceRef::default();
    if sfx[0] == b'c' && sfx[1] == b't' && sfx[2] == b'l' && sfx[3] == 0 {
        dev.kind = device_kind::CTL;
    } else if sfx[0] == b'-' && sfx[1] == b'u' && sfx[2] == b'v' && sfx[3] == b'm' {
        if sfx[4] == 0 {
            dev.kind = device_kind::UVM;
        } else if sfx[4] == b'-' && sfx[5] == b't' && sfx[10] == 0 {
            dev.kind = device_kind::UVM_TOOLS;
        } else {
            return PathMatch::NotNvidia;
        }
    } else if sfx[0] == b'-' && sfx[1] == b'm' && sfx[2] == b'o' && sfx[8] == 0 {
        dev.kind = device_kind::MODESET;
    } else if sfx[0] == b'-' && sfx[1] == b'c' && sfx[2] == b'a' && sfx[3] == b'p' && sfx[4] == b's' && sfx[5] == b'/' {
        dev.kind = device_kind::CAPS;
        // nvidia-caps/nvidia-cap<M>
        dev.minor = parse_minor(&sfx, 16);
    } else if sfx[0].is_ascii_digit() {
        let mut minor = 0u32;
        let mut k = 0;
        while k < 4 {
            let c = sfx[k];
            if c == 0 {
                break;
            }
            if !c.is_ascii_digit() {
                return PathMatch::NotNvidia;
            }
            minor = minor * 10 + (c - b'0') as u32;
            k += 1;
        }
        if k == 4 && sfx[4] != 0 {
            return PathMatch::NotNvidia;
        }
        dev.kind = device_kind::GPU;
        dev.minor = minor;
    } else {
        return PathMatch::NotNvidia;
    }
    PathMatch::Device(dev)
}

/// The trailing decimal number of a NUL-terminated suffix (caps nodes); 0 if none fits.
#[inline(always)]
fn parse_minor(s: &[u8; 16], _cap: usize) -> u32 {
    let mut minor = 0u32;
    let mut k = 6;
    while k < 16 {
        let c = s[k];
        if c == 0 {
            break;
        }
        if c.is_ascii_digit() {
            minor = minor * 10 + (c - b'0') as u32;
        } else {
            minor = 0;
        }
        k += 1;
    }
    minor
}

/// Is the file just opened as `fd` by the current task an NVIDIA device (see `DeviceCheck`)? A path
/// alone is never enough: a regular file or a FIFO called `nvidiactl` in a user's own mount namespace
/// is not traced. With the check off (no kernel BTF) the path decides, as `doctor` reports.
#[inline(always)]
fn is_nvidia_device(fd: u32, kind: u8) -> bool {
    let Some(cfg) = CONFIG.get(0) else { return false };
    let c = &cfg.device_check;
    if c.enabled == 0 {
        return true;
    }
    let Some((mode, rdev, sdev, ino)) = open_inode(fd, c) else { return false };
    const S_IFMT: u16 = 0o170000;
    const S_IFCHR: u16 = 0o020000;
    if mode & S_IFMT == S_IFCHR {
        let major = rdev >> 20;
        let mut i = 0;
        while i < tracer_common::DEVICE_MAJORS_MAX {
            let m = c.majors[i];
            if m == 0 {
                break;
            }
            if m == major {
                return true;
            }
            i += 1;
        }
        // nvidia-uvm and nvidia-caps get dynamic majors, and nvidia-uvm is often loaded on demand
        // after the agent read /proc/devices (user space refreshes the list): a character device
        // in the kernel's dynamic ranges is accepted for those names only.
        let dynamic = tracer_common::is_dynamic_major(major);
        return dynamic && matches!(kind, device_kind::UVM | device_kind::UVM_TOOLS | device_kind::CAPS);
    }
    let key = SimDeviceKey { dev: sdev, _pad: 0, ino };
    // SAFETY: presence check only.
    unsafe { SIM_DEVICES.get(&key) }.is_some()
}

/// `(i_mode, i_rdev, i_sb->s_dev, i_ino)` of the current task's open file `fd`, read through
/// `current->files->fdt->fd[fd]->f_inode` with the offsets user space found in the kernel's BTF.
#[inline(always)]
fn open_inode(fd: u32, c: &DeviceCheck) -> Option<(u16, u32, u32, u64)> {
    // SAFETY: every read is a bpf_probe_read_kernel of a kernel address built from the BTF offsets;
    // a wrong address fails the helper (None), it is never dereferenced directly.
    unsafe {
        let task = bpf_get_current_task() as *const u8;
        let files: u64 = bpf_probe_read_kernel(task.add(c.task_files as usize) as *const u64).ok()?;
        let fdt: u64 = bpf_probe_read_kernel((files as *const u8).add(c.files_fdt as usize) as *const u64).ok()?;
        let max: u32 = bpf_probe_read_kernel((fdt as *const u8).add(c.fdt_max_fds as usize) as *const u32).ok()?;
        if fd >= max {
            return None;
        }
        let arr: u64 = bpf_probe_read_kernel((fdt as *const u8).add(c.fdt_fd as usize) as *const u64).ok()?;
        let file: u64 = bpf_probe_read_kernel((arr as *const u64).add(fd as usize)).ok()?;
        if file == 0 {
            return None;
        }
        let inode: u64 = bpf_probe_read_kernel((file as *const u8).add(c.file_inode as usize) as *const u64).ok()?;
        let ip = inode as *const u8;
        let mode: u16 = bpf_probe_read_kernel(ip.add(c.inode_mode as usize) as *const u16).ok()?;
        let rdev: u32 = bpf_probe_read_kernel(ip.add(c.inode_rdev as usize) as *const u32).ok()?;
        let ino: u64 = bpf_probe_read_kernel(ip.add(c.inode_ino as usize) as *const u64).ok()?;
        let sb: u64 = bpf_probe_read_kernel(ip.add(c.inode_sb as usize) as *const u64).ok()?;
        let sdev: u32 = bpf_probe_read_kernel((sb as *const u8).add(c.sb_dev as usize) as *const u32).ok()?;
        Some((mode, rdev, sdev, ino))
    }
}
