//! NVML's C ABI as the fake needs it: return codes and `#[repr(C)]` structs, restated from nvml.h
//! (LP64) with size asserts, independent of nvml-wrapper-sys so the two can check each other.
#![allow(missing_docs)]

pub const SUCCESS: u32 = 0;
pub const UNINITIALIZED: u32 = 1;
pub const INVALID_ARGUMENT: u32 = 2;
pub const NOT_SUPPORTED: u32 = 3;
pub const NO_PERMISSION: u32 = 4;
pub const NOT_FOUND: u32 = 6;
pub const INSUFFICIENT_SIZE: u32 = 7;
pub const DRIVER_NOT_LOADED: u32 = 9;
pub const LIBRARY_NOT_FOUND: u32 = 12;
pub const FUNCTION_NOT_FOUND: u32 = 13;
pub const GPU_IS_LOST: u32 = 15;
pub const ARGUMENT_VERSION_MISMATCH: u32 = 25;
pub const UNKNOWN: u32 = 999;

/// `NVML_STRUCT_VERSION(Memory, 2)` = sizeof(nvmlMemory_v2_t) | 2 << 24.
pub const MEMORY_V2_VERSION: u32 = 40 | 2 << 24;
/// `NVML_VALUE_NOT_AVAILABLE` for `usedGpuMemory`.
pub const VALUE_NOT_AVAILABLE: u64 = u64::MAX;
/// gpuInstanceId / computeInstanceId off MIG.
pub const NO_INSTANCE: u32 = 0xFFFF_FFFF;

/// Devices and MIG devices per device the fake can hand out handles for.
pub const MAX_DEVICES: usize = 64;
pub const MAX_MIG: usize = 16;

#[repr(C)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
pub struct MemoryV2 {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
pub struct Utilization {
    pub gpu: u32,
    pub memory: u32,
}

#[repr(C)]
pub struct ProcessInfo {
    pub pid: u32,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

#[repr(C)]
pub struct ProcessUtilizationSample {
    pub pid: u32,
    pub time_stamp: u64,
    pub sm_util: u32,
    pub mem_util: u32,
    pub enc_util: u32,
    pub dec_util: u32,
}

#[repr(C)]
pub struct PciInfo {
    pub bus_id_legacy: [u8; 16],
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pci_device_id: u32,
    pub pci_sub_system_id: u32,
    pub bus_id: [u8; 32],
}

const _: () = assert!(size_of::<Memory>() == 24);
const _: () = assert!(size_of::<MemoryV2>() == 40);
const _: () = assert!(size_of::<Utilization>() == 8);
const _: () = assert!(size_of::<ProcessInfo>() == 24);
const _: () = assert!(size_of::<ProcessUtilizationSample>() == 32);
const _: () = assert!(size_of::<PciInfo>() == 68);
