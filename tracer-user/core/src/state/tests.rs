//! State tests: each lifecycle case, bounds, and a property test of the ledger invariants over
//! random sequences of events.

use proptest::prelude::*;
use tracer_common::nv::{DriverAbi, DriverVersion};

use super::*;
use crate::decode::{MalformedReason, RmAllocForm, encode};

const MIB: u64 = 1 << 20;
const CLIENT: u32 = 0xc1d0_0001;
const DEVICE: u32 = 0xcaf0_0001;
const SUBDEVICE: u32 = 0xcaf0_0002;

fn abi() -> DriverAbi {
    DriverAbi::for_version(DriverVersion::new(535, 261, 3))
}

/// A test driver around a state: stamps events, and checks the invariants after each one.
struct World {
    st: TracerState,
    abi: DriverAbi,
    t: u64,
}

impl World {
    fn new() -> Self {
        Self::with(StateConfig::default())
    }
    fn with(cfg: StateConfig) -> Self {
        World { st: TracerState::with_config(cfg), abi: abi(), t: 0 }
    }
    fn hdr(&mut self, tgid: u32, cgroup_id: u64) -> Header {
        self.t += 1;
        Header { ktime_ns: self.t, tgid, pid: tgid, cgroup_id }
    }
    fn apply(&mut self, ev: Event, start: u64) -> Option<u64> {
        let r = self.st.apply(&ev, start);
        if let Err(e) = self.st.check_invariants() {
            panic!("after {ev:?}: {e}");
        }
        r
    }
    fn open(&mut self, tgid: u32, cg: u64, fd: i32, device: Device) {
        let header = self.hdr(tgid, cg);
        self.apply(Event::FdOpened { header, device, fd, open_flags: 0, seeded: false }, 100);
    }
    fn close(&mut self, tgid: u32, cg: u64, fd: i32, device: Device) -> Option<u64> {
        let header = self.hdr(tgid, cg);
        self.apply(Event::FdClosed { header, device, fd, replaced: false }, 100)
    }
    fn ioctl_ret(&mut self, tgid: u32, cg: u64, device: Device, ret: i64, op: IoctlOp) -> Option<u64> {
        let header = self.hdr(tgid, cg);
        let mut e = encode::ioctl(header, device, 3, op, &self.abi);
        e.ret = ret;
        self.apply(Event::Ioctl(e), 100)
    }
    fn ioctl(&mut self, tgid: u32, cg: u64, device: Device, op: IoctlOp) -> Option<u64> {
        self.ioctl_ret(tgid, cg, device, 0, op)
    }
    fn exit(&mut self, tgid: u32, cg: u64) -> Option<u64> {
        let header = self.hdr(tgid, cg);
        self.apply(Event::ProcessExit { header, comm: "x".into() }, 100)
    }
    /// A CUDA-like start: ctl fd (file `file`), /dev/nvidia`minor`, client, device, subdevice.
    fn cuda_init(&mut self, tgid: u32, cg: u64, file: u64, minor: Option<u32>, client: u32) -> Device {
        let ctl = encode::ctl(file);
        self.open(tgid, cg, 3, ctl);
        if let Some(m) = minor {
            self.open(tgid, cg, 4 + m as i32, encode::gpu(m, file + 1000 + m as u64));
        }
        self.ioctl(tgid, cg, ctl, root(client));
        self.ioctl(tgid, cg, ctl, device(client, DEVICE, 0));
        self.ioctl(tgid, cg, ctl, subdevice(client, DEVICE, SUBDEVICE));
        ctl
    }
    fn snap(&self) -> Snapshot {
        self.st.snapshot()
    }
    fn gpu(&self, minor: Option<u32>) -> Usage {
        self.snap().gpus.into_iter().find(|g| g.minor == minor).map(|g| g.usage).unwrap_or_default()
    }
    fn cgroup(&self, id: u64) -> Option<CgroupRow> {
        self.snap().cgroups.into_iter().find(|c| c.cgroup_id == id)
    }
    fn totals(&self) -> Usage {
        self.snap().totals.usage
    }
}

fn rm_alloc(client: u32, parent: u32, handle: u32, class: u32) -> IoctlOp {
    IoctlOp::RmAlloc {
        client,
        parent,
        handle,
        class,
        status: 0,
        form: RmAllocForm::Nvos64,
        memory: None,
        device_instance: None,
        subdevice_instance: None,
    }
}
fn root(client: u32) -> IoctlOp {
    rm_alloc(client, client, client, 0x41)
}
fn device(client: u32, handle: u32, instance: u32) -> IoctlOp {
    let IoctlOp::RmAlloc { client, parent, handle, class, status, form, memory, subdevice_instance, .. } =
        rm_alloc(client, client, handle, 0x80)
    else {
        unreachable!()
    };
    IoctlOp::RmAlloc {
        client,
        parent,
        handle,
        class,
        status,
        form,
        memory,
        device_instance: Some(instance),
        subdevice_instance,
    }
}
fn subdevice(client: u32, parent: u32, handle: u32) -> IoctlOp {
    rm_alloc(client, parent, handle, 0x2080)
}
fn mem(client: u32, parent: u32, handle: u32, class: u32, bytes: u64, location: Location) -> IoctlOp {
    let kind = match class {
        0x50a0 | 0x70 => MemoryKind::VirtualOnly,
        0x71 => MemoryKind::OsDescriptor,
        0xf8 => MemoryKind::Fabric,
        _ => MemoryKind::Physical,
    };
    IoctlOp::RmAlloc {
        client,
        parent,
        handle,
        class,
        status: 0,
        form: RmAllocForm::Nvos64,
        memory: Some(MemoryAlloc { bytes, location, kind }),
        device_instance: None,
        subdevice_instance: None,
    }
}
fn vidmem(client: u32, parent: u32, handle: u32, bytes: u64) -> IoctlOp {
    mem(client, parent, handle, 0x40, bytes, Location::Vidmem)
}
fn free(client: u32, handle: u32) -> IoctlOp {
    IoctlOp::RmFree { client, parent: 0, handle, status: 0 }
}

#[test]
fn alloc_and_free_device_memory() {
    let mut w = World::new();
    let ctl = w.cuda_init(10, 500, 1, Some(0), CLIENT);
    assert_eq!(w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x100, 4 * MIB)), None);
    let t = w.totals();
    assert_eq!((t.vidmem_bytes, t.sysmem_bytes, t.live_allocations, t.allocations), (4 * MIB, 0, 1, 1));
    let g = w.gpu(Some(0));
    assert_eq!((g.vidmem_bytes, g.inferred_vidmem_bytes), (4 * MIB, 0));
    assert_eq!(w.cgroup(500).unwrap().usage.vidmem_bytes, 4 * MIB);
    assert_eq!(w.st.process_usage(10).unwrap().vidmem_bytes, 4 * MIB);
    // Freeing returns what was released.
    assert_eq!(w.ioctl(10, 500, ctl, free(CLIENT, 0x100)), Some(4 * MIB));
    let t = w.totals();
    assert_eq!((t.vidmem_bytes, t.live_allocations, t.frees), (0, 0, 1));
    assert_eq!(w.snap().counters.released_by.get("free"), Some(&1));
    // A second free of the same handle is unknown.
    assert_eq!(w.ioctl(10, 500, ctl, free(CLIENT, 0x100)), None);
    assert_eq!(w.snap().counters.unknown_handle_frees, 1);
}

#[test]
fn failed_allocations_are_counted_not_charged() {
    let mut w = World::new();
    let ctl = w.cuda_init(10, 500, 1, Some(0), CLIENT);
    // RM status failure (syscall returned 0).
    let IoctlOp::RmAlloc { client, parent, handle, class, form, memory, .. } = vidmem(CLIENT, DEVICE, 0x100, MIB)
    else {
        unreachable!()
    };
    let failed = IoctlOp::RmAlloc {
        client,
        parent,
        handle,
        class,
        status: 0x51,
        form,
        memory,
        device_instance: None,
        subdevice_instance: None,
    };
    w.ioctl(10, 500, ctl, failed);
    // Syscall failure with an OK-looking status.
    w.ioctl_ret(10, 500, ctl, -22, vidmem(CLIENT, DEVICE, 0x101, MIB));
    let t = w.totals();
    assert_eq!((t.vidmem_bytes, t.allocations, t.failed_calls), (0, 0, 2));
    assert_eq!(w.snap().counters.failed_by_op.get("rm_alloc"), Some(&2));
    // A malformed call is counted by reason, not as a failure.
    w.ioctl(10, 500, ctl, IoctlOp::Malformed { nr: 0x2b, reason: MalformedReason::FaultNested });
    let s = w.snap();
    assert_eq!(s.counters.malformed_by_reason.get("fault_nested"), Some(&1));
    assert_eq!(s.totals.usage.failed_calls, 2);
    assert_eq!(s.counters.ioctls_by_op.get("malformed"), Some(&1));
}

#[test]
fn freeing_a_parent_or_the_client_frees_descendants() {
    let mut w = World::new();
    let ctl = w.cuda_init(10, 500, 1, Some(0), CLIENT);
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x100, MIB));
    w.ioctl(10, 500, ctl, vidmem(CLIENT, SUBDEVICE, 0x101, 2 * MIB));
    w.ioctl(10, 500, ctl, mem(CLIENT, DEVICE, 0x102, 0x3e, 3 * MIB, Location::Sysmem));
    let t = w.totals();
    assert_eq!((t.vidmem_bytes, t.sysmem_bytes), (3 * MIB, 3 * MIB));
    // Freeing the subdevice frees the memory under it only.
    assert_eq!(w.ioctl(10, 500, ctl, free(CLIENT, SUBDEVICE)), Some(2 * MIB));
    assert_eq!(w.totals().vidmem_bytes, MIB);
    // Freeing the device frees the rest.
    assert_eq!(w.ioctl(10, 500, ctl, free(CLIENT, DEVICE)), Some(4 * MIB));
    assert!(w.totals().is_idle());
    assert_eq!(w.snap().counters.released_by.get("parent_free"), Some(&3));

    // Whole-client free.
    w.ioctl(10, 500, ctl, device(CLIENT, DEVICE, 0));
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x100, MIB));
    assert_eq!(w.ioctl(10, 500, ctl, free(CLIENT, CLIENT)), Some(MIB));
    let s = w.snap();
    assert!(s.totals.usage.is_idle());
    assert_eq!(s.counters.released_by.get("client_free"), Some(&1));
    assert_eq!(s.processes[0].clients, 0);
}

#[test]
fn buckets_keep_device_host_and_va_apart() {
    let mut w = World::new();
    let ctl = w.cuda_init(10, 500, 1, Some(0), CLIENT);
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x100, MIB));
    w.ioctl(10, 500, ctl, mem(CLIENT, DEVICE, 0x101, 0x3e, 2 * MIB, Location::Sysmem));
    w.ioctl(10, 500, ctl, mem(CLIENT, DEVICE, 0x102, 0x71, 4 * MIB, Location::Sysmem));
    w.ioctl(10, 500, ctl, mem(CLIENT, DEVICE, 0x103, 0x50a0, 1 << 40, Location::Unknown));
    w.ioctl(10, 500, ctl, mem(CLIENT, DEVICE, 0x104, 0x70, 1 << 30, Location::Unknown));
    w.ioctl(10, 500, ctl, mem(CLIENT, SUBDEVICE, 0x105, 0xf8, 8 * MIB, Location::Vidmem));
    // 0x40 asked for PCI placement is system memory.
    w.ioctl(10, 500, ctl, mem(CLIENT, DEVICE, 0x106, 0x40, 16 * MIB, Location::Sysmem));
    let vh = |handle, bytes, virtual_only, location| IoctlOp::VidHeapAlloc {
        client: CLIENT,
        parent: DEVICE,
        handle,
        bytes,
        virtual_only,
        location,
        status: 0,
    };
    w.ioctl(10, 500, ctl, vh(0x200, 32 * MIB, false, Location::Any));
    w.ioctl(10, 500, ctl, vh(0x201, 64 * MIB, true, Location::Vidmem));
    let t = w.totals();
    assert_eq!(t.vidmem_bytes, MIB + 8 * MIB + 32 * MIB);
    assert_eq!(t.sysmem_bytes, 2 * MIB + 4 * MIB + 16 * MIB);
    assert_eq!(t.va_reserved_bytes, (1 << 40) + (1 << 30) + 64 * MIB);
    // VID_HEAP FREE releases; VA-only bytes are not reported as released memory.
    let vf = |handle| IoctlOp::VidHeapFree { client: CLIENT, parent: DEVICE, handle, status: 0 };
    assert_eq!(w.ioctl(10, 500, ctl, vf(0x200)), Some(32 * MIB));
    assert_eq!(w.ioctl(10, 500, ctl, vf(0x201)), Some(0));
    assert_eq!(w.totals().va_reserved_bytes, (1 << 40) + (1 << 30));
}

#[test]
fn nvos02_alloc_memory_is_tracked() {
    let mut w = World::new();
    let ctl = w.cuda_init(10, 500, 1, Some(0), CLIENT);
    let gpu = encode::gpu(0, 1000);
    let op = IoctlOp::AllocMemory {
        client: CLIENT,
        parent: DEVICE,
        handle: 0x300,
        class: 0x71,
        memory: MemoryAlloc { bytes: 4096, location: Location::Sysmem, kind: MemoryKind::OsDescriptor },
        status: 0,
    };
    w.ioctl(10, 500, gpu, op);
    assert_eq!(w.totals().sysmem_bytes, 4096);
    assert_eq!(w.gpu(Some(0)).ioctls, 1);
    w.ioctl(10, 500, ctl, free(CLIENT, 0x300));
    assert!(w.totals().is_idle());
}

#[test]
fn dup_is_a_reference_not_new_memory() {
    let mut w = World::new();
    let ctl = w.cuda_init(10, 500, 1, Some(0), CLIENT);
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x100, MIB));
    let dup = |client, parent, handle, src_client, src_handle| IoctlOp::RmDupObject {
        client,
        parent,
        handle,
        src_client,
        src_handle,
        status: 0,
    };
    w.ioctl(10, 500, ctl, dup(CLIENT, DEVICE, 0x900, CLIENT, 0x100));
    let t = w.totals();
    assert_eq!((t.vidmem_bytes, t.live_allocations, t.allocations), (MIB, 1, 1));
    // Freeing the original keeps the memory alive through the dup.
    assert_eq!(w.ioctl(10, 500, ctl, free(CLIENT, 0x100)), None);
    assert_eq!(w.totals().vidmem_bytes, MIB);
    assert_eq!(w.ioctl(10, 500, ctl, free(CLIENT, 0x900)), Some(MIB));
    assert!(w.totals().is_idle());

    // Across processes (IPC-style): B dups A's memory; A frees; the charge moves to B.
    let client_b = 0xc1d0_0002;
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x101, 2 * MIB));
    let ctl_b = w.cuda_init(20, 600, 2, Some(0), client_b);
    w.ioctl(20, 600, ctl_b, dup(client_b, DEVICE, 0x500, CLIENT, 0x101));
    assert_eq!(w.st.process_usage(10).unwrap().vidmem_bytes, 2 * MIB);
    assert_eq!(w.st.process_usage(20).unwrap().vidmem_bytes, 0);
    w.ioctl(10, 500, ctl, free(CLIENT, 0x101));
    assert_eq!(w.st.process_usage(10).unwrap().vidmem_bytes, 0);
    assert_eq!(w.st.process_usage(20).unwrap().vidmem_bytes, 2 * MIB);
    assert_eq!(w.cgroup(600).unwrap().usage.vidmem_bytes, 2 * MIB);
    assert_eq!(w.snap().counters.ownership_transfers, 1);
    // The owner exiting first also transfers; the last holder's exit releases.
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x102, 4 * MIB));
    w.ioctl(20, 600, ctl_b, dup(client_b, DEVICE, 0x501, CLIENT, 0x102));
    w.exit(10, 500);
    assert_eq!(w.totals().vidmem_bytes, 6 * MIB);
    assert_eq!(w.exit(20, 600), Some(6 * MIB));
    assert!(w.totals().is_idle());
    // A dup of something never seen is a placeholder without memory.
    let ctl_c = w.cuda_init(30, 700, 3, None, 0xc1d0_0003);
    w.ioctl(30, 700, ctl_c, dup(0xc1d0_0003, DEVICE, 0x1, 0xdead, 0xbeef));
    assert_eq!(w.snap().counters.dup_unknown_source, 1);
}

#[test]
fn last_fd_of_a_file_releases_its_clients() {
    let mut w = World::new();
    let ctl = w.cuda_init(10, 500, 1, Some(0), CLIENT);
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x100, MIB));
    // A second client on another ctl file.
    let ctl2 = encode::ctl(2);
    w.open(10, 500, 8, ctl2);
    w.ioctl(10, 500, ctl2, root(0xc1d0_0009));
    w.ioctl(10, 500, ctl2, device(0xc1d0_0009, DEVICE, 0));
    w.ioctl(10, 500, ctl2, vidmem(0xc1d0_0009, DEVICE, 0x100, 2 * MIB));
    // dup the first ctl fd: closing one of the two does not release the file.
    let header = w.hdr(10, 500);
    w.apply(Event::FdDuped { header, device: ctl, old_fd: 3, new_fd: 9 }, 100);
    assert_eq!(w.close(10, 500, 3, ctl), None);
    assert_eq!(w.totals().vidmem_bytes, 3 * MIB);
    assert_eq!(w.close(10, 500, 9, ctl), Some(MIB));
    assert_eq!(w.totals().vidmem_bytes, 2 * MIB);
    assert_eq!(w.snap().counters.released_by.get("fd_release"), Some(&1));
    // Closing a GPU fd does not free RM memory.
    assert_eq!(w.close(10, 500, 4, encode::gpu(0, 1001)), None);
    assert_eq!(w.totals().vidmem_bytes, 2 * MIB);
    // dup2 onto the remaining ctl fd closes it implicitly.
    let header = w.hdr(10, 500);
    let uvm = encode::uvm_dev(77);
    w.apply(Event::FdOpened { header, device: uvm, fd: 20, open_flags: 0, seeded: false }, 100);
    let header = w.hdr(10, 500);
    assert_eq!(w.apply(Event::FdDuped { header, device: uvm, old_fd: 20, new_fd: 8 }, 100), Some(2 * MIB));
    assert!(w.totals().is_idle());
}

#[test]
fn exec_closes_cloexec_fds() {
    let mut w = World::new();
    let ctl = encode::ctl(5);
    let header = w.hdr(10, 500);
    let cloexec = libc::O_CLOEXEC as u32 | 2;
    w.apply(Event::FdOpened { header, device: ctl, fd: 3, open_flags: cloexec, seeded: false }, 100);
    w.ioctl(10, 500, ctl, root(CLIENT));
    w.ioctl(10, 500, ctl, device(CLIENT, DEVICE, 0));
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x100, MIB));
    let header = w.hdr(10, 500);
    assert_eq!(w.apply(Event::ProcessExec { header, comm: "bash".into() }, 100), Some(MIB));
    let s = w.snap();
    assert_eq!((s.processes[0].fds, s.processes[0].comm.as_deref()), (0, Some("bash")));
}

#[test]
fn process_exit_releases_everything() {
    let mut w = World::new();
    let ctl = w.cuda_init(10, 500, 1, Some(0), CLIENT);
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x100, MIB));
    w.ioctl(10, 500, ctl, mem(CLIENT, DEVICE, 0x101, 0x3e, MIB, Location::Sysmem));
    let header = w.hdr(10, 500);
    let uvm = encode::uvm_dev(9);
    w.apply(
        Event::UvmMapped {
            header,
            device: uvm,
            fd: 12,
            addr: 0x7f00_0000_0000,
            len: 8 * MIB,
            offset: 0x7f00_0000_0000,
            prot: 3,
            map_flags: 1,
            ret: 0x7f00_0000_0000,
        },
        100,
    );
    assert_eq!(w.totals().managed_bytes, 8 * MIB);
    assert_eq!(w.exit(10, 500), Some(10 * MIB));
    let s = w.snap();
    assert!(s.totals.usage.is_idle());
    assert!(s.processes.is_empty());
    assert_eq!(s.counters.released_by.get("process_exit"), Some(&2));
    // Exit of an unknown process is harmless.
    assert_eq!(w.exit(99, 500), None);
}

#[test]
fn managed_memory_is_reported_separately() {
    let mut w = World::new();
    let uvm = encode::uvm_dev(9);
    let map = |w: &mut World, addr: u64, len: u64, ret: i64| {
        let header = w.hdr(10, 500);
        w.apply(
            Event::UvmMapped { header, device: uvm, fd: 12, addr, len, offset: addr, prot: 3, map_flags: 1, ret },
            100,
        )
    };
    map(&mut w, 0x1000_0000, 2 * MIB, 0x1000_0000);
    map(&mut w, 0x2000_0000, 4 * MIB, -12); // ENOMEM: not mapped
    let t = w.totals();
    assert_eq!((t.managed_bytes, t.managed_mappings, t.vidmem_bytes), (2 * MIB, 1, 0));
    // Managed memory has no GPU until touched: the unknown bucket.
    assert_eq!(w.gpu(None).managed_bytes, 2 * MIB);
    let header = w.hdr(10, 500);
    assert_eq!(w.apply(Event::UvmUnmapped { header, addr: 0x1000_0000, len: 2 * MIB, ret: 0 }, 100), Some(2 * MIB));
    let header = w.hdr(10, 500);
    w.apply(Event::UvmUnmapped { header, addr: 0x3000_0000, len: MIB, ret: 0 }, 100);
    assert_eq!(w.snap().counters.unknown_munmaps, 1);
    assert!(w.totals().is_idle());
}

#[test]
fn pid_reuse_is_a_different_process() {
    let mut w = World::new();
    let ctl = w.cuda_init(10, 500, 1, Some(0), CLIENT);
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x100, MIB));
    // Start time 0 (unknown) means the live incarnation.
    let header = w.hdr(10, 500);
    w.apply(Event::Ioctl(encode::ioctl(header, ctl, 3, free(CLIENT, 0x999), &abi())), 0);
    assert_eq!(w.totals().vidmem_bytes, MIB);
    // Same tgid, another start time: the old process is gone (its exit was missed).
    let header = w.hdr(10, 501);
    let r = w.apply(Event::FdOpened { header, device: encode::ctl(7), fd: 3, open_flags: 0, seeded: false }, 200);
    assert_eq!(r, Some(MIB));
    let s = w.snap();
    assert!(s.totals.usage.is_idle());
    assert_eq!(s.processes[0].start_time_ticks, 200);
    assert_eq!(s.processes[0].cgroup_id, 501);
    assert_eq!(s.counters.pid_reuse, 1);
    assert_eq!(s.counters.released_by.get("pid_reuse"), Some(&1));
}

#[test]
fn gpu_attribution_exact_inferred_unknown() {
    let mut w = World::new();
    // Two GPU minors open: use the device instance (inferred).
    let ctl = w.cuda_init(10, 500, 1, Some(0), CLIENT);
    w.open(10, 500, 6, encode::gpu(1, 5000));
    w.ioctl(10, 500, ctl, device(CLIENT, 0xcaf0_0010, 1));
    w.ioctl(10, 500, ctl, subdevice(CLIENT, 0xcaf0_0010, 0xcaf0_0011));
    w.ioctl(10, 500, ctl, vidmem(CLIENT, 0xcaf0_0011, 0x100, MIB));
    let g1 = w.gpu(Some(1));
    assert_eq!((g1.vidmem_bytes, g1.inferred_vidmem_bytes), (MIB, MIB));
    assert_eq!(w.totals().inferred_vidmem_bytes, MIB);
    // No device ancestor known (parent never seen) and several GPUs: unknown.
    w.ioctl(10, 500, ctl, vidmem(CLIENT, 0xdead, 0x101, 2 * MIB));
    assert_eq!(w.gpu(None).vidmem_bytes, 2 * MIB);
    // Deviceless memory is never put on a GPU.
    w.ioctl(10, 500, ctl, mem(CLIENT, CLIENT, 0x102, 0x90ce, 4 * MIB, Location::Sysmem));
    assert_eq!(w.gpu(None).sysmem_bytes, 4 * MIB);
    let c = w.snap().counters;
    assert_eq!((c.inferred_gpu_attributions, c.unknown_gpu_attributions), (1, 2));

    // One GPU minor open: exact, whatever the device instance says.
    let ctl_b = w.cuda_init(20, 600, 2, Some(3), 0xc1d0_0002);
    w.ioctl(20, 600, ctl_b, device(0xc1d0_0002, 0xcaf0_0020, 7));
    w.ioctl(20, 600, ctl_b, vidmem(0xc1d0_0002, 0xcaf0_0020, 0x100, 8 * MIB));
    let g3 = w.gpu(Some(3));
    assert_eq!((g3.vidmem_bytes, g3.inferred_vidmem_bytes), (8 * MIB, 0));
    // ioctls on a GPU node count on its row.
    assert!(w.gpu(Some(3)).ioctls == 0);
    let s = w.snap();
    assert_eq!(s.gpus.last().unwrap().minor, None, "unknown bucket last");
}

#[test]
fn cgroup_rows_go_when_removed_and_empty() {
    let mut w = World::new();
    let ctl = w.cuda_init(10, 500, 1, Some(0), CLIENT);
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x100, MIB));
    w.st.set_cgroup_path(500, "/kubepods/pod1/ctr");
    let header = w.hdr(1, 1);
    // Not removable yet (a live process): marked.
    w.apply(Event::CgroupRemoved { header, cgroup_id: 500, level: 3, path: "ctr".into() }, 0);
    let c = w.cgroup(500).unwrap();
    assert!(c.removed);
    assert_eq!(c.path.as_deref(), Some("/kubepods/pod1/ctr"));
    // The process moves to another cgroup: its old memory stays charged to 500 until freed.
    w.ioctl(10, 501, ctl, vidmem(CLIENT, DEVICE, 0x101, MIB));
    assert_eq!(w.cgroup(500).unwrap().processes, 0);
    assert_eq!(w.cgroup(500).unwrap().usage.vidmem_bytes, MIB);
    w.ioctl(10, 501, ctl, free(CLIENT, 0x100));
    assert!(w.cgroup(500).is_none());
    assert_eq!(w.snap().counters.cgroups_removed, 1);
    // A removed cgroup with no row is a no-op; the remover never becomes a process.
    let header = w.hdr(1, 1);
    w.apply(Event::CgroupRemoved { header, cgroup_id: 999, level: 3, path: String::new() }, 0);
    assert!(w.snap().processes.iter().all(|p| p.tgid != 1));
    w.exit(10, 501);
    let header = w.hdr(1, 1);
    w.apply(Event::CgroupRemoved { header, cgroup_id: 501, level: 3, path: String::new() }, 0);
    assert!(w.cgroup(501).is_none());
}

#[test]
fn tables_are_bounded_and_evictions_counted() {
    let cfg =
        StateConfig { max_processes: 2, max_handles_per_process: 6, max_control_cmds: 2, ..StateConfig::default() };
    let mut w = World::with(cfg);
    let ctl = w.cuda_init(10, 500, 1, Some(0), CLIENT);
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x100, MIB));
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x101, MIB));
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x102, MIB));
    // client, device, subdevice + 3 = 6 handles: the next one is not tracked.
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x103, MIB));
    let s = w.snap();
    assert_eq!((s.counters.handle_table_full, s.counters.untracked_allocations), (1, 1));
    assert_eq!(s.totals.usage.vidmem_bytes, 3 * MIB);
    for cmd in [1, 2, 3, 3] {
        w.ioctl(10, 500, ctl, IoctlOp::RmControl { client: CLIENT, object: CLIENT, cmd, status: 0 });
    }
    let c = w.snap().counters;
    assert_eq!((c.rm_control_by_cmd.len(), c.rm_control_other), (2, 2));
    // A third process evicts the least recently active one, releasing its memory.
    w.open(20, 600, 3, encode::ctl(2));
    w.open(30, 700, 3, encode::ctl(3));
    let s = w.snap();
    assert_eq!(s.totals.processes, 2);
    assert_eq!(s.counters.evicted_processes, 1);
    assert!(s.processes.iter().all(|p| p.tgid != 10));
    assert!(s.totals.usage.is_idle());
}

#[test]
fn stale_handles_are_replaced() {
    let mut w = World::new();
    let ctl = w.cuda_init(10, 500, 1, Some(0), CLIENT);
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x100, MIB));
    // The same handle allocated again: its free was missed.
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x100, 2 * MIB));
    let s = w.snap();
    assert_eq!(s.totals.usage.vidmem_bytes, 2 * MIB);
    assert_eq!(s.counters.stale_handles_replaced, 1);
    // A client handle allocated again replaces the whole client.
    w.ioctl(10, 500, ctl, root(CLIENT));
    assert!(w.totals().is_idle());
}

#[test]
fn snapshot_serializes() {
    let mut w = World::new();
    let ctl = w.cuda_init(10, 500, 1, Some(0), CLIENT);
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x100, MIB));
    w.st.set_comm(10, "python3");
    let json = serde_json::to_value(w.snap()).unwrap();
    assert_eq!(json["totals"]["usage"]["vidmem_bytes"], MIB);
    assert_eq!(json["processes"][0]["comm"], "python3");
    assert_eq!(json["gpus"][0]["minor"], 0);
    assert_eq!(json["counters"]["ioctls_by_op"]["rm_alloc"], 4);
}

// ---------- property test: ledger invariants ----------

#[derive(Debug, Clone)]
enum Step {
    Open { p: usize, fd: i32, what: u8, file: u64 },
    Dup { p: usize, old: i32, new: i32 },
    Close { p: usize, fd: i32 },
    Root { p: usize, c: usize, file: u64 },
    Alloc { p: usize, c: usize, parent: u32, handle: u32, class: u32, bytes: u64, ok: bool, inst: u32 },
    VidHeap { p: usize, c: usize, parent: u32, handle: u32, bytes: u64, virt: bool, free: bool },
    Free { p: usize, c: usize, handle: u32 },
    FreeClient { p: usize, c: usize },
    DupObj { p: usize, c: usize, parent: u32, handle: u32, sc: usize, sh: u32 },
    Mmap { p: usize, addr: u64, len: u64 },
    Munmap { p: usize, addr: u64 },
    Exec { p: usize },
    Exit { p: usize },
    Reuse { p: usize },
    Migrate { p: usize },
    RmCgroup { cg: u64 },
    Malformed { p: usize },
}

const CLIENTS: [u32; 3] = [0xc1d0_0001, 0xc1d0_0002, 0xc1d0_0003];

fn arb_step() -> impl Strategy<Value = Step> {
    let p = 0usize..3;
    let c = 0usize..3;
    let h = 1u32..10;
    let fd = 3i32..8;
    prop_oneof![
        2 => (p.clone(), fd.clone(), 0u8..4, 0u64..4).prop_map(|(p, fd, what, file)| Step::Open { p, fd, what, file }),
        1 => (p.clone(), fd.clone(), fd.clone()).prop_map(|(p, old, new)| Step::Dup { p, old, new }),
        2 => (p.clone(), fd.clone()).prop_map(|(p, fd)| Step::Close { p, fd }),
        2 => (p.clone(), c.clone(), 0u64..4).prop_map(|(p, c, file)| Step::Root { p, c, file }),
        8 => (
            p.clone(),
            c.clone(),
            prop_oneof![h.clone(), Just(0)],
            h.clone(),
            prop::sample::select(vec![0x80u32, 0x80, 0x2080, 0x40, 0x40, 0x3e, 0x50a0, 0x71, 0xf8, 0x90ce, 0xa06c]),
            1u64..(1 << 32),
            prop::bool::weighted(0.85),
            0u32..3,
        )
            .prop_map(|(p, c, parent, handle, class, bytes, ok, inst)| Step::Alloc {
                p,
                c,
                parent,
                handle,
                class,
                bytes,
                ok,
                inst
            }),
        2 => (p.clone(), c.clone(), h.clone(), h.clone(), 1u64..(1 << 32), any::<bool>(), any::<bool>())
            .prop_map(|(p, c, parent, handle, bytes, virt, free)| Step::VidHeap { p, c, parent, handle, bytes, virt, free }),
        5 => (p.clone(), c.clone(), h.clone()).prop_map(|(p, c, handle)| Step::Free { p, c, handle }),
        1 => (p.clone(), c.clone()).prop_map(|(p, c)| Step::FreeClient { p, c }),
        2 => (p.clone(), c.clone(), h.clone(), h.clone(), c.clone(), h.clone())
            .prop_map(|(p, c, parent, handle, sc, sh)| Step::DupObj { p, c, parent, handle, sc, sh }),
        2 => (p.clone(), 0u64..4, 1u64..(1 << 30)).prop_map(|(p, addr, len)| Step::Mmap { p, addr, len }),
        1 => (p.clone(), 0u64..4).prop_map(|(p, addr)| Step::Munmap { p, addr }),
        1 => p.clone().prop_map(|p| Step::Exec { p }),
        1 => p.clone().prop_map(|p| Step::Exit { p }),
        1 => p.clone().prop_map(|p| Step::Reuse { p }),
        1 => p.clone().prop_map(|p| Step::Migrate { p }),
        1 => (500u64..503).prop_map(|cg| Step::RmCgroup { cg }),
        1 => p.prop_map(|p| Step::Malformed { p }),
    ]
}

/// Drives a [`World`] from generated steps, keeping per-process start times and cgroups.
struct Driver {
    w: World,
    start: [u64; 3],
    cg: [u64; 3],
}

impl Driver {
    fn tgid(p: usize) -> u32 {
        100 + p as u32
    }
    fn apply(&mut self, p: usize, ev: impl FnOnce(Header) -> Event) {
        let header = self.w.hdr(Self::tgid(p), self.cg[p]);
        self.w.apply(ev(header), self.start[p]);
    }
    fn ioctl(&mut self, p: usize, device: Device, op: IoctlOp, ret: i64) {
        let abi = self.w.abi;
        self.apply(p, |header| {
            let mut e = encode::ioctl(header, device, 3, op, &abi);
            e.ret = ret;
            Event::Ioctl(e)
        });
    }
    fn step(&mut self, s: Step) {
        // Files are per process, as the kernel and the /proc seeder assign them.
        let ctl = |p: usize, file: u64| encode::ctl(1000 * p as u64 + file);
        match s {
            Step::Open { p, fd, what, file } => {
                let device = match what {
                    0 | 1 => ctl(p, file),
                    2 => encode::gpu(file as u32 % 2, 5000 + 1000 * p as u64 + file),
                    _ => encode::uvm_dev(9000 + p as u64),
                };
                let flags = if file == 3 { libc::O_CLOEXEC as u32 } else { 0 };
                self.apply(p, |header| Event::FdOpened { header, device, fd, open_flags: flags, seeded: false });
            }
            Step::Dup { p, old, new } => {
                let device = ctl(p, old as u64 % 4);
                self.apply(p, |header| Event::FdDuped { header, device, old_fd: old, new_fd: new });
            }
            Step::Close { p, fd } => {
                let device = ctl(p, fd as u64 % 4);
                self.apply(p, |header| Event::FdClosed { header, device, fd, replaced: false });
            }
            Step::Root { p, c, file } => self.ioctl(p, ctl(p, file), root(CLIENTS[c]), 0),
            Step::Alloc { p, c, parent, handle, class, bytes, ok, inst } => {
                let client = CLIENTS[c];
                let parent = if parent == 0 { client } else { parent };
                let op = match class {
                    0x80 => device(client, handle, inst),
                    0x2080 | 0xa06c => rm_alloc(client, parent, handle, class),
                    0x3e | 0x90ce | 0x71 => mem(client, parent, handle, class, bytes, Location::Sysmem),
                    0x50a0 => mem(client, parent, handle, class, bytes, Location::Unknown),
                    _ => mem(
                        client,
                        parent,
                        handle,
                        class,
                        bytes,
                        if inst == 2 { Location::Any } else { Location::Vidmem },
                    ),
                };
                self.ioctl(p, ctl(p, 0), op, if ok { 0 } else { -22 });
            }
            Step::VidHeap { p, c, parent, handle, bytes, virt, free } => {
                let client = CLIENTS[c];
                let op = if free {
                    IoctlOp::VidHeapFree { client, parent, handle, status: 0 }
                } else {
                    IoctlOp::VidHeapAlloc {
                        client,
                        parent,
                        handle,
                        bytes,
                        virtual_only: virt,
                        location: Location::Vidmem,
                        status: 0,
                    }
                };
                self.ioctl(p, ctl(p, 1), op, 0);
            }
            Step::Free { p, c, handle } => self.ioctl(p, ctl(p, 0), free(CLIENTS[c], handle), 0),
            Step::FreeClient { p, c } => self.ioctl(p, ctl(p, 0), free(CLIENTS[c], CLIENTS[c]), 0),
            Step::DupObj { p, c, parent, handle, sc, sh } => {
                let op = IoctlOp::RmDupObject {
                    client: CLIENTS[c],
                    parent,
                    handle,
                    src_client: CLIENTS[sc],
                    src_handle: sh,
                    status: 0,
                };
                self.ioctl(p, ctl(p, 0), op, 0);
            }
            Step::Mmap { p, addr, len } => {
                let device = encode::uvm_dev(9000 + p as u64);
                let addr = 0x7f00_0000_0000 + (addr << 32);
                self.apply(p, |header| Event::UvmMapped {
                    header,
                    device,
                    fd: 7,
                    addr,
                    len,
                    offset: addr,
                    prot: 3,
                    map_flags: 1,
                    ret: addr as i64,
                });
            }
            Step::Munmap { p, addr } => {
                let addr = 0x7f00_0000_0000 + (addr << 32);
                self.apply(p, |header| Event::UvmUnmapped { header, addr, len: 0, ret: 0 });
            }
            Step::Exec { p } => self.apply(p, |header| Event::ProcessExec { header, comm: "exec".into() }),
            Step::Exit { p } => self.apply(p, |header| Event::ProcessExit { header, comm: "exit".into() }),
            Step::Reuse { p } => self.start[p] += 1,
            Step::Migrate { p } => self.cg[p] = 500 + (self.cg[p] + 1) % 3,
            Step::RmCgroup { cg } => {
                let header = self.w.hdr(1, 1);
                self.w.apply(Event::CgroupRemoved { header, cgroup_id: cg, level: 2, path: String::new() }, 0);
            }
            Step::Malformed { p } => {
                let op = IoctlOp::Malformed { nr: 0x2b, reason: MalformedReason::ShortNested };
                self.ioctl(p, ctl(p, 0), op, 0)
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3_000, ..ProptestConfig::default() })]

    /// Over random sequences of alloc/free/dup/close/exec/exit/pid reuse/cgroup moves and
    /// removals: after every event the byte buckets add up exactly (Σ processes = Σ cgroups =
    /// Σ GPUs = total = Σ live allocations; checked by `World::apply`), and once every process has
    /// exited everything is zero.
    #[test]
    fn prop_ledger_invariants(
        steps in prop::collection::vec(arb_step(), 1..120),
        tight in any::<bool>(),
    ) {
        let cfg = if tight {
            StateConfig { max_processes: 2, max_handles_per_process: 8, max_fds_per_process: 3, max_managed_per_process: 2, max_cgroups: 2, max_control_cmds: 4 }
        } else {
            StateConfig::default()
        };
        let mut d = Driver { w: World::with(cfg), start: [1000, 2000, 3000], cg: [500, 501, 502] };
        for s in steps {
            d.step(s);
        }
        for p in 0..3 {
            d.step(Step::Exit { p });
        }
        let s = d.w.snap();
        prop_assert!(s.totals.usage.is_idle(), "{:?}", s.totals);
        prop_assert_eq!(s.totals.live_allocations, 0);
        prop_assert!(s.processes.is_empty());
        for c in &s.cgroups {
            prop_assert!(c.usage.is_idle(), "{:?}", c);
        }
        for g in &s.gpus {
            prop_assert!(g.usage.is_idle(), "{:?}", g);
        }
        prop_assert_eq!(s.counters.allocations, s.counters.frees);
    }
}

#[test]
fn implausible_sizes_are_counted_and_charged_as_zero() {
    let mut w = World::new();
    let ctl = w.cuda_init(10, 1, 1, Some(0), CLIENT);
    // A size no machine has (a racing writer's garbage): tracked as an object, charged nothing.
    w.ioctl(10, 1, ctl, vidmem(CLIENT, DEVICE, 0xcaf0_0100, u64::MAX - 5));
    w.ioctl(10, 1, ctl, vidmem(CLIENT, DEVICE, 0xcaf0_0101, 4 * MIB));
    assert_eq!(w.totals().vidmem_bytes, 4 * MIB);
    assert_eq!(w.snap().counters.implausible_sizes, 1);
    // Its free matches the tracked handle (not an unknown-handle free).
    w.ioctl(10, 1, ctl, free(CLIENT, 0xcaf0_0100));
    assert_eq!(w.snap().counters.unknown_handle_frees, 0);
    assert_eq!(w.totals().vidmem_bytes, 4 * MIB);
    w.st.check_invariants().unwrap();
}

#[test]
fn completeness_merges_counts_and_keeps_the_earliest_loss() {
    use super::snapshot::Completeness;
    let mut c = Completeness::default();
    assert!(c.exact());
    assert_eq!(c.describe(), "exact");
    let lost = |t: Option<u64>, nvml: Option<u64>| Completeness {
        from_before_agent: u32::from(t.is_none()),
        records_lost_since_unix_ns: t,
        nvml_bytes_from_before_agent: nvml,
    };
    c.merge(&lost(None, None));
    c.merge(&lost(Some(1_764_640_205_000_000_000), None));
    c.merge(&Completeness { from_before_agent: 1, ..lost(Some(1_764_640_300_000_000_000), None) });
    assert!(!c.exact());
    assert_eq!(c.from_before_agent, 2);
    assert_eq!(c.records_lost_since_unix_ns, Some(1_764_640_205_000_000_000));
    assert_eq!(c.describe(), "2 from before the agent, records lost since 2025-12-02T01:50:05Z");
    // NVML's figures for processes from before the agent add up; absent ones add nothing.
    c.merge(&lost(None, Some(1 << 30)));
    c.merge(&lost(None, Some(512 << 20)));
    assert_eq!(c.nvml_bytes_from_before_agent, Some(1536 << 20));
    assert_eq!(c.describe(), "4 from before the agent (NVML: 1.5 GiB), records lost since 2025-12-02T01:50:05Z");
}

/// Issue 13 item 8: the rows of processes from before the agent carry NVML's figure for their
/// memory, per process, summed per cgroup and in the totals, and per GPU on that GPU only.
#[test]
fn rows_of_processes_from_before_the_agent_carry_nvmls_figure() {
    let mut w = World::new();
    w.cuda_init(10, 500, 1, Some(0), CLIENT);
    w.cuda_init(11, 500, 2, Some(1), CLIENT + 1);
    w.cuda_init(12, 600, 3, Some(0), CLIENT + 2);
    w.st.mark_from_before_agent(10);
    w.st.mark_from_before_agent(11);
    let mut s = w.snap();
    // NVML: 10 holds 1 GiB on GPU 0 and 256 MiB on GPU 1; 11 has no reading; 12 (traced from its
    // start) is not asked.
    s.add_nvml_memory(|pid, minor| match (pid, minor) {
        (10, None) => Some((1 << 30) + (256 << 20)),
        (10, Some(0)) => Some(1 << 30),
        (10, Some(1)) => Some(256 << 20),
        (12, _) => panic!("only processes from before the agent are looked up"),
        _ => None,
    });
    let p = |tgid| s.processes.iter().find(|p| p.tgid == tgid).unwrap().completeness;
    assert_eq!(p(10).nvml_bytes_from_before_agent, Some((1 << 30) + (256 << 20)));
    assert_eq!(p(11).nvml_bytes_from_before_agent, None);
    let cg = |id| s.cgroups.iter().find(|c| c.cgroup_id == id).unwrap().completeness;
    assert_eq!(cg(500).nvml_bytes_from_before_agent, Some((1 << 30) + (256 << 20)));
    assert_eq!(cg(600).nvml_bytes_from_before_agent, None);
    let gpu = |m| s.gpus.iter().find(|g| g.minor == m).unwrap().completeness;
    assert_eq!(gpu(Some(0)).nvml_bytes_from_before_agent, Some(1 << 30), "process 10's GPU 0 part only");
    assert_eq!(gpu(Some(1)).nvml_bytes_from_before_agent, None, "10 does not have nvidia1 open; 11 has no reading");
    assert_eq!(s.totals.completeness.nvml_bytes_from_before_agent, Some((1 << 30) + (256 << 20)));
}

/// The bulk ring is not ordered with the ledger ring: a count-only record made before its
/// process's exit can be read after it. It is charged to its cgroup (while the cgroup has a row),
/// never brings the process back; a record made after the exit (the tgid reused) does.
#[test]
fn a_count_only_record_read_after_its_process_exit_does_not_bring_it_back() {
    let mut w = World::new();
    let ctl = w.cuda_init(10, 500, 1, Some(0), CLIENT);
    let control = IoctlOp::RmControl { client: CLIENT, object: CLIENT, cmd: 0x201, status: 0 };
    // Made at t, read after the exit at t+1.
    let late = w.hdr(10, 500);
    w.exit(10, 500);
    let ioctls_before = w.snap().cgroups.iter().find(|c| c.cgroup_id == 500).map(|c| c.usage.ioctls);
    let e = encode::ioctl(late, ctl, 3, control.clone(), &w.abi);
    w.apply(Event::Ioctl(e), 100);
    let s = w.snap();
    assert!(s.processes.is_empty(), "the process is not brought back: {:?}", s.processes);
    assert_eq!(s.counters.records_after_exit, 1);
    let ioctls_after = s.cgroups.iter().find(|c| c.cgroup_id == 500).map(|c| c.usage.ioctls);
    assert_eq!(ioctls_after, ioctls_before.map(|n| n + 1), "charged to its cgroup's row");
    // A record made after the exit is a new incarnation of the tgid.
    w.ioctl(10, 500, ctl, control);
    let s = w.snap();
    assert_eq!(s.processes.len(), 1);
    assert_eq!(s.counters.records_after_exit, 1);
}

/// Driver-entry mode: a file is named by its slot; its open record may come again (first call in
/// a process, processes taking turns), and its release closes it in every process that used it.
#[test]
fn a_released_file_slot_is_closed_in_every_process_that_used_it() {
    let mut w = World::new();
    let slot = tracer_common::FILE_SLOT_BASE as i32 | 0x1234;
    let ctl = encode::ctl(0xfeed);
    w.open(10, 500, slot, ctl);
    w.ioctl(10, 500, ctl, root(CLIENT));
    w.ioctl(10, 500, ctl, device(CLIENT, DEVICE, 0));
    w.ioctl(10, 500, ctl, vidmem(CLIENT, DEVICE, 0x100, MIB));
    // The same file registered again in the same process: nothing changes.
    w.open(10, 500, slot, ctl);
    assert_eq!(w.totals().vidmem_bytes, MIB);
    assert_eq!(w.snap().counters.stale_fds_replaced, 0);
    // A forked child uses the inherited file: its own client through it.
    w.open(11, 500, slot, ctl);
    w.ioctl(11, 500, ctl, root(0xc1d0_0009));
    w.ioctl(11, 500, ctl, device(0xc1d0_0009, DEVICE, 0));
    w.ioctl(11, 500, ctl, vidmem(0xc1d0_0009, DEVICE, 0x100, 2 * MIB));
    assert_eq!(w.totals().vidmem_bytes, 3 * MIB);
    // One release (carrying the last user's tgid) frees both processes' clients of that file.
    assert_eq!(w.close(11, 500, slot, ctl), Some(3 * MIB));
    assert!(w.totals().is_idle(), "{:?}", w.totals());
    assert_eq!(w.snap().counters.released_by.get("fd_release"), Some(&2));
    // A release of a file no process holds (its processes exited first) changes nothing.
    assert_eq!(w.close(12, 500, slot, ctl), None);
    assert_eq!(w.snap().counters.unknown_fd_closes, 0);
}
