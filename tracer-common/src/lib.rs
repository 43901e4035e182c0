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
pub mod map_names;

/// Program names, as they appear in the eBPF object.
pub mod prog_names;

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
pub mod cuda_entry;
/// What the [`cuda_entry::Action::Timed`] entry points are, read from their id and first four
/// arguments (shared by the kernel's byte count and user space's decoding).
pub mod timed;

pub use cuda::*;
pub use maps::*;
mod cuda;
mod maps;

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
mod pod;

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

    /// The per-entry programs are named by id, and the entry table is in id order (the kernel
    /// side indexes it by id at compile time).
    #[test]
    fn per_entry_programs_and_the_entry_table_are_in_id_order() {
        for (i, (id, _, _)) in super::cuda_entry::ALL.iter().enumerate() {
            assert_eq!(*id as usize, i);
            let name = super::prog_names::CUDA_PER_ENTRY[i];
            assert_eq!(name.strip_prefix("cuda_e").and_then(|n| n.parse::<usize>().ok()), Some(i), "{name}");
        }
    }

    #[test]
    fn the_ledger_probe_list_and_its_match_agree() {
        for p in 0..probe::COUNT {
            assert_eq!(probe::is_ledger(p), probe::LEDGER.contains(&p), "probe {}", probe::NAMES[p as usize]);
        }
    }
}
