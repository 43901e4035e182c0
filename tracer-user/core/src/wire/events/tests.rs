use crate::wire::events::proto::event_kind;
use std::collections::BTreeSet;

use gpu_tracer_proto::v1::{self, event::Payload};
use tracer_common::{
    flags, kind,
    nv::{self, DEFAULT_DRIVER_VERSION, DriverAbi},
};

use super::proto::device_proto;
use super::*;
use crate::decode::{self, Device, DeviceKind, Event, IoctlOp, MalformedReason, RmAllocForm, encode};
use crate::fixtures::{abi, enrichment, events, hdr, ops};
use crate::model::EventContext;

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
