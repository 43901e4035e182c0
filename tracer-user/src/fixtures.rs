//! Fixtures for tests, benchmarks and the golden outputs: one of every decoded [`Event`] variant
//! (the ioctl ones from [`ops`], encoded and decoded with the default driver's layouts) and the
//! context the pipeline would give it. Built with the `encode` feature (or in this crate's tests).
use tracer_common::nv::{self, DEFAULT_DRIVER_VERSION, DriverAbi};

use crate::{
    decode::{
        CardInfoEntry, Device, DeviceKind, Event, Header, IoctlOp, Location, MalformedReason, MemoryAlloc, MemoryKind,
        RmAllocForm, encode,
    },
    model::EventContext,
};

/// The header every fixture event carries.
pub fn hdr() -> Header {
    Header { ktime_ns: 1_000_000_123, tgid: 4242, pid: 4243, cgroup_id: 7777 }
}

/// What the pipeline knows about a fixture event: a containerd pod's cgroup, a comm, a kernel name.
pub fn enrichment() -> EventContext {
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

/// The GPU UUID of the fixture `UvmRegisterGpu`.
pub const UUID: [u8; 16] = [0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];

/// One of every `IoctlOp` variant, each on the device it is issued on.
pub fn ops() -> Vec<(Device, IoctlOp)> {
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
/// The default driver version's layouts.
pub fn abi() -> DriverAbi {
    DriverAbi::for_version(DEFAULT_DRIVER_VERSION)
}

/// One of every `Event` variant (the ioctl ones from [`ops`]).
pub fn events() -> Vec<Event> {
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
