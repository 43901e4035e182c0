//! Every map of the kernel side, in one place. Capacities come from `tracer_common::capacity`.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, LruPerCpuHashMap, PerCpuArray, RingBuf},
};
use tracer_common::{
    COUNTER_ENTRIES, ClassSize, CudaAllocInflight, CudaCount, CudaCountKey, CudaTimedInflight, DeIoctlEntry, DeviceRef,
    FdKey, Inflight, NvFile, PerEventKey, PlanSlot, SimDeviceKey, TracerConfig, UvmMapKey, capacity,
};

/// The ledger ring: records a ledger is built from (fds, lifecycle, allocations, frees). Written
/// only through `emit`.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(capacity::EVENTS_BYTES, 0);

/// The bulk ring: high-rate records that only count (count-only ioctls, per-event launches,
/// function lookups), apart so that a flood of them cannot crowd out the ledger's records.
/// Written only through `emit`.
#[map]
pub static BULK_EVENTS: RingBuf = RingBuf::with_byte_size(capacity::EVENTS_BYTES, 0);

/// Per-CPU `seen`/`emitted`/`drop_*` counters per probe (see `tracer_common::counter`).
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_ENTRIES, 0);

/// Per-CPU record count, for batching ring-buffer wake-ups.
#[map]
pub static WAKEUP_SEQ: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Known NVIDIA fds: (tgid, fd) → device. Filled at open exit, by dups, and by user space's
/// `/proc` seed; bounded by LRU; user space removes a process's keys when it exits.
#[map]
pub static NV_FDS: LruHashMap<FdKey, DeviceRef> = LruHashMap::with_max_entries(capacity::NV_FDS, 0);

/// Open NVIDIA files in driver-entry mode: `struct file *` → device, file slot and last user.
/// Filled at the driver's open (or at a file's first call), emptied at its release; bounded by LRU.
#[map]
pub static NV_FILES: LruHashMap<u64, NvFile> = LruHashMap::with_max_entries(capacity::NV_FILES, 0);

/// Driver-entry mode: each thread's ioctl between its kprobe and kretprobe (see `DeIoctlEntry`).
#[map]
pub static DE_IOCTL_ENTRY: Array<DeIoctlEntry> = Array::with_max_entries(capacity::DE_IOCTL_ENTRY, 0);

/// Processes that hold (or held) NVIDIA fds: one byte per possible tgid, in pages of 4096 (the
/// loader sizes it from `pid_max`). Bytes, not bits, so every update is a plain one-byte store
/// that cannot clobber a neighbour (BPF has no portable atomic or/and from Rust). Checked first on every traced syscall, so processes
/// that never touched the GPU pay an inlined array lookup instead of hash lookups, and only tracked
/// processes get exec/exit/fork records. Memory-mapped by user space, which sets bits for the
/// processes its `/proc` scan finds with atomic operations too.
#[map]
pub static TRACKED_TGIDS: Array<[u8; tracer_common::TRACKED_TGIDS_PER_ENTRY]> =
    Array::with_max_entries(capacity::TRACKED_TGID_ENTRIES, tracer_common::BPF_F_MMAPABLE);

/// Syscall entry state, keyed by pid_tgid, consumed at exit. A plain (preallocated) hash: an LRU
/// update costs far more on this hot path. Entries of threads that died inside a syscall (no exit)
/// are swept by user space (`Agent::sweep_inflight`).
#[map]
pub static INFLIGHT: HashMap<u64, Inflight> = HashMap::with_max_entries(capacity::INFLIGHT, 0);

/// Entry time of the ioctl each thread is inside, in the modes whose exit program sees the
/// syscall's registers (btf and raw tracepoints; the arguments are read again there, so no entry
/// state is needed but the time): slot `tid % IOCTL_ENTRY` holds `[pid_tgid, ktime]`, cleared at
/// exit. An array store and load instead of a hash insert, lookup and delete on the hottest path;
/// a thread whose slot another overwrote gets duration 0 (unknown), its record is unaffected.
#[map]
pub static IOCTL_ENTRY: Array<[u64; 2]> = Array::with_max_entries(capacity::IOCTL_ENTRY, 0);

/// Live managed-memory mappings of UVM fds: (tgid, address) → length.
#[map]
pub static UVM_MAPS: LruHashMap<UvmMapKey, u64> = LruHashMap::with_max_entries(capacity::UVM_MAPS, 0);

/// What to copy for each ioctl command, for the running driver version (written by user space):
/// direct-mapped by `tracer_common::plan_slot`, each slot holding its command.
#[map]
pub static CAPTURE_PLANS: Array<PlanSlot> = Array::with_max_entries(tracer_common::CAPTURE_PLAN_SLOTS, 0);

/// RM_ALLOC nested parameter sizes by class (written by user space): direct-mapped by
/// `tracer_common::class_slot`, each slot holding its class.
#[map]
pub static ALLOC_PARAM_SIZES: Array<ClassSize> = Array::with_max_entries(tracer_common::ALLOC_PARAM_SLOTS, 0);

/// `CONFIG[0]`: agent tgid, device prefix, wake-up batching.
#[map]
pub static CONFIG: Array<TracerConfig> = Array::with_max_entries(1, 0);

/// libcuda calls per (cgroup, tgid, entry point), per CPU: launches are counted here, never sent one
/// by one. User space reads and sums it each interval and removes the keys of exited processes.
#[map]
pub static CUDA_COUNTS: LruPerCpuHashMap<CudaCountKey, CudaCount> =
    LruPerCpuHashMap::with_max_entries(capacity::CUDA_COUNTS, 0);

/// Cgroups and processes whose launches are sent one by one (per-event mode), each until a
/// deadline (`bpf_ktime_get_ns`; `u64::MAX` for none): a selection its owner failed to remove
/// expires on its own.
#[map]
pub static CUDA_PER_EVENT: HashMap<PerEventKey, u64> = HashMap::with_max_entries(1024, 0);

/// libcuda allocations between entry and return, keyed by pid_tgid.
#[map]
pub static CUDA_INFLIGHT: HashMap<u64, CudaAllocInflight> = HashMap::with_max_entries(capacity::CUDA_INFLIGHT, 0);

/// Timed libcuda calls (synchronisation, events, copies, memsets) between entry and return, keyed
/// by pid_tgid; only for the processes in per-event mode.
#[map]
pub static CUDA_TIMED_INFLIGHT: HashMap<u64, CudaTimedInflight> =
    HashMap::with_max_entries(capacity::CUDA_TIMED_INFLIGHT, 0);

/// Processes that lost a record their ledger needed (ring buffer full, entry state or fd map
/// full): tgid → `bpf_ktime_get_ns()` of the first loss. User space takes the entries every tick
/// and marks those processes' ledgers (and their cgroups' and GPUs') inexact since then. Only
/// written on the loss path. When full, the global drop counters still say so.
#[map]
pub static LOST_RECORDS: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

/// Simulated device files accepted although they are not NVIDIA character devices, by (file
/// system `dev_t`, inode): the fake driver's files, written by user space only with
/// `simulated_devices` on. Empty on a real node.
#[map]
pub static SIM_DEVICES: HashMap<SimDeviceKey, u8> = HashMap::with_max_entries(64, 0);
