//! Decoder tests: golden records written with literal offsets from the ABI sheet (independent of
//! `encode`), per-op round trips, malformed arguments, record-level errors, and property tests.

use proptest::prelude::*;
use tracer_common::{
    CgroupRmdirRecord, DeviceRef, EventHeader, IoctlRecord, device_kind, flags, kind,
    nv::{DriverAbi, DriverVersion, class, esc, iowr, uvm},
    record_as_bytes,
};

use super::{encode, *};

fn abi535() -> DriverAbi {
    DriverAbi::for_version(DriverVersion::new(535, 261, 3))
}
fn abi530() -> DriverAbi {
    DriverAbi::for_version(DriverVersion::new(530, 41, 3))
}
fn abi550() -> DriverAbi {
    DriverAbi::for_version(DriverVersion::new(550, 54, 15))
}
fn abi595() -> DriverAbi {
    DriverAbi::for_version(DriverVersion::new(595, 45, 4))
}

fn hdr() -> Header {
    Header { ktime_ns: 123_456_789, tgid: 4242, pid: 4243, cgroup_id: 777 }
}

fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// A raw ioctl record on `dev_kind`, written field by field (no encoder involved).
fn raw_ioctl(dev_kind: u8, cmd: u32, nr: u32, size: u32) -> IoctlRecord {
    IoctlRecord {
        hdr: EventHeader {
            kind: kind::IOCTL,
            flags: 0,
            size: size_of::<IoctlRecord>() as u32,
            ktime_ns: 123_456_789,
            tgid: 4242,
            pid: 4243,
            cgroup_id: 777,
        },
        dev: DeviceRef { kind: dev_kind, _pad: [0; 3], minor: 255, file_id: 99 },
        fd: 7,
        cmd,
        nr,
        size,
        ..IoctlRecord::default()
    }
}

fn decode_op(r: &IoctlRecord, abi: &DriverAbi) -> IoctlEvent {
    match decode(record_as_bytes(r), abi) {
        Ok(Event::Ioctl(e)) => e,
        other => panic!("not an ioctl: {other:?}"),
    }
}

fn roundtrip(ev: &Event, abi: &DriverAbi) {
    let bytes = encode::event(ev, abi);
    assert_eq!(decode(&bytes, abi).as_ref(), Ok(ev), "record {:02x?}", &bytes[..bytes.len().min(64)]);
}

fn ioctl_ev(dev: Device, op: IoctlOp, abi: &DriverAbi) -> IoctlEvent {
    encode::ioctl(hdr(), dev, 7, op, abi)
}

// ---------- golden records (literal ABI offsets) ----------

#[test]
fn golden_rm_alloc_nvos64_vidmem() {
    // NVOS64 (48 bytes, 535+): hRoot@0 hParent@4 hNew@8 hClass@12 pAllocParms@16 status@40.
    let mut r = raw_ioctl(device_kind::CTL, 0xC030_462B, 0x2b, 48);
    put32(&mut r.main, 0, 0xc1d0_0001);
    put32(&mut r.main, 4, 0xcaf0_0001);
    put32(&mut r.main, 8, 0xcaf0_0100);
    put32(&mut r.main, 12, 0x40);
    put64(&mut r.main, 16, 0x7fff_0000);
    put32(&mut r.main, 40, 0);
    r.main_len = 48;
    // NV_MEMORY_ALLOCATION_PARAMS: attr@24 (location 26:25 = VIDMEM 0), size@64.
    put32(&mut r.nested, 24, 0);
    put64(&mut r.nested, 64, 2 << 20);
    r.nested_len = 120;
    let e = decode_op(&r, &abi535());
    assert!(e.succeeded());
    assert_eq!(
        e.op,
        IoctlOp::RmAlloc {
            client: 0xc1d0_0001,
            parent: 0xcaf0_0001,
            handle: 0xcaf0_0100,
            class: 0x40,
            status: 0,
            form: RmAllocForm::Nvos64,
            memory: Some(MemoryAlloc { bytes: 2 << 20, location: Location::Vidmem, kind: MemoryKind::Physical }),
            device_instance: None,
            subdevice_instance: None,
        }
    );
    // The same bytes under a 530 driver: 48 is not an RM_ALLOC size there.
    assert_eq!(decode_op(&r, &abi530()).op, IoctlOp::Malformed { nr: 0x2b, reason: MalformedReason::BadSize });
}

#[test]
fn golden_rm_alloc_nvos21_root_and_device() {
    // The root client: hRoot 0 on input, hObjectNew is the client; status@28.
    let mut r = raw_ioctl(device_kind::CTL, 0xC020_462B, 0x2b, 32);
    put32(&mut r.main, 8, 0xc1d0_0042);
    put32(&mut r.main, 12, 0x41);
    r.main_len = 32;
    let e = decode_op(&r, &abi535());
    let IoctlOp::RmAlloc { client, handle, class, form, memory, .. } = e.op else { panic!("{e:?}") };
    assert_eq!((client, handle, class, form, memory), (0xc1d0_0042, 0xc1d0_0042, 0x41, RmAllocForm::Nvos21, None));

    // A device: NV0080_ALLOC_PARAMETERS.deviceId@0 = 1.
    put32(&mut r.main, 0, 0xc1d0_0042);
    put32(&mut r.main, 4, 0xc1d0_0042);
    put32(&mut r.main, 8, 0xcaf0_0001);
    put32(&mut r.main, 12, 0x80);
    put32(&mut r.nested, 0, 1);
    r.nested_len = 56;
    let e = decode_op(&r, &abi535());
    assert!(matches!(e.op, IoctlOp::RmAlloc { device_instance: Some(1), client: 0xc1d0_0042, .. }), "{e:?}");
}

#[test]
fn golden_rm_alloc_pre535_nvos64_status_at_36() {
    let mut r = raw_ioctl(device_kind::CTL, 0xC028_462B, 0x2b, 40);
    put32(&mut r.main, 0, 1);
    put32(&mut r.main, 4, 2);
    put32(&mut r.main, 8, 3);
    put32(&mut r.main, 12, 0xa06c);
    put32(&mut r.main, 36, 0x51);
    r.main_len = 40;
    let e = decode_op(&r, &abi530());
    assert!(matches!(e.op, IoctlOp::RmAlloc { status: 0x51, form: RmAllocForm::Nvos64, .. }), "{e:?}");
    assert!(!e.succeeded());
}

#[test]
fn golden_memory_classes() {
    let abi = abi535();
    // (class, nested offset of the size field, value written, expected bytes, kind, location)
    let cases: [(u32, usize, u64, u64, MemoryKind, Location); 6] = [
        (0x3e, 64, 4096, 4096, MemoryKind::Physical, Location::Sysmem),
        (0x90ce, 64, 8192, 8192, MemoryKind::Physical, Location::Sysmem),
        (0x50a0, 64, 1 << 30, 1 << 30, MemoryKind::VirtualOnly, Location::Unknown),
        (0xc2, 0, 1 << 21, 1 << 21, MemoryKind::Physical, Location::Vidmem),
        (0xf8, 8, 1 << 29, 1 << 29, MemoryKind::Fabric, Location::Vidmem),
        (0x71, 24, 65535, 65536, MemoryKind::OsDescriptor, Location::Sysmem),
    ];
    for (c, off, v, bytes, kind, location) in cases {
        let mut r = raw_ioctl(device_kind::CTL, 0xC030_462B, 0x2b, 48);
        put32(&mut r.main, 12, c);
        r.main_len = 48;
        put64(&mut r.nested, off, v);
        r.nested_len = 120;
        let e = decode_op(&r, &abi);
        let IoctlOp::RmAlloc { memory, .. } = e.op else { panic!("{e:?}") };
        assert_eq!(memory, Some(MemoryAlloc { bytes, location, kind }), "class {c:#x}");
    }
    // 0x70: NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS offset@0, limit@8 → limit - offset + 1.
    let mut r = raw_ioctl(device_kind::CTL, 0xC020_462B, 0x2b, 32);
    put32(&mut r.main, 12, 0x70);
    r.main_len = 32;
    put64(&mut r.nested, 0, 0x1000);
    put64(&mut r.nested, 8, 0x1fff);
    r.nested_len = 24;
    let IoctlOp::RmAlloc { memory, .. } = decode_op(&r, &abi).op else { panic!() };
    assert_eq!(memory, Some(MemoryAlloc { bytes: 0x1000, location: Location::Unknown, kind: MemoryKind::VirtualOnly }));
    // 0x40 with attr LOCATION = PCI (1 << 25) and ANY (3 << 25).
    for (attr, loc) in [(1u32 << 25, Location::Sysmem), (3 << 25, Location::Any), (2 << 25, Location::Unknown)] {
        let mut r = raw_ioctl(device_kind::CTL, 0xC020_462B, 0x2b, 32);
        put32(&mut r.main, 12, 0x40);
        r.main_len = 32;
        put32(&mut r.nested, 24, attr | 0x1234);
        put64(&mut r.nested, 64, 10);
        r.nested_len = 120;
        let IoctlOp::RmAlloc { memory, .. } = decode_op(&r, &abi).op else { panic!() };
        assert_eq!(memory.map(|m| m.location), Some(loc));
    }
}

#[test]
fn golden_vid_heap_alloc_and_free() {
    // NVOS32: hRoot@0 hParent@4 function@8 status@20; AllocSize: hMemory@44 flags@52 attr@56 size@88.
    let mut r = raw_ioctl(device_kind::CTL, 0xC0B8_464A, 0x4a, 184);
    put32(&mut r.main, 0, 0xc1d0_0001);
    put32(&mut r.main, 4, 0xcaf0_0001);
    put32(&mut r.main, 8, 2);
    put32(&mut r.main, 44, 0xcaf0_0200);
    put32(&mut r.main, 52, 0x0008_0000);
    put32(&mut r.main, 56, 1 << 25);
    put64(&mut r.main, 88, 1 << 20);
    r.main_len = 184;
    let e = decode_op(&r, &abi535());
    assert_eq!(
        e.op,
        IoctlOp::VidHeapAlloc {
            client: 0xc1d0_0001,
            parent: 0xcaf0_0001,
            handle: 0xcaf0_0200,
            bytes: 1 << 20,
            virtual_only: true,
            location: Location::Sysmem,
            status: 0
        }
    );
    put32(&mut r.main, 8, 3);
    put32(&mut r.main, 20, 0x57);
    let e = decode_op(&r, &abi535());
    assert_eq!(
        e.op,
        IoctlOp::VidHeapFree { client: 0xc1d0_0001, parent: 0xcaf0_0001, handle: 0xcaf0_0200, status: 0x57 }
    );
    assert!(!e.succeeded());
}

#[test]
fn golden_alloc_memory_nvos02() {
    // NVOS02 with fd (56): hRoot@0 hParent@4 hNew@8 hClass@12 flags@16 limit@32 status@40 fd@48.
    let mut r = raw_ioctl(device_kind::GPU, 0xC038_4627, 0x27, 56);
    put32(&mut r.main, 0, 1);
    put32(&mut r.main, 4, 2);
    put32(&mut r.main, 8, 3);
    put32(&mut r.main, 12, 0x71);
    put32(&mut r.main, 16, 0); // LOCATION PCI
    put64(&mut r.main, 32, 4095);
    r.main_len = 56;
    let e = decode_op(&r, &abi535());
    assert_eq!(
        e.op,
        IoctlOp::AllocMemory {
            client: 1,
            parent: 2,
            handle: 3,
            class: 0x71,
            memory: MemoryAlloc { bytes: 4096, location: Location::Sysmem, kind: MemoryKind::OsDescriptor },
            status: 0
        }
    );
    put32(&mut r.main, 12, 0x3e);
    put32(&mut r.main, 16, 2 << 8); // LOCATION VIDMEM
    let IoctlOp::AllocMemory { memory, .. } = decode_op(&r, &abi535()).op else { panic!() };
    assert_eq!((memory.location, memory.kind), (Location::Vidmem, MemoryKind::Physical));
}

#[test]
fn golden_free_control_dup_map() {
    let abi = abi535();
    let mut r = raw_ioctl(device_kind::CTL, 0xC010_4629, 0x29, 16);
    for (o, v) in [(0, 1), (4, 2), (8, 3), (12, 0)] {
        put32(&mut r.main, o, v);
    }
    r.main_len = 16;
    assert_eq!(decode_op(&r, &abi).op, IoctlOp::RmFree { client: 1, parent: 2, handle: 3, status: 0 });

    let mut r = raw_ioctl(device_kind::CTL, 0xC020_462A, 0x2a, 32);
    for (o, v) in [(0, 1), (4, 2), (8, 0x2080_014a), (28, 0x56)] {
        put32(&mut r.main, o, v);
    }
    r.main_len = 32;
    assert_eq!(decode_op(&r, &abi).op, IoctlOp::RmControl { client: 1, object: 2, cmd: 0x2080_014a, status: 0x56 });

    let mut r = raw_ioctl(device_kind::CTL, 0xC01C_4634, 0x34, 28);
    for (o, v) in [(0, 1), (4, 2), (8, 3), (12, 4), (16, 5), (24, 0)] {
        put32(&mut r.main, o, v);
    }
    r.main_len = 28;
    assert_eq!(
        decode_op(&r, &abi).op,
        IoctlOp::RmDupObject { client: 1, parent: 2, handle: 3, src_client: 4, src_handle: 5, status: 0 }
    );

    let mut r = raw_ioctl(device_kind::CTL, 0xC038_464E, 0x4e, 56);
    for (o, v) in [(0, 1), (4, 2), (8, 3), (40, 0), (48, 12)] {
        put32(&mut r.main, o, v);
    }
    put64(&mut r.main, 16, 0x1000);
    put64(&mut r.main, 24, 0x2000);
    r.main_len = 56;
    assert_eq!(
        decode_op(&r, &abi).op,
        IoctlOp::RmMapMemory { client: 1, device: 2, memory: 3, offset: 0x1000, length: 0x2000, fd: 12, status: 0 }
    );
}

#[test]
fn golden_uvm_map_external_by_version() {
    for (abi, tail_off) in [(abi535(), 1184u32), (abi550(), 9248)] {
        let mut r = raw_ioctl(device_kind::UVM, 33, 33, 0);
        put64(&mut r.main, 0, 0x7f00_0000_0000);
        put64(&mut r.main, 8, 1 << 21);
        put64(&mut r.main, 16, 0);
        r.main_len = 24;
        r.tail_off = tail_off;
        put32(&mut r.tail, 0, 9); // rmCtrlFd
        put32(&mut r.tail, 4, 0xc1d0_0001);
        put32(&mut r.tail, 8, 0xcaf0_0100);
        put32(&mut r.tail, 12, 0);
        r.tail_len = 16;
        assert_eq!(
            decode_op(&r, &abi).op,
            IoctlOp::UvmMapExternal {
                base: 0x7f00_0000_0000,
                length: 1 << 21,
                offset: 0,
                rm_ctrl_fd: 9,
                client: 0xc1d0_0001,
                memory_handle: 0xcaf0_0100,
                status: 0
            }
        );
    }
    // A tail read at the pre-550 offset is wrong for a 550 driver.
    let mut r = raw_ioctl(device_kind::UVM, 33, 33, 0);
    r.main_len = 24;
    r.tail_off = 1184;
    r.tail_len = 16;
    assert_eq!(decode_op(&r, &abi550()).op, IoctlOp::Malformed { nr: 33, reason: MalformedReason::BadTailOffset });
}

#[test]
fn golden_uvm_free_status_moves_in_590() {
    let mut r = raw_ioctl(device_kind::UVM, 34, 34, 0);
    put64(&mut r.main, 0, 0x1000);
    put32(&mut r.main, 8, 0x11);
    put32(&mut r.main, 16, 0x22);
    r.main_len = 24;
    assert_eq!(decode_op(&r, &abi535()).op, IoctlOp::UvmFree { base: 0x1000, status: 0x22 });
    assert_eq!(decode_op(&r, &abi595()).op, IoctlOp::UvmFree { base: 0x1000, status: 0x11 });
}

#[test]
fn golden_uvm_register_gpu_and_initialize() {
    let mut r = raw_ioctl(device_kind::UVM, 37, 37, 0);
    for i in 0..16 {
        r.main[i] = i as u8 + 1;
    }
    put32(&mut r.main, 24, 5);
    put32(&mut r.main, 28, 0xc1d0_0001);
    put32(&mut r.main, 36, 0);
    r.main_len = 40;
    let mut uuid = [0u8; 16];
    for (i, b) in uuid.iter_mut().enumerate() {
        *b = i as u8 + 1;
    }
    assert_eq!(
        decode_op(&r, &abi535()).op,
        IoctlOp::UvmRegisterGpu { uuid, rm_ctrl_fd: 5, client: 0xc1d0_0001, status: 0 }
    );
    let mut r = raw_ioctl(device_kind::UVM, 0x3000_0001, 0x3000_0001, 0);
    put64(&mut r.main, 0, 2);
    put32(&mut r.main, 8, 0x1f);
    r.main_len = 16;
    let e = decode_op(&r, &abi535());
    assert_eq!(e.op, IoctlOp::UvmInitialize { flags: 2, status: 0x1f });
    assert!(!e.succeeded());
}

#[test]
fn golden_check_version_and_card_info() {
    let mut r = raw_ioctl(device_kind::CTL, 0xC048_46D2, 210, 72);
    put32(&mut r.main, 4, 1);
    r.main[8..8 + 10].copy_from_slice(b"535.261.03");
    r.main_len = 72;
    assert_eq!(decode_op(&r, &abi535()).op, IoctlOp::CheckVersion { reply: 1, version: "535.261.03".into() });

    // libcuda's 2560-byte CARD_INFO: the window holds three whole entries.
    let mut r = raw_ioctl(device_kind::CTL, 0xCA00_46C8, 200, 2560 - 2560 % 72);
    r.main[0] = 1;
    put32(&mut r.main, 56, 3);
    r.main[72] = 1;
    put32(&mut r.main, 72 + 56, 0);
    r.main_len = 216;
    let IoctlOp::CardInfo { cards } = decode_op(&r, &abi535()).op else { panic!() };
    assert_eq!(cards.len(), 3);
    assert_eq!((cards[0].valid, cards[0].minor, cards[1].valid, cards[2].valid), (true, 3, true, false));
}

#[test]
fn uvm_and_frontend_numbers_are_told_apart_by_device() {
    // 0x2a is RM_CONTROL on a frontend node, an unknown UVM command on nvidia-uvm.
    let mut r = raw_ioctl(device_kind::UVM, 0x2a, 0x2a, 0);
    r.main_len = 32;
    assert_eq!(decode_op(&r, &abi535()).op, IoctlOp::UvmOther { cmd: 0x2a });
    r.dev.kind = device_kind::MODESET;
    assert_eq!(decode_op(&r, &abi535()).op, IoctlOp::OtherDevice { nr: 0x2a });
    r.dev.kind = 200; // unknown kind value
    assert_eq!(decode_op(&r, &abi535()).device.kind, DeviceKind::Unknown);
}

// ---------- malformed arguments ----------

#[test]
fn malformed_arguments_are_events_not_errors() {
    let abi = abi535();
    let base = |nr: u32, size: u32| {
        let mut r = raw_ioctl(device_kind::CTL, iowr(nr, size), nr, size);
        r.main_len = size.min(256) as u16;
        r
    };
    let m = |r: &IoctlRecord| decode_op(r, &abi).op;
    use MalformedReason::*;

    let mut r = base(esc::RM_FREE, 16);
    r.hdr.flags = flags::FAULT_MAIN;
    assert_eq!(m(&r), IoctlOp::Malformed { nr: 0x29, reason: FaultMain });

    // The status lies past the captured window: it cannot be read.
    let mut r = base(esc::RM_FREE, 16);
    r.main_len = 12;
    assert_eq!(m(&r), IoctlOp::Malformed { nr: 0x29, reason: ShortMain });

    // RM_ALLOC accepts only 32 and the version's NVOS64 size.
    for size in [0, 16, 33, 40, 56] {
        assert_eq!(m(&base(esc::RM_ALLOC, size)), IoctlOp::Malformed { nr: 0x2b, reason: BadSize }, "size {size}");
    }
    assert_eq!(m(&base(esc::RM_CONTROL, 36)), IoctlOp::Malformed { nr: 0x2a, reason: BadSize });
    assert_eq!(m(&base(esc::CARD_INFO, 100)), IoctlOp::Malformed { nr: 200, reason: BadSize });

    // A successful memory allocation whose size cannot be read.
    let mut r = base(esc::RM_ALLOC, 32);
    put32(&mut r.main, 12, class::NV01_MEMORY_LOCAL_USER);
    r.hdr.flags = flags::FAULT_NESTED;
    assert_eq!(m(&r), IoctlOp::Malformed { nr: 0x2b, reason: FaultNested });
    r.hdr.flags = 0;
    r.nested_len = 40; // size@64 not captured
    assert_eq!(m(&r), IoctlOp::Malformed { nr: 0x2b, reason: ShortNested });
    // ... but a failed one is still an RmAlloc (nothing was allocated).
    put32(&mut r.main, 28, 0x51);
    assert!(matches!(m(&r), IoctlOp::RmAlloc { memory: None, status: 0x51, .. }));
    put32(&mut r.main, 28, 0);
    let mut failed = r;
    failed.ret = -22;
    assert!(matches!(decode_op(&failed, &abi).op, IoctlOp::RmAlloc { memory: None, .. }));
    // A device with unreadable params is still a device (its instance unknown).
    put32(&mut r.main, 12, class::NV01_DEVICE_0);
    r.hdr.flags = flags::FAULT_NESTED;
    assert!(matches!(m(&r), IoctlOp::RmAlloc { device_instance: None, class: 0x80, .. }));

    let mut r = base(esc::RM_ALLOC, 32);
    r.hdr.flags = flags::XFER | flags::FAULT_XFER;
    assert_eq!(m(&r), IoctlOp::Malformed { nr: 0x2b, reason: FaultXfer });

    // UVM: no window captured (e.g. no plan) for a command that has a status.
    let mut r = raw_ioctl(device_kind::UVM, 72, 72, 0);
    assert_eq!(decode_op(&r, &abi).op, IoctlOp::Malformed { nr: 72, reason: ShortMain });
    r.main_len = 24;
    r.hdr.flags = flags::FAULT_MAIN;
    assert_eq!(decode_op(&r, &abi).op, IoctlOp::Malformed { nr: 72, reason: FaultMain });
    let mut r = raw_ioctl(device_kind::UVM, 33, 33, 0);
    r.main_len = 24;
    r.tail_off = 1184;
    r.hdr.flags = flags::FAULT_TAIL;
    assert_eq!(decode_op(&r, &abi).op, IoctlOp::Malformed { nr: 33, reason: FaultTail });
    r.hdr.flags = 0;
    r.tail_len = 8;
    assert_eq!(decode_op(&r, &abi).op, IoctlOp::Malformed { nr: 33, reason: ShortTail });
}

#[test]
fn success_needs_both_return_value_and_status() {
    let abi = abi535();
    let dev = encode::ctl(1);
    let mut e = ioctl_ev(dev, IoctlOp::RmFree { client: 1, parent: 1, handle: 2, status: 0 }, &abi);
    assert!(e.succeeded());
    e.ret = -14;
    assert!(!e.succeeded());
    e.ret = 0;
    e.op = IoctlOp::RmFree { client: 1, parent: 1, handle: 2, status: 0x33 };
    assert!(!e.succeeded());
    e.op = IoctlOp::RegisterFd { ctl_fd: 3 };
    assert!(e.succeeded());
    e.op = IoctlOp::Malformed { nr: 0x29, reason: MalformedReason::ShortMain };
    assert!(!e.succeeded());
}

// ---------- record-level errors ----------

#[test]
fn record_errors() {
    let abi = abi535();
    assert_eq!(decode(&[], &abi).unwrap_err().reason(), "short");
    assert_eq!(decode(&[0u8; 31], &abi).unwrap_err().reason(), "short");
    let mut h = [0u8; 32];
    h[0] = 99;
    assert_eq!(decode(&h, &abi).unwrap_err(), DecodeError::UnknownKind { kind: 99 });
    assert_eq!(decode(&[0u8; 600], &abi).unwrap_err().reason(), "unknown_kind");

    let ev = Event::ProcessFork { header: hdr(), child_pid: 5 };
    let mut b = encode::event(&ev, &abi);
    // The header declares less than the layout.
    b[4..8].copy_from_slice(&8u32.to_le_bytes());
    assert_eq!(decode(&b, &abi).unwrap_err().reason(), "bad_record_size");
    // Truncated.
    let b = encode::event(&ev, &abi);
    assert_eq!(decode(&b[..b.len() - 1], &abi).unwrap_err().reason(), "short");
    // Trailing bytes (a longer future record) are tolerated when the header says so.
    let mut longer = b.clone();
    longer.extend_from_slice(&[0xee; 8]);
    longer[4..8].copy_from_slice(&(b.len() as u32 + 8).to_le_bytes());
    assert_eq!(decode(&longer, &abi), Ok(ev));

    let mut r = raw_ioctl(device_kind::CTL, 0, 0x29, 16);
    r.main_len = 257;
    assert_eq!(
        decode(record_as_bytes(&r), &abi).unwrap_err(),
        DecodeError::BadLength { field: "main_len", len: 257, max: 256 }
    );
    r.main_len = 0;
    r.tail_len = 17;
    assert_eq!(decode(record_as_bytes(&r), &abi).unwrap_err().reason(), "bad_length");
    r.tail_len = 0;
    r.nested_len = u16::MAX;
    assert_eq!(decode(record_as_bytes(&r), &abi).unwrap_err().reason(), "bad_length");
}

#[test]
fn text_fields_keep_their_byte_length() {
    let mut comm = [0u8; 16];
    comm[..6].copy_from_slice(b"py\xffth\xc3");
    let r = ProcExecRecord { hdr: encode::wire_header::<ProcExecRecord>(&hdr(), 0), comm };
    match decode(record_as_bytes(&r), &abi535()) {
        Ok(Event::ProcessExec { comm, .. }) => assert_eq!(comm, "py?th?"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn cgroup_path_length_is_clamped() {
    let r = CgroupRmdirRecord {
        hdr: encode::wire_header::<CgroupRmdirRecord>(&hdr(), 0),
        id: 55,
        level: 3,
        path: [b'a'; 128],
        path_len: 4000,
    };
    match decode(record_as_bytes(&r), &abi535()) {
        Ok(Event::CgroupRemoved { cgroup_id: 55, path, .. }) => assert_eq!(path.len(), 128),
        other => panic!("{other:?}"),
    }
}

// ---------- round trips of every op ----------

#[test]
fn every_op_round_trips() {
    for abi in [abi530(), abi535(), abi550(), abi595()] {
        let ctl = encode::ctl(10);
        let gpu = encode::gpu(1, 11);
        let uvmd = encode::uvm_dev(12);
        let mem = |bytes, location, kind| Some(MemoryAlloc { bytes, location, kind });
        let frontend = vec![
            IoctlOp::RmAlloc {
                client: 0xc1d0_0001,
                parent: 0xc1d0_0001,
                handle: 0xc1d0_0001,
                class: class::NV01_ROOT_CLIENT,
                status: 0,
                form: RmAllocForm::Nvos21,
                memory: None,
                device_instance: None,
                subdevice_instance: None,
            },
            IoctlOp::RmAlloc {
                client: 1,
                parent: 1,
                handle: 2,
                class: 0x80,
                status: 0,
                form: RmAllocForm::Nvos64,
                memory: None,
                device_instance: Some(3),
                subdevice_instance: None,
            },
            IoctlOp::RmAlloc {
                client: 1,
                parent: 2,
                handle: 3,
                class: 0x2080,
                status: 0,
                form: RmAllocForm::Nvos64,
                memory: None,
                device_instance: None,
                subdevice_instance: Some(0),
            },
            IoctlOp::RmAlloc {
                client: 1,
                parent: 2,
                handle: 4,
                class: 0x40,
                status: 0,
                form: RmAllocForm::Nvos64,
                memory: mem(1 << 20, Location::Any, MemoryKind::Physical),
                device_instance: None,
                subdevice_instance: None,
            },
            IoctlOp::RmAlloc {
                client: 1,
                parent: 2,
                handle: 5,
                class: 0xa06c,
                status: 0,
                form: RmAllocForm::Nvos05,
                memory: None,
                device_instance: None,
                subdevice_instance: None,
            },
            IoctlOp::RmFree { client: 1, parent: 2, handle: 4, status: 0 },
            IoctlOp::VidHeapAlloc {
                client: 1,
                parent: 2,
                handle: 6,
                bytes: 4096,
                virtual_only: false,
                location: Location::Vidmem,
                status: 0,
            },
            IoctlOp::VidHeapFree { client: 1, parent: 2, handle: 6, status: 0 },
            IoctlOp::VidHeapOther { client: 1, function: 5, status: 0 },
            IoctlOp::AllocMemory {
                client: 1,
                parent: 2,
                handle: 7,
                class: 0x3e,
                memory: MemoryAlloc { bytes: 8192, location: Location::Sysmem, kind: MemoryKind::Physical },
                status: 0,
            },
            IoctlOp::RmControl { client: 1, object: 2, cmd: 0x800292, status: 0 },
            IoctlOp::RmDupObject { client: 9, parent: 8, handle: 7, src_client: 1, src_handle: 4, status: 0 },
            IoctlOp::RmMapMemory { client: 1, device: 2, memory: 4, offset: 0, length: 4096, fd: 20, status: 0 },
            IoctlOp::RmUnmapMemory { client: 1, device: 2, memory: 4, status: 0 },
            IoctlOp::RegisterFd { ctl_fd: 3 },
            IoctlOp::CheckVersion { reply: 1, version: "550.54.15".into() },
            IoctlOp::CardInfo {
                cards: vec![CardInfoEntry {
                    valid: true,
                    pci_domain: 0,
                    pci_bus: 0x41,
                    pci_slot: 0,
                    pci_function: 0,
                    vendor_id: 0x10de,
                    device_id: 0x2330,
                    gpu_id: 0x4100,
                    minor: 0,
                }],
            },
            IoctlOp::OtherFrontend { nr: esc::WAIT_OPEN_COMPLETE },
        ];
        for op in frontend {
            roundtrip(&Event::Ioctl(ioctl_ev(ctl, op.clone(), &abi)), &abi);
            roundtrip(&Event::Ioctl(ioctl_ev(gpu, op, &abi)), &abi);
        }
        let uuid = [7u8; 16];
        let uvm_ops = vec![
            IoctlOp::UvmInitialize { flags: 0, status: 0 },
            IoctlOp::UvmMmInitialize { uvm_fd: 4, status: 0 },
            IoctlOp::UvmRegisterGpu { uuid, rm_ctrl_fd: 3, client: 1, status: 0 },
            IoctlOp::UvmUnregisterGpu { uuid, status: 0 },
            IoctlOp::UvmCreateExternalRange { base: 1 << 40, length: 1 << 21, status: 0 },
            IoctlOp::UvmMapExternal {
                base: 1 << 40,
                length: 1 << 21,
                offset: 0,
                rm_ctrl_fd: 3,
                client: 1,
                memory_handle: 4,
                status: 0,
            },
            IoctlOp::UvmUnmapExternal { base: 1 << 40, length: 1 << 21, uuid, status: 0 },
            IoctlOp::UvmFree { base: 1 << 40, status: 0 },
            IoctlOp::UvmPageableMemAccess { enabled: true, status: 0 },
            IoctlOp::UvmValidateVaRange { base: 1 << 40, length: 4096, status: 0 },
            IoctlOp::UvmOther { cmd: uvm::DEINITIALIZE },
        ];
        for op in uvm_ops {
            roundtrip(&Event::Ioctl(ioctl_ev(uvmd, op, &abi)), &abi);
        }
        for (kind, nrs) in [
            (DeviceKind::Ctl, vec![esc::RM_ALLOC, esc::RM_FREE, esc::CARD_INFO, esc::REGISTER_FD, 0x99]),
            (DeviceKind::Uvm, vec![uvm::MAP_EXTERNAL_ALLOCATION, uvm::FREE, uvm::INITIALIZE]),
        ] {
            let dev = Device { kind, minor: 0, file_id: 1 };
            for nr in nrs {
                for reason in encode::malformed_reasons(kind, nr) {
                    let mut e = ioctl_ev(dev, IoctlOp::Malformed { nr, reason }, &abi);
                    e.xfer = reason == MalformedReason::FaultXfer;
                    roundtrip(&Event::Ioctl(e), &abi);
                }
            }
        }
    }
}

#[test]
fn lifecycle_events_round_trip() {
    let abi = abi535();
    let h = hdr();
    let dev = encode::gpu(0, 77);
    for ev in [
        Event::FdOpened { header: h, device: dev, fd: 5, open_flags: 0o2000002, seeded: false },
        Event::FdOpened { header: h, device: dev, fd: 5, open_flags: 0, seeded: true },
        Event::FdClosed { header: h, device: dev, fd: 5, replaced: true },
        Event::FdDuped { header: h, device: dev, old_fd: 5, new_fd: 9 },
        Event::UvmMapped {
            header: h,
            device: encode::uvm_dev(3),
            fd: 6,
            addr: 0x7f00_0000_0000,
            len: 1 << 21,
            offset: 0x7f00_0000_0000,
            prot: 3,
            map_flags: 0x11,
            ret: 0x7f00_0000_0000,
        },
        Event::UvmUnmapped { header: h, addr: 0x7f00_0000_0000, len: 1 << 21, ret: 0 },
        Event::ProcessExec { header: h, comm: "python3".into() },
        Event::ProcessExit { header: h, comm: "sixteen-chars-xx".into() },
        Event::ProcessFork { header: h, child_pid: 99 },
        Event::CgroupRemoved { header: h, cgroup_id: 1234, level: 4, path: "/kubepods/pod-x/ctr".into() },
    ] {
        roundtrip(&ev, &abi);
    }
}

// ---------- property tests ----------

const KNOWN_FRONTEND: [u32; 12] = [
    esc::RM_ALLOC_MEMORY,
    esc::RM_ALLOC_OBJECT,
    esc::RM_FREE,
    esc::RM_CONTROL,
    esc::RM_ALLOC,
    esc::RM_DUP_OBJECT,
    esc::RM_VID_HEAP_CONTROL,
    esc::RM_MAP_MEMORY,
    esc::RM_UNMAP_MEMORY,
    esc::CARD_INFO,
    esc::REGISTER_FD,
    esc::CHECK_VERSION_STR,
];
const KNOWN_UVM: [u32; 10] = [
    uvm::INITIALIZE,
    uvm::MM_INITIALIZE,
    uvm::REGISTER_GPU,
    uvm::UNREGISTER_GPU,
    uvm::CREATE_EXTERNAL_RANGE,
    uvm::MAP_EXTERNAL_ALLOCATION,
    uvm::UNMAP_EXTERNAL,
    uvm::FREE,
    uvm::PAGEABLE_MEM_ACCESS,
    uvm::VALIDATE_VA_RANGE,
];

fn arb_abi() -> impl Strategy<Value = DriverAbi> {
    prop_oneof![Just(abi530()), Just(abi535()), Just(abi550()), Just(abi595()), Just(abi535())]
}

fn arb_header() -> impl Strategy<Value = Header> {
    (any::<u64>(), any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(ktime_ns, tgid, pid, cgroup_id)| Header {
        ktime_ns,
        tgid,
        pid,
        cgroup_id,
    })
}

fn arb_device_kind() -> impl Strategy<Value = DeviceKind> {
    prop_oneof![
        4 => Just(DeviceKind::Ctl),
        2 => Just(DeviceKind::Gpu),
        3 => Just(DeviceKind::Uvm),
        1 => Just(DeviceKind::UvmTools),
        1 => Just(DeviceKind::Modeset),
        1 => Just(DeviceKind::Caps),
        1 => Just(DeviceKind::Unknown),
    ]
}

fn arb_device() -> impl Strategy<Value = Device> {
    (arb_device_kind(), any::<u32>(), any::<u64>()).prop_map(|(kind, minor, file_id)| Device { kind, minor, file_id })
}

fn arb_status() -> impl Strategy<Value = u32> {
    prop_oneof![3 => Just(0u32), 1 => any::<u32>()]
}

fn arb_location() -> impl Strategy<Value = Location> {
    prop_oneof![Just(Location::Vidmem), Just(Location::Sysmem), Just(Location::Any), Just(Location::Unknown)]
}

fn arb_class() -> impl Strategy<Value = u32> {
    prop_oneof![
        prop::sample::select(vec![
            0x0u32, 0x1, 0x41, 0x80, 0x2080, 0x40, 0x3e, 0x90ce, 0x50a0, 0xc2, 0xf8, 0x71, 0x70, 0xa06c, 0x90f1,
            0xc86f, 0xcbc0,
        ]),
        any::<u32>(),
    ]
}

/// An RM_ALLOC op consistent with what the decoder can produce for a call returning `ret`.
fn arb_rm_alloc(ret: i64) -> impl Strategy<Value = IoctlOp> {
    let forms = prop_oneof![Just(RmAllocForm::Nvos21), Just(RmAllocForm::Nvos64), Just(RmAllocForm::Nvos05)];
    (
        forms,
        arb_class(),
        any::<(u32, u32, u32)>(),
        arb_status(),
        any::<u64>(),
        arb_location(),
        any::<bool>(),
        any::<Option<u32>>(),
    )
        .prop_map(move |(form, c, (client, parent, handle), status, bytes, loc, keep, inst)| {
            let client = if class::is_root(c) { handle } else { client };
            let succeeded = ret == 0 && status == 0;
            let with_params = form != RmAllocForm::Nvos05;
            let memory = match ioctl::memory_class(c) {
                Some((kind, _, fixed)) if with_params && (succeeded || keep) => {
                    Some(MemoryAlloc { bytes, location: fixed.unwrap_or(loc), kind })
                }
                _ => None,
            };
            // A successful memory-class NVOS05 cannot carry a size: use a failed status then.
            let status =
                if !with_params && ioctl::memory_class(c).is_some() && ret == 0 && status == 0 { 1 } else { status };
            IoctlOp::RmAlloc {
                client,
                parent,
                handle,
                class: c,
                status,
                form,
                memory,
                device_instance: if with_params && c == 0x80 { inst } else { None },
                subdevice_instance: if with_params && c == 0x2080 { inst } else { None },
            }
        })
}

fn arb_frontend_op(ret: i64) -> BoxedStrategy<IoctlOp> {
    let u = any::<u32>;
    prop_oneof![
        4 => arb_rm_alloc(ret).boxed(),
        1 => (u(), u(), u(), arb_status()).prop_map(|(client, parent, handle, status)| IoctlOp::RmFree { client, parent, handle, status }).boxed(),
        1 => (u(), u(), u(), any::<u64>(), any::<bool>(), arb_location(), arb_status()).prop_map(
            |(client, parent, handle, bytes, virtual_only, location, status)| IoctlOp::VidHeapAlloc {
                client, parent, handle, bytes, virtual_only, location, status
            }
        ).boxed(),
        1 => (u(), u(), u(), arb_status()).prop_map(|(client, parent, handle, status)| IoctlOp::VidHeapFree { client, parent, handle, status }).boxed(),
        1 => (u(), u().prop_filter("not alloc/free", |f| *f != 2 && *f != 3), arb_status())
            .prop_map(|(client, function, status)| IoctlOp::VidHeapOther { client, function, status }).boxed(),
        1 => (u(), u(), u(), arb_class(), any::<u64>(), prop_oneof![Just(Location::Vidmem), Just(Location::Sysmem), Just(Location::Unknown)], arb_status())
            .prop_map(|(client, parent, handle, c, bytes, location, status)| IoctlOp::AllocMemory {
                client, parent, handle, class: c,
                memory: MemoryAlloc { bytes, location, kind: ioctl::nvos02_kind(c) },
                status,
            }).boxed(),
        1 => (u(), u(), u(), arb_status()).prop_map(|(client, object, cmd, status)| IoctlOp::RmControl { client, object, cmd, status }).boxed(),
        1 => (u(), u(), u(), u(), u(), arb_status()).prop_map(|(client, parent, handle, src_client, src_handle, status)| IoctlOp::RmDupObject {
            client, parent, handle, src_client, src_handle, status
        }).boxed(),
        1 => (u(), u(), u(), any::<u64>(), any::<u64>(), any::<i32>(), arb_status()).prop_map(
            |(client, device, memory, offset, length, fd, status)| IoctlOp::RmMapMemory { client, device, memory, offset, length, fd, status }
        ).boxed(),
        1 => (u(), u(), u(), arb_status()).prop_map(|(client, device, memory, status)| IoctlOp::RmUnmapMemory { client, device, memory, status }).boxed(),
        1 => any::<i32>().prop_map(|ctl_fd| IoctlOp::RegisterFd { ctl_fd }).boxed(),
        1 => prop::collection::vec(
            (any::<bool>(), u(), any::<(u8, u8, u8)>(), any::<(u16, u16)>(), u(), u()).prop_map(
                |(valid, pci_domain, (pci_bus, pci_slot, pci_function), (vendor_id, device_id), gpu_id, minor)| CardInfoEntry {
                    valid, pci_domain, pci_bus, pci_slot, pci_function, vendor_id, device_id, gpu_id, minor
                }
            ),
            1..=3,
        ).prop_map(|cards| IoctlOp::CardInfo { cards }).boxed(),
        1 => (u(), "[ -~]{0,64}").prop_map(|(reply, version)| IoctlOp::CheckVersion { reply, version }).boxed(),
        1 => u().prop_filter("unknown nr", |nr| !KNOWN_FRONTEND.contains(nr)).prop_map(|nr| IoctlOp::OtherFrontend { nr }).boxed(),
    ]
    .boxed()
}

fn arb_uvm_op() -> BoxedStrategy<IoctlOp> {
    let u = any::<u32>;
    let uuid = any::<[u8; 16]>;
    prop_oneof![
        (any::<u64>(), arb_status()).prop_map(|(flags, status)| IoctlOp::UvmInitialize { flags, status }),
        (any::<i32>(), arb_status()).prop_map(|(uvm_fd, status)| IoctlOp::UvmMmInitialize { uvm_fd, status }),
        (uuid(), any::<i32>(), u(), arb_status()).prop_map(|(uuid, rm_ctrl_fd, client, status)| {
            IoctlOp::UvmRegisterGpu { uuid, rm_ctrl_fd, client, status }
        }),
        (uuid(), arb_status()).prop_map(|(uuid, status)| IoctlOp::UvmUnregisterGpu { uuid, status }),
        (any::<u64>(), any::<u64>(), arb_status()).prop_map(|(base, length, status)| IoctlOp::UvmCreateExternalRange {
            base,
            length,
            status
        }),
        (any::<(u64, u64, u64)>(), any::<i32>(), u(), u(), arb_status()).prop_map(
            |((base, length, offset), rm_ctrl_fd, client, memory_handle, status)| IoctlOp::UvmMapExternal {
                base,
                length,
                offset,
                rm_ctrl_fd,
                client,
                memory_handle,
                status
            }
        ),
        (any::<u64>(), any::<u64>(), uuid(), arb_status())
            .prop_map(|(base, length, uuid, status)| IoctlOp::UvmUnmapExternal { base, length, uuid, status }),
        (any::<u64>(), arb_status()).prop_map(|(base, status)| IoctlOp::UvmFree { base, status }),
        (any::<bool>(), arb_status()).prop_map(|(enabled, status)| IoctlOp::UvmPageableMemAccess { enabled, status }),
        (any::<u64>(), any::<u64>(), arb_status()).prop_map(|(base, length, status)| IoctlOp::UvmValidateVaRange {
            base,
            length,
            status
        }),
        u().prop_filter("unknown cmd", |c| !KNOWN_UVM.contains(c)).prop_map(|cmd| IoctlOp::UvmOther { cmd }),
    ]
    .boxed()
}

/// A malformed op that can arise on `kind` (None if none can).
fn arb_malformed(kind: DeviceKind) -> BoxedStrategy<Option<IoctlOp>> {
    let nrs: Vec<u32> = match kind {
        DeviceKind::Ctl | DeviceKind::Gpu => KNOWN_FRONTEND.to_vec(),
        DeviceKind::Uvm => KNOWN_UVM.to_vec(),
        _ => return Just(None).boxed(),
    };
    (prop::sample::select(nrs), any::<prop::sample::Index>())
        .prop_map(move |(nr, i)| {
            let reasons = encode::malformed_reasons(kind, nr);
            (!reasons.is_empty()).then(|| IoctlOp::Malformed { nr, reason: reasons[i.index(reasons.len())] })
        })
        .boxed()
}

fn arb_ioctl() -> impl Strategy<Value = IoctlEvent> {
    (
        arb_header(),
        arb_device(),
        any::<i32>(),
        any::<u32>(),
        prop_oneof![3 => Just(0i64), 1 => any::<i64>()],
        any::<u64>(),
        any::<bool>(),
    )
        .prop_flat_map(|(header, device, fd, cmd, ret, duration_ns, xfer)| {
            let op: BoxedStrategy<IoctlOp> = match device.kind {
                DeviceKind::Ctl | DeviceKind::Gpu => prop_oneof![
                    9 => arb_frontend_op(ret),
                    1 => arb_malformed(device.kind).prop_filter_map("malformed", |o| o),
                ]
                .boxed(),
                DeviceKind::Uvm => {
                    prop_oneof![9 => arb_uvm_op(), 1 => arb_malformed(device.kind).prop_filter_map("malformed", |o| o)]
                        .boxed()
                }
                _ => any::<u32>().prop_map(|nr| IoctlOp::OtherDevice { nr }).boxed(),
            };
            op.prop_map(move |op| {
                // Nested faults only show on calls that succeeded; a faulted xfer is an xfer.
                let ret = match op {
                    IoctlOp::Malformed {
                        reason: MalformedReason::FaultNested | MalformedReason::ShortNested, ..
                    } => 0,
                    _ => ret,
                };
                let xfer = xfer || matches!(op, IoctlOp::Malformed { reason: MalformedReason::FaultXfer, .. });
                IoctlEvent { header, device, fd, cmd, ret, duration_ns, xfer, op }
            })
        })
}

fn arb_event() -> impl Strategy<Value = Event> {
    let h = arb_header;
    prop_oneof![
        1 => (h(), arb_device(), any::<i32>(), any::<u32>(), any::<bool>()).prop_map(|(header, device, fd, open_flags, seeded)| {
            Event::FdOpened { header, device, fd, open_flags, seeded }
        }),
        1 => (h(), arb_device(), any::<i32>(), any::<bool>())
            .prop_map(|(header, device, fd, replaced)| Event::FdClosed { header, device, fd, replaced }),
        1 => (h(), arb_device(), any::<i32>(), any::<i32>())
            .prop_map(|(header, device, old_fd, new_fd)| Event::FdDuped { header, device, old_fd, new_fd }),
        8 => arb_ioctl().prop_map(Event::Ioctl),
        1 => (h(), arb_device(), any::<i32>(), any::<(u64, u64, u64)>(), any::<u32>(), any::<u64>(), any::<i64>()).prop_map(
            |(header, device, fd, (addr, len, offset), prot, map_flags, ret)| Event::UvmMapped {
                header,
                device,
                fd,
                addr,
                len,
                offset,
                prot,
                map_flags,
                ret
            }
        ),
        1 => (h(), any::<u64>(), any::<u64>(), any::<i64>())
            .prop_map(|(header, addr, len, ret)| Event::UvmUnmapped { header, addr, len, ret }),
        1 => (h(), "[ -~]{0,16}").prop_map(|(header, comm)| Event::ProcessExec { header, comm }),
        1 => (h(), "[ -~]{0,16}").prop_map(|(header, comm)| Event::ProcessExit { header, comm }),
        1 => (h(), any::<u32>()).prop_map(|(header, child_pid)| Event::ProcessFork { header, child_pid }),
        1 => (h(), any::<u64>(), any::<u32>(), "[ -~]{0,128}")
            .prop_map(|(header, cgroup_id, level, path)| Event::CgroupRemoved { header, cgroup_id, level, path }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 20_000, ..ProptestConfig::default() })]

    /// decode(encode(x)) == x for every event the decoder can produce, on every layout.
    #[test]
    fn prop_decode_encode_roundtrip(ev in arb_event(), abi in arb_abi()) {
        let bytes = encode::event(&ev, &abi);
        prop_assert_eq!(decode(&bytes, &abi), Ok(ev));
    }

    /// Valid records with random bytes overwritten: Ok or Err, never a panic; malformed ops never
    /// count as success.
    #[test]
    fn prop_mutated_records_never_panic(
        ev in arb_event(),
        abi in arb_abi(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let mut bytes = encode::event(&ev, &abi);
        for (i, v) in edits {
            let n = bytes.len();
            bytes[i.index(n)] = v;
        }
        if do_cut {
            let n = bytes.len();
            bytes.truncate(cut.index(n + 1));
        }
        let decoded = decode(&bytes, &abi);
        if let Ok(Event::Ioctl(e)) = &decoded
            && matches!(e.op, IoctlOp::Malformed { .. })
        {
            prop_assert!(!e.succeeded());
        }
        // Whatever decodes re-encodes to a record that decodes to the same event.
        if let Ok(ev) = decoded {
            prop_assert_eq!(decode(&encode::event(&ev, &abi), &abi), Ok(ev));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 50_000, ..ProptestConfig::default() })]

    /// Any bytes at all (biased towards real kinds and sizes): Ok or Err, never a panic.
    #[test]
    fn prop_arbitrary_bytes_never_panic(
        kind in prop_oneof![0u16..12, any::<u16>()],
        flags in any::<u16>(),
        size in prop_oneof![Just(None), any::<u32>().prop_map(Some)],
        body in prop::collection::vec(any::<u8>(), 0..720),
        abi in arb_abi(),
    ) {
        let mut bytes = Vec::with_capacity(body.len() + 8);
        bytes.extend_from_slice(&kind.to_le_bytes());
        bytes.extend_from_slice(&flags.to_le_bytes());
        let declared = size.unwrap_or((body.len() + 8) as u32);
        bytes.extend_from_slice(&declared.to_le_bytes());
        bytes.extend_from_slice(&body);
        for b in [&bytes[..], &body[..]] {
            if let Ok(ev) = decode(b, &abi) {
                prop_assert_eq!(decode(&encode::event(&ev, &abi), &abi), Ok(ev));
            }
        }
    }
}

/// The short form of the decode fuzzing in every CI run: each input of the kept corpus
/// (`fuzz/corpus/decode`, grown by `cargo xtask reliability`'s fuzz runs) through the fuzz
/// target's oracles. A missing or emptied corpus fails rather than passing on nothing.
#[test]
fn the_kept_fuzz_corpus_passes_the_fuzz_oracles() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/decode");
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let (mut inputs, mut decoded) = (0, 0);
    for entry in entries {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let ok = std::panic::catch_unwind(|| fuzz::check(&data))
            .unwrap_or_else(|_| panic!("{} fails the fuzz oracles", path.display()));
        inputs += 1;
        decoded += usize::from(ok);
    }
    assert!(inputs >= 100, "the kept corpus has {inputs} inputs; it should have hundreds");
    assert!(decoded * 4 >= inputs, "most inputs should decode: {decoded} of {inputs}");
}
