//! Write a seed corpus for the `decode` target: one valid record per kind of operation, for every
//! driver layout, built with `tracer_core::decode::encode`.
use std::{fs, path::PathBuf};

use tracer_common::nv::{DriverAbi, esc, uvm};
use tracer_core::{decode::{Device, DeviceKind, encode, Event, Header, IoctlOp, Location, MalformedReason, MemoryAlloc, MemoryKind, RmAllocForm}};

fn ops() -> Vec<(Device, IoctlOp)> {
    let ctl = encode::ctl(1);
    let gpu = encode::gpu(0, 2);
    let uvmd = encode::uvm_dev(3);
    let alloc = |class, form, memory, device_instance| IoctlOp::RmAlloc {
        client: 0xc1d0_0001,
        parent: 0xcaf0_0001,
        handle: 0xcaf0_0100,
        class,
        status: 0,
        form,
        memory,
        device_instance,
        subdevice_instance: None,
    };
    let m = |bytes, location, kind| Some(MemoryAlloc { bytes, location, kind });
    let mut v = vec![
        (ctl, alloc(0x41, RmAllocForm::Nvos21, None, None)),
        (ctl, alloc(0x80, RmAllocForm::Nvos64, None, Some(0))),
        (ctl, alloc(0x40, RmAllocForm::Nvos64, m(1 << 20, Location::Vidmem, MemoryKind::Physical), None)),
        (ctl, alloc(0x3e, RmAllocForm::Nvos21, m(1 << 16, Location::Sysmem, MemoryKind::Physical), None)),
        (ctl, alloc(0x50a0, RmAllocForm::Nvos64, m(1 << 30, Location::Unknown, MemoryKind::VirtualOnly), None)),
        (ctl, alloc(0x70, RmAllocForm::Nvos64, m(1 << 30, Location::Unknown, MemoryKind::VirtualOnly), None)),
        (ctl, alloc(0xc2, RmAllocForm::Nvos64, m(1 << 21, Location::Vidmem, MemoryKind::Physical), None)),
        (ctl, alloc(0xf8, RmAllocForm::Nvos64, m(1 << 21, Location::Vidmem, MemoryKind::Fabric), None)),
        (ctl, alloc(0x71, RmAllocForm::Nvos64, m(1 << 12, Location::Sysmem, MemoryKind::OsDescriptor), None)),
        (ctl, alloc(0xa06c, RmAllocForm::Nvos05, None, None)),
        (ctl, IoctlOp::RmFree { client: 1, parent: 2, handle: 3, status: 0 }),
        (
            ctl,
            IoctlOp::VidHeapAlloc {
                client: 1,
                parent: 2,
                handle: 3,
                bytes: 1 << 20,
                virtual_only: false,
                location: Location::Vidmem,
                status: 0,
            },
        ),
        (ctl, IoctlOp::VidHeapFree { client: 1, parent: 2, handle: 3, status: 0 }),
        (
            gpu,
            IoctlOp::AllocMemory {
                client: 1,
                parent: 2,
                handle: 3,
                class: 0x71,
                memory: MemoryAlloc { bytes: 4096, location: Location::Sysmem, kind: MemoryKind::OsDescriptor },
                status: 0,
            },
        ),
        (ctl, IoctlOp::RmControl { client: 1, object: 2, cmd: 0x2080_014a, status: 0 }),
        (ctl, IoctlOp::RmDupObject { client: 1, parent: 2, handle: 3, src_client: 4, src_handle: 5, status: 0 }),
        (ctl, IoctlOp::RmMapMemory { client: 1, device: 2, memory: 3, offset: 0, length: 4096, fd: 9, status: 0 }),
        (ctl, IoctlOp::RmUnmapMemory { client: 1, device: 2, memory: 3, status: 0 }),
        (gpu, IoctlOp::RegisterFd { ctl_fd: 3 }),
        (ctl, IoctlOp::CheckVersion { reply: 1, version: "535.261.03".into() }),
        (ctl, IoctlOp::OtherFrontend { nr: esc::SYS_PARAMS }),
        (uvmd, IoctlOp::UvmInitialize { flags: 0, status: 0 }),
        (uvmd, IoctlOp::UvmRegisterGpu { uuid: [1; 16], rm_ctrl_fd: 3, client: 1, status: 0 }),
        (uvmd, IoctlOp::UvmCreateExternalRange { base: 1 << 40, length: 1 << 21, status: 0 }),
        (
            uvmd,
            IoctlOp::UvmMapExternal {
                base: 1 << 40,
                length: 1 << 21,
                offset: 0,
                rm_ctrl_fd: 3,
                client: 1,
                memory_handle: 3,
                status: 0,
            },
        ),
        (uvmd, IoctlOp::UvmFree { base: 1 << 40, status: 0 }),
        (uvmd, IoctlOp::UvmValidateVaRange { base: 1 << 40, length: 4096, status: 0 }),
        (uvmd, IoctlOp::UvmOther { cmd: uvm::DEINITIALIZE }),
        (ctl, IoctlOp::Malformed { nr: esc::RM_ALLOC, reason: MalformedReason::FaultNested }),
        (uvmd, IoctlOp::Malformed { nr: uvm::MAP_EXTERNAL_ALLOCATION, reason: MalformedReason::FaultTail }),
    ];
    v.push((Device { kind: DeviceKind::Modeset, minor: 254, file_id: 4 }, IoctlOp::OtherDevice { nr: 0x10 }));
    v
}

fn main() {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "corpus/decode".into()));
    fs::create_dir_all(&dir).expect("create the corpus directory");
    let header = Header { ktime_ns: 1, tgid: 100, pid: 100, cgroup_id: 42 };
    let mut n = 0;
    for (sel, version) in gpu_tracer_fuzz::VERSIONS.iter().enumerate() {
        let abi = DriverAbi::for_version(*version);
        let mut events: Vec<Event> =
            ops().into_iter().map(|(d, op)| Event::Ioctl(encode::ioctl(header, d, 3, op, &abi))).collect();
        let dev = encode::ctl(1);
        events.extend([
            Event::FdOpened { header, device: dev, fd: 3, open_flags: 0o2000002, seeded: false },
            Event::FdClosed { header, device: dev, fd: 3, replaced: false },
            Event::FdDuped { header, device: dev, old_fd: 3, new_fd: 4 },
            Event::UvmMapped {
                header,
                device: encode::uvm_dev(3),
                fd: 5,
                addr: 1 << 40,
                len: 1 << 21,
                offset: 1 << 40,
                prot: 3,
                map_flags: 1,
                ret: 1 << 40,
            },
            Event::UvmUnmapped { header, addr: 1 << 40, len: 1 << 21, ret: 0 },
            Event::ProcessExec { header, comm: "python3".into() },
            Event::ProcessExit { header, comm: "python3".into() },
            Event::ProcessFork { header, child_pid: 101 },
            Event::CgroupRemoved { header, cgroup_id: 42, level: 3, path: "/kubepods/pod/ctr".into() },
            Event::CudaAlloc {
                header,
                entry: 8,
                result: 0,
                ptr: 0x7000_0000_0000,
                bytes: 1 << 20,
                start_ktime_ns: header.ktime_ns.saturating_sub(4_000),
            },
            Event::CudaFree { header, entry: 15, ptr: 0x7000_0000_0000 },
            Event::CudaFunction { header, entry: 22, result: 0, handle: 0x1234, source: 0, name: "sgemm".into() },
            Event::CudaLaunch {
                header,
                entry: 0,
                function: 0x1234,
                stream: 0x99,
                grid: [128, 2, 1],
                block: [32, 4, 2],
                shared_mem_bytes: 4096,
            },
        ]);
        for (i, ev) in events.iter().enumerate() {
            let mut bytes = vec![sel as u8];
            bytes.extend(encode::event(ev, &abi));
            fs::write(dir.join(format!("seed-{sel}-{i:03}-{}", ev.kind_name())), bytes).expect("write a seed");
            n += 1;
        }
    }
    println!("wrote {n} seeds to {}", dir.display());
}
