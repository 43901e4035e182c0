//! The `cuda` family's records and map values (its entry points are [`crate::cuda_entry`]).
use crate::EventHeader;

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
