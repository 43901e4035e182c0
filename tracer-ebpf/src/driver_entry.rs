//! Driver-entry mode: the `driver` family's probes on the NVIDIA driver's own file operations
//! (on `nvidia.ko`'s and `nvidia-uvm.ko`'s open, ioctl and release, and their returns) instead of
//! on every syscall of the node. Only the calls that are inside the NVIDIA driver run a program,
//! so other processes' syscalls pay nothing.
//!
//! Two mechanisms carry the same programs: fentry/fexit (BPF trampolines, where the module has
//! BTF) and kprobe/kretprobe (everywhere else). Each program here is written once against
//! [`Args`] and [`Ret`]; `main.rs` instantiates it for both contexts.
//!
//! What changes against the syscall modes is where the facts come from, not what is recorded:
//! - the device is known from the probe itself (the call is inside the NVIDIA driver), its minor
//!   from the inode; no path match and no fd-table walk decide that a call is an NVIDIA call;
//! - the driver sees the open *file*, not the fd: an fd and its dups, and a forked child's
//!   inherited fd, are one file, and the driver frees the file's RM clients when its last reference
//!   is released. Records name the file by its *file slot* (`tracer_common::NvFile`) in place of an
//!   fd, and a release closes that slot in every process that used it;
//! - a file opened before the agent attached is registered at its first call (flag
//!   `FIRST_SEEN_IN_CALL` on its open record), as is a file another process uses first (a fork).
//!
//! The ioctl's decoding and record are the syscall modes' own (`driver::exit_ioctl`), as are the
//! UVM managed mappings' (`driver::exit_mmap` at `uvm_mmap_entry`'s return, `driver::unmapped` at
//! the managed VMA's close, `uvm_vm_close_managed_entry`).
use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel},
    programs::{FEntryContext, FExitContext, ProbeContext, RetProbeContext},
};
use tracer_common::{
    DeviceRef, FdCloseRecord, FdOpenRecord, Inflight, NvFile, counter, device_kind, file_identity, flags, probe, sysno,
};

use crate::{
    driver, emit,
    maps::{CONFIG, DE_IOCTL_ENTRY, NV_FILES},
};

/// A probed function's arguments, as integers (pointers are addresses for kernel reads).
pub trait Args {
    fn arg(&self, n: usize) -> Option<u64>;
}

impl Args for ProbeContext {
    #[inline(always)]
    fn arg(&self, n: usize) -> Option<u64> {
        ProbeContext::arg::<u64>(self, n)
    }
}

/// `bpf_get_func_arg` for either trampoline context (see `FEntryContext`'s impl).
#[inline(always)]
fn func_arg(ctx: *mut core::ffi::c_void, n: usize) -> Option<u64> {
    let mut v = 0u64;
    // SAFETY: the helper writes one u64 to `v` (or fails for an argument the function lacks).
    let rc = unsafe { aya_ebpf::helpers::bpf_get_func_arg(ctx, n as u32, &mut v) };
    (rc == 0).then_some(v)
}

impl Args for FExitContext {
    #[inline(always)]
    fn arg(&self, n: usize) -> Option<u64> {
        func_arg(self.as_ptr(), n)
    }
}

impl Args for FEntryContext {
    /// Through `bpf_get_func_arg` (which the verifier inlines), not a load from the context: a
    /// context load of a pointer argument is a BTF-typed pointer, and the file slot's arithmetic
    /// on it (`file_identity`) is refused; the helper's copy is a plain number.
    #[inline(always)]
    fn arg(&self, n: usize) -> Option<u64> {
        func_arg(self.as_ptr(), n)
    }
}

/// A probed function's return value.
pub trait Ret {
    /// `None` only where the mechanism cannot say (not seen in practice: `bpf_get_func_ret` fails
    /// only outside an fexit program).
    fn ret(&self) -> Option<i64>;
}

impl Ret for RetProbeContext {
    #[inline(always)]
    fn ret(&self) -> Option<i64> {
        Some(RetProbeContext::ret::<i64>(self))
    }
}

impl Ret for FExitContext {
    #[inline(always)]
    fn ret(&self) -> Option<i64> {
        FExitContext::ret::<i64>(self).ok()
    }
}

/// Which driver a probe sits in.
#[derive(Clone, Copy)]
pub enum Driver {
    /// `nvidia.ko`: `/dev/nvidiactl` (minor 255), `/dev/nvidia-modeset` (254), `/dev/nvidiaN`.
    Frontend,
    /// `nvidia-uvm.ko`: `/dev/nvidia-uvm` (minor 0), `/dev/nvidia-uvm-tools` (1).
    Uvm,
}

/// The `Inflight::sysno` of an open between its entry and return (no syscall has this number).
const OPEN_IN_FLIGHT: u32 = u32::MAX - 1;

/// The device of an inode of `driver`, by its minor (`inode->i_rdev` at the BTF offset user space
/// found), with the file's identity.
#[inline(always)]
fn device(driver: Driver, inode: u64, file: u64) -> Option<DeviceRef> {
    let cfg = CONFIG.get(0)?;
    // SAFETY: a kernel read at the BTF offset of `inode.i_rdev`; a bad address fails the helper.
    let rdev: u32 =
        unsafe { bpf_probe_read_kernel((inode as *const u8).add(cfg.device_check.inode_rdev as usize) as *const u32) }
            .ok()?;
    let minor = rdev & 0xf_ffff;
    let kind = match driver {
        Driver::Frontend if minor == 255 => device_kind::CTL,
        Driver::Frontend if minor == 254 => device_kind::MODESET,
        Driver::Frontend => device_kind::GPU,
        Driver::Uvm if minor == 0 => device_kind::UVM,
        Driver::Uvm => device_kind::UVM_TOOLS,
    };
    let minor = if kind == device_kind::GPU { minor } else { 0 };
    let (file_id, _) = file_identity(file, cfg.file_salt);
    Some(DeviceRef { kind, _pad: [0; 3], minor, file_id })
}

/// The inode of an open file (`file->f_inode`).
#[inline(always)]
fn inode_of(file: u64) -> Option<u64> {
    let cfg = CONFIG.get(0)?;
    // SAFETY: a kernel read at the BTF offset of `file.f_inode`.
    unsafe { bpf_probe_read_kernel((file as *const u8).add(cfg.device_check.file_inode as usize) as *const u64) }.ok()
}

/// Is `tgid` the agent (its NVML calls are not workload calls)?
#[inline(always)]
fn is_agent(tgid: u32) -> bool {
    CONFIG.get(0).is_none_or(|c| c.agent_tgid == tgid)
}

/// Send the open record of `f` for `pid_tgid`.
#[inline(always)]
fn emit_open(f: &NvFile, fl: u16) {
    if let Some(mut e) = emit::reserve::<FdOpenRecord>(probe::OPEN, fl) {
        let r = e.as_mut_ptr();
        // SAFETY: r points at a reserved FdOpenRecord.
        unsafe {
            (*r).dev = f.dev;
            (*r).fd = f.slot as i32;
            (*r).open_flags = 0;
        }
        emit::submit(probe::OPEN, e);
    }
}

/// `nvidia_open(inode, file)` / `uvm_open_entry(inode, file)` entry.
#[inline(always)]
pub fn on_open(ctx: &impl Args, driver: Driver) {
    let pid_tgid = bpf_get_current_pid_tgid();
    if is_agent((pid_tgid >> 32) as u32) {
        return;
    }
    let (Some(inode), Some(file)) = (ctx.arg(0), ctx.arg(1)) else {
        emit::drop_event(probe::OPEN, counter::DROP_KERNEL_READ);
        return;
    };
    let Some(dev) = device(driver, inode, file) else {
        emit::drop_event(probe::OPEN, counter::DROP_KERNEL_READ);
        return;
    };
    stash_call(pid_tgid, probe::OPEN, |st| {
        st.sysno = OPEN_IN_FLIGHT;
        st.dev = dev;
        st.args[0] = file;
    });
}

/// The open's return: a file the driver accepted is registered and reported.
#[inline(always)]
pub fn on_open_return(ctx: &impl Ret) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(st) = take_entry(pid_tgid, probe::OPEN) else { return };
    let Some(ret) = ctx.ret() else {
        emit::drop_event(probe::OPEN, counter::DROP_NO_RETURN);
        return;
    };
    if st.sysno != OPEN_IN_FLIGHT || ret != 0 {
        return;
    }
    let Some(cfg) = CONFIG.get(0) else { return };
    let tgid = (pid_tgid >> 32) as u32;
    let (_, slot) = file_identity(st.args[0], cfg.file_salt);
    let f = NvFile { dev: st.dev, tgid, slot };
    if NV_FILES.insert(&st.args[0], &f, 0).is_err() {
        emit::drop_event(probe::OPEN, counter::DROP_FD_MAP);
        return;
    }
    driver::set_tracked(tgid, true);
    emit_open(&f, 0);
}

/// The file `file` as process `tgid` knows it: registered at its open, or now, at its first call
/// in this process (opened before the agent attached, evicted from the map, or inherited by a
/// forked child or passed over a socket: the new user becomes the owner). `None`: not an NVIDIA
/// file this mode can name, or the map is full (counted against `probe`).
#[inline(always)]
fn file_of(file: u64, tgid: u32, driver: Driver, probe: u32) -> Option<NvFile> {
    let cfg = CONFIG.get(0)?;
    if let Some(p) = NV_FILES.get_ptr_mut(&file) {
        // SAFETY: a value of this map, copied out; one store below.
        let f = unsafe { *p };
        if f.tgid == tgid {
            return Some(f);
        }
        // SAFETY: as above.
        unsafe { (*p).tgid = tgid };
        let mine = NvFile { tgid, ..f };
        driver::set_tracked(tgid, true);
        emit_open(&mine, flags::FIRST_SEEN_IN_CALL);
        return Some(mine);
    }
    let Some(dev) = inode_of(file).and_then(|inode| device(driver, inode, file)) else {
        emit::drop_event(probe, counter::DROP_KERNEL_READ);
        return None;
    };
    let (_, slot) = file_identity(file, cfg.file_salt);
    let f = NvFile { dev, tgid, slot };
    if NV_FILES.insert(&file, &f, 0).is_err() {
        emit::drop_event(probe, counter::DROP_FD_MAP);
        return None;
    }
    driver::set_tracked(tgid, true);
    emit_open(&f, flags::FIRST_SEEN_IN_CALL);
    Some(f)
}

/// Keep a call's entry state in its thread's slot for the return probe; a state the thread left
/// there means that call's return never came (counted as `no_return` against `probe`).
#[inline(always)]
fn stash_call(pid_tgid: u64, probe: u32, fill: impl FnOnce(&mut Inflight)) {
    let Some(e) = DE_IOCTL_ENTRY.get_ptr_mut(ioctl_slot(pid_tgid)) else { return };
    // SAFETY: a value of this program's array; plain loads and stores.
    unsafe {
        if (*e).pid_tgid == pid_tgid {
            emit::drop_event(probe, counter::DROP_NO_RETURN);
        }
        (*e).pid_tgid = pid_tgid;
        (*e).st = Inflight::default();
        fill(&mut (*e).st);
        (*e).st.enter_ktime = bpf_ktime_get_ns();
    }
}

/// `nvidia_unlocked_ioctl(file, cmd, arg)` / `uvm_unlocked_ioctl_entry(file, cmd, arg)` entry.
#[inline(always)]
pub fn on_ioctl(ctx: &impl Args, driver: Driver) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if is_agent(tgid) {
        return;
    }
    let (Some(file), Some(cmd), Some(arg)) = (ctx.arg(0), ctx.arg(1), ctx.arg(2)) else {
        emit::drop_event(probe::IOCTL, counter::DROP_KERNEL_READ);
        return;
    };
    let Some(f) = file_of(file, tgid, driver, probe::IOCTL) else { return };
    stash_call(pid_tgid, probe::IOCTL, |st| {
        st.sysno = sysno::IOCTL;
        st.fd = f.slot as i32;
        st.dev = f.dev;
        st.args[0] = cmd;
        st.args[1] = arg;
    });
}

/// fentry on the ioctl: only the clock, in the thread's slot (for `duration_ns`). Everything else
/// is read at the fexit, which has the arguments too (`on_ioctl_exit`): one slot store here instead
/// of the file lookup and the whole entry state the kprobe path must carry to its kretprobe.
#[inline(always)]
pub fn on_ioctl_clock() {
    let pid_tgid = bpf_get_current_pid_tgid();
    if is_agent((pid_tgid >> 32) as u32) {
        return;
    }
    let Some(e) = DE_IOCTL_ENTRY.get_ptr_mut(ioctl_slot(pid_tgid)) else { return };
    // SAFETY: a value of this program's array; plain stores.
    unsafe {
        (*e).pid_tgid = pid_tgid;
        (*e).st.sysno = sysno::IOCTL;
        (*e).st.enter_ktime = bpf_ktime_get_ns();
    }
}

/// fexit on the ioctl: the arguments and the return value are both here, so the record is built
/// from them directly; the entry clock comes from the thread's slot (0 when the call began before
/// the probes: the record is still made, without a duration).
#[inline(always)]
pub fn on_ioctl_exit(ctx: &FExitContext, driver: Driver) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if is_agent(tgid) {
        return;
    }
    let mut enter_ktime = 0;
    if let Some(e) = DE_IOCTL_ENTRY.get_ptr_mut(ioctl_slot(pid_tgid)) {
        // SAFETY: a value of this program's array; plain loads and a store.
        unsafe {
            if (*e).pid_tgid == pid_tgid && (*e).st.sysno == sysno::IOCTL {
                enter_ktime = (*e).st.enter_ktime;
                (*e).pid_tgid = 0;
            }
        }
    }
    let (Some(file), Some(cmd), Some(arg), Some(ret)) =
        (Args::arg(ctx, 0), Args::arg(ctx, 1), Args::arg(ctx, 2), Ret::ret(ctx))
    else {
        emit::drop_event(probe::IOCTL, counter::DROP_KERNEL_READ);
        return;
    };
    let Some(f) = file_of(file, tgid, driver, probe::IOCTL) else { return };
    let mut st = Inflight { sysno: sysno::IOCTL, fd: f.slot as i32, dev: f.dev, enter_ktime, ..Default::default() };
    st.args[0] = cmd;
    st.args[1] = arg;
    driver::exit_ioctl(&st, ret, pid_tgid);
}

/// `vm_flags` bits: `VM_READ | VM_WRITE | VM_EXEC` are `PROT_*`'s values; `VM_SHARED`.
const VM_PROT: u64 = 0x7;
const VM_SHARED: u64 = 0x8;
const MAP_SHARED: u64 = 0x1;
const MAP_PRIVATE: u64 = 0x2;

/// `uvm_mmap_entry(file, vma)`: a mapping of a UVM file being made (`cudaMallocManaged`); its range,
/// protection and offset are the VMA's. Recorded at its return, as the syscall modes record mmap.
#[inline(always)]
pub fn on_mmap(ctx: &impl Args) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if is_agent(tgid) {
        return;
    }
    let (Some(file), Some(vma), Some(cfg)) = (ctx.arg(0), ctx.arg(1), CONFIG.get(0)) else {
        emit::drop_event(probe::MMAP, counter::DROP_KERNEL_READ);
        return;
    };
    let Some(f) = file_of(file, tgid, Driver::Uvm, probe::MMAP) else { return };
    if f.dev.kind != device_kind::UVM {
        return;
    }
    let c = &cfg.device_check;
    let field = |off: u32| -> Option<u64> {
        // SAFETY: a kernel read at a BTF offset of `vm_area_struct`; a bad address fails the helper.
        unsafe { bpf_probe_read_kernel((vma as *const u8).add(off as usize) as *const u64) }.ok()
    };
    let (Some(start), Some(end), Some(vm_flags), Some(pgoff)) =
        (field(c.vma_start), field(c.vma_end), field(c.vma_flags), field(c.vma_pgoff))
    else {
        emit::drop_event(probe::MMAP, counter::DROP_KERNEL_READ);
        return;
    };
    let map_flags = if vm_flags & VM_SHARED != 0 { MAP_SHARED } else { MAP_PRIVATE };
    stash_call(pid_tgid, probe::MMAP, |st| {
        st.sysno = sysno::MMAP;
        st.fd = f.slot as i32;
        st.dev = f.dev;
        st.args = [start, end.wrapping_sub(start), (vm_flags & VM_PROT) | (map_flags << 32), pgoff << 12];
    });
}

/// `uvm_vm_close_managed_entry(vma)`: a managed mapping goes away (munmap, or the process's exit);
/// reported as the syscall modes report its munmap, if its mmap was recorded.
#[inline(always)]
pub fn on_vm_close(ctx: &impl Args) {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let (Some(vma), Some(cfg)) = (ctx.arg(0), CONFIG.get(0)) else {
        emit::drop_event(probe::MUNMAP, counter::DROP_KERNEL_READ);
        return;
    };
    let c = &cfg.device_check;
    let field = |off: u32| -> Option<u64> {
        // SAFETY: a kernel read at a BTF offset of `vm_area_struct`; a bad address fails the helper.
        unsafe { bpf_probe_read_kernel((vma as *const u8).add(off as usize) as *const u64) }.ok()
    };
    let (Some(start), Some(end)) = (field(c.vma_start), field(c.vma_end)) else {
        emit::drop_event(probe::MUNMAP, counter::DROP_KERNEL_READ);
        return;
    };
    driver::unmapped(tgid, start, end.wrapping_sub(start));
}

/// Take the entry state the returning call's entry probe left in this thread's slot. `None`: there
/// is none — the agent's own calls, which leave none; any other call lost its entry (another
/// thread with the same slot took it, or the call began before the probes), counted as `no_entry`
/// against `probe`.
#[inline(always)]
fn take_entry(pid_tgid: u64, probe: u32) -> Option<Inflight> {
    let e = DE_IOCTL_ENTRY.get_ptr_mut(ioctl_slot(pid_tgid))?;
    // SAFETY: a value of this program's array, copied out and released.
    unsafe {
        if (*e).pid_tgid != pid_tgid {
            if !is_agent((pid_tgid >> 32) as u32) {
                emit::drop_event(probe, counter::DROP_NO_ENTRY);
            }
            return None;
        }
        (*e).pid_tgid = 0;
        Some((*e).st)
    }
}

/// `DE_IOCTL_ENTRY` slot of a thread (opens, ioctls and UVM mmaps between entry and return).
#[inline(always)]
fn ioctl_slot(pid_tgid: u64) -> u32 {
    (pid_tgid as u32) & (tracer_common::capacity::DE_IOCTL_ENTRY - 1)
}

/// The return of an ioctl (or of a UVM mmap, which this program also probes): the same record as
/// the syscall modes'.
#[inline(always)]
pub fn on_ioctl_return(ctx: &impl Ret) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(st) = take_entry(pid_tgid, probe::IOCTL) else { return };
    let Some(ret) = ctx.ret() else {
        emit::drop_event(probe::IOCTL, counter::DROP_NO_RETURN);
        return;
    };
    if st.sysno == sysno::MMAP {
        // The driver's mmap returns 0 on success; the syscall's return, the address, is the VMA's start.
        let ret = if ret == 0 { st.args[0] as i64 } else { ret };
        driver::exit_mmap(&st, (pid_tgid >> 32) as u32, ret);
    } else {
        driver::exit_ioctl(&st, ret, pid_tgid);
    }
}

/// `nvidia_close(inode, file)` / `uvm_release_entry(inode, file)`: the file's last reference is
/// gone. Its slot is closed in every process that used it (user space does that for a slot).
#[inline(always)]
pub fn on_release(ctx: &impl Args) {
    let Some(file) = ctx.arg(1) else {
        emit::drop_event(probe::CLOSE, counter::DROP_KERNEL_READ);
        return;
    };
    // SAFETY: copied out immediately.
    let Some(f) = (unsafe { NV_FILES.get(&file) }).copied() else { return };
    let _ = NV_FILES.remove(&file);
    // The record carries the file's last user, whatever task drops the last reference.
    let pid_tgid = ((f.tgid as u64) << 32) | f.tgid as u64;
    // SAFETY: helpers without arguments: the monotonic clock and the current task's cgroup.
    let (now, cgroup_id) = unsafe { (bpf_ktime_get_ns(), aya_ebpf::helpers::bpf_get_current_cgroup_id()) };
    let Some(mut e) = emit::reserve_at::<FdCloseRecord>(emit::Ring::Ledger, probe::CLOSE, 0, pid_tgid, now, cgroup_id)
    else {
        return;
    };
    let r = e.as_mut_ptr();
    // SAFETY: r points at a reserved FdCloseRecord.
    unsafe {
        (*r).dev = f.dev;
        (*r).fd = f.slot as i32;
        (*r)._pad = 0;
    }
    emit::submit(probe::CLOSE, e);
}
