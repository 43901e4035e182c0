use super::*;
use crate::le::{cstr_at, i32_at, u32_at, u64_at};
use tracer_common::nv::{DEFAULT_DRIVER_VERSION, DriverVersion};

fn abi535() -> DriverAbi {
    DriverAbi::for_version(DEFAULT_DRIVER_VERSION)
}

fn args() -> RmAllocArgs {
    RmAllocArgs {
        h_root: 0xc1d0_0001,
        h_parent: 0xcaf0_0001,
        h_new: 0,
        h_class: class::NV01_MEMORY_LOCAL_USER,
        p_alloc_params: 0x7fff_1234_5000,
        params_size: 120,
    }
}

#[test]
fn nvos64_535_layout() {
    let b = nvos64(&args(), &abi535());
    assert_eq!(b.len(), 48);
    assert_eq!(u32_at(&b, 0), 0xc1d0_0001);
    assert_eq!(u32_at(&b, 4), 0xcaf0_0001);
    assert_eq!(u32_at(&b, 8), 0);
    assert_eq!(u32_at(&b, 12), 0x40);
    assert_eq!(u64_at(&b, 16), 0x7fff_1234_5000);
    assert_eq!(u64_at(&b, 24), 0, "pRightsRequested");
    assert_eq!(u32_at(&b, 32), 120, "paramsSize");
    assert_eq!(u32_at(&b, 40), 0, "status");
    assert_eq!(nv::iowr(nv::esc::RM_ALLOC, b.len() as u32), 0xC030_462B);
}

#[test]
fn nvos64_pre535_layout_has_no_params_size() {
    let abi = DriverAbi::for_version(DriverVersion::new(530, 41, 3));
    let b = nvos64(&args(), &abi);
    assert_eq!(b.len(), 40);
    assert_eq!(u32_at(&b, 32), 0, "flags, not paramsSize");
    assert_eq!(nv::iowr(nv::esc::RM_ALLOC, 40), 0xC028_462B);
}

#[test]
fn nvos21_layout() {
    let b = nvos21(&args());
    assert_eq!(u32_at(&b, 12), 0x40);
    assert_eq!(u64_at(&b, 16), 0x7fff_1234_5000);
    assert_eq!(u32_at(&b, 24), 120);
    assert_eq!(u32_at(&b, 28), 0);
    assert_eq!(nv::iowr(nv::esc::RM_ALLOC, b.len() as u32), 0xC020_462B);
}

#[test]
fn memory_params_size_and_location() {
    let v = memory_allocation_params(1 << 30, MemLocation::Vidmem, 7);
    assert_eq!(u64_at(&v, 64), 1 << 30);
    assert_eq!(nv::attr_location(u32_at(&v, 24)), nv::ATTR_LOCATION_VIDMEM);
    let s = memory_allocation_params(4096, MemLocation::Sysmem, 7);
    assert_eq!(nv::attr_location(u32_at(&s, 24)), nv::ATTR_LOCATION_PCI);
    assert_eq!(u32_at(&s, 0), 7);
    assert_eq!(MemLocation::Vidmem.class(), 0x40);
    assert_eq!(MemLocation::Sysmem.class(), 0x3e);
}

#[test]
fn nvos32_alloc_and_free() {
    let b = nvos32_alloc_size(1, 2, 3 << 20, MemLocation::Vidmem, 0);
    assert_eq!(b.len(), 184);
    assert_eq!(u32_at(&b, 8), 2, "function ALLOC_SIZE");
    assert_eq!(u32_at(&b, 44), 0);
    assert_eq!(u32_at(&b, 52) & nv::NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED, 0);
    assert_eq!(u64_at(&b, 88), 3 << 20);
    let p = nvos32_alloc_size(1, 2, 4096, MemLocation::Sysmem, 0xbeef);
    assert_eq!(u32_at(&p, 44), 0xbeef);
    assert_ne!(u32_at(&p, 52) & nv::NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED, 0);
    assert_eq!(nv::attr_location(u32_at(&p, 56)), nv::ATTR_LOCATION_PCI);
    let f = nvos32_free(1, 2, 0xbeef);
    assert_eq!(u32_at(&f, 8), 3, "function FREE");
    assert_eq!(u32_at(&f, 44), 0xbeef);
    assert_eq!(nv::iowr(nv::esc::RM_VID_HEAP_CONTROL, 184), 0xC0B8_464A);
}

#[test]
fn free_control_version_register() {
    let f = nvos00(1, 2, 3);
    assert_eq!((u32_at(&f, 0), u32_at(&f, 4), u32_at(&f, 8), u32_at(&f, 12)), (1, 2, 3, 0));
    let c = nvos54(1, 2, 0x2080_014a, 0xabc0, 268);
    assert_eq!((u32_at(&c, 8), u64_at(&c, 16), u32_at(&c, 24)), (0x2080_014a, 0xabc0, 268));
    let v = rm_api_version(nv::NV_RM_API_VERSION_CMD_STRICT, "535.261.03");
    assert_eq!(cstr_at(&v, 8, 64), "535.261.03");
    assert_eq!(nv::iowr(nv::esc::CHECK_VERSION_STR, v.len() as u32), 0xC048_46D2);
    assert_eq!(i32_at(&register_fd(5), 0), 5);
    assert_eq!(u32_at(&nv0080_alloc_params(3), 0), 3);
}

#[test]
fn uvm_map_external_layouts() {
    let uuid = [0xabu8; 16];
    let pre = uvm_map_external_allocation(&abi535(), 0x7f00_0000_0000, 1 << 21, &uuid, 9, 0xc1d0_0001, 0xcaf0_0005);
    assert_eq!(pre.len(), 1200);
    assert_eq!(u64_at(&pre, 1176), 1, "gpuAttributesCount");
    assert_eq!((i32_at(&pre, 1184), u32_at(&pre, 1188), u32_at(&pre, 1192)), (9, 0xc1d0_0001, 0xcaf0_0005));
    assert_eq!(uvm_map_external_status_offset(&abi535()), 1196);
    assert_eq!(&pre[24..40], &uuid);
    let abi550 = DriverAbi::for_version(DriverVersion::new(550, 54, 14));
    let new = uvm_map_external_allocation(&abi550, 1, 2, &uuid, 9, 3, 4);
    assert_eq!(new.len(), 9264);
    assert_eq!((u64_at(&new, 9240), i32_at(&new, 9248), u32_at(&new, 9252), u32_at(&new, 9256)), (1, 9, 3, 4));
    assert_eq!(uvm_map_external_status_offset(&abi550), 9260);
}

#[test]
fn uvm_small_structs() {
    let r = uvm_register_gpu(&[1; 16], 7, 0xc1d0_0002);
    assert_eq!((i32_at(&r, 24), u32_at(&r, 28), u32_at(&r, 36)), (7, 0xc1d0_0002, 0));
    let c = uvm_create_external_range(0x1000, 0x2000);
    assert_eq!((u64_at(&c, 0), u64_at(&c, 8)), (0x1000, 0x2000));
    assert_eq!(uvm_free(&abi535(), 0x1000, 0x2000).len(), 24);
    assert_eq!(u64_at(&uvm_free(&abi535(), 0x1000, 0x2000), 8), 0x2000);
    let abi590 = DriverAbi::for_version(DriverVersion::new(590, 44, 1));
    assert_eq!(uvm_free(&abi590, 0x1000, 0x2000).len(), 16);
    assert_eq!(u64_at(&uvm_initialize(2), 0), 2);
    assert_eq!(u32_at(&get_gid_info(), 4), 2);
}
