//! NVIDIA driver ABI facts the tracer relies on (x86_64).
//!
//! Source: `shared/reference/nvidia-abi.md` (open-gpu-kernel-modules headers, cross-checked against
//! gVisor's ABI structs). Offsets are byte offsets into the parameter structs. Layouts that drifted
//! between driver versions are described by [`DriverAbi`], chosen from the driver version at start-up.

/// `NV_IOCTL_MAGIC`: the `_IOC_TYPE` of every frontend (`nvidiactl`, `nvidiaN`) command.
pub const NV_IOCTL_MAGIC: u32 = b'F' as u32;

/// Build a frontend command the way user space does: `_IOWR('F', nr, size)`.
pub const fn iowr(nr: u32, size: u32) -> u32 {
    (3 << 30) | ((size & 0x3fff) << 16) | (NV_IOCTL_MAGIC << 8) | (nr & 0xff)
}
/// `_IOC_NR(cmd)`: the only part of a frontend command the driver dispatches on.
pub const fn ioc_nr(cmd: u32) -> u32 {
    cmd & 0xff
}
/// `_IOC_SIZE(cmd)`: the number of bytes the driver copies in and out.
pub const fn ioc_size(cmd: u32) -> u32 {
    (cmd >> 16) & 0x3fff
}
/// `_IOC_TYPE(cmd)`.
pub const fn ioc_type(cmd: u32) -> u32 {
    (cmd >> 8) & 0xff
}

/// Frontend escape numbers (`_IOC_NR`).
pub mod esc {
    pub const RM_ALLOC_MEMORY: u32 = 0x27;
    pub const RM_ALLOC_OBJECT: u32 = 0x28;
    pub const RM_FREE: u32 = 0x29;
    pub const RM_CONTROL: u32 = 0x2a;
    pub const RM_ALLOC: u32 = 0x2b;
    pub const RM_DUP_OBJECT: u32 = 0x34;
    pub const RM_SHARE: u32 = 0x35;
    pub const RM_VID_HEAP_CONTROL: u32 = 0x4a;
    pub const RM_MAP_MEMORY: u32 = 0x4e;
    pub const RM_UNMAP_MEMORY: u32 = 0x4f;
    pub const RM_MAP_MEMORY_DMA: u32 = 0x57;
    pub const RM_UNMAP_MEMORY_DMA: u32 = 0x58;
    pub const CARD_INFO: u32 = 200;
    pub const REGISTER_FD: u32 = 201;
    pub const ALLOC_OS_EVENT: u32 = 206;
    pub const FREE_OS_EVENT: u32 = 207;
    pub const STATUS_CODE: u32 = 209;
    pub const CHECK_VERSION_STR: u32 = 210;
    /// `NV_ESC_IOCTL_XFER_CMD`: the real nr, size and pointer are in an `nv_ioctl_xfer_t`.
    pub const IOCTL_XFER_CMD: u32 = 211;
    pub const ATTACH_GPUS_TO_FD: u32 = 212;
    pub const SYS_PARAMS: u32 = 214;
    pub const NUMA_INFO: u32 = 215;
    pub const WAIT_OPEN_COMPLETE: u32 = 218;
    pub const RM_I2C_ACCESS: u32 = 0x39;
    pub const RM_IDLE_CHANNELS: u32 = 0x41;
    pub const RM_ACCESS_REGISTRY: u32 = 0x4d;
    pub const RM_ALLOC_CONTEXT_DMA2: u32 = 0x54;
    pub const RM_BIND_CONTEXT_DMA: u32 = 0x59;
    pub const RM_UPDATE_DEVICE_MAPPING_INFO: u32 = 0x5e;
    pub const QUERY_DEVICE_INTR: u32 = 213;
    pub const SET_NUMA_STATUS: u32 = 216;
    pub const EXPORT_TO_DMABUF_FD: u32 = 217;
}

/// Parameter struct sizes (the `_IOC_SIZE` user space encodes).
pub mod size {
    pub const NVOS00: u32 = 16; // RM_FREE
    pub const NVOS02_WITH_FD: u32 = 56; // RM_ALLOC_MEMORY
    pub const NVOS21: u32 = 32; // RM_ALLOC, short form
    pub const NVOS64: u32 = 48; // RM_ALLOC, access-rights form (535.43.02+)
    pub const NVOS64_PRE535: u32 = 40; // RM_ALLOC, access-rights form (<= 530.x)
    pub const NVOS54: u32 = 32; // RM_CONTROL
    pub const NVOS55: u32 = 28; // RM_DUP_OBJECT
    pub const NVOS32: u32 = 184; // RM_VID_HEAP_CONTROL
    pub const NVOS33_WITH_FD: u32 = 56; // RM_MAP_MEMORY
    pub const NVOS34: u32 = 32; // RM_UNMAP_MEMORY
    pub const XFER: u32 = 16; // nv_ioctl_xfer_t
    pub const REGISTER_FD: u32 = 4;
    pub const CARD_INFO_ENTRY: u32 = 72;
    /// NV_MEMORY_ALLOCATION_PARAMS since 545.23.06 (numaNode added); 120 before.
    pub const NV_MEMORY_ALLOCATION_PARAMS: u32 = 128;
    pub const NV_MEMORY_ALLOCATION_PARAMS_PRE545: u32 = 120;
    pub const NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS: u32 = 24;
    pub const NV_PHYSICAL_MEMORY_ALLOCATION_PARAMS: u32 = 24;
    pub const NV_OS_DESC_MEMORY_ALLOCATION_PARAMS: u32 = 40;
    pub const NV00F8_ALLOCATION_PARAMETERS: u32 = 48;
    pub const NV0080_ALLOC_PARAMETERS: u32 = 56;
    pub const NV2080_ALLOC_PARAMETERS: u32 = 4;
    pub const NVOS05: u32 = 20; // RM_ALLOC_OBJECT
    pub const NVOS57: u32 = 24; // RM_SHARE
    pub const NVOS30: u32 = 56; // RM_IDLE_CHANNELS
    pub const NVOS39: u32 = 56; // RM_ALLOC_CONTEXT_DMA2
    pub const NVOS46: u32 = 64; // RM_MAP_MEMORY_DMA (580.65.06+)
    pub const NVOS46_PRE580: u32 = 56;
    pub const NVOS47: u32 = 48; // RM_UNMAP_MEMORY_DMA (550.54.04+)
    pub const NVOS47_PRE550: u32 = 40;
    pub const NVOS56: u32 = 40; // RM_UPDATE_DEVICE_MAPPING_INFO
    pub const OS_EVENT: u32 = 16; // nv_ioctl_alloc_os_event_t / nv_ioctl_free_os_event_t
    pub const STATUS_CODE: u32 = 12; // nv_ioctl_status_code_t
    pub const RM_API_VERSION: u32 = 72; // nv_ioctl_rm_api_version_t (CHECK_VERSION_STR)
    pub const SYS_PARAMS: u32 = 8;
    pub const WAIT_OPEN_COMPLETE: u32 = 8;
    pub const QUERY_DEVICE_INTR: u32 = 8;
    pub const NUMA_INFO: u32 = 560;
    pub const SET_NUMA_STATUS: u32 = 4;
    /// ATTACH_GPUS_TO_FD takes an array of u32 GPU ids.
    pub const ATTACH_GPUS_ENTRY: u32 = 4;
    /// NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS.
    pub const NV0000_CTRL_GPU_GET_ID_INFO_V2: u32 = 32;
    /// NV2080_CTRL_GPU_GET_GID_INFO_PARAMS.
    pub const NV2080_CTRL_GPU_GET_GID_INFO: u32 = 268;
}

/// Field offsets inside the frontend parameter structs.
pub mod off {
    // NVOS21 / NVOS64 (RM_ALLOC)
    pub const ALLOC_H_ROOT: usize = 0;
    pub const ALLOC_H_PARENT: usize = 4;
    pub const ALLOC_H_NEW: usize = 8;
    pub const ALLOC_H_CLASS: usize = 12;
    pub const ALLOC_P_PARAMS: usize = 16;
    pub const NVOS21_PARAMS_SIZE: usize = 24;
    pub const NVOS21_STATUS: usize = 28;
    pub const NVOS64_P_RIGHTS: usize = 24;
    pub const NVOS64_PARAMS_SIZE: usize = 32;
    pub const NVOS64_FLAGS: usize = 36;
    pub const NVOS64_STATUS: usize = 40;
    pub const NVOS64_PRE535_FLAGS: usize = 32;
    pub const NVOS64_PRE535_STATUS: usize = 36;
    // NVOS00 (RM_FREE)
    pub const FREE_H_ROOT: usize = 0;
    pub const FREE_H_PARENT: usize = 4;
    pub const FREE_H_OBJECT: usize = 8;
    pub const FREE_STATUS: usize = 12;
    // NVOS02 (RM_ALLOC_MEMORY)
    pub const NVOS02_H_ROOT: usize = 0;
    pub const NVOS02_H_PARENT: usize = 4;
    pub const NVOS02_H_NEW: usize = 8;
    pub const NVOS02_H_CLASS: usize = 12;
    pub const NVOS02_FLAGS: usize = 16;
    pub const NVOS02_P_MEMORY: usize = 24;
    pub const NVOS02_LIMIT: usize = 32;
    pub const NVOS02_STATUS: usize = 40;
    pub const NVOS02_FD: usize = 48;
    // NVOS54 (RM_CONTROL)
    pub const CTRL_H_CLIENT: usize = 0;
    pub const CTRL_H_OBJECT: usize = 4;
    pub const CTRL_CMD: usize = 8;
    pub const CTRL_FLAGS: usize = 12;
    pub const CTRL_PARAMS: usize = 16;
    pub const CTRL_PARAMS_SIZE: usize = 24;
    pub const CTRL_STATUS: usize = 28;
    // NVOS55 (RM_DUP_OBJECT)
    pub const DUP_H_CLIENT: usize = 0;
    pub const DUP_H_PARENT: usize = 4;
    pub const DUP_H_OBJECT: usize = 8;
    pub const DUP_H_CLIENT_SRC: usize = 12;
    pub const DUP_H_OBJECT_SRC: usize = 16;
    pub const DUP_FLAGS: usize = 20;
    pub const DUP_STATUS: usize = 24;
    // NVOS32 (RM_VID_HEAP_CONTROL)
    pub const VHC_H_ROOT: usize = 0;
    pub const VHC_H_PARENT: usize = 4;
    pub const VHC_FUNCTION: usize = 8;
    pub const VHC_H_VASPACE: usize = 12;
    pub const VHC_STATUS: usize = 20;
    pub const VHC_TOTAL: usize = 24;
    pub const VHC_FREE: usize = 32;
    pub const VHC_OWNER: usize = 40;
    pub const VHC_H_MEMORY: usize = 44;
    pub const VHC_TYPE: usize = 48;
    pub const VHC_ALLOC_FLAGS: usize = 52;
    pub const VHC_ALLOC_ATTR: usize = 56;
    pub const VHC_ALLOC_SIZE: usize = 88;
    pub const VHC_ALLOC_ADDRESS: usize = 120;
    // NVOS33 (RM_MAP_MEMORY)
    pub const MAP_H_CLIENT: usize = 0;
    pub const MAP_H_DEVICE: usize = 4;
    pub const MAP_H_MEMORY: usize = 8;
    pub const MAP_OFFSET: usize = 16;
    pub const MAP_LENGTH: usize = 24;
    pub const MAP_P_LINEAR: usize = 32;
    pub const MAP_STATUS: usize = 40;
    pub const MAP_FLAGS: usize = 44;
    pub const MAP_FD: usize = 48;
    // nv_ioctl_xfer_t
    pub const XFER_CMD: usize = 0;
    pub const XFER_SIZE: usize = 4;
    pub const XFER_PTR: usize = 8;
    // NV_MEMORY_ALLOCATION_PARAMS (classes 0x40, 0x3e, 0x90ce, 0x50a0)
    pub const MEM_PARAMS_OWNER: usize = 0;
    pub const MEM_PARAMS_TYPE: usize = 4;
    pub const MEM_PARAMS_FLAGS: usize = 8;
    pub const MEM_PARAMS_ATTR: usize = 24;
    pub const MEM_PARAMS_ATTR2: usize = 28;
    pub const MEM_PARAMS_SIZE: usize = 64;
    pub const MEM_PARAMS_ALIGNMENT: usize = 72;
    pub const MEM_PARAMS_OFFSET: usize = 80;
    pub const MEM_PARAMS_LIMIT: usize = 88;
    pub const MEM_PARAMS_ADDRESS: usize = 96;
    // NV_PHYSICAL_MEMORY_ALLOCATION_PARAMS (0xc2)
    pub const PHYS_MEM_SIZE: usize = 0;
    // NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS (0x70)
    pub const VIRT_OFFSET: usize = 0;
    pub const VIRT_LIMIT: usize = 8;
    // NV_OS_DESC_MEMORY_ALLOCATION_PARAMS (0x71)
    pub const OSDESC_ATTR: usize = 8;
    pub const OSDESC_DESCRIPTOR: usize = 16;
    pub const OSDESC_LIMIT: usize = 24;
    // NV00F8_ALLOCATION_PARAMETERS (0xf8)
    pub const FABRIC_ALLOC_SIZE: usize = 8;
    // NV0080_ALLOC_PARAMETERS (0x80)
    pub const DEVICE_ID: usize = 0;
    // NV2080_ALLOC_PARAMETERS (0x2080)
    pub const SUBDEVICE_ID: usize = 0;
    // NVOS34 (RM_UNMAP_MEMORY)
    pub const UNMAP_H_CLIENT: usize = 0;
    pub const UNMAP_H_DEVICE: usize = 4;
    pub const UNMAP_H_MEMORY: usize = 8;
    pub const UNMAP_P_LINEAR: usize = 16;
    pub const UNMAP_STATUS: usize = 24;
    // NVOS32 data.AllocSize / data.Free (VID_HEAP_CONTROL)
    pub const VHC_ALLOC_OFFSET: usize = 104;
    pub const VHC_ALLOC_LIMIT: usize = 112;
    // Status fields of the other frontend structs.
    pub const NVOS05_STATUS: usize = 16;
    pub const NVOS57_STATUS: usize = 20;
    pub const NVOS39_STATUS: usize = 48;
    pub const NVOS46_STATUS: usize = 56; // 580.65.06+
    pub const NVOS46_PRE580_STATUS: usize = 48;
    pub const NVOS47_STATUS: usize = 40; // 550.54.04+
    pub const NVOS47_PRE550_STATUS: usize = 32;
    pub const NVOS56_STATUS: usize = 32;
    // nv_ioctl_alloc_os_event_t / nv_ioctl_free_os_event_t
    pub const OS_EVENT_H_CLIENT: usize = 0;
    pub const OS_EVENT_H_DEVICE: usize = 4;
    pub const OS_EVENT_FD: usize = 8;
    pub const OS_EVENT_STATUS: usize = 12;
    // nv_ioctl_status_code_t
    pub const STATUS_CODE_STATUS: usize = 8;
    // nv_ioctl_rm_api_version_t (CHECK_VERSION_STR)
    pub const RM_API_VERSION_CMD: usize = 0;
    pub const RM_API_VERSION_REPLY: usize = 4;
    pub const RM_API_VERSION_STRING: usize = 8;
    // nv_ioctl_register_fd_t
    pub const REGISTER_FD_CTL_FD: usize = 0;
    // nv_ioctl_card_info_t (72 bytes per GPU)
    pub const CARD_INFO_VALID: usize = 0;
    pub const CARD_INFO_PCI_DOMAIN: usize = 4;
    pub const CARD_INFO_PCI_BUS: usize = 8;
    pub const CARD_INFO_PCI_SLOT: usize = 9;
    pub const CARD_INFO_PCI_FUNCTION: usize = 10;
    pub const CARD_INFO_PCI_VENDOR_ID: usize = 12;
    pub const CARD_INFO_PCI_DEVICE_ID: usize = 14;
    pub const CARD_INFO_GPU_ID: usize = 16;
    pub const CARD_INFO_INTERRUPT_LINE: usize = 20;
    pub const CARD_INFO_REG_ADDRESS: usize = 24;
    pub const CARD_INFO_REG_SIZE: usize = 32;
    pub const CARD_INFO_FB_ADDRESS: usize = 40;
    pub const CARD_INFO_FB_SIZE: usize = 48;
    pub const CARD_INFO_MINOR_NUMBER: usize = 56;
    pub const CARD_INFO_DEV_NAME: usize = 60;
    // nv_ioctl_wait_open_complete_t
    pub const WAIT_OPEN_COMPLETE_RC: usize = 0;
    pub const WAIT_OPEN_COMPLETE_ADAPTER_STATUS: usize = 4;
    // NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS
    pub const GET_ID_INFO_V2_GPU_ID: usize = 0;
    pub const GET_ID_INFO_V2_DEVICE_INSTANCE: usize = 8;
    // NV2080_CTRL_GPU_GET_GID_INFO_PARAMS
    pub const GET_GID_INFO_INDEX: usize = 0;
    pub const GET_GID_INFO_FLAGS: usize = 4;
    pub const GET_GID_INFO_LENGTH: usize = 8;
    pub const GET_GID_INFO_DATA: usize = 12;
}

/// RM class ids (`hClass`).
pub mod class {
    pub const NV01_ROOT: u32 = 0x0;
    pub const NV01_ROOT_NON_PRIV: u32 = 0x1;
    pub const NV01_ROOT_CLIENT: u32 = 0x41;
    pub const NV01_DEVICE_0: u32 = 0x80;
    pub const NV20_SUBDEVICE_0: u32 = 0x2080;
    pub const NV01_MEMORY_SYSTEM: u32 = 0x3e;
    pub const NV01_MEMORY_LOCAL_USER: u32 = 0x40;
    pub const NV01_MEMORY_VIRTUAL: u32 = 0x70;
    pub const NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: u32 = 0x71;
    pub const NV01_MEMORY_LOCAL_PHYSICAL: u32 = 0xc2;
    pub const NV_MEMORY_FABRIC: u32 = 0xf8;
    pub const NV50_MEMORY_VIRTUAL: u32 = 0x50a0;
    pub const NV01_MEMORY_DEVICELESS: u32 = 0x90ce;
    pub const FERMI_VASPACE_A: u32 = 0x90f1;
    pub const KEPLER_CHANNEL_GROUP_A: u32 = 0xa06c;
    pub const HOPPER_CHANNEL_GPFIFO_A: u32 = 0xc86f;
    pub const HOPPER_COMPUTE_A: u32 = 0xcbc0;
    pub const HOPPER_USERMODE_A: u32 = 0xc661;

    /// Is `c` one of the RM client (root) classes?
    pub const fn is_root(c: u32) -> bool {
        matches!(c, NV01_ROOT | NV01_ROOT_NON_PRIV | NV01_ROOT_CLIENT)
    }
    pub const NV01_EVENT: u32 = 0x5;
    pub const NV01_EVENT_KERNEL_CALLBACK: u32 = 0x78;
    pub const NV01_EVENT_OS_EVENT: u32 = 0x79;
    pub const NV01_EVENT_KERNEL_CALLBACK_EX: u32 = 0x7e;

    /// Is `c` an event class (the only RM_ALLOC classes allowed on a `/dev/nvidiaN` fd)?
    pub const fn is_event(c: u32) -> bool {
        matches!(c, NV01_EVENT | NV01_EVENT_KERNEL_CALLBACK | NV01_EVENT_OS_EVENT | NV01_EVENT_KERNEL_CALLBACK_EX)
    }
}

/// `NVOS32_ATTR_LOCATION`: bits 26:25 of `attr`.
pub const fn attr_location(attr: u32) -> u32 {
    (attr >> 25) & 0x3
}
pub const ATTR_LOCATION_VIDMEM: u32 = 0;
pub const ATTR_LOCATION_PCI: u32 = 1;
pub const ATTR_LOCATION_ANY: u32 = 3;
/// `NVOS32_ALLOC_FLAGS_VIRTUAL`: VA only, no backing memory.
pub const NVOS32_ALLOC_FLAGS_VIRTUAL: u32 = 0x0008_0000;
/// NVOS32 `function` values.
pub const NVOS32_FUNCTION_ALLOC_SIZE: u32 = 2;
pub const NVOS32_FUNCTION_FREE: u32 = 3;
/// NVOS02 flags: LOCATION bits 11:8 (PCI=0, VIDMEM=2).
pub const fn nvos02_location(flags: u32) -> u32 {
    (flags >> 8) & 0xf
}
pub const NVOS02_LOCATION_VIDMEM: u32 = 2;

/// `NV_OK`.
pub const NV_OK: u32 = 0;
/// `NV_ERR_INVALID_ARGUMENT` (a status a fake driver can answer with).
pub const NV_ERR_INVALID_ARGUMENT: u32 = 0x1f;
/// `NV_ERR_NO_MEMORY`.
pub const NV_ERR_NO_MEMORY: u32 = 0x51;

/// UVM commands (`/dev/nvidia-uvm`): plain integers, not `_IOC`-encoded.
pub mod uvm {
    pub const INITIALIZE: u32 = 0x3000_0001;
    pub const DEINITIALIZE: u32 = 0x3000_0002;
    pub const CREATE_RANGE_GROUP: u32 = 23;
    pub const REGISTER_GPU_VASPACE: u32 = 25;
    pub const REGISTER_CHANNEL: u32 = 27;
    pub const MAP_EXTERNAL_ALLOCATION: u32 = 33;
    pub const FREE: u32 = 34;
    pub const REGISTER_GPU: u32 = 37;
    pub const UNREGISTER_GPU: u32 = 38;
    pub const PAGEABLE_MEM_ACCESS: u32 = 39;
    pub const UNMAP_EXTERNAL: u32 = 66;
    pub const ALLOC_SEMAPHORE_POOL: u32 = 68;
    pub const VALIDATE_VA_RANGE: u32 = 72;
    pub const CREATE_EXTERNAL_RANGE: u32 = 73;
    pub const MM_INITIALIZE: u32 = 75;

    pub const INITIALIZE_SIZE: u32 = 16;
    pub const INITIALIZE_STATUS: usize = 8;
    /// UVM_REGISTER_GPU_PARAMS (40): gpu_uuid[16]@0, rmCtrlFd@24, hClient@28, rmStatus@36.
    pub const REGISTER_GPU_SIZE: u32 = 40;
    pub const REGISTER_GPU_UUID: usize = 0;
    pub const REGISTER_GPU_RM_CTRL_FD: usize = 24;
    pub const REGISTER_GPU_H_CLIENT: usize = 28;
    pub const REGISTER_GPU_STATUS: usize = 36;
    /// UVM_UNREGISTER_GPU_PARAMS (20): gpu_uuid[16]@0, rmStatus@16.
    pub const UNREGISTER_GPU_SIZE: u32 = 20;
    pub const UNREGISTER_GPU_STATUS: usize = 16;
    /// UVM_CREATE_EXTERNAL_RANGE_PARAMS (24): base@0, length@8, rmStatus@16.
    pub const CREATE_EXTERNAL_RANGE_SIZE: u32 = 24;
    /// UVM_MAP_EXTERNAL_ALLOCATION_PARAMS: base@0, length@8, offset@16; the tail (rmCtrlFd, hClient,
    /// hMemory, rmStatus) sits at a version-dependent offset, see [`super::DriverAbi`].
    pub const MAP_EXTERNAL_HEAD: u32 = 24;
    pub const MAP_EXTERNAL_SIZE_550: u32 = 9264;
    pub const MAP_EXTERNAL_TAIL_550: u32 = 9248;
    pub const MAP_EXTERNAL_SIZE_PRE550: u32 = 1200;
    pub const MAP_EXTERNAL_TAIL_PRE550: u32 = 1184;
    /// Tail layout: rmCtrlFd@0, hClient@4, hMemory@8, rmStatus@12 (relative to the tail offset).
    pub const MAP_EXTERNAL_TAIL_LEN: u32 = 16;
    /// UVM_FREE_PARAMS: base@0, rmStatus@8 (590+, 16 bytes) or base@0, length@8, rmStatus@16 (24 bytes).
    pub const FREE_SIZE_590: u32 = 16;
    pub const FREE_SIZE_PRE590: u32 = 24;
    /// UVM_UNMAP_EXTERNAL_PARAMS (40): base@0, length@8, gpuUuid@16, rmStatus@32.
    pub const UNMAP_EXTERNAL_SIZE: u32 = 40;
    pub const PAGEABLE_MEM_ACCESS_SIZE: u32 = 8;
    pub const VALIDATE_VA_RANGE_SIZE: u32 = 24;
    pub const MM_INITIALIZE_SIZE: u32 = 8;
    /// UVM_MAP_EXTERNAL_ALLOCATION_PARAMS: perGpuAttributes[] start at 24, 36 bytes each
    /// (gpuUuid[16]@+0, gpuMappingType@+16, gpuCachingType@+20, gpuFormatType@+24, gpuElementBits@+28,
    /// gpuCompressionType@+32); gpuAttributesCount (u64) sits 8 bytes before the tail.
    pub const MAP_EXTERNAL_PER_GPU: usize = 24;
    pub const MAP_EXTERNAL_PER_GPU_LEN: usize = 36;
    pub const MAP_EXTERNAL_COUNT_BEFORE_TAIL: usize = 8;
    /// UVM_CREATE_EXTERNAL_RANGE_PARAMS status.
    pub const CREATE_EXTERNAL_RANGE_STATUS: usize = 16;
}

/// A driver version, `major.minor.patch` (e.g. 535.261.03).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DriverVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl DriverVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self { major, minor, patch }
    }
    /// `self >= other` (usable in const context).
    pub const fn at_least(self, other: DriverVersion) -> bool {
        self.major > other.major
            || (self.major == other.major
                && (self.minor > other.minor || (self.minor == other.minor && self.patch >= other.patch)))
    }
}

/// The struct layouts that drift across driver versions, resolved for one version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverAbi {
    pub version: DriverVersion,
    /// `_IOC_SIZE` of the NVOS64 RM_ALLOC form (48 since 535.43.02, 40 before).
    pub nvos64_size: u32,
    /// Offset of `status` in the NVOS64 form.
    pub nvos64_status: usize,
    /// Size of NV_MEMORY_ALLOCATION_PARAMS (128 since 545.23.06, 120 before).
    pub mem_alloc_params_size: u32,
    /// UVM_MAP_EXTERNAL_ALLOCATION_PARAMS size and the offset of its (rmCtrlFd, hClient, hMemory, status) tail.
    pub uvm_map_external_size: u32,
    pub uvm_map_external_tail: u32,
    /// UVM_FREE_PARAMS size and the offset of its status.
    pub uvm_free_size: u32,
    pub uvm_free_status: usize,
}

impl DriverAbi {
    /// The layouts used by driver `v`.
    pub const fn for_version(v: DriverVersion) -> Self {
        let v535 = v.at_least(DriverVersion::new(535, 43, 2));
        let v545 = v.at_least(DriverVersion::new(545, 23, 6));
        let v550 = v.at_least(DriverVersion::new(550, 0, 0));
        let v590 = v.at_least(DriverVersion::new(590, 44, 1));
        DriverAbi {
            version: v,
            nvos64_size: if v535 { size::NVOS64 } else { size::NVOS64_PRE535 },
            nvos64_status: if v535 { off::NVOS64_STATUS } else { off::NVOS64_PRE535_STATUS },
            mem_alloc_params_size: if v545 {
                size::NV_MEMORY_ALLOCATION_PARAMS
            } else {
                size::NV_MEMORY_ALLOCATION_PARAMS_PRE545
            },
            uvm_map_external_size: if v550 { uvm::MAP_EXTERNAL_SIZE_550 } else { uvm::MAP_EXTERNAL_SIZE_PRE550 },
            uvm_map_external_tail: if v550 { uvm::MAP_EXTERNAL_TAIL_550 } else { uvm::MAP_EXTERNAL_TAIL_PRE550 },
            uvm_free_size: if v590 { uvm::FREE_SIZE_590 } else { uvm::FREE_SIZE_PRE590 },
            uvm_free_status: if v590 { 8 } else { 16 },
        }
    }
}

/// The driver version assumed when none can be read (the Debian bookworm user-space libraries'
/// version, which is also what the fake driver reports).
pub const DEFAULT_DRIVER_VERSION: DriverVersion = DriverVersion::new(535, 261, 3);

/// `NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED`: `hMemory` is an input (else RM picks the handle).
pub const NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED: u32 = 0x4000;
/// `NVOS32_ATTR_LOCATION` field position (bits 26:25 of `attr`).
pub const ATTR_LOCATION_SHIFT: u32 = 25;
/// NVOS02 `flags` LOCATION field position (bits 11:8) and its PCI (system memory) value.
pub const NVOS02_LOCATION_SHIFT: u32 = 8;
pub const NVOS02_LOCATION_PCI: u32 = 0;

/// `nv_ioctl_rm_api_version_t.cmd` / `.reply` values (CHECK_VERSION_STR).
pub const NV_RM_API_VERSION_CMD_STRICT: u32 = 0;
pub const NV_RM_API_VERSION_CMD_RELAXED: u32 = b'1' as u32;
pub const NV_RM_API_VERSION_CMD_QUERY: u32 = b'2' as u32;
pub const NV_RM_API_VERSION_REPLY_UNRECOGNIZED: u32 = 0;
pub const NV_RM_API_VERSION_REPLY_RECOGNIZED: u32 = 1;
pub const NV_RM_API_VERSION_STRING_LENGTH: usize = 64;

/// More `NV_STATUS` values (OGKM `src/common/sdk/nvidia/inc/nvstatuscodes.h`).
pub const NV_ERR_GENERIC: u32 = 0xffff;
pub const NV_ERR_INSERT_DUPLICATE_NAME: u32 = 0x19;
pub const NV_ERR_INVALID_ADDRESS: u32 = 0x1e;
pub const NV_ERR_INVALID_CLASS: u32 = 0x22;
pub const NV_ERR_INVALID_CLIENT: u32 = 0x23;
pub const NV_ERR_INVALID_FUNCTION: u32 = 0x2a;
pub const NV_ERR_INVALID_LIMIT: u32 = 0x2e;
pub const NV_ERR_INVALID_OBJECT_HANDLE: u32 = 0x33;
pub const NV_ERR_INVALID_OBJECT_NEW: u32 = 0x34;
pub const NV_ERR_INVALID_OBJECT_PARENT: u32 = 0x36;
pub const NV_ERR_INVALID_POINTER: u32 = 0x3d;
pub const NV_ERR_NOT_SUPPORTED: u32 = 0x56;
pub const NV_ERR_OBJECT_NOT_FOUND: u32 = 0x57;

/// RM control commands (`NVOS54.cmd`) a CUDA-like client issues at start-up.
pub mod ctrl {
    pub const NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS: u32 = 0x201;
    pub const NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2: u32 = 0x205;
    pub const NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2: u32 = 0x0080_0292;
    pub const NV2080_CTRL_CMD_GPU_GET_GID_INFO: u32 = 0x2080_014a;
    pub const NV2080_CTRL_CMD_FB_GET_INFO_V2: u32 = 0x2080_1303;
    /// NV2080_CTRL_GPU_GET_GID_INFO flags: FORMAT_BINARY (16-byte UUID).
    pub const GID_INFO_FLAGS_FORMAT_BINARY: u32 = 2;
}

// ---- UVM layout facts used by the user-space decoder (nvidia-abi.md §4.2). ----

/// `UVM_MM_INITIALIZE_PARAMS` (8): uvmFd(i32)@0, rmStatus@4.
pub const UVM_MM_INITIALIZE_FD: usize = 0;
pub const UVM_MM_INITIALIZE_STATUS: usize = 4;
/// `UVM_VALIDATE_VA_RANGE_PARAMS` (24): base@0, length@8, rmStatus@16.
pub const UVM_VALIDATE_VA_RANGE_STATUS: usize = 16;
/// `UVM_UNMAP_EXTERNAL_PARAMS` (40): base@0, length@8, gpuUuid@16, rmStatus@32.
pub const UVM_UNMAP_EXTERNAL_UUID: usize = 16;
pub const UVM_UNMAP_EXTERNAL_STATUS: usize = 32;
/// `UVM_PAGEABLE_MEM_ACCESS_PARAMS` (8): pageableMemAccess(u8)@0, rmStatus@4.
pub const UVM_PAGEABLE_MEM_ACCESS_STATUS: usize = 4;
/// Fields of the UVM_MAP_EXTERNAL_ALLOCATION tail, relative to `DriverAbi::uvm_map_external_tail`.
pub const UVM_MAP_EXTERNAL_TAIL_RM_CTRL_FD: usize = 0;
pub const UVM_MAP_EXTERNAL_TAIL_H_CLIENT: usize = 4;
pub const UVM_MAP_EXTERNAL_TAIL_H_MEMORY: usize = 8;
pub const UVM_MAP_EXTERNAL_TAIL_STATUS: usize = 12;
