//! Wire types shared by the kernel programs (`tracer-ebpf`) and user space (`tracer-user`).
//!
//! Everything here is `#[repr(C)]`, uses fixed-width integers and explicit padding, and has its size
//! asserted at compile time, so the two sides cannot drift. Records are written to the ring buffer by
//! the kernel side and decoded, without I/O, by `tracer_core::decode`.
#![no_std]

pub mod nv;

/// Bumped whenever a record or map layout changes.
pub const ABI_VERSION: u32 = 3;

/// Map names, as they appear in the eBPF object.
pub mod map_names {
    /// The ledger ring: every record a ledger is built from (fds, lifecycle, allocations, frees).
    pub const EVENTS: &str = "EVENTS";
    /// The bulk ring: high-rate records that only count (RM_CONTROL and other count-only ioctls,
    /// per-event launches, function lookups), so a flood of them never crowds out the ledger's.
    pub const BULK_EVENTS: &str = "BULK_EVENTS";
    pub const COUNTERS: &str = "COUNTERS";
    pub const NV_FDS: &str = "NV_FDS";
    pub const TRACKED_TGIDS: &str = "TRACKED_TGIDS";
    pub const INFLIGHT: &str = "INFLIGHT";
    pub const IOCTL_ENTRY: &str = "IOCTL_ENTRY";
    pub const UVM_MAPS: &str = "UVM_MAPS";
    pub const CAPTURE_PLANS: &str = "CAPTURE_PLANS";
    pub const ALLOC_PARAM_SIZES: &str = "ALLOC_PARAM_SIZES";
    pub const CONFIG: &str = "CONFIG";
    pub const CUDA_COUNTS: &str = "CUDA_COUNTS";
    pub const CUDA_PER_EVENT: &str = "CUDA_PER_EVENT";
    pub const CUDA_INFLIGHT: &str = "CUDA_INFLIGHT";
    pub const CUDA_TIMED_INFLIGHT: &str = "CUDA_TIMED_INFLIGHT";
    pub const SIM_DEVICES: &str = "SIM_DEVICES";
    pub const LOST_RECORDS: &str = "LOST_RECORDS";
}

/// Program names, as they appear in the eBPF object.
pub mod prog_names {
    /// One program per attach mode for syscall entry and exit; all share one handler.
    pub const SYS_ENTER_TP: &str = "sys_enter_tp";
    pub const SYS_EXIT_TP: &str = "sys_exit_tp";
    pub const SYS_ENTER_RAW: &str = "sys_enter_raw";
    pub const SYS_EXIT_RAW: &str = "sys_exit_raw";
    pub const SYS_ENTER_BTF: &str = "sys_enter_btf";
    pub const SYS_EXIT_BTF: &str = "sys_exit_btf";
    pub const PROC_EXEC: &str = "proc_exec";
    pub const PROC_EXIT: &str = "proc_exit";
    pub const PROC_FORK: &str = "proc_fork";
    pub const CGROUP_RMDIR: &str = "cgroup_rmdir";
    /// The lifecycle programs as `tp_btf` (no perf event to open).
    pub const PROC_EXEC_BTF: &str = "proc_exec_btf";
    pub const PROC_EXIT_BTF: &str = "proc_exit_btf";
    pub const PROC_FORK_BTF: &str = "proc_fork_btf";
    pub const CGROUP_RMDIR_BTF: &str = "cgroup_rmdir_btf";
    /// libcuda uprobes (the attach cookie is the `cuda_entry` id).
    pub const CUDA_COUNT: &str = "cuda_count";
    pub const CUDA_ALLOC_ENTER: &str = "cuda_alloc_enter";
    pub const CUDA_ALLOC_RETURN: &str = "cuda_alloc_return";
    pub const CUDA_FREE: &str = "cuda_free";
    pub const CUDA_LOOKUP_ENTER: &str = "cuda_lookup_enter";
    pub const CUDA_LOOKUP_RETURN: &str = "cuda_lookup_return";
    pub const CUDA_TIMED_ENTER: &str = "cuda_timed_enter";
    pub const CUDA_TIMED_RETURN: &str = "cuda_timed_return";
    /// Driver-entry mode: kprobes on the NVIDIA driver's own file operations (`nvidia.ko`'s and
    /// `nvidia-uvm.ko`'s open, ioctl and release), and the kretprobes of open and ioctl (their
    /// fentry/fexit twins: `DRIVER_ENTRY_TRAMPOLINE`).
    pub const DE_NV_OPEN: &str = "de_nv_open";
    pub const DE_UVM_OPEN: &str = "de_uvm_open";
    pub const DE_OPEN_RET: &str = "de_open_ret";
    pub const DE_NV_IOCTL: &str = "de_nv_ioctl";
    pub const DE_UVM_IOCTL: &str = "de_uvm_ioctl";
    pub const DE_IOCTL_RET: &str = "de_ioctl_ret";
    pub const DE_RELEASE: &str = "de_release";
    pub const DE_UVM_MMAP: &str = "de_uvm_mmap";
    pub const DE_UVM_VM_CLOSE: &str = "de_uvm_vm_close";
    /// Every driver-entry program.
    pub const DRIVER_ENTRY: [&str; 9] = [
        DE_NV_OPEN,
        DE_UVM_OPEN,
        DE_OPEN_RET,
        DE_NV_IOCTL,
        DE_UVM_IOCTL,
        DE_IOCTL_RET,
        DE_RELEASE,
        DE_UVM_MMAP,
        DE_UVM_VM_CLOSE,
    ];
    /// Each driver-entry program's twin on BPF trampolines (`def_…`), used where the NVIDIA module
    /// has BTF: (kprobe program, the function it is on or "" for any, trampoline program, fexit?).
    /// The ioctls differ: an fexit has the arguments, so their entry keeps only the clock and their
    /// return (one program per driver) does what the kprobe did at entry.
    pub const DRIVER_ENTRY_TRAMPOLINE: [(&str, &str, &str, bool); 11] = [
        (DE_NV_OPEN, "", "def_nv_open", false),
        (DE_UVM_OPEN, "", "def_uvm_open", false),
        (DE_OPEN_RET, "", "def_open_ret", true),
        (DE_NV_IOCTL, "", "def_ioctl_clock", false),
        (DE_UVM_IOCTL, "", "def_ioctl_clock", false),
        (DE_IOCTL_RET, "uvm_mmap_entry", "def_ioctl_ret", true),
        (DE_IOCTL_RET, "uvm_unlocked_ioctl_entry", "def_uvm_ioctl_ret", true),
        (DE_IOCTL_RET, "", "def_nv_ioctl_ret", true),
        (DE_RELEASE, "", "def_release", false),
        (DE_UVM_MMAP, "", "def_uvm_mmap", false),
        (DE_UVM_VM_CLOSE, "", "def_uvm_vm_close", false),
    ];
    /// Empty programs for measuring each attach mechanism's floor (benchmark only).
    pub const NOOP_TP: &str = "noop_tp";
    pub const NOOP_RAW: &str = "noop_raw";
    pub const NOOP_BTF: &str = "noop_btf";
    pub const NOOP_KPROBE: &str = "noop_kprobe";
    pub const NOOP_KRETPROBE: &str = "noop_kretprobe";
    pub const NOOP_FENTRY: &str = "noop_fentry";
    pub const NOOP_FEXIT: &str = "noop_fexit";
}

/// Syscall numbers the driver family handles, for the architecture the crate is built for: the
/// host's (`target_arch`) in user space, the one the kernel programs are built for
/// (`bpf_target_arch`, set by aya-build from the user-space target) on the kernel side. x86-64 has
/// its own table; arm64 has the generic one, without `open` and `dup2` (libc uses `openat` and
/// `dup3` there): those two get numbers no syscall has, so they never match.
pub mod sysno {
    #[cfg(not(any(target_arch = "aarch64", bpf_target_arch = "aarch64")))]
    mod arch {
        pub const OPEN: u32 = 2;
        pub const CLOSE: u32 = 3;
        pub const MMAP: u32 = 9;
        pub const MUNMAP: u32 = 11;
        pub const IOCTL: u32 = 16;
        pub const DUP: u32 = 32;
        pub const DUP2: u32 = 33;
        pub const FCNTL: u32 = 72;
        pub const OPENAT: u32 = 257;
        pub const DUP3: u32 = 292;
    }
    #[cfg(any(target_arch = "aarch64", bpf_target_arch = "aarch64"))]
    mod arch {
        /// Not a syscall on arm64 (a number no syscall has).
        pub const OPEN: u32 = u32::MAX - 1;
        pub const CLOSE: u32 = 57;
        pub const MMAP: u32 = 222;
        pub const MUNMAP: u32 = 215;
        pub const IOCTL: u32 = 29;
        pub const DUP: u32 = 23;
        /// Not a syscall on arm64 (a number no syscall has).
        pub const DUP2: u32 = u32::MAX - 2;
        pub const FCNTL: u32 = 25;
        pub const OPENAT: u32 = 56;
        pub const DUP3: u32 = 24;
    }
    pub use arch::*;
    /// Syscalls whose per-syscall tracepoints (`syscalls:sys_{enter,exit}_<name>`) the
    /// `syscall-tracepoint` attach mode attaches to (arm64 has no `open` or `dup2`).
    pub const TRACED: &[(u32, &str)] = &[
        #[cfg(not(any(target_arch = "aarch64", bpf_target_arch = "aarch64")))]
        (OPEN, "open"),
        (CLOSE, "close"),
        (MMAP, "mmap"),
        (MUNMAP, "munmap"),
        (IOCTL, "ioctl"),
        (DUP, "dup"),
        #[cfg(not(any(target_arch = "aarch64", bpf_target_arch = "aarch64")))]
        (DUP2, "dup2"),
        (FCNTL, "fcntl"),
        (OPENAT, "openat"),
        (DUP3, "dup3"),
    ];
    pub const F_DUPFD: u64 = 0;
    pub const F_DUPFD_CLOEXEC: u64 = 1030;
}

/// Which kind of NVIDIA device node an fd refers to.
pub mod device_kind {
    pub const UNKNOWN: u8 = 0;
    /// `/dev/nvidiactl`
    pub const CTL: u8 = 1;
    /// `/dev/nvidiaN` (minor N)
    pub const GPU: u8 = 2;
    /// `/dev/nvidia-uvm`
    pub const UVM: u8 = 3;
    /// `/dev/nvidia-uvm-tools`
    pub const UVM_TOOLS: u8 = 4;
    /// `/dev/nvidia-modeset`
    pub const MODESET: u8 = 5;
    /// `/dev/nvidia-caps/*`
    pub const CAPS: u8 = 6;
    pub const COUNT: usize = 7;
}

/// Record kinds (`EventHeader::kind`).
pub mod kind {
    pub const FD_OPEN: u16 = 1;
    pub const FD_CLOSE: u16 = 2;
    pub const FD_DUP: u16 = 3;
    pub const IOCTL: u16 = 4;
    pub const UVM_MMAP: u16 = 5;
    pub const UVM_MUNMAP: u16 = 6;
    pub const PROC_EXEC: u16 = 7;
    pub const PROC_EXIT: u16 = 8;
    pub const PROC_FORK: u16 = 9;
    pub const CGROUP_RMDIR: u16 = 10;
    pub const CUDA_ALLOC: u16 = 11;
    pub const CUDA_FREE: u16 = 12;
    pub const CUDA_FUNCTION: u16 = 13;
    pub const CUDA_LAUNCH: u16 = 14;
    pub const CUDA_TIMED: u16 = 15;
}

/// `EventHeader::flags` bits.
pub mod flags {
    /// The main window of the ioctl argument could not be read (NULL, unmapped, guard page).
    pub const FAULT_MAIN: u16 = 1 << 0;
    /// The tail window could not be read.
    pub const FAULT_TAIL: u16 = 1 << 1;
    /// The nested parameter block (e.g. `pAllocParms`) could not be read.
    pub const FAULT_NESTED: u16 = 1 << 2;
    /// The argument was larger than the capture window; only a prefix was copied.
    pub const TRUNCATED: u16 = 1 << 3;
    /// The command came through `NV_ESC_IOCTL_XFER_CMD`; `nr`/`size`/`data_ptr` are the inner ones.
    pub const XFER: u16 = 1 << 4;
    /// The xfer envelope itself could not be read.
    pub const FAULT_XFER: u16 = 1 << 5;
    /// A dup whose source was not an NVIDIA fd replaced an NVIDIA fd (an implicit close).
    pub const DUP_REPLACED: u16 = 1 << 6;
    /// The fd was seeded by user space from `/proc` (never set by the kernel).
    pub const SEEDED: u16 = 1 << 7;
    /// Driver-entry mode: the file was registered at its first call in this process, not at its
    /// open (opened before the agent attached, inherited over fork, or passed over a socket).
    pub const FIRST_SEEN_IN_CALL: u16 = 1 << 8;
}

/// Common header of every ring-buffer record (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventHeader {
    pub kind: u16,
    pub flags: u16,
    /// Total record size in bytes, header included.
    pub size: u32,
    /// `bpf_ktime_get_ns()` at the event (syscall exit for calls).
    pub ktime_ns: u64,
    pub tgid: u32,
    pub pid: u32,
    /// cgroup v2 id (the inode of the cgroup directory).
    pub cgroup_id: u64,
}

/// Which NVIDIA device an fd refers to (16 bytes). Stored as the `NV_FDS` map value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DeviceRef {
    /// One of [`device_kind`].
    pub kind: u8,
    pub _pad: [u8; 3],
    /// GPU minor for `GPU`, caps number for `CAPS`, else 0.
    pub minor: u32,
    /// Identity of the open file description: the same for an fd and its dups, different for two
    /// `open`s of the same node. Assigned at open (`(pid_tgid << 16) ^ ktime`-style, unique enough).
    pub file_id: u64,
}

/// `NV_FDS` key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FdKey {
    pub tgid: u32,
    pub fd: u32,
}

/// `NV_FILES` value (driver-entry mode): an NVIDIA open file, keyed by its `struct file *`. The
/// driver's own entry points see the file, not the fd (an fd and its dups are one file; the driver
/// releases the file's RM clients when its last reference goes), so records of this mode name the
/// file by a *file slot* in place of an fd: [`FILE_SLOT_BASE`] `|` 30 bits of the salted file
/// pointer, a number no real fd reaches (`fs.nr_open` is below 2^30).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvFile {
    pub dev: DeviceRef,
    /// The process that opened it (or that first used it, for files opened before the agent).
    pub tgid: u32,
    /// The file slot used as its fd in records.
    pub slot: u32,
}

/// `DE_IOCTL_ENTRY` value (driver-entry mode): an open, ioctl or UVM mmap between its kprobe and
/// kretprobe, in the slot of its thread (`tid % capacity::DE_IOCTL_ENTRY`), owned by `pid_tgid`
/// (0: free). The kretprobe sees no arguments, so they wait here: an array store and load instead
/// of a hash insert, lookup and delete.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeIoctlEntry {
    pub pid_tgid: u64,
    pub st: Inflight,
}

/// The lowest file slot ([`NvFile`]): bit 30. Real fds stay below it.
pub const FILE_SLOT_BASE: u32 = 1 << 30;

/// `(file_id, slot)` of the open file at kernel address `file` under `salt` (driver-entry mode):
/// a mix of the two, so neither the address nor its neighbours can be read back from records.
#[inline(always)]
pub const fn file_identity(file: u64, salt: u64) -> (u64, u32) {
    // splitmix64's finaliser: a bijection, so distinct files get distinct ids.
    let mut z = file ^ salt;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z, FILE_SLOT_BASE | (z >> 34) as u32)
}

/// An NVIDIA device node was opened (or found by the `/proc` scan).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdOpenRecord {
    pub hdr: EventHeader,
    pub dev: DeviceRef,
    pub fd: i32,
    pub open_flags: u32,
}

/// An NVIDIA fd was closed (explicitly, or replaced by dup2/dup3).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdCloseRecord {
    pub hdr: EventHeader,
    pub dev: DeviceRef,
    pub fd: i32,
    pub _pad: u32,
}

/// An NVIDIA fd was duplicated (dup, dup2, dup3, fcntl F_DUPFD[_CLOEXEC]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdDupRecord {
    pub hdr: EventHeader,
    pub dev: DeviceRef,
    pub old_fd: i32,
    pub new_fd: i32,
}

/// Bytes of the ioctl argument copied from its start.
pub const IOCTL_MAIN_MAX: usize = 256;
/// Bytes copied from a second window (e.g. the tail of UVM_MAP_EXTERNAL_ALLOCATION).
pub const IOCTL_TAIL_MAX: usize = 16;
/// Bytes copied from a nested parameter block (e.g. RM_ALLOC's `pAllocParms`).
pub const IOCTL_NESTED_MAX: usize = 128;

/// One completed ioctl on an NVIDIA fd, with the argument as it was at syscall exit (so OUT fields
/// such as new handles and `status` are there). Decoding is done in user space.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoctlRecord {
    pub hdr: EventHeader,
    pub dev: DeviceRef,
    pub fd: i32,
    /// The command as passed to ioctl(2).
    pub cmd: u32,
    /// The argument pointer as passed to ioctl(2).
    pub arg: u64,
    /// The syscall's return value.
    pub ret: i64,
    /// Time from syscall entry to exit.
    pub duration_ns: u64,
    /// Effective escape number (frontend `_IOC_NR`, the inner nr under XFER) or the UVM command.
    pub nr: u32,
    /// Effective parameter size (frontend `_IOC_SIZE`, the inner size under XFER, 0 for UVM).
    pub size: u32,
    /// Effective parameter pointer (`arg`, or the inner pointer under XFER).
    pub data_ptr: u64,
    /// Pointer the nested block was read from (0 if none).
    pub nested_ptr: u64,
    pub main_len: u16,
    pub tail_len: u16,
    pub nested_len: u16,
    pub _pad: u16,
    /// Offset of the tail window inside the parameters.
    pub tail_off: u32,
    pub _pad2: u32,
    pub main: [u8; IOCTL_MAIN_MAX],
    pub tail: [u8; IOCTL_TAIL_MAX],
    pub nested: [u8; IOCTL_NESTED_MAX],
}

impl Default for IoctlRecord {
    fn default() -> Self {
        Self {
            hdr: EventHeader::default(),
            dev: DeviceRef::default(),
            fd: 0,
            cmd: 0,
            arg: 0,
            ret: 0,
            duration_ns: 0,
            nr: 0,
            size: 0,
            data_ptr: 0,
            nested_ptr: 0,
            main_len: 0,
            tail_len: 0,
            nested_len: 0,
            _pad: 0,
            tail_off: 0,
            _pad2: 0,
            main: [0; IOCTL_MAIN_MAX],
            tail: [0; IOCTL_TAIL_MAX],
            nested: [0; IOCTL_NESTED_MAX],
        }
    }
}

/// A managed-memory mapping of a `/dev/nvidia-uvm` fd (`cudaMallocManaged`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UvmMmapRecord {
    pub hdr: EventHeader,
    pub dev: DeviceRef,
    pub fd: i32,
    pub prot: u32,
    pub map_flags: u64,
    pub addr: u64,
    pub len: u64,
    pub offset: u64,
    /// mmap's return value (the address, or -errno).
    pub ret: i64,
}

/// A managed-memory mapping was unmapped (exact address match with an earlier [`UvmMmapRecord`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UvmMunmapRecord {
    pub hdr: EventHeader,
    pub addr: u64,
    pub len: u64,
    pub ret: i64,
}

/// A tracked process (one that holds NVIDIA fds) called exec.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcExecRecord {
    pub hdr: EventHeader,
    pub comm: [u8; 16],
}

/// A tracked process exited (its last thread; `group_dead`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcExitRecord {
    pub hdr: EventHeader,
    pub comm: [u8; 16],
}

/// A tracked process forked (the child inherits its NVIDIA fds). `child_pid` may be a thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcForkRecord {
    pub hdr: EventHeader,
    pub child_pid: u32,
    pub _pad: u32,
}

/// Bytes of a removed cgroup's path that are copied.
pub const CGROUP_PATH_MAX: usize = 128;

/// A cgroup v2 directory was removed.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupRmdirRecord {
    pub hdr: EventHeader,
    /// Id of the removed cgroup.
    pub id: u64,
    pub level: u32,
    pub path_len: u32,
    pub path: [u8; CGROUP_PATH_MAX],
}

impl Default for CgroupRmdirRecord {
    fn default() -> Self {
        Self { hdr: EventHeader::default(), id: 0, level: 0, path_len: 0, path: [0; CGROUP_PATH_MAX] }
    }
}

/// libcuda entry points the `cuda` family probes. The id is the uprobe's attach cookie.
pub mod cuda_entry {
    /// What the kernel does when an entry point is called.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Action {
        /// Count calls per (cgroup, tgid, entry point) in `CUDA_COUNTS`.
        Count,
        /// `(T *out, size_t bytes, ...)`: count calls and bytes; at return, report the pointer.
        Alloc,
        /// `cuMemAllocPitch_v2(dptr*, pitch*, width, height, elem)`: bytes = width × height.
        AllocPitch,
        /// `(T ptr_or_handle, ...)`: report the pointer.
        Free,
        /// `(Handle *out, Handle src, [const char *name])`: report the handle with its name (or the
        /// handle it was derived from), so launches can be named.
        Lookup,
        /// Synchronisation, event records, copies and memsets: counted (copies and memsets with
        /// their bytes, [`crate::timed::bytes`]); in per-event mode also timed, entry to return,
        /// and reported with their first four arguments (user space reads them by entry point).
        Timed,
    }
    pub const LAUNCH_KERNEL: u32 = 0;
    pub const LAUNCH_KERNEL_PTSZ: u32 = 1;
    pub const LAUNCH_KERNEL_EX: u32 = 2;
    pub const LAUNCH_KERNEL_EX_PTSZ: u32 = 3;
    pub const LAUNCH_COOPERATIVE_KERNEL: u32 = 4;
    pub const LAUNCH_COOPERATIVE_KERNEL_PTSZ: u32 = 5;
    pub const GRAPH_LAUNCH: u32 = 6;
    pub const GRAPH_LAUNCH_PTSZ: u32 = 7;
    pub const MEM_ALLOC: u32 = 8;
    pub const MEM_ALLOC_ASYNC: u32 = 9;
    pub const MEM_ALLOC_ASYNC_PTSZ: u32 = 10;
    pub const MEM_ALLOC_MANAGED: u32 = 11;
    pub const MEM_ALLOC_PITCH: u32 = 12;
    pub const MEM_CREATE: u32 = 13;
    pub const MEM_ALLOC_HOST: u32 = 14;
    pub const MEM_FREE: u32 = 15;
    pub const MEM_FREE_ASYNC: u32 = 16;
    pub const MEM_FREE_ASYNC_PTSZ: u32 = 17;
    pub const MEM_RELEASE: u32 = 18;
    pub const MEM_FREE_HOST: u32 = 19;
    pub const CTX_CREATE: u32 = 20;
    pub const PRIMARY_CTX_RETAIN: u32 = 21;
    pub const MODULE_GET_FUNCTION: u32 = 22;
    pub const LIBRARY_GET_KERNEL: u32 = 23;
    pub const KERNEL_GET_FUNCTION: u32 = 24;
    // Synchronisation and events: `(stream)`, `()`, `(event)`, `(stream, event, flags)`,
    // `(event, stream[, flags])`.
    pub const STREAM_SYNCHRONIZE: u32 = 25;
    pub const STREAM_SYNCHRONIZE_PTSZ: u32 = 26;
    pub const CTX_SYNCHRONIZE: u32 = 27;
    pub const EVENT_SYNCHRONIZE: u32 = 28;
    pub const EVENT_QUERY: u32 = 29;
    pub const STREAM_WAIT_EVENT: u32 = 30;
    pub const STREAM_WAIT_EVENT_PTSZ: u32 = 31;
    pub const EVENT_RECORD: u32 = 32;
    pub const EVENT_RECORD_PTSZ: u32 = 33;
    pub const EVENT_RECORD_WITH_FLAGS: u32 = 34;
    pub const EVENT_RECORD_WITH_FLAGS_PTSZ: u32 = 35;
    // Copies: `(dst, src, bytes[, stream])`. The `_ptds` ones (synchronous) are what a program
    // built with `--default-stream per-thread` calls; they copy on its thread's default stream.
    pub const MEMCPY: u32 = 36;
    pub const MEMCPY_PTDS: u32 = 37;
    pub const MEMCPY_ASYNC: u32 = 38;
    pub const MEMCPY_ASYNC_PTSZ: u32 = 39;
    pub const MEMCPY_HTOD: u32 = 40;
    pub const MEMCPY_HTOD_PTDS: u32 = 41;
    pub const MEMCPY_DTOH: u32 = 42;
    pub const MEMCPY_DTOH_PTDS: u32 = 43;
    pub const MEMCPY_DTOD: u32 = 44;
    pub const MEMCPY_DTOD_PTDS: u32 = 45;
    pub const MEMCPY_HTOD_ASYNC: u32 = 46;
    pub const MEMCPY_HTOD_ASYNC_PTSZ: u32 = 47;
    pub const MEMCPY_DTOH_ASYNC: u32 = 48;
    pub const MEMCPY_DTOH_ASYNC_PTSZ: u32 = 49;
    pub const MEMCPY_DTOD_ASYNC: u32 = 50;
    pub const MEMCPY_DTOD_ASYNC_PTSZ: u32 = 51;
    // Memsets: `(dst, value, count[, stream])`, count in elements of 1 or 4 bytes.
    pub const MEMSET_D8: u32 = 52;
    pub const MEMSET_D8_PTDS: u32 = 53;
    pub const MEMSET_D32: u32 = 54;
    pub const MEMSET_D32_PTDS: u32 = 55;
    pub const MEMSET_D8_ASYNC: u32 = 56;
    pub const MEMSET_D8_ASYNC_PTSZ: u32 = 57;
    pub const MEMSET_D32_ASYNC: u32 = 58;
    pub const MEMSET_D32_ASYNC_PTSZ: u32 = 59;
    pub const COUNT: u32 = 60;
    /// (id, exported symbol, action), in id order.
    pub const ALL: [(u32, &str, Action); COUNT as usize] = [
        (LAUNCH_KERNEL, "cuLaunchKernel", Action::Count),
        (LAUNCH_KERNEL_PTSZ, "cuLaunchKernel_ptsz", Action::Count),
        (LAUNCH_KERNEL_EX, "cuLaunchKernelEx", Action::Count),
        (LAUNCH_KERNEL_EX_PTSZ, "cuLaunchKernelEx_ptsz", Action::Count),
        (LAUNCH_COOPERATIVE_KERNEL, "cuLaunchCooperativeKernel", Action::Count),
        (LAUNCH_COOPERATIVE_KERNEL_PTSZ, "cuLaunchCooperativeKernel_ptsz", Action::Count),
        (GRAPH_LAUNCH, "cuGraphLaunch", Action::Count),
        (GRAPH_LAUNCH_PTSZ, "cuGraphLaunch_ptsz", Action::Count),
        (MEM_ALLOC, "cuMemAlloc_v2", Action::Alloc),
        (MEM_ALLOC_ASYNC, "cuMemAllocAsync", Action::Alloc),
        (MEM_ALLOC_ASYNC_PTSZ, "cuMemAllocAsync_ptsz", Action::Alloc),
        (MEM_ALLOC_MANAGED, "cuMemAllocManaged", Action::Alloc),
        (MEM_ALLOC_PITCH, "cuMemAllocPitch_v2", Action::AllocPitch),
        (MEM_CREATE, "cuMemCreate", Action::Alloc),
        (MEM_ALLOC_HOST, "cuMemAllocHost_v2", Action::Alloc),
        (MEM_FREE, "cuMemFree_v2", Action::Free),
        (MEM_FREE_ASYNC, "cuMemFreeAsync", Action::Free),
        (MEM_FREE_ASYNC_PTSZ, "cuMemFreeAsync_ptsz", Action::Free),
        (MEM_RELEASE, "cuMemRelease", Action::Free),
        (MEM_FREE_HOST, "cuMemFreeHost", Action::Free),
        (CTX_CREATE, "cuCtxCreate_v2", Action::Count),
        (PRIMARY_CTX_RETAIN, "cuDevicePrimaryCtxRetain", Action::Count),
        (MODULE_GET_FUNCTION, "cuModuleGetFunction", Action::Lookup),
        (LIBRARY_GET_KERNEL, "cuLibraryGetKernel", Action::Lookup),
        (KERNEL_GET_FUNCTION, "cuKernelGetFunction", Action::Lookup),
        (STREAM_SYNCHRONIZE, "cuStreamSynchronize", Action::Timed),
        (STREAM_SYNCHRONIZE_PTSZ, "cuStreamSynchronize_ptsz", Action::Timed),
        (CTX_SYNCHRONIZE, "cuCtxSynchronize", Action::Timed),
        (EVENT_SYNCHRONIZE, "cuEventSynchronize", Action::Timed),
        (EVENT_QUERY, "cuEventQuery", Action::Timed),
        (STREAM_WAIT_EVENT, "cuStreamWaitEvent", Action::Timed),
        (STREAM_WAIT_EVENT_PTSZ, "cuStreamWaitEvent_ptsz", Action::Timed),
        (EVENT_RECORD, "cuEventRecord", Action::Timed),
        (EVENT_RECORD_PTSZ, "cuEventRecord_ptsz", Action::Timed),
        (EVENT_RECORD_WITH_FLAGS, "cuEventRecordWithFlags", Action::Timed),
        (EVENT_RECORD_WITH_FLAGS_PTSZ, "cuEventRecordWithFlags_ptsz", Action::Timed),
        (MEMCPY, "cuMemcpy", Action::Timed),
        (MEMCPY_PTDS, "cuMemcpy_ptds", Action::Timed),
        (MEMCPY_ASYNC, "cuMemcpyAsync", Action::Timed),
        (MEMCPY_ASYNC_PTSZ, "cuMemcpyAsync_ptsz", Action::Timed),
        (MEMCPY_HTOD, "cuMemcpyHtoD_v2", Action::Timed),
        (MEMCPY_HTOD_PTDS, "cuMemcpyHtoD_v2_ptds", Action::Timed),
        (MEMCPY_DTOH, "cuMemcpyDtoH_v2", Action::Timed),
        (MEMCPY_DTOH_PTDS, "cuMemcpyDtoH_v2_ptds", Action::Timed),
        (MEMCPY_DTOD, "cuMemcpyDtoD_v2", Action::Timed),
        (MEMCPY_DTOD_PTDS, "cuMemcpyDtoD_v2_ptds", Action::Timed),
        (MEMCPY_HTOD_ASYNC, "cuMemcpyHtoDAsync_v2", Action::Timed),
        (MEMCPY_HTOD_ASYNC_PTSZ, "cuMemcpyHtoDAsync_v2_ptsz", Action::Timed),
        (MEMCPY_DTOH_ASYNC, "cuMemcpyDtoHAsync_v2", Action::Timed),
        (MEMCPY_DTOH_ASYNC_PTSZ, "cuMemcpyDtoHAsync_v2_ptsz", Action::Timed),
        (MEMCPY_DTOD_ASYNC, "cuMemcpyDtoDAsync_v2", Action::Timed),
        (MEMCPY_DTOD_ASYNC_PTSZ, "cuMemcpyDtoDAsync_v2_ptsz", Action::Timed),
        (MEMSET_D8, "cuMemsetD8_v2", Action::Timed),
        (MEMSET_D8_PTDS, "cuMemsetD8_v2_ptds", Action::Timed),
        (MEMSET_D32, "cuMemsetD32_v2", Action::Timed),
        (MEMSET_D32_PTDS, "cuMemsetD32_v2_ptds", Action::Timed),
        (MEMSET_D8_ASYNC, "cuMemsetD8Async", Action::Timed),
        (MEMSET_D8_ASYNC_PTSZ, "cuMemsetD8Async_ptsz", Action::Timed),
        (MEMSET_D32_ASYNC, "cuMemsetD32Async", Action::Timed),
        (MEMSET_D32_ASYNC_PTSZ, "cuMemsetD32Async_ptsz", Action::Timed),
    ];
    /// Is this entry point a kernel launch (graph launches included)?
    pub const fn is_launch(id: u32) -> bool {
        id <= GRAPH_LAUNCH_PTSZ
    }
    /// Is this a graph launch?
    pub const fn is_graph_launch(id: u32) -> bool {
        id == GRAPH_LAUNCH || id == GRAPH_LAUNCH_PTSZ
    }
}

/// `CUDA_COUNTS` key: calls of one libcuda entry point by one process in one cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CudaCountKey {
    pub cgroup_id: u64,
    pub tgid: u32,
    /// `cuda_entry` id.
    pub entry: u32,
}

/// `CUDA_COUNTS` value (per CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaCount {
    pub calls: u64,
    /// Bytes requested (allocation entry points).
    pub bytes: u64,
}

/// `CUDA_PER_EVENT` key: a cgroup (`kind` 0) or a process (`kind` 1) whose launches are sent one
/// by one. An empty map costs the launch path one lookup that misses.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PerEventKey {
    pub kind: u32,
    pub _pad: u32,
    pub id: u64,
}
pub const PER_EVENT_CGROUP: u32 = 0;
pub const PER_EVENT_TGID: u32 = 1;

/// `CUDA_INFLIGHT` value: an allocation or handle lookup between entry and return (keyed by
/// pid_tgid).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaAllocInflight {
    /// The out-parameter (where the pointer or handle will be written).
    pub out: u64,
    /// Bytes requested (allocations); the name pointer (module/library lookups); the source
    /// handle (cuKernelGetFunction).
    pub bytes: u64,
    /// When the call was entered (`bpf_ktime_get_ns`; allocations only, 0 for lookups).
    pub start_ktime_ns: u64,
    pub entry: u32,
    pub _pad: u32,
}

/// A libcuda allocation returned (successfully or not).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaAllocRecord {
    pub hdr: EventHeader,
    pub entry: u32,
    /// CUresult.
    pub result: u32,
    /// The device pointer / handle written to the out-parameter (0 if unreadable).
    pub ptr: u64,
    pub bytes: u64,
    /// When the call was entered (the header's `ktime_ns` is when it returned).
    pub start_ktime_ns: u64,
}

/// Bytes of a kernel name copied into a [`CudaFunctionRecord`].
pub const CUDA_NAME_MAX: usize = 128;

/// A function or kernel handle was obtained (cuModuleGetFunction, cuLibraryGetKernel: with its name;
/// cuKernelGetFunction: from the kernel handle `source`). Sent whether or not per-event mode is on,
/// so launches can be named when it is switched on later.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaFunctionRecord {
    pub hdr: EventHeader,
    pub entry: u32,
    pub result: u32,
    pub handle: u64,
    pub source: u64,
    pub name_len: u32,
    pub _pad: u32,
    pub name: [u8; CUDA_NAME_MAX],
}

impl Default for CudaFunctionRecord {
    fn default() -> Self {
        Self {
            hdr: EventHeader::default(),
            entry: 0,
            result: 0,
            handle: 0,
            source: 0,
            name_len: 0,
            _pad: 0,
            name: [0; CUDA_NAME_MAX],
        }
    }
}

/// One kernel launch, sent only in per-event mode (for selected cgroups or processes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaLaunchRecord {
    pub hdr: EventHeader,
    pub entry: u32,
    pub shared_mem_bytes: u32,
    /// CUfunction (or CUkernel cast to it; the graph exec for graph launches).
    pub function: u64,
    pub stream: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

/// What the [`cuda_entry::Action::Timed`] entry points are, read from their id and first four
/// arguments (shared by the kernel's byte count and user space's decoding).
pub mod timed {
    use crate::cuda_entry::*;

    /// What a timed call does.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Class {
        /// Blocks the host thread until a stream, the context or an event is done.
        Synchronize,
        /// Polls an event (returns at once: CUDA_SUCCESS done, CUDA_ERROR_NOT_READY not yet).
        Query,
        /// Makes a stream wait for an event (GPU-side; the host does not block).
        Wait,
        /// Records an event on a stream.
        Record,
        /// A memory copy.
        Copy,
        /// A memset.
        Set,
    }

    /// The class of timed entry point `id`; `None` for any other id.
    pub const fn class(id: u32) -> Option<Class> {
        Some(match id {
            STREAM_SYNCHRONIZE | STREAM_SYNCHRONIZE_PTSZ | CTX_SYNCHRONIZE | EVENT_SYNCHRONIZE => Class::Synchronize,
            EVENT_QUERY => Class::Query,
            STREAM_WAIT_EVENT | STREAM_WAIT_EVENT_PTSZ => Class::Wait,
            EVENT_RECORD | EVENT_RECORD_PTSZ | EVENT_RECORD_WITH_FLAGS | EVENT_RECORD_WITH_FLAGS_PTSZ => Class::Record,
            MEMCPY..=MEMCPY_DTOD_ASYNC_PTSZ => Class::Copy,
            MEMSET_D8..=MEMSET_D32_ASYNC_PTSZ => Class::Set,
            _ => return None,
        })
    }

    /// Bytes a copy or memset moves or writes (0 for the others).
    pub const fn bytes(id: u32, args: &[u64; 4]) -> u64 {
        match id {
            MEMCPY..=MEMCPY_DTOD_ASYNC_PTSZ | MEMSET_D8 | MEMSET_D8_PTDS | MEMSET_D8_ASYNC | MEMSET_D8_ASYNC_PTSZ => {
                args[2]
            }
            // Clamped so that the product fits (no 128-bit multiply in BPF).
            MEMSET_D32 | MEMSET_D32_PTDS | MEMSET_D32_ASYNC | MEMSET_D32_ASYNC_PTSZ => {
                (if args[2] > u32::MAX as u64 { u32::MAX as u64 } else { args[2] }) * 4
            }
            _ => 0,
        }
    }

    /// The stream a call is on: its argument, or 0 (the legacy default stream) for the synchronous
    /// copies and memsets, 2 (`CU_STREAM_PER_THREAD`) for their `_ptds` forms; `None` for calls that
    /// name no stream (context and event synchronisation, event queries).
    pub const fn stream(id: u32, args: &[u64; 4]) -> Option<u64> {
        match id {
            STREAM_SYNCHRONIZE | STREAM_SYNCHRONIZE_PTSZ | STREAM_WAIT_EVENT | STREAM_WAIT_EVENT_PTSZ => Some(args[0]),
            EVENT_RECORD | EVENT_RECORD_PTSZ | EVENT_RECORD_WITH_FLAGS | EVENT_RECORD_WITH_FLAGS_PTSZ => Some(args[1]),
            MEMCPY_ASYNC
            | MEMCPY_ASYNC_PTSZ
            | MEMCPY_HTOD_ASYNC
            | MEMCPY_HTOD_ASYNC_PTSZ
            | MEMCPY_DTOH_ASYNC
            | MEMCPY_DTOH_ASYNC_PTSZ
            | MEMCPY_DTOD_ASYNC
            | MEMCPY_DTOD_ASYNC_PTSZ
            | MEMSET_D8_ASYNC
            | MEMSET_D8_ASYNC_PTSZ
            | MEMSET_D32_ASYNC
            | MEMSET_D32_ASYNC_PTSZ => Some(args[3]),
            MEMCPY | MEMCPY_HTOD | MEMCPY_DTOH | MEMCPY_DTOD | MEMSET_D8 | MEMSET_D32 => Some(0),
            MEMCPY_PTDS | MEMCPY_HTOD_PTDS | MEMCPY_DTOH_PTDS | MEMCPY_DTOD_PTDS | MEMSET_D8_PTDS | MEMSET_D32_PTDS => {
                Some(2)
            }
            _ => None,
        }
    }

    /// The event a call names, if any.
    pub const fn event(id: u32, args: &[u64; 4]) -> Option<u64> {
        match id {
            EVENT_SYNCHRONIZE
            | EVENT_QUERY
            | EVENT_RECORD
            | EVENT_RECORD_PTSZ
            | EVENT_RECORD_WITH_FLAGS
            | EVENT_RECORD_WITH_FLAGS_PTSZ => Some(args[0]),
            STREAM_WAIT_EVENT | STREAM_WAIT_EVENT_PTSZ => Some(args[1]),
            _ => None,
        }
    }

    /// Whether a copy or memset returns before the work is done (the `Async` ones).
    pub const fn is_async(id: u32) -> bool {
        matches!(
            id,
            MEMCPY_ASYNC
                | MEMCPY_ASYNC_PTSZ
                | MEMCPY_HTOD_ASYNC
                | MEMCPY_HTOD_ASYNC_PTSZ
                | MEMCPY_DTOH_ASYNC
                | MEMCPY_DTOH_ASYNC_PTSZ
                | MEMCPY_DTOD_ASYNC
                | MEMCPY_DTOD_ASYNC_PTSZ
                | MEMSET_D8_ASYNC
                | MEMSET_D8_ASYNC_PTSZ
                | MEMSET_D32_ASYNC
                | MEMSET_D32_ASYNC_PTSZ
        )
    }

    /// A copy's direction, from the entry point (`cuMemcpy` and `cuMemcpyAsync` infer it from
    /// unified addresses: "any").
    pub const fn direction(id: u32) -> &'static str {
        match id {
            MEMCPY_HTOD | MEMCPY_HTOD_PTDS | MEMCPY_HTOD_ASYNC | MEMCPY_HTOD_ASYNC_PTSZ => "htod",
            MEMCPY_DTOH | MEMCPY_DTOH_PTDS | MEMCPY_DTOH_ASYNC | MEMCPY_DTOH_ASYNC_PTSZ => "dtoh",
            MEMCPY_DTOD | MEMCPY_DTOD_PTDS | MEMCPY_DTOD_ASYNC | MEMCPY_DTOD_ASYNC_PTSZ => "dtod",
            _ => "any",
        }
    }
}

/// `CUDA_TIMED_INFLIGHT` value: a timed call between entry and return (per-event mode only).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaTimedInflight {
    pub start_ktime_ns: u64,
    pub args: [u64; 4],
    pub entry: u32,
    pub _pad: u32,
}

/// A timed call returned (per-event mode only): its entry time, result and first four arguments.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaTimedRecord {
    pub hdr: EventHeader,
    pub entry: u32,
    /// CUresult.
    pub result: u32,
    pub start_ktime_ns: u64,
    pub args: [u64; 4],
}

/// A libcuda free was called.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaFreeRecord {
    pub hdr: EventHeader,
    pub entry: u32,
    pub _pad: u32,
    pub ptr: u64,
}

/// Per-syscall state kept from entry to exit (`INFLIGHT`, keyed by pid_tgid).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inflight {
    pub sysno: u32,
    pub fd: i32,
    pub args: [u64; 4],
    pub enter_ktime: u64,
    pub dev: DeviceRef,
    /// For dup2/dup3: the device of the fd being replaced (kind 0 if none).
    pub replaced: DeviceRef,
}

/// `UVM_MAPS` key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UvmMapKey {
    pub tgid: u32,
    pub _pad: u32,
    pub addr: u64,
}

/// `CAPTURE_PLANS` key: `space` is 0 for frontend escapes (`cmd` = nr), 1 for UVM (`cmd` = command).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CaptureKey {
    pub space: u32,
    pub cmd: u32,
}
pub const SPACE_FRONTEND: u32 = 0;
pub const SPACE_UVM: u32 = 1;

/// `nested_ptr_off` value meaning "no nested block".
pub const NO_NESTED: u32 = u32::MAX;

/// What to copy from an ioctl argument, chosen per command by user space for the running driver
/// version. Frontend commands without a plan copy `min(_IOC_SIZE, IOCTL_MAIN_MAX)` bytes; UVM
/// commands without a plan copy nothing (they are still counted and reported).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CapturePlan {
    pub main_len: u32,
    pub tail_off: u32,
    pub tail_len: u32,
    /// Offset of a u64 user pointer inside the main window to follow, or [`NO_NESTED`].
    pub nested_ptr_off: u32,
    /// Bytes to copy from the nested pointer; if `nested_by_class` is 1 the length is looked up in
    /// `ALLOC_PARAM_SIZES` by the u32 class at `class_off` in the main window (0 ⇒ nothing).
    pub nested_len: u32,
    pub nested_by_class: u32,
    pub class_off: u32,
    /// 1: the command's records feed the memory ledger (allocations, frees, duplicates) and go
    /// through the ledger ring (`EVENTS`); 0: they only count and go through the bulk ring
    /// (`BULK_EVENTS`). Commands without a plan only count.
    pub ledger: u32,
}

/// `CAPTURE_PLANS` entry: a direct-mapped slot (see [`plan_slot`]) holding its command, so a
/// command that shares a slot with a planned one is never mistaken for it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanSlot {
    /// The command (frontend nr or UVM command) whose plan this is.
    pub cmd: u32,
    /// 1 if the slot holds a plan.
    pub present: u32,
    pub plan: CapturePlan,
}

/// Slots of `CAPTURE_PLANS`: 256 per space.
pub const CAPTURE_PLAN_SLOTS: u32 = 512;

/// The `CAPTURE_PLANS` slot of a command: its space's half, indexed by the command's low byte
/// (frontend nrs are one byte; UVM commands are small numbers plus two 0x3000_000x ones). An array
/// load on the hot path instead of a hash lookup; user space refuses a plan table with two
/// commands in one slot.
#[inline(always)]
pub const fn plan_slot(space: u32, cmd: u32) -> u32 {
    (space & 1) * 256 + (cmd & 0xff)
}

/// `ALLOC_PARAM_SIZES` entry: an RM class and the bytes of its nested parameters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassSize {
    pub class: u32,
    pub size: u32,
}

/// Slots of `ALLOC_PARAM_SIZES`.
pub const ALLOC_PARAM_SLOTS: u32 = 256;

/// The `ALLOC_PARAM_SIZES` slot of an RM class (classes are 16-bit numbers; the two bytes folded
/// together spread the memory classes over distinct slots). The slot holds its class; user space
/// refuses two classes in one slot.
#[inline(always)]
pub const fn class_slot(class: u32) -> u32 {
    (class ^ (class >> 8)) & 0xff
}

/// Bytes of the device-directory prefix (e.g. `/dev/nvidia`) the kernel matches opens against.
pub const DEV_PREFIX_MAX: usize = 64;

/// Character-device majors the device check accepts (195 and the driver's dynamic ones).
pub const DEVICE_MAJORS_MAX: usize = 8;

/// The NVIDIA frontend major (`nvidiactl`, `nvidiaN`, `nvidia-modeset`).
pub const NVIDIA_MAJOR: u32 = 195;

/// Whether `major` is one the kernel hands out dynamically (`alloc_chrdev_region`: 254 down to
/// 234, then 511 down to 384), as `nvidia-uvm` and `nvidia-caps` get. One definition for the kernel
/// side's device check and user space's `/proc` scan.
#[inline(always)]
pub const fn is_dynamic_major(major: u32) -> bool {
    (major >= 234 && major <= 254) || (major >= 384 && major <= 511)
}

/// How the kernel side decides that an opened file is an NVIDIA device, not just a file with an
/// NVIDIA name: the open file's inode is read through `current->files->fdt->fd[fd]->f_inode` at
/// open exit (offsets from the kernel's BTF, found by user space) and must be a character device
/// with an accepted major, or a simulated device listed in `SIM_DEVICES` by (device, inode).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCheck {
    /// 1: check every matched open; 0: no kernel BTF, the path alone decides (reported by `doctor`).
    pub enabled: u32,
    /// Accepted majors; 0 ends the list. [`NVIDIA_MAJOR`] first, then `/proc/devices`' `nvidia*`.
    pub majors: [u32; DEVICE_MAJORS_MAX],
    /// Byte offsets: `task_struct.files`, `files_struct.fdt`, `fdtable.max_fds`, `fdtable.fd`,
    /// `file.f_inode`, `inode.i_mode`, `inode.i_rdev`, `inode.i_ino`, `inode.i_sb`,
    /// `super_block.s_dev`; for driver-entry mode's UVM mappings `vm_area_struct.vm_start`,
    /// `.vm_end`, `.vm_flags`, `.vm_pgoff`.
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdt_max_fds: u32,
    pub fdt_fd: u32,
    pub file_inode: u32,
    pub inode_mode: u32,
    pub inode_rdev: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    pub vma_start: u32,
    pub vma_end: u32,
    pub vma_flags: u32,
    pub vma_pgoff: u32,
}

/// A simulated device file (`SIM_DEVICES` key): its file system's kernel `dev_t`
/// (`major << 20 | minor`) and inode number.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SimDeviceKey {
    pub dev: u32,
    pub _pad: u32,
    pub ino: u64,
}

/// `CONFIG[0]`, written by user space before attaching.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracerConfig {
    /// The agent's own tgid: its opens are never tracked.
    pub agent_tgid: u32,
    /// Length of `dev_prefix` (the configured device directory followed by `/nvidia`).
    pub dev_prefix_len: u32,
    /// Consider a wake-up of user space every this many ring-buffer records per CPU (0 or 1: wake
    /// at every record); see `wakeup_bytes`.
    pub wakeup_every: u32,
    /// Bit set of enabled families ([`family`]).
    pub families: u32,
    /// Kernel-side diagnostics through aya-log (a copy that faulted, a capture plan that did not
    /// match): 1 on, 0 off (the default). Switched at run time; off costs one load and a branch.
    pub diagnostics: u32,
    /// Every `wakeup_every` records per CPU the kernel wakes user space only if one of the rings
    /// holds at least this many unread bytes (0: always). User space also drains on its timer.
    pub wakeup_bytes: u32,
    pub dev_prefix: [u8; DEV_PREFIX_MAX],
    pub device_check: DeviceCheck,
    pub lifecycle: LifecycleLayout,
    /// 1: time NVIDIA ioctls (`duration_ns`) in the modes whose entry program would otherwise do
    /// nothing for them (btf and raw tracepoints); 0: their entry returns at once and
    /// `duration_ns` is 0. `Config::ioctl_durations`.
    pub ioctl_durations: u32,
    /// Driver-entry mode: mixed into each open file's `struct file *` to make its `file_id` and
    /// file slot ([`NvFile`]), so no kernel address reaches user space. Random per agent start.
    pub file_salt: u64,
}

impl Default for TracerConfig {
    fn default() -> Self {
        Self {
            agent_tgid: 0,
            dev_prefix_len: 0,
            wakeup_every: 64,
            families: 0,
            diagnostics: 0,
            wakeup_bytes: 0,
            dev_prefix: [0; DEV_PREFIX_MAX],
            device_check: DeviceCheck::default(),
            lifecycle: LifecycleLayout::default(),
            ioctl_durations: 0,
            file_salt: 0,
        }
    }
}

/// Where the lifecycle tracepoints keep their fields on the running kernel, read by user space
/// from their `format` files (the layouts change between kernels: `sched_process_fork`'s comms
/// became `__data_loc` strings, `sched_process_exit` gained `group_dead`), how the exit
/// program tells that a process's last thread exited ([`exit_by`]), and for the `tp_btf`
/// programs (which get the kernel objects, not a record) the BTF offsets of the fields they read.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LifecycleLayout {
    /// `sched_process_fork.child_pid`.
    pub fork_child_pid: u32,
    /// `sched_process_exit.group_dead`, for [`exit_by::GROUP_DEAD`].
    pub exit_group_dead: u32,
    /// One of [`exit_by`].
    pub exit_by: u32,
    /// BTF offsets `task_struct.signal` and `signal_struct.live`, for [`exit_by::SIGNAL_LIVE`].
    pub task_signal: u32,
    pub signal_live: u32,
    /// `cgroup_rmdir.level`, `.id` and `.path` (a `__data_loc` string).
    pub rmdir_level: u32,
    pub rmdir_id: u32,
    pub rmdir_path: u32,
    /// BTF offsets for the `tp_btf` programs: `task_struct.pid` (the forked child's id),
    /// `cgroup.level`, `cgroup.kn` and `kernfs_node.id` (a cgroup's id is its kernfs node's).
    pub task_pid: u32,
    pub cgroup_level: u32,
    pub cgroup_kn: u32,
    pub kernfs_id: u32,
}

/// How `sched_process_exit` knows the whole process is gone.
pub mod exit_by {
    /// The tracepoint's own `group_dead` field (recent kernels).
    pub const GROUP_DEAD: u32 = 1;
    /// `current->signal->live` is 0 (it is decremented before the tracepoint fires), read at
    /// offsets from the kernel's BTF: exact on kernels without `group_dead`.
    pub const SIGNAL_LIVE: u32 = 2;
    /// The thread-group leader exits (no BTF either): early when the leader exits before its
    /// other threads, which CUDA programs do not do in practice.
    pub const LEADER: u32 = 3;
}

impl Default for LifecycleLayout {
    /// The layout of kernel 6.18 (the development machines').
    fn default() -> Self {
        Self {
            fork_child_pid: 20,
            exit_group_dead: 32,
            exit_by: exit_by::GROUP_DEAD,
            task_signal: 0,
            signal_live: 0,
            rmdir_level: 12,
            rmdir_id: 16,
            rmdir_path: 24,
            task_pid: 0,
            cgroup_level: 0,
            cgroup_kn: 0,
            kernfs_id: 0,
        }
    }
}

/// Probe families, as bits of [`TracerConfig::families`].
pub mod family {
    pub const LIFECYCLE: u32 = 1 << 0;
    pub const DRIVER: u32 = 1 << 1;
    pub const CUDA: u32 = 1 << 2;
    /// Set while `CUDA_PER_EVENT` selects any cgroup or process (launches are then checked).
    pub const CUDA_PER_EVENT: u32 = 1 << 8;
}

/// Per-CPU counters: `COUNTERS[probe * counter::SLOTS + slot]`.
///
/// For every probe, `SEEN == EMITTED + Σ DROP_*` holds exactly in the kernel; user space adds what it
/// received and dropped itself.
///
/// The drop reasons are the slots `DROP_FIRST..=DROP_LAST`, named by `NAMES`: user space reads,
/// sums, exports (the `reason` label) and serialises them from this table, so a new reason is an
/// edit of this module only (its slot and name, `DROP_LAST`, the slots after it moved up), plus the
/// probe that counts it and its line in `docs/metrics.md`.
pub mod counter {
    pub const SEEN: u32 = 0;
    pub const EMITTED: u32 = 1;
    /// `bpf_ringbuf_reserve` failed on the ledger ring: the ring buffer was full (the process's
    /// ledgers are marked "records lost since").
    pub const DROP_RINGBUF_FULL: u32 = 2;
    /// The entry→exit map was full: the exit could not be matched.
    pub const DROP_INFLIGHT_FULL: u32 = 3;
    /// The fd map update failed (the fd will not be tracked).
    pub const DROP_FD_MAP: u32 = 4;
    /// The exit was seen but its entry state was gone (evicted).
    pub const DROP_NO_ENTRY: u32 = 5;
    /// The in-kernel aggregation map could not take a new key.
    pub const DROP_COUNT_MAP: u32 = 6;
    /// An open of a file named like an NVIDIA node that is not an NVIDIA device (not a character
    /// device with an NVIDIA major, nor a simulated device): not traced. Not data loss — a spoofing
    /// attempt or a stray file (`DeviceCheck`).
    pub const DROP_NOT_A_DEVICE: u32 = 7;
    /// `bpf_ringbuf_reserve` failed on the bulk ring (count-only records): counts are short, no
    /// ledger is affected.
    pub const DROP_BULK_RINGBUF_FULL: u32 = 8;
    /// The entry of a call was seen but its return never came (driver-entry mode: the kernel had
    /// no free kretprobe instance, `maxactive`), found when the thread's next call entered.
    pub const DROP_NO_RETURN: u32 = 9;
    /// A kernel value the probe reads could not be read (driver-entry mode: a probed function's
    /// argument, the file's inode or device number, the VMA's range): the call could not be
    /// attributed.
    pub const DROP_KERNEL_READ: u32 = 10;
    /// Counted in an in-kernel aggregate (`CUDA_COUNTS`) instead of a ring-buffer record.
    pub const AGGREGATED: u32 = 11;
    pub const SLOTS: u32 = 12;
    pub const DROP_FIRST: u32 = DROP_RINGBUF_FULL;
    pub const DROP_LAST: u32 = DROP_KERNEL_READ;
    /// Names used for metric labels, by slot.
    pub const NAMES: [&str; 12] = [
        "seen",
        "emitted",
        "ringbuf_full",
        "inflight_full",
        "fd_map_full",
        "no_entry",
        "count_map_full",
        "not_a_device",
        "bulk_ringbuf_full",
        "no_return",
        "kernel_read",
        "aggregated",
    ];
}

/// Probe ids (rows of the counter table).
pub mod probe {
    pub const OPEN: u32 = 0;
    pub const CLOSE: u32 = 1;
    pub const DUP: u32 = 2;
    pub const IOCTL: u32 = 3;
    pub const MMAP: u32 = 4;
    pub const MUNMAP: u32 = 5;
    pub const EXEC: u32 = 6;
    pub const EXIT: u32 = 7;
    pub const FORK: u32 = 8;
    pub const CGROUP_RMDIR: u32 = 9;
    /// libcuda entry points counted in the kernel (launches, contexts, modules).
    pub const CUDA_CALL: u32 = 10;
    /// libcuda allocations (entry + return).
    pub const CUDA_ALLOC: u32 = 11;
    /// libcuda frees.
    pub const CUDA_FREE: u32 = 12;
    /// Function/kernel handle lookups (names).
    pub const CUDA_FUNCTION: u32 = 13;
    /// Per-event launch records.
    pub const CUDA_LAUNCH: u32 = 14;
    /// Per-event records of timed calls (synchronisation, events, copies, memsets).
    pub const CUDA_TIMED: u32 = 15;
    pub const COUNT: u32 = 16;
    pub const NAMES: [&str; 16] = [
        "open",
        "close",
        "dup",
        "ioctl",
        "mmap",
        "munmap",
        "exec",
        "exit",
        "fork",
        "cgroup_rmdir",
        "cuda_call",
        "cuda_alloc",
        "cuda_free",
        "cuda_function",
        "cuda_launch",
        "cuda_timed",
    ];

    /// The probes whose records a ledger is built from: a loss of one of them (a full ledger ring,
    /// a full entry or fd map) marks the process's ledgers "records lost since". Lifecycle records
    /// are not among them (a lost exit is found by the reconciliation against `/proc`), nor are
    /// the count-only ones.
    pub const LEDGER: [u32; 8] = [OPEN, CLOSE, DUP, IOCTL, MMAP, MUNMAP, CUDA_ALLOC, CUDA_FREE];

    /// Whether `probe` is one of [`LEDGER`] (a `match`, so the kernel side needs no loop).
    #[inline(always)]
    pub const fn is_ledger(probe: u32) -> bool {
        matches!(probe, OPEN | CLOSE | DUP | IOCTL | MMAP | MUNMAP | CUDA_ALLOC | CUDA_FREE)
    }
}

/// Entries of the `COUNTERS` per-CPU array.
pub const COUNTER_ENTRIES: u32 = probe::COUNT * counter::SLOTS;

/// Tgids per `TRACKED_TGIDS` entry (one byte each; one page per entry).
pub const TRACKED_TGIDS_PER_ENTRY: usize = 4096;

/// `BPF_F_MMAPABLE`: an array user space can mmap.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

/// Capacities of the kernel maps.
pub mod capacity {
    pub const NV_FDS: u32 = 65536;
    /// Open NVIDIA files in driver-entry mode (`NV_FILES`).
    pub const NV_FILES: u32 = 65536;
    /// Driver-entry mode's ioctl slots (`DE_IOCTL_ENTRY`, a power of two): two threads whose tids
    /// agree modulo this, inside NVIDIA ioctls at the same moment, cost one record (counted).
    pub const DE_IOCTL_ENTRY: u32 = 8192;
    /// Entries of the tracked-tgid map by default (covers pid_max 4194304); the loader sizes it
    /// from `/proc/sys/kernel/pid_max`.
    pub const TRACKED_TGID_ENTRIES: u32 = 4194304 / super::TRACKED_TGIDS_PER_ENTRY as u32;
    pub const INFLIGHT: u32 = 16384;
    /// Slots of `IOCTL_ENTRY` (a power of two): threads inside an ioctl at once, by thread id
    /// modulo this; two threads sharing a slot lose only a duration, never a record.
    pub const IOCTL_ENTRY: u32 = 32768;
    pub const UVM_MAPS: u32 = 16384;
    pub const CUDA_COUNTS: u32 = 65536;
    pub const CUDA_INFLIGHT: u32 = 16384;
    pub const CUDA_TIMED_INFLIGHT: u32 = 16384;
    /// Default size of each ring buffer, the ledger ring and the bulk ring (bytes, power of two).
    pub const EVENTS_BYTES: u32 = 8 << 20;
}

const _: () = {
    assert!(size_of::<EventHeader>() == 32);
    assert!(size_of::<DeviceRef>() == 16);
    assert!(size_of::<FdKey>() == 8);
    assert!(size_of::<FdOpenRecord>() == 56);
    assert!(size_of::<FdCloseRecord>() == 56);
    assert!(size_of::<FdDupRecord>() == 56);
    assert!(size_of::<IoctlRecord>() == 32 + 16 + 4 + 4 + 8 + 8 + 8 + 8 + 8 + 8 + 8 + 8 + 256 + 16 + 128);
    assert!(size_of::<UvmMmapRecord>() == 32 + 16 + 8 + 8 + 8 + 8 + 8 + 8);
    assert!(size_of::<UvmMunmapRecord>() == 56);
    assert!(size_of::<ProcExecRecord>() == 48);
    assert!(size_of::<ProcExitRecord>() == 48);
    assert!(size_of::<ProcForkRecord>() == 40);
    assert!(size_of::<CgroupRmdirRecord>() == 32 + 16 + CGROUP_PATH_MAX);
    assert!(size_of::<Inflight>() == 8 + 32 + 8 + 16 + 16);
    assert!(size_of::<UvmMapKey>() == 16);
    assert!(size_of::<CaptureKey>() == 8);
    assert!(size_of::<CapturePlan>() == 32);
    assert!(size_of::<PlanSlot>() == 40);
    assert!(size_of::<ClassSize>() == 8);
    assert!(size_of::<DeviceCheck>() == 4 + 4 * DEVICE_MAJORS_MAX + 56);
    assert!(size_of::<SimDeviceKey>() == 16);
    assert!(
        size_of::<TracerConfig>() == 24 + DEV_PREFIX_MAX + size_of::<DeviceCheck>() + size_of::<LifecycleLayout>() + 12
    );
    assert!(size_of::<LifecycleLayout>() == 48);
    assert!(size_of::<CudaCountKey>() == 16);
    assert!(size_of::<PerEventKey>() == 16);
    assert!(size_of::<CudaCount>() == 16);
    assert!(size_of::<CudaAllocInflight>() == 32);
    assert!(size_of::<CudaAllocRecord>() == 64);
    assert!(size_of::<CudaFreeRecord>() == 48);
    assert!(size_of::<CudaFunctionRecord>() == 32 + 32 + CUDA_NAME_MAX);
    assert!(size_of::<CudaLaunchRecord>() == 32 + 8 + 16 + 24);
    assert!(size_of::<CudaTimedInflight>() == 8 + 32 + 8);
    assert!(size_of::<CudaTimedRecord>() == 32 + 8 + 8 + 32);
};

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: DeviceRef is #[repr(C)] with only integer fields (u8, u32, u64) and its padding as the explicit
    // `_pad: [u8; 3]` field (size asserted to be 16 above), so every byte is initialised and any bit pattern
    // is valid.
    unsafe impl aya::Pod for DeviceRef {}
    // SAFETY: FdKey is #[repr(C)] with two u32 fields and no padding (size asserted to be 8), so any bit
    // pattern is a valid value.
    unsafe impl aya::Pod for FdKey {}
    // SAFETY: Inflight is #[repr(C)] of integers, a u64 array and two DeviceRefs (themselves Pod); its size
    // is asserted to be the sum of its fields, so it has no implicit padding and any bit pattern is valid.
    unsafe impl aya::Pod for Inflight {}
    // SAFETY: UvmMapKey is #[repr(C)] with u32/u64 fields and the explicit `_pad: u32` (size asserted to be
    // 16), so it has no implicit padding and any bit pattern is valid.
    unsafe impl aya::Pod for UvmMapKey {}
    // SAFETY: CaptureKey is #[repr(C)] with two u32 fields and no padding (size asserted to be 8), so any bit
    // pattern is valid.
    unsafe impl aya::Pod for CaptureKey {}
    // SAFETY: CapturePlan is #[repr(C)] with eight u32 fields, the last the explicit `_pad` (size asserted to
    // be 32), so it has no implicit padding and any bit pattern is valid.
    unsafe impl aya::Pod for CapturePlan {}
    // SAFETY: PlanSlot is #[repr(C)] of two u32 fields and a CapturePlan (itself Pod, u32s only; size
    // asserted to be 40), so it has no implicit padding and any bit pattern is valid.
    unsafe impl aya::Pod for PlanSlot {}
    // SAFETY: ClassSize is #[repr(C)] with two u32 fields (size asserted to be 8), so any bit pattern is
    // valid.
    unsafe impl aya::Pod for ClassSize {}
    // SAFETY: TracerConfig is #[repr(C)] with four u32 fields, a byte array and a DeviceCheck of u32s only
    // (size asserted to be their sum), so it has no implicit padding and any bit pattern is valid.
    unsafe impl aya::Pod for TracerConfig {}
    // SAFETY: SimDeviceKey is #[repr(C)] with two u32 fields and a u64 (size asserted to be 16), so it has no
    // implicit padding and any bit pattern is valid.
    unsafe impl aya::Pod for SimDeviceKey {}
    // SAFETY: CudaCountKey is #[repr(C)] with a u64 and two u32 fields (size asserted to be 16), so it has no
    // implicit padding and any bit pattern is valid.
    unsafe impl aya::Pod for CudaCountKey {}
    // SAFETY: CudaCount is #[repr(C)] with two u64 fields (size asserted to be 16), so any bit pattern is
    // valid.
    unsafe impl aya::Pod for CudaCount {}
    // SAFETY: CudaAllocInflight is #[repr(C)] with three u64 and two u32 fields, the last the explicit `_pad`
    // (size asserted to be 32), so it has no implicit padding and any bit pattern is valid.
    unsafe impl aya::Pod for CudaAllocInflight {}
    // SAFETY: CudaTimedInflight is #[repr(C)] with five u64s, a u32 and the explicit `_pad: u32` (size
    // asserted to be 48), so it has no implicit padding and any bit pattern is valid.
    unsafe impl aya::Pod for CudaTimedInflight {}
    // SAFETY: PerEventKey is #[repr(C)] with a u32, the explicit `_pad: u32` and a u64 (size asserted to be
    // 16), so it has no implicit padding and any bit pattern is valid.
    unsafe impl aya::Pod for PerEventKey {}
}

/// Read a record's header from raw ring-buffer bytes (user space helper; no allocation).
pub fn header_from_bytes(b: &[u8]) -> Option<EventHeader> {
    if b.len() < size_of::<EventHeader>() {
        return None;
    }
    // SAFETY: the length check above makes the read of size_of::<EventHeader>() bytes in bounds; EventHeader
    // is #[repr(C)] of integers only, so any bit pattern is valid, and read_unaligned tolerates the byte
    // slice's alignment.
    Some(unsafe { core::ptr::read_unaligned(b.as_ptr() as *const EventHeader) })
}

/// Marker for the plain-old-data records that may be read from raw bytes.
///
/// # Safety
/// Implementors must be `repr(C)`, contain only integers and byte arrays, accept any bit pattern, and have
/// no implicit padding ([`record_as_bytes`] exposes every byte).
pub unsafe trait Record: Copy {
    const KIND: u16;
}
// SAFETY: FdOpenRecord is #[repr(C)] of `EventHeader`, `DeviceRef`, `i32`, `u32`, all of which accept any bit
// pattern; its size is asserted above to be 56, the sum of its fields, so there is no implicit padding.
unsafe impl Record for FdOpenRecord {
    const KIND: u16 = kind::FD_OPEN;
}
// SAFETY: FdCloseRecord is #[repr(C)] of `EventHeader`, `DeviceRef`, `i32`, `u32` and the explicit `_pad`,
// all of which accept any bit pattern; its size is asserted above to be 56, the sum of its fields, so there
// is no implicit padding.
unsafe impl Record for FdCloseRecord {
    const KIND: u16 = kind::FD_CLOSE;
}
// SAFETY: FdDupRecord is #[repr(C)] of `EventHeader`, `DeviceRef`, `i32`, all of which accept any bit
// pattern; its size is asserted above to be 56, the sum of its fields, so there is no implicit padding.
unsafe impl Record for FdDupRecord {
    const KIND: u16 = kind::FD_DUP;
}
// SAFETY: IoctlRecord is #[repr(C)] of `EventHeader`, `DeviceRef`, `i32`, `u32`, `u64`, `i64`, `u16`, `[u8;
// IOCTL_MAIN_MAX]`, `[u8; IOCTL_TAIL_MAX]`, `[u8; IOCTL_NESTED_MAX]` and the explicit `_pad`, all of which
// accept any bit pattern; its size is asserted above to be 32 + 16 + 4 + 4 + 8 + 8 + 8 + 8 + 8 + 8 + 8 + 8 +
// 256 + 16 + 128, the sum of its fields, so there is no implicit padding.
unsafe impl Record for IoctlRecord {
    const KIND: u16 = kind::IOCTL;
}
// SAFETY: UvmMmapRecord is #[repr(C)] of `EventHeader`, `DeviceRef`, `i32`, `u32`, `u64`, `i64`, all of which
// accept any bit pattern; its size is asserted above to be 32 + 16 + 8 + 8 + 8 + 8 + 8 + 8, the sum of its
// fields, so there is no implicit padding.
unsafe impl Record for UvmMmapRecord {
    const KIND: u16 = kind::UVM_MMAP;
}
// SAFETY: UvmMunmapRecord is #[repr(C)] of `EventHeader`, `u64`, `i64`, all of which accept any bit pattern;
// its size is asserted above to be 56, the sum of its fields, so there is no implicit padding.
unsafe impl Record for UvmMunmapRecord {
    const KIND: u16 = kind::UVM_MUNMAP;
}
// SAFETY: ProcExecRecord is #[repr(C)] of `EventHeader`, `[u8; 16]`, all of which accept any bit pattern; its
// size is asserted above to be 48, the sum of its fields, so there is no implicit padding.
unsafe impl Record for ProcExecRecord {
    const KIND: u16 = kind::PROC_EXEC;
}
// SAFETY: ProcExitRecord is #[repr(C)] of `EventHeader`, `[u8; 16]`, all of which accept any bit pattern; its
// size is asserted above to be 48, the sum of its fields, so there is no implicit padding.
unsafe impl Record for ProcExitRecord {
    const KIND: u16 = kind::PROC_EXIT;
}
// SAFETY: ProcForkRecord is #[repr(C)] of `EventHeader`, `u32` and the explicit `_pad`, all of which accept
// any bit pattern; its size is asserted above to be 40, the sum of its fields, so there is no implicit
// padding.
unsafe impl Record for ProcForkRecord {
    const KIND: u16 = kind::PROC_FORK;
}
// SAFETY: CgroupRmdirRecord is #[repr(C)] of `EventHeader`, `u64`, `u32`, `[u8; CGROUP_PATH_MAX]`, all of
// which accept any bit pattern; its size is asserted above to be 32 + 16 + CGROUP_PATH_MAX, the sum of its
// fields, so there is no implicit padding.
unsafe impl Record for CgroupRmdirRecord {
    const KIND: u16 = kind::CGROUP_RMDIR;
}
// SAFETY: CudaAllocRecord is #[repr(C)] of `EventHeader`, `u32`, `u64`, all of which accept any bit pattern;
// its size is asserted above to be 64, the sum of its fields, so there is no implicit padding.
unsafe impl Record for CudaAllocRecord {
    const KIND: u16 = kind::CUDA_ALLOC;
}
// SAFETY: CudaFreeRecord is #[repr(C)] of `EventHeader`, `u32`, `u64` and the explicit `_pad`, all of which
// accept any bit pattern; its size is asserted above to be 48, the sum of its fields, so there is no implicit
// padding.
unsafe impl Record for CudaFreeRecord {
    const KIND: u16 = kind::CUDA_FREE;
}
// SAFETY: CudaFunctionRecord is #[repr(C)] of `EventHeader`, `u32`, `u64`, `[u8; CUDA_NAME_MAX]` and the
// explicit `_pad`, all of which accept any bit pattern; its size is asserted above to be 32 + 32 +
// CUDA_NAME_MAX, the sum of its fields, so there is no implicit padding.
unsafe impl Record for CudaFunctionRecord {
    const KIND: u16 = kind::CUDA_FUNCTION;
}
// SAFETY: CudaLaunchRecord is #[repr(C)] of `EventHeader`, `u32`, `u64`, `[u32; 3]`, all of which accept any
// bit pattern; its size is asserted above to be 32 + 8 + 16 + 24, the sum of its fields, so there is no
// implicit padding.
unsafe impl Record for CudaLaunchRecord {
    const KIND: u16 = kind::CUDA_LAUNCH;
}
// SAFETY: CudaTimedRecord is #[repr(C)] of `EventHeader`, two `u32`, a `u64` and `[u64; 4]`, all of which
// accept any bit pattern; its size is asserted above to be 32 + 8 + 8 + 32, the sum of its fields, so there
// is no implicit padding.
unsafe impl Record for CudaTimedRecord {
    const KIND: u16 = kind::CUDA_TIMED;
}

/// Read a whole record of type `R` from raw bytes; `None` if too short.
pub fn record_from_bytes<R: Record>(b: &[u8]) -> Option<R> {
    if b.len() < size_of::<R>() {
        return None;
    }
    // SAFETY: the length check above makes the read of size_of::<R>() bytes in bounds; R: Record promises a
    // #[repr(C)] plain-data type that accepts any bit pattern, and read_unaligned tolerates the byte slice's
    // alignment.
    Some(unsafe { core::ptr::read_unaligned(b.as_ptr() as *const R) })
}

/// View a record as bytes (for encoding test inputs and the `/proc` seed path).
pub fn record_as_bytes<R: Record>(r: &R) -> &[u8] {
    // SAFETY: `r` is a valid reference, so its size_of::<R>() bytes are readable for the returned lifetime
    // (tied to `r`), and u8 has alignment 1. R: Record promises no implicit padding (every layout's size is
    // asserted to be the sum of its fields), so every byte is initialised.
    unsafe { core::slice::from_raw_parts(r as *const R as *const u8, size_of::<R>()) }
}

#[cfg(test)]
mod tests {
    use super::probe;

    #[test]
    fn the_ledger_probe_list_and_its_match_agree() {
        for p in 0..probe::COUNT {
            assert_eq!(probe::is_ledger(p), probe::LEDGER.contains(&p), "probe {}", probe::NAMES[p as usize]);
        }
    }
}
