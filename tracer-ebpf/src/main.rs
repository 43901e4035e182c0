//! gpu-tracer kernel programs. Entry points are thin: they extract the syscall number and arguments
//! for their attach mode and hand over to one shared handler per family.
#![no_std]
#![no_main]

mod cuda;
mod driver;
mod driver_entry;
mod emit;
mod lifecycle;
mod maps;

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::{btf_tracepoint, fentry, fexit, kprobe, kretprobe, raw_tracepoint, tracepoint, uprobe, uretprobe},
    programs::{
        BtfTracePointContext, FEntryContext, FExitContext, ProbeContext, RawTracePointContext, RetProbeContext,
        TracePointContext,
    },
};
use driver::SyscallArgs;

/// `syscalls:sys_enter_<name>` records: `__syscall_nr` at 8, six u64 args from 16.
struct TpArgs<'a>(&'a TracePointContext);
impl SyscallArgs for TpArgs<'_> {
    const AT_EXIT: bool = false;
    #[inline(always)]
    fn arg(&self, i: usize) -> u64 {
        // SAFETY: every sys_enter_* record has six 8-byte argument slots from offset 16 (fewer are
        // declared for short syscalls, but the handler only reads the ones its syscall has).
        unsafe { self.0.read_at::<u64>(16 + 8 * i) }.unwrap_or(0)
    }
}

/// Where a syscall's six arguments sit in the kernel's `struct pt_regs`, and its number.
/// x86_64: di, si, dx, r10, r8, r9; the number in `orig_ax`.
#[cfg(not(bpf_target_arch = "aarch64"))]
mod regs {
    pub const ARG_OFF: [usize; 6] = [112, 104, 96, 56, 72, 64];
    pub const NR_OFF: usize = 120;
    /// `orig_ax` is a u64 (the syscall number in its low half on little-endian).
    pub type Nr = u64;
    /// The raw exit reads dx, si, di and orig_ax (the first three arguments and the number) in
    /// one helper call.
    pub const BLOCK_OFF: usize = 96;
    pub const BLOCK_WORDS: usize = 4;
}
/// arm64: x0..x5, except that x0 holds the return value at exit, so the first argument comes from
/// `orig_x0` (saved at entry, offset 272); the number is `syscallno` (an s32 at 280).
#[cfg(bpf_target_arch = "aarch64")]
mod regs {
    pub const ARG_OFF: [usize; 6] = [272, 8, 16, 24, 32, 40];
    pub const NR_OFF: usize = 280;
    pub type Nr = u32;
    /// The raw exit reads `orig_x0` and `syscallno` in one helper call.
    pub const BLOCK_OFF: usize = 272;
    pub const BLOCK_WORDS: usize = 2;
}

/// The word of the raw exit's register block holding the register at `off`, if it is in it.
#[inline(always)]
const fn block_word(off: usize) -> Option<usize> {
    if off >= regs::BLOCK_OFF && off < regs::BLOCK_OFF + 8 * regs::BLOCK_WORDS {
        Some((off - regs::BLOCK_OFF) / 8)
    } else {
        None
    }
}

const _: () = assert!(block_word(regs::NR_OFF).is_some(), "the raw exit's register block holds the syscall number");

/// The registers at a raw-tracepoint syscall exit: a block of them copied with one
/// `bpf_probe_read_kernel` (the number and, on x86_64, the three arguments an ioctl needs), any
/// other argument read on demand. Each helper call costs tens of ns on the hottest path.
struct RawExitRegs {
    regs: *const u8,
    block: [u64; regs::BLOCK_WORDS],
}
impl RawExitRegs {
    #[inline(always)]
    fn nr(&self) -> u32 {
        match block_word(regs::NR_OFF) {
            Some(w) => self.block[w] as u32,
            None => u32::MAX,
        }
    }
}
impl SyscallArgs for RawExitRegs {
    const AT_EXIT: bool = true;
    #[inline(always)]
    fn arg(&self, i: usize) -> u64 {
        let off = if i < 6 { regs::ARG_OFF[i] } else { return 0 };
        match block_word(off) {
            Some(w) => self.block[w],
            // SAFETY: reads the saved user registers of the current syscall.
            None => unsafe { bpf_probe_read_kernel(self.regs.add(off) as *const u64) }.unwrap_or(0),
        }
    }
}

struct RegsArgs(*const u8);
impl SyscallArgs for RegsArgs {
    const AT_EXIT: bool = true;
    #[inline(always)]
    fn arg(&self, i: usize) -> u64 {
        let off = if i < 6 { regs::ARG_OFF[i] } else { return 0 };
        // SAFETY: reads the saved user registers of the current syscall.
        unsafe { bpf_probe_read_kernel(self.0.add(off) as *const u64) }.unwrap_or(0)
    }
}

/// The same registers through a BTF-typed `struct pt_regs *` (tp_btf): direct loads, which the
/// verifier checks against the type, instead of a helper call per argument.
struct BtfRegsArgs(*const u8);
impl SyscallArgs for BtfRegsArgs {
    const AT_EXIT: bool = true;
    #[inline(always)]
    fn arg(&self, i: usize) -> u64 {
        // Constant offsets per arm: the verifier rejects a load at a variable context offset.
        // SAFETY: constant offsets of `struct pt_regs` fields, validated by the verifier via BTF.
        unsafe {
            match i {
                0 => core::ptr::read_volatile(self.0.add(regs::ARG_OFF[0]) as *const u64),
                1 => core::ptr::read_volatile(self.0.add(regs::ARG_OFF[1]) as *const u64),
                2 => core::ptr::read_volatile(self.0.add(regs::ARG_OFF[2]) as *const u64),
                3 => core::ptr::read_volatile(self.0.add(regs::ARG_OFF[3]) as *const u64),
                4 => core::ptr::read_volatile(self.0.add(regs::ARG_OFF[4]) as *const u64),
                5 => core::ptr::read_volatile(self.0.add(regs::ARG_OFF[5]) as *const u64),
                _ => 0,
            }
        }
    }
}

#[tracepoint]
pub fn sys_enter_tp(ctx: TracePointContext) -> u32 {
    // SAFETY: `id` (the syscall number, a long; we read its low half) is at offset 8 of every
    // raw_syscalls/sys_enter record (its format file); read_at goes through bpf_probe_read_kernel, so even a
    // wrong offset only fails.
    let nr = unsafe { ctx.read_at::<i32>(8) }.unwrap_or(-1) as u32;
    if driver::interesting(nr) {
        driver::on_enter(nr, &TpArgs(&ctx));
    }
    0
}

#[tracepoint]
pub fn sys_exit_tp(ctx: TracePointContext) -> u32 {
    // SAFETY: `id` (the syscall number, a long; we read its low half) is at offset 8 of every
    // raw_syscalls/sys_exit record (its format file); read_at goes through bpf_probe_read_kernel, so even a
    // wrong offset only fails.
    let nr = unsafe { ctx.read_at::<i32>(8) }.unwrap_or(-1) as u32;
    if driver::interesting(nr) {
        // SAFETY: `ret` (a long) is at offset 16 of the same record, per its format file.
        let ret = unsafe { ctx.read_at::<i64>(16) }.unwrap_or(0);
        driver::on_exit::<TpArgs>(nr, ret, None);
    }
    0
}

#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn sys_enter_raw(ctx: RawTracePointContext) -> i32 {
    let nr: u64 = ctx.arg(1);
    let nr = nr as u32;
    if driver::interesting(nr) {
        let regs: *const u8 = ctx.arg(0);
        driver::on_enter(nr, &RegsArgs(regs));
    }
    0
}

#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit_raw(ctx: RawTracePointContext) -> i32 {
    let regs: *const u8 = ctx.arg(0);
    // SAFETY: the saved registers' block holding the syscall number (`orig_ax`; arm64:
    // `syscallno`); a failed read gives no syscall.
    let Ok(block) = (unsafe { bpf_probe_read_kernel(regs.add(regs::BLOCK_OFF) as *const [u64; regs::BLOCK_WORDS]) })
    else {
        return 0;
    };
    let a = RawExitRegs { regs, block };
    let nr = a.nr();
    if driver::interesting(nr) {
        let ret: i64 = ctx.arg(1);
        driver::on_exit(nr, ret, Some(&a));
    }
    0
}

#[btf_tracepoint(function = "sys_enter")]
pub fn sys_enter_btf(ctx: BtfTracePointContext) -> i32 {
    let nr: u64 = ctx.arg(1);
    let nr = nr as u32;
    if driver::interesting(nr) {
        let regs: *const u8 = ctx.arg(0);
        driver::on_enter(nr, &BtfRegsArgs(regs));
    }
    0
}

#[btf_tracepoint(function = "sys_exit")]
pub fn sys_exit_btf(ctx: BtfTracePointContext) -> i32 {
    let regs: *const u8 = ctx.arg(0);
    // SAFETY: `regs` is a BTF-typed `struct pt_regs *`: the verifier allows a direct load of
    // the syscall number (`orig_ax`; arm64: `syscallno`), cheaper than a probe-read helper call.
    let nr = unsafe { core::ptr::read_volatile(regs.add(regs::NR_OFF) as *const regs::Nr) } as u32;
    if driver::interesting(nr) {
        let ret: i64 = ctx.arg(1);
        driver::on_exit(nr, ret, Some(&BtfRegsArgs(regs)));
    }
    0
}

// Driver-entry mode: on the NVIDIA driver's file operations (names per driver version, found in
// kallsyms by user space).
#[kprobe]
pub fn de_nv_open(ctx: ProbeContext) -> u32 {
    driver_entry::on_open(&ctx, driver_entry::Driver::Frontend);
    0
}

#[kprobe]
pub fn de_uvm_open(ctx: ProbeContext) -> u32 {
    driver_entry::on_open(&ctx, driver_entry::Driver::Uvm);
    0
}

#[kretprobe]
pub fn de_open_ret(ctx: RetProbeContext) -> u32 {
    driver_entry::on_open_return(&ctx);
    0
}

#[kprobe]
pub fn de_nv_ioctl(ctx: ProbeContext) -> u32 {
    driver_entry::on_ioctl(&ctx, driver_entry::Driver::Frontend);
    0
}

#[kprobe]
pub fn de_uvm_ioctl(ctx: ProbeContext) -> u32 {
    driver_entry::on_ioctl(&ctx, driver_entry::Driver::Uvm);
    0
}

#[kretprobe]
pub fn de_ioctl_ret(ctx: RetProbeContext) -> u32 {
    driver_entry::on_ioctl_return(&ctx);
    0
}

#[kprobe]
pub fn de_release(ctx: ProbeContext) -> u32 {
    driver_entry::on_release(&ctx);
    0
}

#[kprobe]
pub fn de_uvm_mmap(ctx: ProbeContext) -> u32 {
    driver_entry::on_mmap(&ctx);
    0
}

#[kprobe]
pub fn de_uvm_vm_close(ctx: ProbeContext) -> u32 {
    driver_entry::on_vm_close(&ctx);
    0
}

// The same nine programs on BPF trampolines (fentry/fexit), for a driver whose module has BTF.
// User space loads each one per target function (attach_btf_id in the module's BTF).
#[fentry]
pub fn def_nv_open(ctx: FEntryContext) -> u32 {
    driver_entry::on_open(&ctx, driver_entry::Driver::Frontend);
    0
}

#[fentry]
pub fn def_uvm_open(ctx: FEntryContext) -> u32 {
    driver_entry::on_open(&ctx, driver_entry::Driver::Uvm);
    0
}

#[fexit]
pub fn def_open_ret(ctx: FExitContext) -> u32 {
    driver_entry::on_open_return(&ctx);
    0
}

// The ioctl on trampolines: the entry keeps only the clock, the exit (which has the arguments)
// does the rest; one entry program serves both drivers.
#[fentry]
pub fn def_ioctl_clock(_ctx: FEntryContext) -> u32 {
    driver_entry::on_ioctl_clock();
    0
}

#[fexit]
pub fn def_nv_ioctl_ret(ctx: FExitContext) -> u32 {
    driver_entry::on_ioctl_exit(&ctx, driver_entry::Driver::Frontend);
    0
}

#[fexit]
pub fn def_uvm_ioctl_ret(ctx: FExitContext) -> u32 {
    driver_entry::on_ioctl_exit(&ctx, driver_entry::Driver::Uvm);
    0
}

/// The UVM mmap's return (its entry, `def_uvm_mmap`, left the VMA's facts in the slot).
#[fexit]
pub fn def_ioctl_ret(ctx: FExitContext) -> u32 {
    driver_entry::on_ioctl_return(&ctx);
    0
}

#[fentry]
pub fn def_release(ctx: FEntryContext) -> u32 {
    driver_entry::on_release(&ctx);
    0
}

#[fentry]
pub fn def_uvm_mmap(ctx: FEntryContext) -> u32 {
    driver_entry::on_mmap(&ctx);
    0
}

#[fentry]
pub fn def_uvm_vm_close(ctx: FEntryContext) -> u32 {
    driver_entry::on_vm_close(&ctx);
    0
}

#[tracepoint]
pub fn proc_exec(_ctx: TracePointContext) -> u32 {
    lifecycle::exec();
    0
}

#[tracepoint]
pub fn proc_exit(ctx: TracePointContext) -> u32 {
    lifecycle::exit(&ctx);
    0
}

#[tracepoint]
pub fn proc_fork(ctx: TracePointContext) -> u32 {
    lifecycle::fork(&ctx);
    0
}

#[tracepoint]
pub fn cgroup_rmdir(ctx: TracePointContext) -> u32 {
    lifecycle::cgroup_rmdir(&ctx);
    0
}

// The same four as tp_btf programs: attached through BPF links, not perf events.
#[btf_tracepoint(function = "sched_process_exec")]
pub fn proc_exec_btf(_ctx: BtfTracePointContext) -> i32 {
    lifecycle::exec();
    0
}

#[btf_tracepoint(function = "sched_process_exit")]
pub fn proc_exit_btf(_ctx: BtfTracePointContext) -> i32 {
    lifecycle::exit_btf();
    0
}

#[btf_tracepoint(function = "sched_process_fork")]
pub fn proc_fork_btf(ctx: BtfTracePointContext) -> i32 {
    lifecycle::fork_btf(&ctx);
    0
}

#[btf_tracepoint(function = "cgroup_rmdir")]
pub fn cgroup_rmdir_btf(ctx: BtfTracePointContext) -> i32 {
    lifecycle::cgroup_rmdir_btf(&ctx);
    0
}

#[uprobe]
pub fn cuda_count(ctx: ProbeContext) -> u32 {
    cuda::on_call(&ctx);
    0
}

#[uprobe]
pub fn cuda_alloc_enter(ctx: ProbeContext) -> u32 {
    cuda::on_alloc_enter(&ctx);
    0
}

#[uretprobe]
pub fn cuda_alloc_return(ctx: RetProbeContext) -> u32 {
    cuda::on_alloc_return(&ctx);
    0
}

#[uprobe]
pub fn cuda_lookup_enter(ctx: ProbeContext) -> u32 {
    cuda::on_lookup_enter(&ctx);
    0
}

#[uretprobe]
pub fn cuda_lookup_return(ctx: RetProbeContext) -> u32 {
    cuda::on_lookup_return(&ctx);
    0
}

#[uprobe]
pub fn cuda_free(ctx: ProbeContext) -> u32 {
    cuda::on_free(&ctx);
    0
}

#[uprobe]
pub fn cuda_timed_enter(ctx: ProbeContext) -> u32 {
    cuda::on_timed_enter(&ctx);
    0
}

#[uretprobe]
pub fn cuda_timed_return(ctx: RetProbeContext) -> u32 {
    cuda::on_timed_return(&ctx);
    0
}

/// The cuda family's entry probes without attach cookies: one program per entry point, its id a
/// constant (`cuda::on_entry`); names as `prog_names::CUDA_PER_ENTRY` lists them.
macro_rules! cuda_per_entry {
    ($($name:ident = $id:literal),* $(,)?) => {
        $(
            #[uprobe]
            pub fn $name(ctx: ProbeContext) -> u32 {
                cuda::on_entry::<$id>(&ctx);
                0
            }
        )*
    };
}

cuda_per_entry!(
    cuda_e0 = 0,
    cuda_e1 = 1,
    cuda_e2 = 2,
    cuda_e3 = 3,
    cuda_e4 = 4,
    cuda_e5 = 5,
    cuda_e6 = 6,
    cuda_e7 = 7,
    cuda_e8 = 8,
    cuda_e9 = 9,
    cuda_e10 = 10,
    cuda_e11 = 11,
    cuda_e12 = 12,
    cuda_e13 = 13,
    cuda_e14 = 14,
    cuda_e15 = 15,
    cuda_e16 = 16,
    cuda_e17 = 17,
    cuda_e18 = 18,
    cuda_e19 = 19,
    cuda_e20 = 20,
    cuda_e21 = 21,
    cuda_e22 = 22,
    cuda_e23 = 23,
    cuda_e24 = 24,
    cuda_e25 = 25,
    cuda_e26 = 26,
    cuda_e27 = 27,
    cuda_e28 = 28,
    cuda_e29 = 29,
    cuda_e30 = 30,
    cuda_e31 = 31,
    cuda_e32 = 32,
    cuda_e33 = 33,
    cuda_e34 = 34,
    cuda_e35 = 35,
    cuda_e36 = 36,
    cuda_e37 = 37,
    cuda_e38 = 38,
    cuda_e39 = 39,
    cuda_e40 = 40,
    cuda_e41 = 41,
    cuda_e42 = 42,
    cuda_e43 = 43,
    cuda_e44 = 44,
    cuda_e45 = 45,
    cuda_e46 = 46,
    cuda_e47 = 47,
    cuda_e48 = 48,
    cuda_e49 = 49,
    cuda_e50 = 50,
    cuda_e51 = 51,
    cuda_e52 = 52,
    cuda_e53 = 53,
    cuda_e54 = 54,
    cuda_e55 = 55,
    cuda_e56 = 56,
    cuda_e57 = 57,
    cuda_e58 = 58,
    cuda_e59 = 59,
);

// Empty programs, one per attach mechanism: the benchmark attaches them to measure each mechanism's
// own floor, so the tracer's cost can be reported as "floor + our work".
#[tracepoint]
pub fn noop_tp(_ctx: TracePointContext) -> u32 {
    0
}

#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn noop_raw(_ctx: RawTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "sys_enter")]
pub fn noop_btf(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[kprobe]
pub fn noop_kprobe(_ctx: ProbeContext) -> u32 {
    0
}

#[kretprobe]
pub fn noop_kretprobe(_ctx: RetProbeContext) -> u32 {
    0
}

#[fentry]
pub fn noop_fentry(_ctx: FEntryContext) -> u32 {
    0
}

#[fexit]
pub fn noop_fexit(_ctx: FExitContext) -> u32 {
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
