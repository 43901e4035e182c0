//! Unit tests of the fake resource manager, driven in-process with the workload's encoders. The
//! "caller" is this test process, so nested parameters are read with `process_vm_readv` on
//! ourselves, which needs no privilege.

use tracer_common::nv::{self, DriverAbi, DriverVersion, class, esc, off, size, uvm};

use super::caller::{Caller, CallerFault, ProcessCaller};
use super::rm::{DriverConfig, FileId, Node, RmServer, parse_version, version_string};
use super::stats::DriverStats;
use crate::le::{cstr_at, put_u32, put_u64, u32_at, u64_at};
use crate::workload::encode::{self, MemLocation, RmAllocArgs};

const GIB: u64 = 1 << 30;

fn me() -> ProcessCaller {
    ProcessCaller::new(std::process::id())
}

fn abi() -> DriverAbi {
    DriverAbi::for_version(nv::DEFAULT_DRIVER_VERSION)
}

fn server(gpus: u32, mem: u64) -> RmServer {
    RmServer::new(DriverConfig { gpus, gpu_memory_bytes: mem, ..Default::default() })
}

/// RM_ALLOC through NVOS64; returns (errno result, new handle, status).
fn alloc(s: &mut RmServer, f: FileId, a: RmAllocArgs) -> (Result<(), i32>, u32, u32) {
    let mut b = encode::nvos64(&a, &abi());
    let r = s.ioctl(f, nv::iowr(esc::RM_ALLOC, b.len() as u32), &mut b, &me());
    (r, u32_at(&b, off::ALLOC_H_NEW), u32_at(&b, off::NVOS64_STATUS))
}

struct Setup {
    s: RmServer,
    ctl: FileId,
    client: u32,
    device: u32,
}

fn setup(gpus: u32, mem: u64, gpu: u32) -> Setup {
    let mut s = server(gpus, mem);
    let ctl = s.open(Node::Ctl, 1);
    let (r, client, st) = alloc(&mut s, ctl, RmAllocArgs { h_class: class::NV01_ROOT_CLIENT, ..Default::default() });
    assert_eq!((r, st), (Ok(()), nv::NV_OK));
    assert_eq!(client, 0xc1d0_0001);
    let p = encode::nv0080_alloc_params(gpu);
    let (r, device, st) = alloc(
        &mut s,
        ctl,
        RmAllocArgs {
            h_root: client,
            h_parent: client,
            h_class: class::NV01_DEVICE_0,
            p_alloc_params: p.as_ptr() as u64,
            params_size: 56,
            ..Default::default()
        },
    );
    assert_eq!((r, st), (Ok(()), nv::NV_OK));
    assert_eq!(device & 0xfff0_0000, 0xcaf0_0000);
    Setup { s, ctl, client, device }
}

fn alloc_mem(t: &mut Setup, bytes: u64, loc: MemLocation) -> (u32, u32) {
    let p = encode::memory_allocation_params(bytes, loc, 0);
    let (r, h, st) = alloc(
        &mut t.s,
        t.ctl,
        RmAllocArgs {
            h_root: t.client,
            h_parent: t.device,
            h_class: loc.class(),
            p_alloc_params: p.as_ptr() as u64,
            params_size: abi().mem_alloc_params_size,
            ..Default::default()
        },
    );
    assert_eq!(r, Ok(()));
    (h, st)
}

fn free(t: &mut Setup, h: u32) -> u32 {
    let mut b = encode::nvos00(t.client, t.device, h);
    assert_eq!(t.s.ioctl(t.ctl, nv::iowr(esc::RM_FREE, 16), &mut b, &me()), Ok(()));
    u32_at(&b, off::FREE_STATUS)
}

fn vidheap(t: &mut Setup, bytes: u64) -> (u32, u32, [u8; 184]) {
    let mut b = encode::nvos32_alloc_size(t.client, t.device, bytes, MemLocation::Vidmem, 0);
    assert_eq!(t.s.ioctl(t.ctl, nv::iowr(esc::RM_VID_HEAP_CONTROL, 184), &mut b, &me()), Ok(()));
    (u32_at(&b, off::VHC_H_MEMORY), u32_at(&b, off::VHC_STATUS), b)
}

#[test]
fn rm_alloc_memory_is_sized_from_nested_params_and_charged() {
    let mut t = setup(2, 4 * GIB, 1);
    let (h, st) = alloc_mem(&mut t, 3 * GIB, MemLocation::Vidmem);
    assert_eq!(st, nv::NV_OK);
    let stats = t.s.stats();
    let o = stats.object(t.client, h).expect("object listed");
    assert_eq!(o.gpu, Some(1), "GPU from the device's deviceId");
    let m = o.memory.as_ref().expect("memory");
    assert_eq!((m.bytes, m.location.as_str(), m.source.as_str(), m.accounted), (3 * GIB, "vidmem", "rm_alloc", true));
    assert_eq!((stats.used_bytes(1), stats.used_bytes(0)), (3 * GIB, 0));

    // Over capacity: NV_ERR_NO_MEMORY, nothing created.
    let (_, st) = alloc_mem(&mut t, 2 * GIB, MemLocation::Vidmem);
    assert_eq!(st, nv::NV_ERR_NO_MEMORY);
    // System memory is tracked but not charged.
    let (hs, st) = alloc_mem(&mut t, 8 * GIB, MemLocation::Sysmem);
    assert_eq!(st, nv::NV_OK);
    let stats = t.s.stats();
    assert!(!stats.object(t.client, hs).unwrap().memory.as_ref().unwrap().accounted);
    assert_eq!(stats.used_bytes(1), 3 * GIB);

    assert_eq!(free(&mut t, h), nv::NV_OK);
    assert_eq!(t.s.stats().used_bytes(1), 0);
    assert_eq!(free(&mut t, h), nv::NV_ERR_INVALID_OBJECT_HANDLE, "double free");
}

#[test]
fn nvos21_form_and_wrong_sizes() {
    let mut t = setup(1, 4 * GIB, 0);
    let p = encode::memory_allocation_params(GIB, MemLocation::Vidmem, 0);
    let a = RmAllocArgs {
        h_root: t.client,
        h_parent: t.device,
        h_class: class::NV01_MEMORY_LOCAL_USER,
        p_alloc_params: p.as_ptr() as u64,
        params_size: 120,
        ..Default::default()
    };
    let mut b = encode::nvos21(&a);
    assert_eq!(t.s.ioctl(t.ctl, nv::iowr(esc::RM_ALLOC, 32), &mut b, &me()), Ok(()));
    assert_eq!(u32_at(&b, off::NVOS21_STATUS), nv::NV_OK);
    assert_ne!(u32_at(&b, off::ALLOC_H_NEW), 0);
    // 40 bytes is not an RM_ALLOC size on 535: -EINVAL, like nv_validate/RmValidateIoctl.
    let mut b = vec![0u8; 48];
    assert_eq!(t.s.ioctl(t.ctl, nv::iowr(esc::RM_ALLOC, 40), &mut b, &me()), Err(libc::EINVAL));
    let mut b = vec![0u8; 20];
    assert_eq!(t.s.ioctl(t.ctl, nv::iowr(esc::RM_FREE, 20), &mut b, &me()), Err(libc::EINVAL));
    // Unknown escape.
    let mut b = vec![0u8; 16];
    assert_eq!(t.s.ioctl(t.ctl, nv::iowr(0x99, 16), &mut b, &me()), Err(libc::EINVAL));
    let stats = t.s.stats();
    assert_eq!(stats.ioctl_calls("RM_ALLOC"), 4);
    assert_eq!(stats.ioctl_errnos("RM_ALLOC"), 1);
    assert_eq!(stats.ioctl_calls("unknown"), 1);
}

#[test]
fn pre535_driver_accepts_the_40_byte_form() {
    let v = DriverVersion::new(530, 41, 3);
    let mut s = RmServer::new(DriverConfig { version: v, ..Default::default() });
    let ctl = s.open(Node::Ctl, 1);
    let old = DriverAbi::for_version(v);
    let mut b = encode::nvos64(&RmAllocArgs { h_class: class::NV01_ROOT, ..Default::default() }, &old);
    assert_eq!(b.len(), 40);
    assert_eq!(s.ioctl(ctl, nv::iowr(esc::RM_ALLOC, 40), &mut b, &me()), Ok(()));
    assert_eq!(u32_at(&b, off::NVOS64_PRE535_STATUS), nv::NV_OK);
    let mut b = vec![0u8; 48];
    assert_eq!(s.ioctl(ctl, nv::iowr(esc::RM_ALLOC, 48), &mut b, &me()), Err(libc::EINVAL));
}

#[test]
fn bad_nested_pointers_get_rm_statuses() {
    let mut t = setup(1, GIB, 0);
    let base = RmAllocArgs {
        h_root: t.client,
        h_parent: t.device,
        h_class: class::NV01_MEMORY_LOCAL_USER,
        params_size: 120,
        ..Default::default()
    };
    let (r, _, st) = alloc(&mut t.s, t.ctl, base);
    assert_eq!((r, st), (Ok(()), nv::NV_ERR_INVALID_ARGUMENT), "NULL pAllocParms");
    let (r, _, st) = alloc(&mut t.s, t.ctl, RmAllocArgs { p_alloc_params: 0x10, ..base });
    assert_eq!((r, st), (Ok(()), nv::NV_ERR_INVALID_ADDRESS), "unmapped pAllocParms");
    assert_eq!(t.s.stats().live_objects(), 1, "only the device");
}

#[test]
fn parents_clients_and_handles_are_checked() {
    let mut t = setup(1, GIB, 0);
    let mem =
        RmAllocArgs { h_root: t.client, h_parent: 0xdead, h_class: class::NV20_SUBDEVICE_0, ..Default::default() };
    assert_eq!(alloc(&mut t.s, t.ctl, mem).2, nv::NV_ERR_INVALID_OBJECT_PARENT);
    let bad_client =
        RmAllocArgs { h_root: 0x1234, h_parent: 0x1234, h_class: class::NV01_DEVICE_0, ..Default::default() };
    assert_eq!(alloc(&mut t.s, t.ctl, bad_client).2, nv::NV_ERR_INVALID_CLIENT);
    // Clients are private to the file that created them.
    let other = t.s.open(Node::Ctl, 2);
    let sub =
        RmAllocArgs { h_root: t.client, h_parent: t.device, h_class: class::NV20_SUBDEVICE_0, ..Default::default() };
    assert_eq!(alloc(&mut t.s, other, sub).2, nv::NV_ERR_INVALID_CLIENT);
    // Caller-chosen handles, and duplicates of them.
    let (_, h, st) = alloc(&mut t.s, t.ctl, RmAllocArgs { h_new: 0x5000_0001, ..sub });
    assert_eq!((h, st), (0x5000_0001, nv::NV_OK));
    assert_eq!(alloc(&mut t.s, t.ctl, RmAllocArgs { h_new: 0x5000_0001, ..sub }).2, nv::NV_ERR_INSERT_DUPLICATE_NAME);
    // A device out of range.
    let p = encode::nv0080_alloc_params(7);
    let dev = RmAllocArgs {
        h_root: t.client,
        h_parent: t.client,
        h_class: class::NV01_DEVICE_0,
        p_alloc_params: p.as_ptr() as u64,
        ..Default::default()
    };
    assert_eq!(alloc(&mut t.s, t.ctl, dev).2, nv::NV_ERR_INVALID_ARGUMENT);
    // Non-event RM_ALLOC on a GPU node: -EINVAL (wrong node).
    let gpu = t.s.open(Node::Gpu(0), 1);
    assert_eq!(alloc(&mut t.s, gpu, sub).0, Err(libc::EINVAL));
}

#[test]
fn vid_heap_alloc_capacity_and_free() {
    let mut t = setup(1, 2 * GIB, 0);
    let (h, st, b) = vidheap(&mut t, GIB);
    assert_eq!(st, nv::NV_OK);
    assert_eq!(h & 0xfff0_0000, 0xcaf0_0000);
    assert_eq!(u64_at(&b, off::VHC_TOTAL), 2 * GIB);
    assert_eq!(u64_at(&b, off::VHC_FREE), GIB);
    let (_, st, _) = vidheap(&mut t, 2 * GIB);
    assert_eq!(st, nv::NV_ERR_NO_MEMORY);
    // MEMORY_HANDLE_PROVIDED: the caller's handle is used.
    let mut p = encode::nvos32_alloc_size(t.client, t.device, 4096, MemLocation::Vidmem, 0x7777);
    assert_eq!(t.s.ioctl(t.ctl, nv::iowr(esc::RM_VID_HEAP_CONTROL, 184), &mut p, &me()), Ok(()));
    assert_eq!((u32_at(&p, off::VHC_STATUS), u32_at(&p, off::VHC_H_MEMORY)), (nv::NV_OK, 0x7777));
    let stats = t.s.stats();
    assert_eq!(stats.used_bytes(0), GIB + 4096);
    assert_eq!(stats.object(t.client, h).unwrap().memory.as_ref().unwrap().source, "vid_heap");

    let mut f = encode::nvos32_free(t.client, t.device, h);
    assert_eq!(t.s.ioctl(t.ctl, nv::iowr(esc::RM_VID_HEAP_CONTROL, 184), &mut f, &me()), Ok(()));
    assert_eq!(u32_at(&f, off::VHC_STATUS), nv::NV_OK);
    assert_eq!(t.s.stats().used_bytes(0), 4096);
    let mut f = encode::nvos32_free(t.client, t.device, h);
    assert_eq!(t.s.ioctl(t.ctl, nv::iowr(esc::RM_VID_HEAP_CONTROL, 184), &mut f, &me()), Ok(()));
    assert_eq!(u32_at(&f, off::VHC_STATUS), nv::NV_ERR_INVALID_OBJECT_HANDLE);
    // The device was the parent: freeing it takes the memory below it along.
    let device = t.device;
    assert_eq!(free(&mut t, device), nv::NV_OK);
    let stats = t.s.stats();
    assert_eq!((stats.used_bytes(0), stats.live_objects()), (0, 0));
}

#[test]
fn whole_client_free_and_release_free_everything() {
    let mut t = setup(1, 8 * GIB, 0);
    alloc_mem(&mut t, GIB, MemLocation::Vidmem);
    vidheap(&mut t, GIB);
    let client = t.client;
    assert_eq!(free(&mut t, client), nv::NV_OK);
    let stats = t.s.stats();
    assert!(stats.clients.is_empty());
    assert_eq!(stats.used_bytes(0), 0);
    assert_eq!(stats.totals.clients_freed, 1);
    assert_eq!(stats.totals.objects_freed, 3);

    let mut t = setup(1, 8 * GIB, 0);
    alloc_mem(&mut t, GIB, MemLocation::Vidmem);
    t.s.release(t.ctl);
    let stats = t.s.stats();
    assert!(stats.clients.is_empty() && stats.open_files.is_empty());
    assert_eq!(stats.used_bytes(0), 0);
}

#[test]
fn dup_object_shares_the_allocation() {
    let mut t = setup(1, 8 * GIB, 0);
    let (h, _) = alloc_mem(&mut t, GIB, MemLocation::Vidmem);
    let mut b = vec![0u8; size::NVOS55 as usize];
    put_u32(&mut b, off::DUP_H_CLIENT, t.client);
    put_u32(&mut b, off::DUP_H_PARENT, t.device);
    put_u32(&mut b, off::DUP_H_CLIENT_SRC, t.client);
    put_u32(&mut b, off::DUP_H_OBJECT_SRC, h);
    assert_eq!(t.s.ioctl(t.ctl, nv::iowr(esc::RM_DUP_OBJECT, 28), &mut b, &me()), Ok(()));
    assert_eq!(u32_at(&b, off::DUP_STATUS), nv::NV_OK);
    let dup = u32_at(&b, off::DUP_H_OBJECT);
    let stats = t.s.stats();
    let (a, d) = (stats.object(t.client, h).unwrap(), stats.object(t.client, dup).unwrap());
    assert_eq!(a.memory.as_ref().unwrap().id, d.memory.as_ref().unwrap().id);
    assert_eq!(a.memory.as_ref().unwrap().refs, 2);
    assert_eq!(stats.used_bytes(0), GIB, "a dup is not new memory");
    free(&mut t, h);
    assert_eq!(t.s.stats().used_bytes(0), GIB, "still referenced by the dup");
    free(&mut t, dup);
    assert_eq!(t.s.stats().used_bytes(0), 0);
}

#[test]
fn alloc_memory_only_on_gpu_nodes() {
    let mut t = setup(2, 8 * GIB, 0);
    let mut b = vec![0u8; 56];
    put_u32(&mut b, off::NVOS02_H_ROOT, t.client);
    put_u32(&mut b, off::NVOS02_H_PARENT, t.device);
    put_u32(&mut b, off::NVOS02_H_CLASS, class::NV01_MEMORY_LOCAL_USER);
    put_u32(&mut b, off::NVOS02_FLAGS, nv::NVOS02_LOCATION_VIDMEM << 8);
    put_u64(&mut b, off::NVOS02_LIMIT, GIB - 1);
    let cmd = nv::iowr(esc::RM_ALLOC_MEMORY, 56);
    assert_eq!(t.s.ioctl(t.ctl, cmd, &mut b.clone(), &me()), Err(libc::EINVAL), "ctl node");
    let gpu1 = t.s.open(Node::Gpu(1), 1);
    assert_eq!(t.s.ioctl(gpu1, cmd, &mut b, &me()), Ok(()));
    assert_eq!(u32_at(&b, off::NVOS02_STATUS), nv::NV_OK);
    assert_eq!(t.s.stats().used_bytes(1), GIB, "charged to the node's GPU");
}

#[test]
fn version_check_card_info_and_misc() {
    let mut t = setup(3, 8 * GIB, 0);
    let ours = version_string(nv::DEFAULT_DRIVER_VERSION);
    assert_eq!(ours, "535.261.03");
    assert_eq!(parse_version(&ours), Some(nv::DEFAULT_DRIVER_VERSION));
    assert_eq!(parse_version("535.261"), None);
    let cmd = nv::iowr(esc::CHECK_VERSION_STR, 72);
    let mut v = encode::rm_api_version(nv::NV_RM_API_VERSION_CMD_STRICT, &ours);
    assert_eq!(t.s.ioctl(t.ctl, cmd, &mut v, &me()), Ok(()));
    assert_eq!(u32_at(&v, off::RM_API_VERSION_REPLY), nv::NV_RM_API_VERSION_REPLY_RECOGNIZED);
    let mut v = encode::rm_api_version(nv::NV_RM_API_VERSION_CMD_STRICT, "550.54.14");
    assert_eq!(t.s.ioctl(t.ctl, cmd, &mut v, &me()), Err(libc::EINVAL));
    let mut v = encode::rm_api_version(nv::NV_RM_API_VERSION_CMD_RELAXED, "535.1.1");
    assert_eq!(t.s.ioctl(t.ctl, cmd, &mut v, &me()), Ok(()));
    let mut v = encode::rm_api_version(nv::NV_RM_API_VERSION_CMD_QUERY, "");
    assert_eq!(t.s.ioctl(t.ctl, cmd, &mut v, &me()), Ok(()));
    assert_eq!(cstr_at(&v, off::RM_API_VERSION_STRING, 64), "535.261.03");

    let mut cards = vec![0u8; 72 * 4];
    assert_eq!(t.s.ioctl(t.ctl, nv::iowr(esc::CARD_INFO, cards.len() as u32), &mut cards, &me()), Ok(()));
    for i in 0..4 {
        let e = &cards[i * 72..(i + 1) * 72];
        assert_eq!(e[0] != 0, i < 3);
        if i < 3 {
            assert_eq!(u32_at(e, off::CARD_INFO_MINOR_NUMBER), i as u32);
        }
    }
    let mut bad = vec![0u8; 100];
    assert_eq!(t.s.ioctl(t.ctl, nv::iowr(esc::CARD_INFO, 100), &mut bad, &me()), Err(libc::EINVAL));

    let mut c = encode::nvos54(t.client, t.device, 0x2080_014a, 0, 0);
    assert_eq!(t.s.ioctl(t.ctl, nv::iowr(esc::RM_CONTROL, 32), &mut c, &me()), Ok(()));
    assert_eq!(u32_at(&c, off::CTRL_STATUS), nv::NV_OK);
    let mut c = encode::nvos54(t.client, 0xbad, 0x2080_014a, 0, 0);
    assert_eq!(t.s.ioctl(t.ctl, nv::iowr(esc::RM_CONTROL, 32), &mut c, &me()), Ok(()));
    assert_eq!(u32_at(&c, off::CTRL_STATUS), nv::NV_ERR_INVALID_OBJECT_HANDLE);
}

#[test]
fn register_fd_resolves_the_ctl_fd() {
    let dir = std::env::temp_dir().join(format!("fake-nv-regfd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ctl_file = std::fs::File::create(dir.join("nvidiactl")).unwrap();
    let other = std::fs::File::create(dir.join("nvidia0")).unwrap();
    use std::os::fd::AsRawFd;
    let mut s = server(1, GIB);
    let gpu = s.open(Node::Gpu(0), 1);
    let cmd = nv::iowr(esc::REGISTER_FD, 4);
    assert_eq!(s.ioctl(gpu, cmd, &mut encode::register_fd(other.as_raw_fd()), &me()), Err(libc::EINVAL));
    assert_eq!(s.ioctl(gpu, cmd, &mut encode::register_fd(ctl_file.as_raw_fd()), &me()), Ok(()));
    assert_eq!(s.ioctl(gpu, cmd, &mut encode::register_fd(ctl_file.as_raw_fd()), &me()), Err(libc::EINVAL), "once");
    assert!(s.stats().open_files[0].registered);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn uvm_commands_carry_no_data() {
    let mut s = server(1, GIB);
    let u = s.open(Node::Uvm, 1);
    assert_eq!(s.ioctl(u, uvm::INITIALIZE, &mut [], &me()), Ok(()));
    assert_eq!(s.ioctl(u, uvm::REGISTER_GPU, &mut [], &me()), Ok(()));
    assert_eq!(s.ioctl(u, 5, &mut [], &me()), Err(libc::EINVAL));
    let stats = s.stats();
    assert_eq!(stats.ioctl_calls("UVM_INITIALIZE"), 1);
    assert_eq!(stats.ioctl_calls("UVM_REGISTER_GPU"), 1);
}

#[test]
fn stats_round_trip_through_json() {
    let mut t = setup(1, 8 * GIB, 0);
    alloc_mem(&mut t, GIB, MemLocation::Vidmem);
    let stats = t.s.stats();
    let json = serde_json::to_string(&stats).unwrap();
    let back: DriverStats = serde_json::from_str(&json).unwrap();
    assert_eq!(back, stats);
    assert_eq!(back.driver_version, "535.261.03");
    assert_eq!(back.clients[0].pid, std::process::id(), "the allocating process");
}

#[test]
fn process_caller_reads_own_memory_and_reports_faults() {
    let c = me();
    assert_eq!(c.tgid(), std::process::id());
    let src = [1u8, 2, 3, 4, 5, 6, 7, 8];
    let mut dst = [0u8; 8];
    c.read(src.as_ptr() as u64, &mut dst).unwrap();
    assert_eq!(dst, src);
    assert_eq!(c.read(0, &mut dst), Err(CallerFault::Null));
    assert!(matches!(c.read(0x10, &mut dst), Err(CallerFault::Unreadable(_))));
}
