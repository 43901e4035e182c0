use std::collections::BTreeSet;

use gpu_tracer_proto::{
    prost::Message,
    v1::{self, event::Payload},
};
use serde_json::Value;
use tracer_common::{
    flags, kind,
    nv::{self, DEFAULT_DRIVER_VERSION, DriverAbi},
};

use super::proto::device_proto;
use super::*;
use crate::decode::{
    self, CardInfoEntry, Device, DeviceKind, Event, Header, IoctlOp, Location, MalformedReason, MemoryAlloc,
    MemoryKind, RmAllocForm, encode,
};
use crate::model::EventContext;

fn hdr() -> Header {
    Header { ktime_ns: 1_000_000_123, tgid: 4242, pid: 4243, cgroup_id: 7777 }
}

fn enrichment() -> EventContext {
    EventContext {
        wall_time_unix_ns: 1_790_000_000_000_000_000,
        process_start_time_ns: 99_000_000,
        cgroup_path: Some("/kubepods.slice/kubepods-pod1234.slice/cri-containerd-abc.scope".into()),
        comm: Some("python3".into()),
        released_bytes: Some(2 << 20),
        kernel_name: Some("sgemm_kernel".into()),
        container: None,
    }
}

const UUID: [u8; 16] = [0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];

/// One of every `IoctlOp` variant, each on the device it is issued on.
fn ops() -> Vec<(Device, IoctlOp)> {
    use IoctlOp::*;
    let (ctl, gpu, uvm) = (encode::ctl(1), encode::gpu(0, 2), encode::uvm_dev(3));
    let mem = MemoryAlloc { bytes: 2 << 20, location: Location::Vidmem, kind: MemoryKind::Physical };
    vec![
        (
            ctl,
            RmAlloc {
                client: 0xc1d0_0001,
                parent: 0xcaf0_0002,
                handle: 0xcaf0_0010,
                class: 0x40,
                status: 0,
                form: RmAllocForm::Nvos64,
                memory: Some(mem),
                device_instance: None,
                subdevice_instance: None,
            },
        ),
        (ctl, RmFree { client: 0xc1d0_0001, parent: 0xcaf0_0002, handle: 0xcaf0_0010, status: 0 }),
        (
            ctl,
            VidHeapAlloc {
                client: 1,
                parent: 2,
                handle: 3,
                bytes: 1 << 20,
                virtual_only: true,
                location: Location::Any,
                status: 0,
            },
        ),
        (ctl, VidHeapFree { client: 1, parent: 2, handle: 3, status: 0 }),
        (ctl, VidHeapOther { client: 1, function: 9, status: 0 }),
        (
            gpu,
            AllocMemory {
                client: 1,
                parent: 2,
                handle: 4,
                class: 0x3e,
                memory: MemoryAlloc { bytes: 4096, location: Location::Sysmem, kind: MemoryKind::Physical },
                status: 0,
            },
        ),
        (ctl, RmControl { client: 1, object: 2, cmd: 0x2080_014a, status: 0x51 }),
        (ctl, RmDupObject { client: 1, parent: 2, handle: 5, src_client: 6, src_handle: 7, status: 0 }),
        (ctl, RmMapMemory { client: 1, device: 2, memory: 3, offset: 0, length: 4096, fd: 9, status: 0 }),
        (ctl, RmUnmapMemory { client: 1, device: 2, memory: 3, status: 0 }),
        (gpu, RegisterFd { ctl_fd: 5 }),
        (
            ctl,
            CardInfo {
                cards: vec![CardInfoEntry {
                    valid: true,
                    pci_domain: 0,
                    pci_bus: 0x41,
                    pci_slot: 0,
                    pci_function: 0,
                    vendor_id: 0x10de,
                    device_id: 0x2335,
                    gpu_id: 0x4100,
                    minor: 0,
                }],
            },
        ),
        (ctl, CheckVersion { reply: 0, version: "535.261.03".into() }),
        (ctl, OtherFrontend { nr: nv::esc::SYS_PARAMS }),
        (uvm, UvmInitialize { flags: 0, status: 0 }),
        (uvm, UvmMmInitialize { uvm_fd: 7, status: 0 }),
        (uvm, UvmRegisterGpu { uuid: UUID, rm_ctrl_fd: 5, client: 1, status: 0 }),
        (uvm, UvmUnregisterGpu { uuid: UUID, status: 0 }),
        (uvm, UvmCreateExternalRange { base: 0x7f00_0000_0000, length: 1 << 21, status: 0 }),
        (
            uvm,
            UvmMapExternal {
                base: 0x7f00_0000_0000,
                length: 1 << 21,
                offset: 0,
                rm_ctrl_fd: 5,
                client: 1,
                memory_handle: 0xcaf0_0010,
                status: 0,
            },
        ),
        (uvm, UvmUnmapExternal { base: 0x7f00_0000_0000, length: 1 << 21, uuid: UUID, status: 0 }),
        (uvm, UvmFree { base: 0x7f00_0000_0000, status: 0 }),
        (uvm, UvmPageableMemAccess { enabled: true, status: 0 }),
        (uvm, UvmValidateVaRange { base: 0x7f00_0000_0000, length: 4096, status: 0 }),
        (uvm, UvmOther { cmd: 0x30 }),
        (Device { kind: DeviceKind::Modeset, minor: 254, file_id: 4 }, OtherDevice { nr: 0 }),
        (ctl, Malformed { nr: nv::esc::RM_ALLOC, reason: MalformedReason::FaultMain }),
    ]
}

/// The message kind an op must become. Exhaustive, so a new op fails to compile here.
fn expected_kind(op: &IoctlOp) -> v1::EventKind {
    use IoctlOp::*;
    use v1::EventKind as K;
    match op {
        RmAlloc { .. } => K::RmAlloc,
        RmFree { .. } => K::RmFree,
        VidHeapAlloc { .. } => K::VidHeapAlloc,
        VidHeapFree { .. } => K::VidHeapFree,
        AllocMemory { .. } => K::AllocMemory,
        RmControl { .. } => K::RmControl,
        RmDupObject { .. } => K::RmDupObject,
        RmMapMemory { .. } => K::RmMapMemory,
        UvmRegisterGpu { .. } => K::UvmRegisterGpu,
        UvmMapExternal { .. } => K::UvmMapExternal,
        UvmFree { .. } => K::UvmFree,
        VidHeapOther { .. }
        | RmUnmapMemory { .. }
        | RegisterFd { .. }
        | CardInfo { .. }
        | CheckVersion { .. }
        | OtherFrontend { .. }
        | OtherDevice { .. } => K::OtherIoctl,
        UvmInitialize { .. }
        | UvmMmInitialize { .. }
        | UvmUnregisterGpu { .. }
        | UvmCreateExternalRange { .. }
        | UvmUnmapExternal { .. }
        | UvmPageableMemAccess { .. }
        | UvmValidateVaRange { .. }
        | UvmOther { .. } => K::UvmOther,
        Malformed { .. } => K::Malformed,
    }
}

fn abi() -> DriverAbi {
    DriverAbi::for_version(DEFAULT_DRIVER_VERSION)
}

/// One of every `Event` variant (the ioctl ones from [`ops`]).
pub(crate) fn events() -> Vec<Event> {
    let h = hdr();
    let ctl = encode::ctl(1);
    let uvm = encode::uvm_dev(3);
    let mut v = vec![
        Event::FdOpened { header: h, device: ctl, fd: 5, open_flags: 0x80002, seeded: false },
        Event::FdClosed { header: h, device: ctl, fd: 5, replaced: true },
        Event::FdDuped { header: h, device: ctl, old_fd: 5, new_fd: 9 },
        Event::UvmMapped {
            header: h,
            device: uvm,
            fd: 7,
            addr: 0,
            len: 1 << 21,
            offset: 0,
            prot: 3,
            map_flags: 1,
            ret: 0x7f00_0020_0000,
        },
        Event::UvmUnmapped { header: h, addr: 0x7f00_0020_0000, len: 1 << 21, ret: 0 },
        Event::ProcessExec { header: h, comm: "trainer".into() },
        Event::ProcessExit { header: h, comm: "trainer".into() },
        Event::ProcessFork { header: h, child_pid: 5000 },
        Event::CgroupRemoved { header: h, cgroup_id: 8888, level: 3, path: "/kubepods.slice/x".into() },
    ];
    v.extend(ops().into_iter().map(|(d, op)| Event::Ioctl(encode::ioctl(h, d, 5, op, &abi()))));
    v
}

fn hdr_of(m: &v1::Event) -> &v1::Header {
    m.header.as_ref().expect("header is always set")
}

#[test]
fn every_ioctl_op_maps_to_its_kind() {
    let ops = ops();
    let names: BTreeSet<_> = ops.iter().map(|(_, op)| op.kind_name()).collect();
    assert_eq!(names.len(), ops.len(), "one sample per IoctlOp variant");
    for (device, op) in ops {
        let io = encode::ioctl(hdr(), device, 5, op.clone(), &abi());
        let m = to_proto(&Event::Ioctl(io.clone()), &enrichment());
        assert_eq!(hdr_of(&m).kind(), expected_kind(&op), "{op:?}");
        assert_eq!(m.fd, Some(5));
        assert_eq!(m.device, Some(device_proto(&device)));
        assert_eq!(hdr_of(&m).duration_ns, io.duration_ns);
        assert_eq!(hdr_of(&m).syscall_ret, io.ret);
    }
}

#[test]
fn every_event_converts_with_a_consistent_header() {
    let e = enrichment();
    let all = events();
    let kinds: BTreeSet<_> = all.iter().map(|ev| ev.kind_name()).collect();
    assert_eq!(kinds.len(), 10, "every Event variant is sampled");
    for ev in &all {
        let m = to_proto(ev, &e);
        let h = hdr_of(&m);
        assert_eq!(h.kind, event_kind(m.payload.as_ref().unwrap()) as i32, "{ev:?}");
        assert_ne!(h.kind(), v1::EventKind::Unspecified);
        assert_eq!((h.ktime_ns, h.tgid, h.pid, h.cgroup_id), (1_000_000_123, 4242, 4243, 7777));
        assert_eq!(h.wall_time_unix_ns, e.wall_time_unix_ns);
        assert_eq!(h.process_start_time_ns, e.process_start_time_ns);
        assert_eq!(h.cgroup_path, e.cgroup_path.clone().unwrap());
        let on_fd = !matches!(
            ev,
            Event::UvmUnmapped { .. }
                | Event::ProcessExec { .. }
                | Event::ProcessExit { .. }
                | Event::ProcessFork { .. }
                | Event::CgroupRemoved { .. }
                | Event::CudaAlloc { .. }
                | Event::CudaFree { .. }
                | Event::CudaFunction { .. }
                | Event::CudaLaunch { .. }
        );
        assert_eq!(m.device.is_some(), on_fd, "{ev:?}");
        assert_eq!(m.fd.is_some(), on_fd, "{ev:?}");
        // Exec and exit name the process themselves.
        let comm =
            if matches!(ev, Event::ProcessExec { .. } | Event::ProcessExit { .. }) { "trainer" } else { "python3" };
        assert_eq!(h.comm, comm);
    }
}

#[test]
fn non_ioctl_events_carry_their_fields() {
    let e = EventContext::default();
    let h = hdr();
    let m = to_proto(&Event::FdDuped { header: h, device: encode::ctl(1), old_fd: 5, new_fd: 9 }, &e);
    assert_eq!((m.fd, hdr_of(&m).syscall_ret), (Some(5), 9));
    assert_eq!(m.payload, Some(Payload::FdDuped(v1::FdDuped { new_fd: 9 })));

    let seeded = Event::FdOpened { header: h, device: encode::gpu(3, 2), fd: 6, open_flags: 0, seeded: true };
    let m = to_proto(&seeded, &e);
    assert_eq!(hdr_of(&m).syscall_ret, 0, "a seeded fd was not opened by a syscall we saw");
    assert_eq!(m.device, Some(v1::Device { kind: v1::DeviceKind::Gpu as i32, minor: 3, file_id: 2 }));
    assert_eq!(hdr_of(&m).cgroup_path, "");
    assert_eq!(hdr_of(&m).comm, "");

    // A successful mmap reports the mapped address, a failed one its hint and the errno.
    let map = |ret| Event::UvmMapped {
        header: h,
        device: encode::uvm_dev(3),
        fd: 7,
        addr: 0x1000,
        len: 4096,
        offset: 0,
        prot: 3,
        map_flags: 1,
        ret,
    };
    let m = to_proto(&map(0x7f00_0000_0000), &e);
    assert_eq!(m.payload, Some(Payload::ManagedMap(v1::ManagedMap { addr: 0x7f00_0000_0000, length: 4096 })));
    let m = to_proto(&map(-12), &e);
    assert_eq!(m.payload, Some(Payload::ManagedMap(v1::ManagedMap { addr: 0x1000, length: 4096 })));
    assert_eq!(hdr_of(&m).syscall_ret, -12);

    let m = to_proto(&Event::CgroupRemoved { header: h, cgroup_id: 8888, level: 3, path: "/a/b".into() }, &e);
    assert_eq!(hdr_of(&m).cgroup_id, 7777);
    assert_eq!(
        m.payload,
        Some(Payload::CgroupRemoved(v1::CgroupRemoved { cgroup_id: 8888, level: 3, path: "/a/b".into() }))
    );
}

#[test]
fn ioctl_fields_status_and_release() {
    let e = enrichment();
    let ctl = encode::ctl(1);
    let free = IoctlOp::RmFree { client: 1, parent: 1, handle: 1, status: 0 };
    let m = to_proto(&Event::Ioctl(encode::ioctl(hdr(), ctl, 5, free, &abi())), &e);
    assert_eq!(
        m.payload,
        Some(Payload::RmFree(v1::RmFree {
            client: 1,
            parent: 1,
            handle: 1,
            status: 0,
            success: true,
            bytes_released: 2 << 20
        }))
    );

    // success needs both the syscall and the RM status.
    let ctrl = IoctlOp::RmControl { client: 1, object: 2, cmd: 0x2080_014a, status: 0x51 };
    let m = to_proto(&Event::Ioctl(encode::ioctl(hdr(), ctl, 5, ctrl, &abi())), &e);
    match m.payload {
        Some(Payload::RmControl(c)) => assert!(c.status == 0x51 && !c.success),
        p => panic!("{p:?}"),
    }
    let mut io =
        encode::ioctl(hdr(), ctl, 5, IoctlOp::VidHeapFree { client: 1, parent: 2, handle: 3, status: 0 }, &abi());
    io.ret = -22;
    let m = to_proto(&Event::Ioctl(io), &EventContext::default());
    assert_eq!(hdr_of(&m).syscall_ret, -22);
    match m.payload {
        Some(Payload::VidHeapFree(f)) => assert!(!f.success && f.bytes_released == 0),
        p => panic!("{p:?}"),
    }

    // Ops without a message keep their escape number and size, or their UVM command.
    let op = IoctlOp::RmUnmapMemory { client: 1, device: 2, memory: 3, status: 0 };
    let io = encode::ioctl(hdr(), ctl, 5, op, &abi());
    let m = to_proto(&Event::Ioctl(io.clone()), &e);
    let want = v1::OtherIoctl { nr: nv::esc::RM_UNMAP_MEMORY, size: nv::ioc_size(io.cmd) };
    assert_eq!(m.payload, Some(Payload::OtherIoctl(want)));
    assert_eq!(want.size, nv::size::NVOS34);
    let io = encode::ioctl(hdr(), encode::uvm_dev(3), 7, IoctlOp::UvmInitialize { flags: 0, status: 0 }, &abi());
    let m = to_proto(&Event::Ioctl(io.clone()), &e);
    assert_eq!(m.payload, Some(Payload::UvmOther(v1::UvmOther { cmd: io.cmd })));
    let tools = Device { kind: DeviceKind::UvmTools, minor: 0, file_id: 8 };
    let m = to_proto(&Event::Ioctl(encode::ioctl(hdr(), tools, 8, IoctlOp::OtherDevice { nr: 0x21 }, &abi())), &e);
    assert_eq!(m.payload, Some(Payload::UvmOther(v1::UvmOther { cmd: 0x21 })));

    // NV_ESC_RM_ALLOC_OBJECT has no form of its own in v1.
    let op = IoctlOp::RmAlloc {
        client: 1,
        parent: 2,
        handle: 3,
        class: 0x906f,
        status: 0,
        form: RmAllocForm::Nvos05,
        memory: None,
        device_instance: None,
        subdevice_instance: None,
    };
    let m = to_proto(&Event::Ioctl(encode::ioctl(hdr(), ctl, 5, op, &abi())), &e);
    match m.payload {
        Some(Payload::RmAlloc(a)) => {
            assert_eq!(a.form(), v1::RmAllocForm::Unspecified);
            assert_eq!(
                (a.bytes, a.memory_kind(), a.location()),
                (0, v1::MemoryKind::None, v1::MemoryLocation::Unknown)
            );
        }
        p => panic!("{p:?}"),
    }

    let mut io = encode::ioctl(
        hdr(),
        ctl,
        5,
        IoctlOp::Malformed { nr: nv::esc::RM_ALLOC, reason: MalformedReason::FaultMain },
        &abi(),
    );
    io.xfer = true;
    let m = to_proto(&Event::Ioctl(io.clone()), &e);
    let want = v1::Malformed {
        reason: "fault_main".into(),
        nr: nv::esc::RM_ALLOC,
        cmd: io.cmd,
        flags: u32::from(flags::FAULT_MAIN | flags::XFER),
        record_kind: u32::from(kind::IOCTL),
    };
    assert_eq!(m.payload, Some(Payload::Malformed(want)));
}

#[test]
fn converts_what_the_decoder_produces() {
    // The real path: raw record → decode → proto.
    let (_, op) = ops().swap_remove(0);
    let ev = Event::Ioctl(encode::ioctl(hdr(), encode::ctl(1), 5, op, &abi()));
    let decoded = decode::decode(&encode::event(&ev, &abi()), &abi()).expect("decodes");
    let m = to_proto(&decoded, &enrichment());
    match m.payload {
        Some(Payload::RmAlloc(a)) => {
            assert_eq!((a.handle, a.class_id, a.bytes, a.success), (0xcaf0_0010, 0x40, 2 << 20, true));
            assert_eq!(a.location(), v1::MemoryLocation::Vidmem);
            assert_eq!(a.memory_kind(), v1::MemoryKind::Physical);
        }
        p => panic!("{p:?}"),
    }
}

#[test]
fn rm_alloc_json_is_readable() {
    let (d, op) = ops().swap_remove(0);
    let m = to_proto(&Event::Ioctl(encode::ioctl(hdr(), d, 5, op, &abi())), &enrichment());
    let j = to_json(&m);
    assert_eq!(j["kind"], "rm_alloc");
    assert_eq!(j["class"], 0x40);
    assert_eq!(j["class_hex"], "0x40");
    assert_eq!(j["handle"], 0xcaf0_0010u32);
    assert_eq!(j["handle_hex"], "0xcaf00010");
    assert_eq!(j["bytes"], 2 << 20);
    assert_eq!(j["location"], "vidmem");
    assert_eq!(j["memory_kind"], "physical");
    assert_eq!(j["form"], "nvos64");
    assert_eq!(j["success"], true);
    assert_eq!(j["cgroup_path"], "/kubepods.slice/kubepods-pod1234.slice/cri-containerd-abc.scope");
    assert_eq!(j["comm"], "python3");
    assert_eq!((j["tgid"].as_u64(), j["pid"].as_u64(), j["cgroup_id"].as_u64()), (Some(4242), Some(4243), Some(7777)));
    assert_eq!(j["device"], serde_json::json!({ "kind": "ctl", "minor": 255, "file_id": 1 }));
    assert_eq!(j["fd"], 5);
}

#[test]
fn json_of_every_event_names_its_kind() {
    for ev in events() {
        let m = to_proto(&ev, &enrichment());
        let j = to_json(&m);
        let want = hdr_of(&m).kind().as_str_name().trim_start_matches("EVENT_KIND_").to_ascii_lowercase();
        assert_eq!(j["kind"], want.as_str());
        assert!(j["wall_time_unix_ns"].is_u64());
        assert_eq!(j["device"].is_object(), m.device.is_some());
    }
    let reg = ops().into_iter().find(|(_, op)| matches!(op, IoctlOp::UvmRegisterGpu { .. })).unwrap();
    let j = to_json(&to_proto(&Event::Ioctl(encode::ioctl(hdr(), reg.0, 7, reg.1, &abi())), &enrichment()));
    assert_eq!(j["uuid"], "GPU-deadbeef-0102-0304-0506-0708090a0b0c");
    // A value from a newer schema stays visible as its number.
    let mut m = to_proto(&events()[0], &enrichment());
    m.device.as_mut().unwrap().kind = 99;
    assert_eq!(to_json(&m)["device"]["kind"], 99);
}

#[test]
fn protobuf_stream_reads_back() {
    let msgs: Vec<_> = events().iter().map(|ev| to_proto(ev, &enrichment())).collect();
    let mut w = EventWriter::new(Vec::new(), EventFormat::Protobuf);
    for m in &msgs {
        w.write(m).unwrap();
    }
    w.flush().unwrap();
    assert_eq!(w.events_written(), msgs.len() as u64);
    let (n, buf) = (w.bytes_written(), w.into_inner());
    assert_eq!(n, buf.len() as u64);
    let back: Vec<_> = gpu_tracer_proto::read_stream(&buf).collect::<Result<_, _>>().unwrap();
    assert_eq!(back, msgs);
}

/// An event the hub encoded is written as the same bytes `write` would make (protobuf: a view of
/// the hub's buffer, not a second encoding) and the same JSON; a LostEvents is refused.
#[test]
fn hub_encoded_events_write_as_the_messages_do() {
    use crate::export::api::hub::EventHub;
    let msgs: Vec<_> = events().iter().map(|ev| to_proto(ev, &enrichment())).collect();
    for format in [EventFormat::Protobuf, EventFormat::JsonLines] {
        let (mut a, mut b) = (EventWriter::new(Vec::new(), format), EventWriter::new(Vec::new(), format));
        for m in &msgs {
            a.write(m).unwrap();
            b.write_encoded(&EventHub::encode(m)).unwrap();
        }
        assert_eq!((a.events_written(), a.bytes_written()), (b.events_written(), b.bytes_written()));
        assert_eq!(a.into_inner(), b.into_inner(), "{format:?}");
    }
    let lost = gpu_tracer_proto::EncodedSubscribeResponse::new(&v1::SubscribeResponse {
        response: Some(v1::subscribe_response::Response::LostEvents(Default::default())),
    });
    let mut w = EventWriter::new(Vec::new(), EventFormat::Protobuf);
    assert_eq!(w.write_encoded(&lost).unwrap_err().kind(), std::io::ErrorKind::InvalidData);
    assert_eq!(w.events_written(), 0);
}

#[test]
fn json_lines_one_object_per_event() {
    let msgs: Vec<_> = events().iter().map(|ev| to_proto(ev, &enrichment())).collect();
    let mut w = EventWriter::new(Vec::new(), EventFormat::JsonLines);
    for m in &msgs {
        w.write(m).unwrap();
    }
    let (n, buf) = (w.bytes_written(), w.into_inner());
    assert_eq!(n, buf.len() as u64);
    let text = String::from_utf8(buf).unwrap();
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len(), msgs.len());
    for (line, m) in lines.iter().zip(&msgs) {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v, to_json(m));
    }
}

#[test]
fn to_path_writes_a_file() {
    let path = std::env::temp_dir().join(format!("gpu-tracer-export-test-{}.pb", std::process::id()));
    let msgs: Vec<_> = events().iter().take(3).map(|ev| to_proto(ev, &enrichment())).collect();
    {
        let mut w = EventWriter::to_path(Some(&path), EventFormat::Protobuf).unwrap();
        assert_eq!(w.format(), EventFormat::Protobuf);
        for m in &msgs {
            w.write(m).unwrap();
        }
        w.flush().unwrap();
    }
    let buf = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let back: Vec<_> = gpu_tracer_proto::read_stream(&buf).collect::<Result<_, _>>().unwrap();
    assert_eq!(back, msgs);
}

/// A writer that takes `room` bytes, then fails every write and flush with `kind`; it counts the
/// calls it gets.
struct Failing {
    room: usize,
    kind: std::io::ErrorKind,
    taken: Vec<u8>,
    writes: usize,
}

impl Failing {
    fn new(room: usize, kind: std::io::ErrorKind) -> Self {
        Failing { room, kind, taken: Vec::new(), writes: 0 }
    }
}

impl std::io::Write for Failing {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.writes += 1;
        if self.room == 0 {
            return Err(self.kind.into());
        }
        let n = b.len().min(self.room);
        self.room -= n;
        self.taken.extend_from_slice(&b[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.room == 0 { Err(self.kind.into()) } else { Ok(()) }
    }
}

fn messages() -> Vec<v1::Event> {
    events().iter().map(|ev| to_proto(ev, &enrichment())).collect()
}

#[test]
fn stream_honours_its_limit_exactly() {
    let msgs = messages();
    assert!(msgs.len() > 3);
    let mut out = Vec::new();
    let mut s = EventStream::new(EventWriter::new(&mut out, EventFormat::Protobuf), Some(3));
    let emitted: Vec<bool> = msgs.iter().map(|m| s.emit(m)).collect();
    assert_eq!(emitted.iter().filter(|&&e| e).count(), 3);
    assert!(emitted[..3].iter().all(|&e| e), "the first three are written");
    assert!(s.is_done());
    assert_eq!(s.written(), 3);
    assert!(!s.emit_with(|| panic!("a finished stream builds no message")));
    assert_eq!(s.finish().unwrap(), 3);
    let back: Vec<_> = gpu_tracer_proto::read_stream(&out).collect::<Result<_, _>>().unwrap();
    assert_eq!(back, msgs[..3]);
}

#[test]
fn stream_without_limit_writes_everything() {
    let msgs = messages();
    let mut out = Vec::new();
    let mut s = EventStream::new(EventWriter::new(&mut out, EventFormat::JsonLines), None);
    for m in &msgs {
        assert!(s.emit_with(|| m.clone()));
    }
    assert!(!s.is_done());
    assert_eq!(s.written(), msgs.len() as u64);
    assert_eq!(s.finish().unwrap(), msgs.len() as u64);
    assert_eq!(String::from_utf8(out).unwrap().lines().count(), msgs.len());
    // A limit of zero takes nothing.
    let mut s = EventStream::new(EventWriter::new(Vec::new(), EventFormat::Protobuf), Some(0));
    assert!(s.is_done() && !s.emit(&msgs[0]));
    assert_eq!(s.finish().unwrap(), 0);
}

#[test]
fn stream_stops_at_an_io_error_and_reports_it() {
    let msgs = messages();
    let one = msgs[0].encode_length_delimited_to_vec().len();
    // Room for the first message and part of the second.
    let mut w = Failing::new(one + 1, std::io::ErrorKind::StorageFull);
    let mut s = EventStream::new(EventWriter::new(&mut w, EventFormat::Protobuf), None);
    assert!(s.emit(&msgs[0]));
    assert!(!s.is_done());
    assert!(!s.emit(&msgs[1]), "the failed write does not count");
    assert!(s.is_done());
    assert_eq!(s.written(), 1);
    for m in &msgs[2..] {
        assert!(!s.emit(m));
    }
    let err = s.finish().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::StorageFull);
    // Nothing was written after the error (the finish's flush aside).
    assert_eq!(w.writes, 3, "first message, the failing one, and nothing more");
    assert_eq!(w.taken.len(), one + 1);
}

#[test]
fn stream_reports_a_failed_final_flush() {
    let msgs = messages();
    let mut w = Failing::new(0, std::io::ErrorKind::PermissionDenied);
    let mut s = EventStream::new(EventWriter::new(std::io::BufWriter::new(&mut w), EventFormat::Protobuf), None);
    // Buffered: the writes succeed, the flush does not.
    assert!(s.emit(&msgs[0]));
    assert_eq!(s.written(), 1);
    assert_eq!(s.finish().unwrap_err().kind(), std::io::ErrorKind::PermissionDenied);
}

#[test]
fn stream_ends_normally_on_a_broken_pipe() {
    let msgs = messages();
    // Unbuffered: the write that meets the closed pipe ends the stream.
    let mut w = Failing::new(0, std::io::ErrorKind::BrokenPipe);
    let mut s = EventStream::new(EventWriter::new(&mut w, EventFormat::JsonLines), Some(10));
    assert!(!s.emit(&msgs[0]));
    assert!(s.is_done());
    assert_eq!(s.finish().unwrap(), 0);
    // Buffered, as the command writes: the pipe closes after some events; the error shows at a
    // write that spills the buffer and again at the final flush. Neither is an error.
    let mut all = EventWriter::new(Vec::new(), EventFormat::JsonLines);
    msgs.iter().for_each(|m| all.write(m).unwrap());
    let total = all.bytes_written() as usize;
    let mut w = Failing::new(total / 2, std::io::ErrorKind::BrokenPipe);
    let buffered = std::io::BufWriter::with_capacity(total / 4, &mut w);
    let mut s = EventStream::new(EventWriter::new(buffered, EventFormat::JsonLines), None);
    let written = msgs.iter().take_while(|m| s.emit(m)).count() as u64;
    assert!(s.is_done());
    assert!(written >= 1 && written < msgs.len() as u64);
    assert_eq!(s.written(), written);
    assert_eq!(s.finish().unwrap(), written);
}

/// `kind_of` (what the agent checks before building a message) names the kind `to_proto` writes,
/// for every variant and every ioctl operation.
#[test]
fn kind_of_agrees_with_the_message() {
    let ctx = EventContext::default();
    for ev in events() {
        let msg = to_proto(&ev, &ctx);
        assert_eq!(kind_of(&ev, &ctx) as i32, msg.header.unwrap().kind, "{ev:?}");
    }
}

/// Timed libcuda calls: the class, stream, event, bytes and direction come from the entry point and
/// its arguments; the duration from the entry time; the record round-trips through the wire.
#[test]
fn timed_calls_read_their_arguments_by_entry_point() {
    use tracer_common::cuda_entry as ce;
    let e = EventContext::default();
    let h = hdr();
    let abi = DriverAbi::for_version(DEFAULT_DRIVER_VERSION);
    let timed = |entry: u32, args: [u64; 4], result: u32| Event::CudaTimed {
        header: h,
        entry,
        result,
        start_ktime_ns: h.ktime_ns - 5_000,
        args,
    };
    let call = |ev: &Event| -> (v1::CudaCall, u64) {
        let bytes = encode::event(ev, &abi);
        assert_eq!(&decode::decode(&bytes, &abi).unwrap(), ev, "round trip");
        let m = to_proto(ev, &e);
        assert_eq!(hdr_of(&m).kind(), v1::EventKind::CudaCall);
        let d = hdr_of(&m).duration_ns;
        let Some(Payload::CudaCall(c)) = m.payload else { panic!("{m:?}") };
        (c, d)
    };
    let (c, d) = call(&timed(ce::STREAM_SYNCHRONIZE, [0x5000, 0, 0, 0], 0));
    assert_eq!(
        (c.entry_point.as_str(), c.class.as_str(), c.stream, c.event, c.success),
        ("cuStreamSynchronize", "synchronize", Some(0x5000), None, true)
    );
    assert_eq!(d, 5_000);
    let (c, _) = call(&timed(ce::CTX_SYNCHRONIZE, [9, 9, 9, 9], 0));
    assert_eq!((c.stream, c.event), (None, None), "cuCtxSynchronize takes no arguments: registers are noise");
    let (c, _) = call(&timed(ce::EVENT_QUERY, [0xe0, 0, 0, 0], 600));
    assert_eq!((c.class.as_str(), c.event, c.result, c.success), ("query", Some(0xe0), 600, false));
    let (c, _) = call(&timed(ce::EVENT_RECORD, [0xe0, 0x5000, 0, 0], 0));
    assert_eq!((c.class.as_str(), c.event, c.stream), ("record", Some(0xe0), Some(0x5000)));
    let (c, _) = call(&timed(ce::STREAM_WAIT_EVENT, [0x5000, 0xe0, 0, 0], 0));
    assert_eq!((c.class.as_str(), c.event, c.stream), ("wait", Some(0xe0), Some(0x5000)));
    let (c, _) = call(&timed(ce::MEMCPY_HTOD, [0x7000, 0x1000, 4096, 0xdead], 0));
    assert_eq!(
        (c.class.as_str(), c.bytes, c.direction.as_str(), c.r#async, c.stream),
        ("copy", 4096, "htod", false, Some(0))
    );
    let (c, _) = call(&timed(ce::MEMCPY_ASYNC, [0x7000, 0x1000, 100, 0x5000], 0));
    assert_eq!((c.bytes, c.direction.as_str(), c.r#async, c.stream), (100, "any", true, Some(0x5000)));
    let (c, _) = call(&timed(ce::MEMSET_D32_ASYNC, [0x7000, 7, 10, 0x5000], 0));
    assert_eq!((c.class.as_str(), c.bytes, c.direction.as_str(), c.stream), ("memset", 40, "", Some(0x5000)));
    let j = to_json(&to_proto(&timed(ce::MEMCPY_DTOH, [0x1000, 0x7000, 64, 0], 0), &e));
    assert_eq!(
        (j["kind"].as_str(), j["class"].as_str(), j["bytes"].as_u64(), j["direction"].as_str()),
        (Some("cuda_call"), Some("copy"), Some(64), Some("dtoh"))
    );
}
