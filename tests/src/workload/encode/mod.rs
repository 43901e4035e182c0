//! Builders for the parameter structs a CUDA-like client passes to the driver, as byte buffers at
//! the offsets in `tracer_common::nv` (pure functions; unit-tested below).

use tracer_common::nv::{self, DriverAbi, class, off, size, uvm};

use crate::le::{put_cstr, put_i32, put_u32, put_u64};

/// Where an allocation should live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemLocation {
    /// Video memory (`NVOS32_ATTR_LOCATION_VIDMEM`, class `NV01_MEMORY_LOCAL_USER`).
    Vidmem,
    /// System memory (`NVOS32_ATTR_LOCATION_PCI`, class `NV01_MEMORY_SYSTEM`).
    Sysmem,
}

impl MemLocation {
    /// The RM_ALLOC class for this location.
    pub fn class(self) -> u32 {
        match self {
            MemLocation::Vidmem => class::NV01_MEMORY_LOCAL_USER,
            MemLocation::Sysmem => class::NV01_MEMORY_SYSTEM,
        }
    }

    /// The `attr` word with this location in bits 26:25.
    pub fn attr(self) -> u32 {
        let loc = match self {
            MemLocation::Vidmem => nv::ATTR_LOCATION_VIDMEM,
            MemLocation::Sysmem => nv::ATTR_LOCATION_PCI,
        };
        loc << nv::ATTR_LOCATION_SHIFT
    }
}

/// The common RM_ALLOC header fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RmAllocArgs {
    pub h_root: u32,
    pub h_parent: u32,
    pub h_new: u32,
    pub h_class: u32,
    pub p_alloc_params: u64,
    pub params_size: u32,
}

/// `NVOS64_PARAMETERS` in the layout of `abi` (48 bytes since 535.43.02, 40 before).
pub fn nvos64(a: &RmAllocArgs, abi: &DriverAbi) -> Vec<u8> {
    let mut b = vec![0u8; abi.nvos64_size as usize];
    put_alloc_header(&mut b, a);
    put_u64(&mut b, off::NVOS64_P_RIGHTS, 0);
    if abi.nvos64_size == size::NVOS64 {
        put_u32(&mut b, off::NVOS64_PARAMS_SIZE, a.params_size);
        put_u32(&mut b, off::NVOS64_FLAGS, 0);
    } else {
        put_u32(&mut b, off::NVOS64_PRE535_FLAGS, 0);
    }
    b
}

/// `NVOS21_PARAMETERS` (32 bytes).
pub fn nvos21(a: &RmAllocArgs) -> [u8; size::NVOS21 as usize] {
    let mut b = [0u8; size::NVOS21 as usize];
    put_alloc_header(&mut b, a);
    put_u32(&mut b, off::NVOS21_PARAMS_SIZE, a.params_size);
    b
}

fn put_alloc_header(b: &mut [u8], a: &RmAllocArgs) {
    put_u32(b, off::ALLOC_H_ROOT, a.h_root);
    put_u32(b, off::ALLOC_H_PARENT, a.h_parent);
    put_u32(b, off::ALLOC_H_NEW, a.h_new);
    put_u32(b, off::ALLOC_H_CLASS, a.h_class);
    put_u64(b, off::ALLOC_P_PARAMS, a.p_alloc_params);
}

/// `NV_MEMORY_ALLOCATION_PARAMS` for `bytes` at `location`. The buffer is always 128 bytes (the
/// 545+ size); `abi.mem_alloc_params_size` says how many of them the driver reads.
pub fn memory_allocation_params(bytes: u64, location: MemLocation, owner: u32) -> [u8; 128] {
    let mut b = [0u8; 128];
    put_u32(&mut b, off::MEM_PARAMS_OWNER, owner);
    put_u32(&mut b, off::MEM_PARAMS_TYPE, 0); // NVOS32_TYPE_IMAGE
    put_u32(&mut b, off::MEM_PARAMS_FLAGS, 0);
    put_u32(&mut b, off::MEM_PARAMS_ATTR, location.attr());
    put_u32(&mut b, off::MEM_PARAMS_ATTR2, 0);
    put_u64(&mut b, off::MEM_PARAMS_SIZE, bytes);
    b
}

/// `NV0080_ALLOC_PARAMETERS` for device instance `device_id`.
pub fn nv0080_alloc_params(device_id: u32) -> [u8; size::NV0080_ALLOC_PARAMETERS as usize] {
    let mut b = [0u8; size::NV0080_ALLOC_PARAMETERS as usize];
    put_u32(&mut b, off::DEVICE_ID, device_id);
    b
}

/// `NV2080_ALLOC_PARAMETERS` for subdevice `sub_device_id`.
pub fn nv2080_alloc_params(sub_device_id: u32) -> [u8; size::NV2080_ALLOC_PARAMETERS as usize] {
    let mut b = [0u8; size::NV2080_ALLOC_PARAMETERS as usize];
    put_u32(&mut b, off::SUBDEVICE_ID, sub_device_id);
    b
}

/// `NVOS00_PARAMETERS` (RM_FREE).
pub fn nvos00(h_root: u32, h_parent: u32, h_old: u32) -> [u8; size::NVOS00 as usize] {
    let mut b = [0u8; size::NVOS00 as usize];
    put_u32(&mut b, off::FREE_H_ROOT, h_root);
    put_u32(&mut b, off::FREE_H_PARENT, h_parent);
    put_u32(&mut b, off::FREE_H_OBJECT, h_old);
    b
}

/// `NVOS54_PARAMETERS` (RM_CONTROL).
pub fn nvos54(h_client: u32, h_object: u32, cmd: u32, params: u64, params_size: u32) -> [u8; size::NVOS54 as usize] {
    let mut b = [0u8; size::NVOS54 as usize];
    put_u32(&mut b, off::CTRL_H_CLIENT, h_client);
    put_u32(&mut b, off::CTRL_H_OBJECT, h_object);
    put_u32(&mut b, off::CTRL_CMD, cmd);
    put_u32(&mut b, off::CTRL_FLAGS, 0);
    put_u64(&mut b, off::CTRL_PARAMS, params);
    put_u32(&mut b, off::CTRL_PARAMS_SIZE, params_size);
    b
}

/// `NVOS32_PARAMETERS` for function ALLOC_SIZE: `bytes` at `location` below device `h_parent`.
/// `h_memory` = 0 lets RM choose the handle; otherwise it is passed with
/// `NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED`.
pub fn nvos32_alloc_size(
    h_root: u32,
    h_parent: u32,
    bytes: u64,
    location: MemLocation,
    h_memory: u32,
) -> [u8; size::NVOS32 as usize] {
    let mut b = [0u8; size::NVOS32 as usize];
    put_u32(&mut b, off::VHC_H_ROOT, h_root);
    put_u32(&mut b, off::VHC_H_PARENT, h_parent);
    put_u32(&mut b, off::VHC_FUNCTION, nv::NVOS32_FUNCTION_ALLOC_SIZE);
    put_u32(&mut b, off::VHC_OWNER, h_root);
    put_u32(&mut b, off::VHC_H_MEMORY, h_memory);
    put_u32(&mut b, off::VHC_TYPE, 0); // NVOS32_TYPE_IMAGE
    let flags = if h_memory != 0 { nv::NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED } else { 0 };
    put_u32(&mut b, off::VHC_ALLOC_FLAGS, flags);
    put_u32(&mut b, off::VHC_ALLOC_ATTR, location.attr());
    put_u64(&mut b, off::VHC_ALLOC_SIZE, bytes);
    b
}

/// `NVOS32_PARAMETERS` for function FREE of `h_memory`.
pub fn nvos32_free(h_root: u32, h_parent: u32, h_memory: u32) -> [u8; size::NVOS32 as usize] {
    let mut b = [0u8; size::NVOS32 as usize];
    put_u32(&mut b, off::VHC_H_ROOT, h_root);
    put_u32(&mut b, off::VHC_H_PARENT, h_parent);
    put_u32(&mut b, off::VHC_FUNCTION, nv::NVOS32_FUNCTION_FREE);
    put_u32(&mut b, off::VHC_OWNER, h_root);
    put_u32(&mut b, off::VHC_H_MEMORY, h_memory);
    b
}

/// `nv_ioctl_rm_api_version_t` (CHECK_VERSION_STR) with `cmd` and our version string.
pub fn rm_api_version(cmd: u32, version: &str) -> [u8; size::RM_API_VERSION as usize] {
    let mut b = [0u8; size::RM_API_VERSION as usize];
    put_u32(&mut b, off::RM_API_VERSION_CMD, cmd);
    put_cstr(&mut b, off::RM_API_VERSION_STRING, nv::NV_RM_API_VERSION_STRING_LENGTH, version);
    b
}

/// `nv_ioctl_register_fd_t`.
pub fn register_fd(ctl_fd: i32) -> [u8; size::REGISTER_FD as usize] {
    let mut b = [0u8; size::REGISTER_FD as usize];
    put_i32(&mut b, off::REGISTER_FD_CTL_FD, ctl_fd);
    b
}

/// `UVM_INITIALIZE_PARAMS` with `flags`.
pub fn uvm_initialize(flags: u64) -> [u8; uvm::INITIALIZE_SIZE as usize] {
    let mut b = [0u8; uvm::INITIALIZE_SIZE as usize];
    put_u64(&mut b, 0, flags);
    b
}

/// `UVM_REGISTER_GPU_PARAMS`.
pub fn uvm_register_gpu(uuid: &[u8; 16], rm_ctrl_fd: i32, h_client: u32) -> [u8; uvm::REGISTER_GPU_SIZE as usize] {
    let mut b = [0u8; uvm::REGISTER_GPU_SIZE as usize];
    b[uvm::REGISTER_GPU_UUID..uvm::REGISTER_GPU_UUID + 16].copy_from_slice(uuid);
    put_i32(&mut b, uvm::REGISTER_GPU_RM_CTRL_FD, rm_ctrl_fd);
    put_u32(&mut b, uvm::REGISTER_GPU_H_CLIENT, h_client);
    b
}

/// `UVM_CREATE_EXTERNAL_RANGE_PARAMS`.
pub fn uvm_create_external_range(base: u64, length: u64) -> [u8; uvm::CREATE_EXTERNAL_RANGE_SIZE as usize] {
    let mut b = [0u8; uvm::CREATE_EXTERNAL_RANGE_SIZE as usize];
    put_u64(&mut b, 0, base);
    put_u64(&mut b, 8, length);
    b
}

/// `UVM_MAP_EXTERNAL_ALLOCATION_PARAMS` in the layout of `abi` (1200 bytes before 550, 9264 since),
/// mapping `h_memory` of `h_client` at `[base, base + length)` on one GPU.
pub fn uvm_map_external_allocation(
    abi: &DriverAbi,
    base: u64,
    length: u64,
    gpu_uuid: &[u8; 16],
    rm_ctrl_fd: i32,
    h_client: u32,
    h_memory: u32,
) -> Vec<u8> {
    let mut b = vec![0u8; abi.uvm_map_external_size as usize];
    put_u64(&mut b, 0, base);
    put_u64(&mut b, 8, length);
    put_u64(&mut b, 16, 0); // offset into the allocation
    let g = uvm::MAP_EXTERNAL_PER_GPU;
    b[g..g + 16].copy_from_slice(gpu_uuid);
    // gpuMappingType / gpuCachingType / gpuFormatType / gpuElementBits / gpuCompressionType: defaults (0).
    let tail = abi.uvm_map_external_tail as usize;
    put_u64(&mut b, tail - uvm::MAP_EXTERNAL_COUNT_BEFORE_TAIL, 1);
    put_i32(&mut b, tail, rm_ctrl_fd);
    put_u32(&mut b, tail + 4, h_client);
    put_u32(&mut b, tail + 8, h_memory);
    b
}

/// Offset of `rmStatus` in `UVM_MAP_EXTERNAL_ALLOCATION_PARAMS` for `abi`.
pub fn uvm_map_external_status_offset(abi: &DriverAbi) -> usize {
    abi.uvm_map_external_tail as usize + 12
}

/// `UVM_FREE_PARAMS` in the layout of `abi` (24 bytes with `length` before 590, 16 since).
pub fn uvm_free(abi: &DriverAbi, base: u64, length: u64) -> Vec<u8> {
    let mut b = vec![0u8; abi.uvm_free_size as usize];
    put_u64(&mut b, 0, base);
    if abi.uvm_free_size == uvm::FREE_SIZE_PRE590 {
        put_u64(&mut b, 8, length);
    }
    b
}

/// `NV2080_CTRL_GPU_GET_GID_INFO_PARAMS` asking for the binary (16-byte) UUID.
pub fn get_gid_info() -> [u8; size::NV2080_CTRL_GPU_GET_GID_INFO as usize] {
    let mut b = [0u8; size::NV2080_CTRL_GPU_GET_GID_INFO as usize];
    put_u32(&mut b, off::GET_GID_INFO_INDEX, 0);
    put_u32(&mut b, off::GET_GID_INFO_FLAGS, nv::ctrl::GID_INFO_FLAGS_FORMAT_BINARY);
    b
}

#[cfg(test)]
mod tests;
