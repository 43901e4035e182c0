//! Pure decoding of ring-buffer records into typed events: bytes in, [`Event`] out, no I/O.
//!
//! The wire records are defined once in `tracer_common`; the NVIDIA parameter layouts in
//! `tracer_common::nv`, with the layouts that drift between driver versions resolved by
//! [`DriverAbi`]. [`decode`] never panics, whatever the bytes: a record that is too short, of an
//! unknown kind or with impossible window lengths is a [`DecodeError`] (each with a short
//! [`DecodeError::reason`] for a metric label). An ioctl whose *argument* could not be read or is
//! inconsistent (a faulted window, a window too short to hold the fields, an `_IOC_SIZE` the driver
//! rejects) still decodes, as [`IoctlOp::Malformed`], so that it is counted rather than dropped.
//!
//! What the kernel side copies for each command is chosen by [`plan`]; [`encode`] is the inverse of
//! [`decode`] and builds raw records for tests, benchmarks and the fuzz seed corpus; it is built
//! only for this crate's tests and behind the `encode` feature (the tests crate, bench and fuzz
//! turn it on), so the agent binary does not carry it.

#[cfg(any(test, feature = "encode"))]
pub mod encode;
#[cfg(any(test, feature = "encode"))]
pub mod fuzz;
mod ioctl;
pub mod plan;
#[cfg(test)]
mod tests;

use tracer_common::{
    CGROUP_PATH_MAX, CUDA_NAME_MAX, CgroupRmdirRecord, CudaAllocRecord, CudaFreeRecord, CudaFunctionRecord,
    CudaLaunchRecord, CudaTimedRecord, EventHeader, FdCloseRecord, FdDupRecord, FdOpenRecord, IOCTL_MAIN_MAX,
    IOCTL_NESTED_MAX, IOCTL_TAIL_MAX, IoctlRecord, ProcExecRecord, ProcExitRecord, ProcForkRecord, Record,
    UvmMmapRecord, UvmMunmapRecord, device_kind, flags, header_from_bytes, kind, nv::DriverAbi, record_from_bytes,
};

/// Why a record could not be decoded at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than the header or the record of this kind needs (or than the header says).
    #[error("record too short: kind {kind} needs {need} bytes, got {got}")]
    Short { kind: u16, need: usize, got: usize },
    /// `EventHeader::kind` is not one this build knows.
    #[error("unknown record kind {kind}")]
    UnknownKind { kind: u16 },
    /// `EventHeader::size` is smaller than the record of its kind.
    #[error("record of kind {kind} declares {declared} bytes, its layout has {expected}")]
    BadRecordSize { kind: u16, declared: u32, expected: usize },
    /// A window length inside the record is larger than the array that holds it.
    #[error("{field} = {len} exceeds the {max}-byte capture window")]
    BadLength { field: &'static str, len: u32, max: usize },
}

impl DecodeError {
    /// Every [`reason`](Self::reason), so `decode_errors_total` has each one, also at 0.
    pub const REASONS: [&'static str; 4] = ["short", "unknown_kind", "bad_record_size", "bad_length"];

    /// A short, stable label for the `decode_errors_total{reason}` metric.
    pub fn reason(&self) -> &'static str {
        match self {
            DecodeError::Short { .. } => "short",
            DecodeError::UnknownKind { .. } => "unknown_kind",
            DecodeError::BadRecordSize { .. } => "bad_record_size",
            DecodeError::BadLength { .. } => "bad_length",
        }
    }
}

/// Who and when: the common part of every event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Header {
    /// `bpf_ktime_get_ns()` at the event (syscall exit for calls).
    pub ktime_ns: u64,
    /// Host process id (thread-group id).
    pub tgid: u32,
    /// Host thread id.
    pub pid: u32,
    /// cgroup v2 id of the task at the event.
    pub cgroup_id: u64,
}

impl Header {
    fn from_wire(h: &EventHeader) -> Self {
        Header { ktime_ns: h.ktime_ns, tgid: h.tgid, pid: h.pid, cgroup_id: h.cgroup_id }
    }
}

/// Which kind of NVIDIA device node an fd refers to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum DeviceKind {
    /// Not classified (also any kind value this build does not know).
    #[default]
    Unknown,
    /// `/dev/nvidiactl`: all RM object traffic.
    Ctl,
    /// `/dev/nvidiaN`: one GPU (the minor is N).
    Gpu,
    /// `/dev/nvidia-uvm`.
    Uvm,
    /// `/dev/nvidia-uvm-tools`.
    UvmTools,
    /// `/dev/nvidia-modeset`.
    Modeset,
    /// `/dev/nvidia-caps/*`.
    Caps,
}

impl DeviceKind {
    /// From `tracer_common::device_kind`.
    pub(crate) fn from_wire(k: u8) -> Self {
        match k {
            device_kind::CTL => DeviceKind::Ctl,
            device_kind::GPU => DeviceKind::Gpu,
            device_kind::UVM => DeviceKind::Uvm,
            device_kind::UVM_TOOLS => DeviceKind::UvmTools,
            device_kind::MODESET => DeviceKind::Modeset,
            device_kind::CAPS => DeviceKind::Caps,
            _ => DeviceKind::Unknown,
        }
    }
    #[cfg(any(test, feature = "encode"))]
    /// To `tracer_common::device_kind`.
    pub(crate) fn to_wire(self) -> u8 {
        match self {
            DeviceKind::Unknown => device_kind::UNKNOWN,
            DeviceKind::Ctl => device_kind::CTL,
            DeviceKind::Gpu => device_kind::GPU,
            DeviceKind::Uvm => device_kind::UVM,
            DeviceKind::UvmTools => device_kind::UVM_TOOLS,
            DeviceKind::Modeset => device_kind::MODESET,
            DeviceKind::Caps => device_kind::CAPS,
        }
    }
    /// A short label (`ctl`, `gpu`, `uvm`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Unknown => "unknown",
            DeviceKind::Ctl => "ctl",
            DeviceKind::Gpu => "gpu",
            DeviceKind::Uvm => "uvm",
            DeviceKind::UvmTools => "uvm_tools",
            DeviceKind::Modeset => "modeset",
            DeviceKind::Caps => "caps",
        }
    }
}

/// The NVIDIA device behind an fd (the decoded `tracer_common::DeviceRef`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Device {
    pub kind: DeviceKind,
    /// GPU minor for [`DeviceKind::Gpu`], caps number for [`DeviceKind::Caps`], else 0.
    pub minor: u32,
    /// Identity of the open file description: shared by an fd and its dups (and by a forked child's
    /// copy), different for two opens of the same node.
    pub file_id: u64,
}

impl Device {
    /// Decode a wire `DeviceRef`.
    pub(crate) fn from_wire(d: &tracer_common::DeviceRef) -> Self {
        Device { kind: DeviceKind::from_wire(d.kind), minor: d.minor, file_id: d.file_id }
    }
    #[cfg(any(test, feature = "encode"))]
    /// Encode as a wire `DeviceRef`.
    pub(crate) fn to_wire(self) -> tracer_common::DeviceRef {
        tracer_common::DeviceRef { kind: self.kind.to_wire(), _pad: [0; 3], minor: self.minor, file_id: self.file_id }
    }
}

/// One decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An NVIDIA device node was opened (or found by the start-up `/proc` scan: `seeded`).
    FdOpened { header: Header, device: Device, fd: i32, open_flags: u32, seeded: bool },
    /// An NVIDIA fd was closed; `replaced` when it was closed implicitly by a dup2/dup3 onto it.
    FdClosed { header: Header, device: Device, fd: i32, replaced: bool },
    /// An NVIDIA fd was duplicated (dup, dup2, dup3, fcntl F_DUPFD*); `device` is the source's.
    FdDuped { header: Header, device: Device, old_fd: i32, new_fd: i32 },
    /// A completed ioctl on an NVIDIA fd.
    Ioctl(IoctlEvent),
    /// `mmap` of a `/dev/nvidia-uvm` fd: a managed-memory range (`cudaMallocManaged`).
    UvmMapped {
        header: Header,
        device: Device,
        fd: i32,
        addr: u64,
        len: u64,
        offset: u64,
        prot: u32,
        map_flags: u64,
        /// mmap's return value (the address, or -errno).
        ret: i64,
    },
    /// A managed-memory range was unmapped (exact address of an earlier [`Event::UvmMapped`]).
    UvmUnmapped { header: Header, addr: u64, len: u64, ret: i64 },
    /// A tracked process called exec (new `comm`).
    ProcessExec { header: Header, comm: String },
    /// A tracked process exited (its last thread).
    ProcessExit { header: Header, comm: String },
    /// A tracked process forked or cloned; `child_pid` may be a thread of the same process.
    ProcessFork { header: Header, child_pid: u32 },
    /// A libcuda allocation returned (`cuda` family): `ptr` is what was written to the
    /// out-parameter (0 when the call failed or it was unreadable); `result` is the CUresult; the
    /// header's time is the return, `start_ktime_ns` the entry.
    CudaAlloc { header: Header, entry: u32, result: u32, ptr: u64, bytes: u64, start_ktime_ns: u64 },
    /// A libcuda free was called with `ptr` (a device pointer, host pointer or handle).
    CudaFree { header: Header, entry: u32, ptr: u64 },
    /// A function/kernel handle was obtained: with its name (cuModuleGetFunction,
    /// cuLibraryGetKernel) or from the kernel handle `source` (cuKernelGetFunction).
    CudaFunction { header: Header, entry: u32, result: u32, handle: u64, source: u64, name: String },
    /// One kernel launch (per-event mode only).
    CudaLaunch {
        header: Header,
        entry: u32,
        function: u64,
        stream: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
    },
    /// A timed call returned (per-event mode only): synchronisation, an event record, query or
    /// wait, a copy or a memset (`tracer_common::timed` reads the arguments by entry point).
    CudaTimed { header: Header, entry: u32, result: u32, start_ktime_ns: u64, args: [u64; 4] },
    /// A cgroup v2 directory was removed.
    CgroupRemoved { header: Header, cgroup_id: u64, level: u32, path: String },
}

impl Event {
    /// The common header.
    pub fn header(&self) -> &Header {
        match self {
            Event::FdOpened { header, .. }
            | Event::FdClosed { header, .. }
            | Event::FdDuped { header, .. }
            | Event::UvmMapped { header, .. }
            | Event::UvmUnmapped { header, .. }
            | Event::ProcessExec { header, .. }
            | Event::ProcessExit { header, .. }
            | Event::ProcessFork { header, .. }
            | Event::CgroupRemoved { header, .. }
            | Event::CudaAlloc { header, .. }
            | Event::CudaFree { header, .. }
            | Event::CudaFunction { header, .. }
            | Event::CudaLaunch { header, .. }
            | Event::CudaTimed { header, .. } => header,
            Event::Ioctl(e) => &e.header,
        }
    }
    /// A short label for the event kind (`fd_opened`, `ioctl`, ...).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Event::FdOpened { .. } => "fd_opened",
            Event::FdClosed { .. } => "fd_closed",
            Event::FdDuped { .. } => "fd_duped",
            Event::Ioctl(_) => "ioctl",
            Event::UvmMapped { .. } => "uvm_mapped",
            Event::UvmUnmapped { .. } => "uvm_unmapped",
            Event::ProcessExec { .. } => "process_exec",
            Event::ProcessExit { .. } => "process_exit",
            Event::ProcessFork { .. } => "process_fork",
            Event::CgroupRemoved { .. } => "cgroup_removed",
            Event::CudaAlloc { .. } => "cuda_alloc",
            Event::CudaFree { .. } => "cuda_free",
            Event::CudaFunction { .. } => "cuda_function",
            Event::CudaLaunch { .. } => "cuda_launch",
            Event::CudaTimed { .. } => "cuda_timed",
        }
    }
}

/// A completed ioctl: the common fields and the decoded operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoctlEvent {
    pub header: Header,
    pub device: Device,
    pub fd: i32,
    /// The command as passed to ioctl(2) (for XFER: the outer command).
    pub cmd: u32,
    /// The syscall's return value (0, or -errno).
    pub ret: i64,
    /// Time from syscall entry to exit.
    pub duration_ns: u64,
    /// The command came through `NV_ESC_IOCTL_XFER_CMD` (the op is the inner one).
    pub xfer: bool,
    pub op: IoctlOp,
}

impl IoctlEvent {
    /// Did the call succeed? Both the syscall (an RM escape returns 0 even when the RM operation
    /// failed) and, where the struct has one, its `status` must say so. A malformed call never counts
    /// as a success: its effect cannot be known.
    pub fn succeeded(&self) -> bool {
        self.ret == 0 && !matches!(self.op, IoctlOp::Malformed { .. }) && self.op.status().is_none_or(|s| s == 0)
    }
}

/// How the RM_ALLOC parameters were passed (chosen by `_IOC_SIZE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum RmAllocForm {
    /// `NVOS21_PARAMETERS` (32 bytes).
    Nvos21,
    /// `NVOS64_PARAMETERS` (48 bytes since 535.43.02, 40 before): with access rights.
    Nvos64,
    /// `NV_ESC_RM_ALLOC_OBJECT` (`NVOS05_PARAMETERS`, 20 bytes): an object without parameters.
    Nvos05,
}

/// Where the driver was asked to place memory (`NVOS32_ATTR_LOCATION`, or fixed by the class).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Location {
    /// Device (video) memory.
    Vidmem,
    /// System memory (PCI aperture, pinned host pages).
    Sysmem,
    /// The driver may choose (`NVOS32_ATTR_LOCATION_ANY`).
    Any,
    /// A reserved/unknown value, or not applicable (VA-only objects).
    Unknown,
}

impl Location {
    /// From the 2-bit `NVOS32_ATTR_LOCATION` field (attr bits 26:25).
    pub(crate) fn from_attr(attr: u32) -> Self {
        match tracer_common::nv::attr_location(attr) {
            tracer_common::nv::ATTR_LOCATION_VIDMEM => Location::Vidmem,
            tracer_common::nv::ATTR_LOCATION_PCI => Location::Sysmem,
            tracer_common::nv::ATTR_LOCATION_ANY => Location::Any,
            _ => Location::Unknown,
        }
    }
    #[cfg(any(test, feature = "encode"))]
    /// The `attr` bits that decode to `self` (for encoding).
    pub(crate) fn to_attr(self) -> u32 {
        let v = match self {
            Location::Vidmem => tracer_common::nv::ATTR_LOCATION_VIDMEM,
            Location::Sysmem => tracer_common::nv::ATTR_LOCATION_PCI,
            Location::Any => tracer_common::nv::ATTR_LOCATION_ANY,
            Location::Unknown => 2,
        };
        v << 25
    }
    /// A short label.
    pub fn as_str(self) -> &'static str {
        match self {
            Location::Vidmem => "vidmem",
            Location::Sysmem => "sysmem",
            Location::Any => "any",
            Location::Unknown => "unknown",
        }
    }
}

/// What kind of memory object an allocation creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum MemoryKind {
    /// Backed memory (video or system).
    Physical,
    /// A GPU virtual-address reservation without backing (0x50a0, 0x70, NVOS32 VIRTUAL flag).
    VirtualOnly,
    /// Existing user pages wrapped and pinned (0x71, `NV01_MEMORY_SYSTEM_OS_DESCRIPTOR`).
    OsDescriptor,
    /// NVLink fabric memory (0xf8), backed by video memory.
    Fabric,
}

/// The memory an allocation asked for (sizes are the driver's OUT values, read at syscall exit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct MemoryAlloc {
    pub bytes: u64,
    pub location: Location,
    pub kind: MemoryKind,
}

/// Why an ioctl argument could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum MalformedReason {
    /// The main window faulted (NULL, unmapped, guard page).
    FaultMain,
    /// The tail window faulted.
    FaultTail,
    /// The nested parameter block faulted.
    FaultNested,
    /// The `NV_ESC_IOCTL_XFER_CMD` envelope faulted.
    FaultXfer,
    /// The main window is too short for the fields (or the status) of this command.
    ShortMain,
    /// The tail window is too short.
    ShortTail,
    /// The nested block is too short for a successful memory allocation's size.
    ShortNested,
    /// `_IOC_SIZE` does not match the command's struct: the driver rejects the call.
    BadSize,
    /// The tail window was read from the wrong offset for this driver version.
    BadTailOffset,
}

impl MalformedReason {
    /// Every reason, in label order.
    pub const ALL: [MalformedReason; 9] = [
        MalformedReason::FaultMain,
        MalformedReason::FaultTail,
        MalformedReason::FaultNested,
        MalformedReason::FaultXfer,
        MalformedReason::ShortMain,
        MalformedReason::ShortTail,
        MalformedReason::ShortNested,
        MalformedReason::BadSize,
        MalformedReason::BadTailOffset,
    ];
    /// A short label for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            MalformedReason::FaultMain => "fault_main",
            MalformedReason::FaultTail => "fault_tail",
            MalformedReason::FaultNested => "fault_nested",
            MalformedReason::FaultXfer => "fault_xfer",
            MalformedReason::ShortMain => "short_main",
            MalformedReason::ShortTail => "short_tail",
            MalformedReason::ShortNested => "short_nested",
            MalformedReason::BadSize => "bad_size",
            MalformedReason::BadTailOffset => "bad_tail_offset",
        }
    }
}

/// One `nv_ioctl_card_info_t` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct CardInfoEntry {
    pub valid: bool,
    pub pci_domain: u32,
    pub pci_bus: u8,
    pub pci_slot: u8,
    pub pci_function: u8,
    pub vendor_id: u16,
    pub device_id: u16,
    pub gpu_id: u32,
    /// `/dev/nvidiaN` minor of this GPU.
    pub minor: u32,
}

/// The decoded operation of an ioctl. Handles are RM handles (`NvHandle`), statuses `NV_STATUS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoctlOp {
    /// `NV_ESC_RM_ALLOC` (or `NV_ESC_RM_ALLOC_OBJECT`): a new RM object `handle` of `class` under
    /// `parent` in `client`. For a client (root class) `client == handle`.
    RmAlloc {
        client: u32,
        parent: u32,
        handle: u32,
        class: u32,
        status: u32,
        form: RmAllocForm,
        /// For memory classes: what was allocated (None when the parameters were not readable on a
        /// failed call, or for classes that are not memory).
        memory: Option<MemoryAlloc>,
        /// For `NV01_DEVICE_0` (0x80): `NV0080_ALLOC_PARAMETERS.deviceId`, the device instance.
        device_instance: Option<u32>,
        /// For `NV20_SUBDEVICE_0` (0x2080): `NV2080_ALLOC_PARAMETERS.subDeviceId`.
        subdevice_instance: Option<u32>,
    },
    /// `NV_ESC_RM_FREE`: frees `handle` and its descendants (the whole client if `handle == client`).
    RmFree { client: u32, parent: u32, handle: u32, status: u32 },
    /// `NV_ESC_RM_VID_HEAP_CONTROL`, function ALLOC_SIZE: memory `handle` under device `parent`.
    VidHeapAlloc {
        client: u32,
        parent: u32,
        handle: u32,
        bytes: u64,
        /// `NVOS32_ALLOC_FLAGS_VIRTUAL`: a VA reservation, no backing memory.
        virtual_only: bool,
        location: Location,
        status: u32,
    },
    /// `NV_ESC_RM_VID_HEAP_CONTROL`, function FREE.
    VidHeapFree { client: u32, parent: u32, handle: u32, status: u32 },
    /// `NV_ESC_RM_VID_HEAP_CONTROL`, any other function (not decoded further).
    VidHeapOther { client: u32, function: u32, status: u32 },
    /// `NV_ESC_RM_ALLOC_MEMORY` (NVOS02, on `/dev/nvidiaN`): memory of `memory.bytes` (= limit+1).
    AllocMemory { client: u32, parent: u32, handle: u32, class: u32, memory: MemoryAlloc, status: u32 },
    /// `NV_ESC_RM_CONTROL`.
    RmControl { client: u32, object: u32, cmd: u32, status: u32 },
    /// `NV_ESC_RM_DUP_OBJECT`: `handle` in `client` becomes a second reference to `src_handle` of
    /// `src_client` (not new memory).
    RmDupObject { client: u32, parent: u32, handle: u32, src_client: u32, src_handle: u32, status: u32 },
    /// `NV_ESC_RM_MAP_MEMORY`: a CPU mapping of `memory`, later `mmap`ed through `fd`.
    RmMapMemory { client: u32, device: u32, memory: u32, offset: u64, length: u64, fd: i32, status: u32 },
    /// `NV_ESC_RM_UNMAP_MEMORY`.
    RmUnmapMemory { client: u32, device: u32, memory: u32, status: u32 },
    /// `NV_ESC_REGISTER_FD`: links this `/dev/nvidiaN` fd to the ctl fd `ctl_fd`.
    RegisterFd { ctl_fd: i32 },
    /// `NV_ESC_CARD_INFO`: the GPUs the driver knows (as many entries as the window held).
    CardInfo { cards: Vec<CardInfoEntry> },
    /// `NV_ESC_CHECK_VERSION_STR`: the client's RM API version string and the driver's reply.
    CheckVersion { reply: u32, version: String },
    /// Any other frontend escape (counted by `nr`).
    OtherFrontend { nr: u32 },
    /// `UVM_INITIALIZE`.
    UvmInitialize { flags: u64, status: u32 },
    /// `UVM_MM_INITIALIZE` (on a second UVM fd, naming the primary one).
    UvmMmInitialize { uvm_fd: i32, status: u32 },
    /// `UVM_REGISTER_GPU`: binds this UVM fd to the GPU `uuid` through RM client `client`.
    UvmRegisterGpu { uuid: [u8; 16], rm_ctrl_fd: i32, client: u32, status: u32 },
    /// `UVM_UNREGISTER_GPU`.
    UvmUnregisterGpu { uuid: [u8; 16], status: u32 },
    /// `UVM_CREATE_EXTERNAL_RANGE`: a GPU VA range for external allocations.
    UvmCreateExternalRange { base: u64, length: u64, status: u32 },
    /// `UVM_MAP_EXTERNAL_ALLOCATION`: maps RM memory `memory_handle` of `client` into `[base, base+length)`.
    UvmMapExternal {
        base: u64,
        length: u64,
        offset: u64,
        rm_ctrl_fd: i32,
        client: u32,
        memory_handle: u32,
        status: u32,
    },
    /// `UVM_UNMAP_EXTERNAL`.
    UvmUnmapExternal { base: u64, length: u64, uuid: [u8; 16], status: u32 },
    /// `UVM_FREE`: destroys the external/semaphore range at `base`.
    UvmFree { base: u64, status: u32 },
    /// `UVM_PAGEABLE_MEM_ACCESS`.
    UvmPageableMemAccess { enabled: bool, status: u32 },
    /// `UVM_VALIDATE_VA_RANGE`.
    UvmValidateVaRange { base: u64, length: u64, status: u32 },
    /// Any other UVM command (counted by `cmd`).
    UvmOther { cmd: u32 },
    /// An ioctl on a device that is neither a frontend node nor `/dev/nvidia-uvm` (modeset, caps,
    /// uvm-tools).
    OtherDevice { nr: u32 },
    /// The argument could not be read or is inconsistent; `nr` is the effective escape / UVM command.
    Malformed { nr: u32, reason: MalformedReason },
}

impl IoctlOp {
    /// The struct's status field, for operations that have one.
    pub fn status(&self) -> Option<u32> {
        use IoctlOp::*;
        match *self {
            RmAlloc { status, .. }
            | RmFree { status, .. }
            | VidHeapAlloc { status, .. }
            | VidHeapFree { status, .. }
            | VidHeapOther { status, .. }
            | AllocMemory { status, .. }
            | RmControl { status, .. }
            | RmDupObject { status, .. }
            | RmMapMemory { status, .. }
            | RmUnmapMemory { status, .. }
            | UvmInitialize { status, .. }
            | UvmMmInitialize { status, .. }
            | UvmRegisterGpu { status, .. }
            | UvmUnregisterGpu { status, .. }
            | UvmCreateExternalRange { status, .. }
            | UvmMapExternal { status, .. }
            | UvmUnmapExternal { status, .. }
            | UvmFree { status, .. }
            | UvmPageableMemAccess { status, .. }
            | UvmValidateVaRange { status, .. } => Some(status),
            RegisterFd { .. }
            | CardInfo { .. }
            | CheckVersion { .. }
            | OtherFrontend { .. }
            | UvmOther { .. }
            | OtherDevice { .. }
            | Malformed { .. } => None,
        }
    }

    /// A short, bounded label for the operation (for `ioctls_total{op}`).
    pub fn kind_name(&self) -> &'static str {
        use IoctlOp::*;
        match self {
            RmAlloc { .. } => "rm_alloc",
            RmFree { .. } => "rm_free",
            VidHeapAlloc { .. } => "vid_heap_alloc",
            VidHeapFree { .. } => "vid_heap_free",
            VidHeapOther { .. } => "vid_heap_other",
            AllocMemory { .. } => "alloc_memory",
            RmControl { .. } => "rm_control",
            RmDupObject { .. } => "rm_dup_object",
            RmMapMemory { .. } => "rm_map_memory",
            RmUnmapMemory { .. } => "rm_unmap_memory",
            RegisterFd { .. } => "register_fd",
            CardInfo { .. } => "card_info",
            CheckVersion { .. } => "check_version",
            OtherFrontend { .. } => "other_frontend",
            UvmInitialize { .. } => "uvm_initialize",
            UvmMmInitialize { .. } => "uvm_mm_initialize",
            UvmRegisterGpu { .. } => "uvm_register_gpu",
            UvmUnregisterGpu { .. } => "uvm_unregister_gpu",
            UvmCreateExternalRange { .. } => "uvm_create_external_range",
            UvmMapExternal { .. } => "uvm_map_external",
            UvmUnmapExternal { .. } => "uvm_unmap_external",
            UvmFree { .. } => "uvm_free",
            UvmPageableMemAccess { .. } => "uvm_pageable_mem_access",
            UvmValidateVaRange { .. } => "uvm_validate_va_range",
            UvmOther { .. } => "uvm_other",
            OtherDevice { .. } => "other_device",
            Malformed { .. } => "malformed",
        }
    }
}

/// Decode one ring-buffer record. Never panics; see the module docs for what is an error and what
/// is a [`IoctlOp::Malformed`] event.
pub fn decode(bytes: &[u8], abi: &DriverAbi) -> Result<Event, DecodeError> {
    let hdr_len = size_of::<EventHeader>();
    let hdr = header_from_bytes(bytes).ok_or(DecodeError::Short { kind: 0, need: hdr_len, got: bytes.len() })?;
    let header = Header::from_wire(&hdr);
    Ok(match hdr.kind {
        kind::FD_OPEN => {
            let r: FdOpenRecord = record(bytes, &hdr)?;
            Event::FdOpened {
                header,
                device: Device::from_wire(&r.dev),
                fd: r.fd,
                open_flags: r.open_flags,
                seeded: hdr.flags & flags::SEEDED != 0,
            }
        }
        kind::FD_CLOSE => {
            let r: FdCloseRecord = record(bytes, &hdr)?;
            Event::FdClosed {
                header,
                device: Device::from_wire(&r.dev),
                fd: r.fd,
                replaced: hdr.flags & flags::DUP_REPLACED != 0,
            }
        }
        kind::FD_DUP => {
            let r: FdDupRecord = record(bytes, &hdr)?;
            Event::FdDuped { header, device: Device::from_wire(&r.dev), old_fd: r.old_fd, new_fd: r.new_fd }
        }
        kind::IOCTL => {
            let r: IoctlRecord = record(bytes, &hdr)?;
            Event::Ioctl(decode_ioctl(header, &r, abi)?)
        }
        kind::UVM_MMAP => {
            let r: UvmMmapRecord = record(bytes, &hdr)?;
            Event::UvmMapped {
                header,
                device: Device::from_wire(&r.dev),
                fd: r.fd,
                addr: r.addr,
                len: r.len,
                offset: r.offset,
                prot: r.prot,
                map_flags: r.map_flags,
                ret: r.ret,
            }
        }
        kind::UVM_MUNMAP => {
            let r: UvmMunmapRecord = record(bytes, &hdr)?;
            Event::UvmUnmapped { header, addr: r.addr, len: r.len, ret: r.ret }
        }
        kind::PROC_EXEC => {
            let r: ProcExecRecord = record(bytes, &hdr)?;
            Event::ProcessExec { header, comm: c_string(&r.comm) }
        }
        kind::PROC_EXIT => {
            let r: ProcExitRecord = record(bytes, &hdr)?;
            Event::ProcessExit { header, comm: c_string(&r.comm) }
        }
        kind::PROC_FORK => {
            let r: ProcForkRecord = record(bytes, &hdr)?;
            Event::ProcessFork { header, child_pid: r.child_pid }
        }
        kind::CGROUP_RMDIR => {
            let r: CgroupRmdirRecord = record(bytes, &hdr)?;
            // The path is informational (the id is what state keys on): a length past the array is
            // clamped rather than costing the event, whose loss would leak a cgroup row.
            let n = (r.path_len as usize).min(CGROUP_PATH_MAX);
            Event::CgroupRemoved { header, cgroup_id: r.id, level: r.level, path: c_string(&r.path[..n]) }
        }
        kind::CUDA_ALLOC => {
            let r: CudaAllocRecord = record(bytes, &hdr)?;
            Event::CudaAlloc {
                header,
                entry: r.entry,
                result: r.result,
                ptr: r.ptr,
                bytes: r.bytes,
                start_ktime_ns: r.start_ktime_ns,
            }
        }
        kind::CUDA_FREE => {
            let r: CudaFreeRecord = record(bytes, &hdr)?;
            Event::CudaFree { header, entry: r.entry, ptr: r.ptr }
        }
        kind::CUDA_FUNCTION => {
            let r: CudaFunctionRecord = record(bytes, &hdr)?;
            let n = (r.name_len as usize).min(CUDA_NAME_MAX);
            Event::CudaFunction {
                header,
                entry: r.entry,
                result: r.result,
                handle: r.handle,
                source: r.source,
                name: c_string(&r.name[..n]),
            }
        }
        kind::CUDA_LAUNCH => {
            let r: CudaLaunchRecord = record(bytes, &hdr)?;
            Event::CudaLaunch {
                header,
                entry: r.entry,
                function: r.function,
                stream: r.stream,
                grid: r.grid,
                block: r.block,
                shared_mem_bytes: r.shared_mem_bytes,
            }
        }
        kind::CUDA_TIMED => {
            let r: CudaTimedRecord = record(bytes, &hdr)?;
            Event::CudaTimed {
                header,
                entry: r.entry,
                result: r.result,
                start_ktime_ns: r.start_ktime_ns,
                args: r.args,
            }
        }
        other => return Err(DecodeError::UnknownKind { kind: other }),
    })
}

/// Read a whole record of type `R`, checking the buffer and the header's declared size.
fn record<R: Record>(bytes: &[u8], hdr: &EventHeader) -> Result<R, DecodeError> {
    let need = size_of::<R>();
    if bytes.len() < need {
        return Err(DecodeError::Short { kind: hdr.kind, need, got: bytes.len() });
    }
    if (hdr.size as usize) < need {
        return Err(DecodeError::BadRecordSize { kind: hdr.kind, declared: hdr.size, expected: need });
    }
    if hdr.size as usize > bytes.len() {
        // The header promises more than we were given: the record was cut.
        return Err(DecodeError::Short { kind: hdr.kind, need: hdr.size as usize, got: bytes.len() });
    }
    record_from_bytes::<R>(bytes).ok_or(DecodeError::Short { kind: hdr.kind, need, got: bytes.len() })
}

fn decode_ioctl(header: Header, r: &IoctlRecord, abi: &DriverAbi) -> Result<IoctlEvent, DecodeError> {
    check_len("main_len", r.main_len, IOCTL_MAIN_MAX)?;
    check_len("tail_len", r.tail_len, IOCTL_TAIL_MAX)?;
    check_len("nested_len", r.nested_len, IOCTL_NESTED_MAX)?;
    let device = Device::from_wire(&r.dev);
    let op = match device.kind {
        DeviceKind::Ctl | DeviceKind::Gpu => ioctl::frontend(r, abi),
        DeviceKind::Uvm => ioctl::uvm(r, abi),
        _ => IoctlOp::OtherDevice { nr: r.nr },
    };
    Ok(IoctlEvent {
        header,
        device,
        fd: r.fd,
        cmd: r.cmd,
        ret: r.ret,
        duration_ns: r.duration_ns,
        xfer: r.hdr.flags & flags::XFER != 0,
        op,
    })
}

fn check_len(field: &'static str, len: u16, max: usize) -> Result<(), DecodeError> {
    if len as usize > max { Err(DecodeError::BadLength { field, len: len as u32, max }) } else { Ok(()) }
}

/// A NUL-terminated (or full) byte array as text. Bytes that are not UTF-8 become `?` one for one,
/// so the text keeps the byte length of the original (and re-encodes to the same length).
fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    let mut s = String::with_capacity(end);
    for chunk in b[..end].utf8_chunks() {
        s.push_str(chunk.valid());
        s.extend(std::iter::repeat_n('?', chunk.invalid().len()));
    }
    s
}
