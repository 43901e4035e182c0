//! The inverse of [`super::decode`]: builds the raw records the kernel side would write for an
//! event, for unit and integration tests, benchmarks and the fuzz seed corpus.
//!
//! `decode(&event(&e, abi), abi) == Ok(e)` for every event `decode` can produce (property-tested).
//! For [`IoctlOp::Malformed`] the encoder writes a record that exhibits the reason (a fault flag, a
//! short window, a bad size, a wrong tail offset) for the given `nr`; the reasons that can arise for
//! an `nr` are those listed by [`malformed_reasons`].

use tracer_common::{
    CGROUP_PATH_MAX, CgroupRmdirRecord, CudaAllocRecord, CudaFreeRecord, CudaFunctionRecord, CudaLaunchRecord,
    CudaTimedRecord, EventHeader, FdCloseRecord, FdDupRecord, FdOpenRecord, IOCTL_MAIN_MAX, IOCTL_NESTED_MAX,
    IoctlRecord, ProcExecRecord, ProcExitRecord, ProcForkRecord, Record, UvmMmapRecord, UvmMunmapRecord, flags,
    nv::{self, DriverAbi, class, esc, ioc_size, iowr, off, size, uvm},
    record_as_bytes,
};

use super::{
    Device, DeviceKind, Event, Header, IoctlEvent, IoctlOp, Location, MalformedReason, MemoryAlloc, RmAllocForm,
    ioctl::{MemLayout, memory_class},
    plan,
};

/// A user-space-looking address used for `arg`/`data_ptr` in encoded records.
pub(crate) const FAKE_ARG_PTR: u64 = 0x7ffd_1000_0000;
/// A user-space-looking address used for `nested_ptr` in encoded records.
pub(crate) const FAKE_NESTED_PTR: u64 = 0x7ffd_2000_0000;

/// The raw bytes of `ev`, as the kernel side would write them.
pub fn event(ev: &Event, abi: &DriverAbi) -> Vec<u8> {
    match ev {
        Event::FdOpened { header, device, fd, open_flags, seeded } => {
            let f = if *seeded { flags::SEEDED } else { 0 };
            record_bytes(&FdOpenRecord {
                hdr: wire_header::<FdOpenRecord>(header, f),
                dev: device.to_wire(),
                fd: *fd,
                open_flags: *open_flags,
            })
        }
        Event::FdClosed { header, device, fd, replaced } => {
            let f = if *replaced { flags::DUP_REPLACED } else { 0 };
            record_bytes(&FdCloseRecord {
                hdr: wire_header::<FdCloseRecord>(header, f),
                dev: device.to_wire(),
                fd: *fd,
                _pad: 0,
            })
        }
        Event::FdDuped { header, device, old_fd, new_fd } => record_bytes(&FdDupRecord {
            hdr: wire_header::<FdDupRecord>(header, 0),
            dev: device.to_wire(),
            old_fd: *old_fd,
            new_fd: *new_fd,
        }),
        Event::Ioctl(e) => record_bytes(&ioctl_record(e, abi)),
        Event::UvmMapped { header, device, fd, addr, len, offset, prot, map_flags, ret } => {
            record_bytes(&UvmMmapRecord {
                hdr: wire_header::<UvmMmapRecord>(header, 0),
                dev: device.to_wire(),
                fd: *fd,
                prot: *prot,
                map_flags: *map_flags,
                addr: *addr,
                len: *len,
                offset: *offset,
                ret: *ret,
            })
        }
        Event::UvmUnmapped { header, addr, len, ret } => record_bytes(&UvmMunmapRecord {
            hdr: wire_header::<UvmMunmapRecord>(header, 0),
            addr: *addr,
            len: *len,
            ret: *ret,
        }),
        Event::ProcessExec { header, comm } => {
            record_bytes(&ProcExecRecord { hdr: wire_header::<ProcExecRecord>(header, 0), comm: fixed(comm) })
        }
        Event::ProcessExit { header, comm } => {
            record_bytes(&ProcExitRecord { hdr: wire_header::<ProcExitRecord>(header, 0), comm: fixed(comm) })
        }
        Event::ProcessFork { header, child_pid } => record_bytes(&ProcForkRecord {
            hdr: wire_header::<ProcForkRecord>(header, 0),
            child_pid: *child_pid,
            _pad: 0,
        }),
        Event::CudaAlloc { header, entry, result, ptr, bytes, start_ktime_ns } => record_bytes(&CudaAllocRecord {
            hdr: wire_header::<CudaAllocRecord>(header, 0),
            entry: *entry,
            result: *result,
            ptr: *ptr,
            bytes: *bytes,
            start_ktime_ns: *start_ktime_ns,
        }),
        Event::CudaFree { header, entry, ptr } => record_bytes(&CudaFreeRecord {
            hdr: wire_header::<CudaFreeRecord>(header, 0),
            entry: *entry,
            _pad: 0,
            ptr: *ptr,
        }),
        Event::CudaFunction { header, entry, result, handle, source, name } => {
            let name: [u8; tracer_common::CUDA_NAME_MAX] = fixed(name);
            let name_len = name.iter().position(|&c| c == 0).unwrap_or(tracer_common::CUDA_NAME_MAX) as u32;
            record_bytes(&CudaFunctionRecord {
                hdr: wire_header::<CudaFunctionRecord>(header, 0),
                entry: *entry,
                result: *result,
                handle: *handle,
                source: *source,
                name_len,
                _pad: 0,
                name,
            })
        }
        Event::CudaLaunch { header, entry, function, stream, grid, block, shared_mem_bytes } => {
            record_bytes(&CudaLaunchRecord {
                hdr: wire_header::<CudaLaunchRecord>(header, 0),
                entry: *entry,
                shared_mem_bytes: *shared_mem_bytes,
                function: *function,
                stream: *stream,
                grid: *grid,
                block: *block,
            })
        }
        Event::CudaTimed { header, entry, result, start_ktime_ns, args } => record_bytes(&CudaTimedRecord {
            hdr: wire_header::<CudaTimedRecord>(header, 0),
            entry: *entry,
            result: *result,
            start_ktime_ns: *start_ktime_ns,
            args: *args,
        }),
        Event::CgroupRemoved { header, cgroup_id, level, path } => {
            let path: [u8; CGROUP_PATH_MAX] = fixed(path);
            let path_len = path.iter().position(|&c| c == 0).unwrap_or(CGROUP_PATH_MAX) as u32;
            record_bytes(&CgroupRmdirRecord {
                hdr: wire_header::<CgroupRmdirRecord>(header, 0),
                id: *cgroup_id,
                level: *level,
                path_len,
                path,
            })
        }
    }
}

/// The bytes of any wire record.
pub(crate) fn record_bytes<R: Record>(r: &R) -> Vec<u8> {
    record_as_bytes(r).to_vec()
}

/// A wire header for a record of type `R` (kind and size filled in).
pub(crate) fn wire_header<R: Record>(h: &Header, flags: u16) -> EventHeader {
    EventHeader {
        kind: R::KIND,
        flags,
        size: size_of::<R>() as u32,
        ktime_ns: h.ktime_ns,
        tgid: h.tgid,
        pid: h.pid,
        cgroup_id: h.cgroup_id,
    }
}

/// An ioctl event as a client would issue it: natural command, return 0, no XFER.
pub fn ioctl(header: Header, device: Device, fd: i32, op: IoctlOp, abi: &DriverAbi) -> IoctlEvent {
    IoctlEvent { header, device, fd, cmd: natural_cmd(&op, abi), ret: 0, duration_ns: 1_000, xfer: false, op }
}

/// A `DeviceRef`-equivalent for tests: `/dev/nvidiactl` opened as `file_id`.
pub fn ctl(file_id: u64) -> Device {
    Device { kind: DeviceKind::Ctl, minor: 255, file_id }
}
/// `/dev/nvidia<minor>` opened as `file_id`.
pub fn gpu(minor: u32, file_id: u64) -> Device {
    Device { kind: DeviceKind::Gpu, minor, file_id }
}
/// `/dev/nvidia-uvm` opened as `file_id`.
pub fn uvm_dev(file_id: u64) -> Device {
    Device { kind: DeviceKind::Uvm, minor: 0, file_id }
}

/// The frontend escape number an op is issued with (None for UVM/other-device ops).
pub(crate) fn frontend_nr(op: &IoctlOp) -> Option<u32> {
    use IoctlOp::*;
    Some(match op {
        RmAlloc { form: RmAllocForm::Nvos05, .. } => esc::RM_ALLOC_OBJECT,
        RmAlloc { .. } => esc::RM_ALLOC,
        RmFree { .. } => esc::RM_FREE,
        VidHeapAlloc { .. } | VidHeapFree { .. } | VidHeapOther { .. } => esc::RM_VID_HEAP_CONTROL,
        AllocMemory { .. } => esc::RM_ALLOC_MEMORY,
        RmControl { .. } => esc::RM_CONTROL,
        RmDupObject { .. } => esc::RM_DUP_OBJECT,
        RmMapMemory { .. } => esc::RM_MAP_MEMORY,
        RmUnmapMemory { .. } => esc::RM_UNMAP_MEMORY,
        RegisterFd { .. } => esc::REGISTER_FD,
        CardInfo { .. } => esc::CARD_INFO,
        CheckVersion { .. } => esc::CHECK_VERSION_STR,
        OtherFrontend { nr } => *nr,
        _ => return None,
    })
}

/// The `_IOC_SIZE` a client uses for a frontend op.
fn frontend_size(op: &IoctlOp, abi: &DriverAbi) -> u32 {
    use IoctlOp::*;
    match op {
        RmAlloc { form: RmAllocForm::Nvos21, .. } => size::NVOS21,
        RmAlloc { form: RmAllocForm::Nvos64, .. } => abi.nvos64_size,
        RmAlloc { form: RmAllocForm::Nvos05, .. } => size::NVOS05,
        CardInfo { cards } => size::CARD_INFO_ENTRY * (cards.len().max(1) as u32),
        Malformed { nr, .. } | OtherFrontend { nr } => valid_frontend_size(*nr, abi),
        other => frontend_nr(other).map_or(0, |nr| valid_frontend_size(nr, abi)),
    }
}

/// A size the driver accepts for frontend `nr` (0 if not a decoded escape).
fn valid_frontend_size(nr: u32, abi: &DriverAbi) -> u32 {
    let _ = abi;
    match nr {
        esc::RM_ALLOC => size::NVOS21,
        esc::RM_ALLOC_OBJECT => size::NVOS05,
        esc::RM_FREE => size::NVOS00,
        esc::RM_VID_HEAP_CONTROL => size::NVOS32,
        esc::RM_ALLOC_MEMORY => size::NVOS02_WITH_FD,
        esc::RM_CONTROL => size::NVOS54,
        esc::RM_DUP_OBJECT => size::NVOS55,
        esc::RM_MAP_MEMORY => size::NVOS33_WITH_FD,
        esc::RM_UNMAP_MEMORY => size::NVOS34,
        esc::REGISTER_FD => size::REGISTER_FD,
        esc::CARD_INFO => size::CARD_INFO_ENTRY,
        esc::CHECK_VERSION_STR => size::RM_API_VERSION,
        _ => 0,
    }
}

/// The UVM command of a UVM op (None for frontend/other ops).
pub(crate) fn uvm_cmd(op: &IoctlOp) -> Option<u32> {
    use IoctlOp::*;
    Some(match op {
        UvmInitialize { .. } => uvm::INITIALIZE,
        UvmMmInitialize { .. } => uvm::MM_INITIALIZE,
        UvmRegisterGpu { .. } => uvm::REGISTER_GPU,
        UvmUnregisterGpu { .. } => uvm::UNREGISTER_GPU,
        UvmCreateExternalRange { .. } => uvm::CREATE_EXTERNAL_RANGE,
        UvmMapExternal { .. } => uvm::MAP_EXTERNAL_ALLOCATION,
        UvmUnmapExternal { .. } => uvm::UNMAP_EXTERNAL,
        UvmFree { .. } => uvm::FREE,
        UvmPageableMemAccess { .. } => uvm::PAGEABLE_MEM_ACCESS,
        UvmValidateVaRange { .. } => uvm::VALIDATE_VA_RANGE,
        UvmOther { cmd } => *cmd,
        _ => return None,
    })
}

/// The command word a client passes to ioctl(2) for `op`: `_IOWR('F', nr, size)` for frontend
/// escapes, the plain command for UVM.
pub(crate) fn natural_cmd(op: &IoctlOp, abi: &DriverAbi) -> u32 {
    if let Some(cmd) = uvm_cmd(op) {
        return cmd;
    }
    match op {
        IoctlOp::OtherDevice { nr } => *nr,
        IoctlOp::Malformed { nr, .. } => iowr(*nr, valid_frontend_size(*nr, abi)),
        _ => iowr(frontend_nr(op).unwrap_or(0), frontend_size(op, abi)),
    }
}

/// The [`MalformedReason`]s the decoder can report for escape / UVM command `nr` on a device of
/// `kind` (what [`ioctl_record`] can encode faithfully).
pub fn malformed_reasons(kind: DeviceKind, nr: u32) -> Vec<MalformedReason> {
    use MalformedReason::*;
    match kind {
        DeviceKind::Ctl | DeviceKind::Gpu => {
            let mut v = vec![FaultXfer];
            if valid_frontend_size(nr, &DriverAbi::for_version(nv::DEFAULT_DRIVER_VERSION)) != 0 {
                v.extend([FaultMain, ShortMain, BadSize]);
            }
            if nr == esc::RM_ALLOC {
                v.extend([FaultNested, ShortNested]);
            }
            v
        }
        DeviceKind::Uvm => match nr {
            uvm::INITIALIZE
            | uvm::MM_INITIALIZE
            | uvm::REGISTER_GPU
            | uvm::UNREGISTER_GPU
            | uvm::CREATE_EXTERNAL_RANGE
            | uvm::UNMAP_EXTERNAL
            | uvm::FREE
            | uvm::PAGEABLE_MEM_ACCESS
            | uvm::VALIDATE_VA_RANGE => vec![FaultMain, ShortMain],
            uvm::MAP_EXTERNAL_ALLOCATION => vec![FaultMain, ShortMain, FaultTail, ShortTail, BadTailOffset],
            _ => vec![],
        },
        _ => vec![],
    }
}

/// Little-endian field writes into a record window, growing its captured length.
struct Writer<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl Writer<'_> {
    fn put(&mut self, off: usize, b: &[u8]) {
        if let Some(dst) = self.buf.get_mut(off..off + b.len()) {
            dst.copy_from_slice(b);
        }
    }
    fn u8(&mut self, off: usize, v: u8) {
        self.put(off, &[v]);
    }
    fn u16(&mut self, off: usize, v: u16) {
        self.put(off, &v.to_le_bytes());
    }
    fn u32(&mut self, off: usize, v: u32) {
        self.put(off, &v.to_le_bytes());
    }
    fn i32(&mut self, off: usize, v: i32) {
        self.put(off, &v.to_le_bytes());
    }
    fn u64(&mut self, off: usize, v: u64) {
        self.put(off, &v.to_le_bytes());
    }
    fn set_len(&mut self, n: usize) {
        self.len = n.min(self.buf.len());
    }
}

/// The raw ioctl record for `ev` (see the module docs).
pub(crate) fn ioctl_record(ev: &IoctlEvent, abi: &DriverAbi) -> IoctlRecord {
    let mut r = IoctlRecord {
        hdr: wire_header::<IoctlRecord>(&ev.header, if ev.xfer { flags::XFER } else { 0 }),
        dev: ev.device.to_wire(),
        fd: ev.fd,
        cmd: ev.cmd,
        arg: FAKE_ARG_PTR,
        ret: ev.ret,
        duration_ns: ev.duration_ns,
        data_ptr: FAKE_ARG_PTR,
        ..IoctlRecord::default()
    };
    match ev.device.kind {
        DeviceKind::Ctl | DeviceKind::Gpu => encode_frontend(&mut r, &ev.op, abi),
        DeviceKind::Uvm => encode_uvm(&mut r, &ev.op, abi),
        _ => {
            r.nr = match &ev.op {
                IoctlOp::OtherDevice { nr } => *nr,
                other => frontend_nr(other).or_else(|| uvm_cmd(other)).unwrap_or(0),
            };
        }
    }
    r
}

fn finish_main(r: &mut IoctlRecord, len: usize) {
    r.main_len = len.min(IOCTL_MAIN_MAX) as u16;
}

fn encode_frontend(r: &mut IoctlRecord, op: &IoctlOp, abi: &DriverAbi) {
    use IoctlOp::*;
    r.nr = frontend_nr(op).unwrap_or(match op {
        Malformed { nr, .. } => *nr,
        _ => 0,
    });
    r.size = frontend_size(op, abi);
    let size = r.size as usize;
    match op {
        RmAlloc { client, parent, handle, class: c, status, form, memory, device_instance, subdevice_instance } => {
            let status_off = match form {
                RmAllocForm::Nvos21 => off::NVOS21_STATUS,
                RmAllocForm::Nvos64 => abi.nvos64_status,
                RmAllocForm::Nvos05 => off::NVOS05_STATUS,
            };
            let nested_len = if *form != RmAllocForm::Nvos05
                && (memory.is_some() || device_instance.is_some() || subdevice_instance.is_some())
            {
                encode_alloc_params(r, *c, memory.as_ref(), *device_instance, *subdevice_instance, abi)
            } else {
                0
            };
            let mut w = Writer { buf: &mut r.main, len: 0 };
            w.u32(off::ALLOC_H_ROOT, if class::is_root(*c) { 0 } else { *client });
            w.u32(off::ALLOC_H_PARENT, *parent);
            w.u32(off::ALLOC_H_NEW, *handle);
            w.u32(off::ALLOC_H_CLASS, *c);
            if *form != RmAllocForm::Nvos05 {
                w.u64(off::ALLOC_P_PARAMS, if nested_len > 0 { FAKE_NESTED_PTR } else { 0 });
                match form {
                    RmAllocForm::Nvos21 => w.u32(off::NVOS21_PARAMS_SIZE, nested_len as u32),
                    _ if abi.nvos64_size == size::NVOS64 => w.u32(off::NVOS64_PARAMS_SIZE, nested_len as u32),
                    _ => {}
                }
            }
            w.u32(status_off, *status);
            finish_main(r, size);
        }
        RmFree { client, parent, handle, status } => {
            let mut w = Writer { buf: &mut r.main, len: 0 };
            w.u32(off::FREE_H_ROOT, *client);
            w.u32(off::FREE_H_PARENT, *parent);
            w.u32(off::FREE_H_OBJECT, *handle);
            w.u32(off::FREE_STATUS, *status);
            finish_main(r, size);
        }
        VidHeapAlloc { client, parent, handle, bytes, virtual_only, location, status } => {
            let mut w = Writer { buf: &mut r.main, len: 0 };
            vid_heap_head(&mut w, *client, *parent, nv::NVOS32_FUNCTION_ALLOC_SIZE, *status);
            w.u32(off::VHC_H_MEMORY, *handle);
            w.u32(off::VHC_ALLOC_FLAGS, if *virtual_only { nv::NVOS32_ALLOC_FLAGS_VIRTUAL } else { 0 });
            w.u32(off::VHC_ALLOC_ATTR, location.to_attr());
            w.u64(off::VHC_ALLOC_SIZE, *bytes);
            finish_main(r, size);
        }
        VidHeapFree { client, parent, handle, status } => {
            let mut w = Writer { buf: &mut r.main, len: 0 };
            vid_heap_head(&mut w, *client, *parent, nv::NVOS32_FUNCTION_FREE, *status);
            w.u32(off::VHC_H_MEMORY, *handle);
            finish_main(r, size);
        }
        VidHeapOther { client, function, status } => {
            let mut w = Writer { buf: &mut r.main, len: 0 };
            vid_heap_head(&mut w, *client, 0, *function, *status);
            finish_main(r, size);
        }
        AllocMemory { client, parent, handle, class: c, memory, status } => {
            let loc = match memory.location {
                Location::Sysmem => nv::NVOS02_LOCATION_PCI,
                Location::Vidmem => nv::NVOS02_LOCATION_VIDMEM,
                Location::Any | Location::Unknown => 1,
            };
            let mut w = Writer { buf: &mut r.main, len: 0 };
            w.u32(off::NVOS02_H_ROOT, *client);
            w.u32(off::NVOS02_H_PARENT, *parent);
            w.u32(off::NVOS02_H_NEW, *handle);
            w.u32(off::NVOS02_H_CLASS, *c);
            w.u32(off::NVOS02_FLAGS, loc << nv::NVOS02_LOCATION_SHIFT);
            w.u64(off::NVOS02_P_MEMORY, 0);
            w.u64(off::NVOS02_LIMIT, memory.bytes.wrapping_sub(1));
            w.u32(off::NVOS02_STATUS, *status);
            w.i32(off::NVOS02_FD, -1);
            finish_main(r, size);
        }
        RmControl { client, object, cmd, status } => {
            let mut w = Writer { buf: &mut r.main, len: 0 };
            w.u32(off::CTRL_H_CLIENT, *client);
            w.u32(off::CTRL_H_OBJECT, *object);
            w.u32(off::CTRL_CMD, *cmd);
            w.u32(off::CTRL_STATUS, *status);
            finish_main(r, size);
        }
        RmDupObject { client, parent, handle, src_client, src_handle, status } => {
            let mut w = Writer { buf: &mut r.main, len: 0 };
            w.u32(off::DUP_H_CLIENT, *client);
            w.u32(off::DUP_H_PARENT, *parent);
            w.u32(off::DUP_H_OBJECT, *handle);
            w.u32(off::DUP_H_CLIENT_SRC, *src_client);
            w.u32(off::DUP_H_OBJECT_SRC, *src_handle);
            w.u32(off::DUP_STATUS, *status);
            finish_main(r, size);
        }
        RmMapMemory { client, device, memory, offset, length, fd, status } => {
            let mut w = Writer { buf: &mut r.main, len: 0 };
            w.u32(off::MAP_H_CLIENT, *client);
            w.u32(off::MAP_H_DEVICE, *device);
            w.u32(off::MAP_H_MEMORY, *memory);
            w.u64(off::MAP_OFFSET, *offset);
            w.u64(off::MAP_LENGTH, *length);
            w.u32(off::MAP_STATUS, *status);
            w.i32(off::MAP_FD, *fd);
            finish_main(r, size);
        }
        RmUnmapMemory { client, device, memory, status } => {
            let mut w = Writer { buf: &mut r.main, len: 0 };
            w.u32(off::UNMAP_H_CLIENT, *client);
            w.u32(off::UNMAP_H_DEVICE, *device);
            w.u32(off::UNMAP_H_MEMORY, *memory);
            w.u32(off::UNMAP_STATUS, *status);
            finish_main(r, size);
        }
        RegisterFd { ctl_fd } => {
            Writer { buf: &mut r.main, len: 0 }.i32(off::REGISTER_FD_CTL_FD, *ctl_fd);
            finish_main(r, size);
        }
        CardInfo { cards } => {
            let entry = size::CARD_INFO_ENTRY as usize;
            let mut w = Writer { buf: &mut r.main, len: 0 };
            for (i, c) in cards.iter().enumerate().take(IOCTL_MAIN_MAX / entry) {
                let b = i * entry;
                w.u8(b + off::CARD_INFO_VALID, c.valid as u8);
                w.u32(b + off::CARD_INFO_PCI_DOMAIN, c.pci_domain);
                w.u8(b + off::CARD_INFO_PCI_BUS, c.pci_bus);
                w.u8(b + off::CARD_INFO_PCI_SLOT, c.pci_slot);
                w.u8(b + off::CARD_INFO_PCI_FUNCTION, c.pci_function);
                w.u16(b + off::CARD_INFO_PCI_VENDOR_ID, c.vendor_id);
                w.u16(b + off::CARD_INFO_PCI_DEVICE_ID, c.device_id);
                w.u32(b + off::CARD_INFO_GPU_ID, c.gpu_id);
                w.u32(b + off::CARD_INFO_MINOR_NUMBER, c.minor);
            }
            // Like the kernel: as many whole entries as the window holds.
            finish_main(r, size.min(IOCTL_MAIN_MAX / entry * entry));
        }
        CheckVersion { reply, version } => {
            let mut w = Writer { buf: &mut r.main, len: 0 };
            w.u32(off::RM_API_VERSION_REPLY, *reply);
            let s: [u8; nv::NV_RM_API_VERSION_STRING_LENGTH] = fixed(version);
            w.put(off::RM_API_VERSION_STRING, &s);
            finish_main(r, size);
        }
        OtherFrontend { .. } => {
            r.size = ioc_size(r.cmd);
            finish_main(r, 0);
        }
        Malformed { nr, reason } => encode_malformed_frontend(r, *nr, *reason, abi),
        // UVM/other-device ops on a frontend node: not producible by decode; record the nr only.
        other => {
            r.nr = uvm_cmd(other).unwrap_or(0);
        }
    }
}

fn vid_heap_head(w: &mut Writer<'_>, client: u32, parent: u32, function: u32, status: u32) {
    w.u32(off::VHC_H_ROOT, client);
    w.u32(off::VHC_H_PARENT, parent);
    w.u32(off::VHC_FUNCTION, function);
    w.u32(off::VHC_STATUS, status);
}

/// Fill the nested window for an RM_ALLOC of class `c`; returns its length.
fn encode_alloc_params(
    r: &mut IoctlRecord,
    c: u32,
    memory: Option<&MemoryAlloc>,
    device_instance: Option<u32>,
    subdevice_instance: Option<u32>,
    abi: &DriverAbi,
) -> usize {
    let len = (plan::alloc_param_size(abi, c) as usize).min(IOCTL_NESTED_MAX);
    let mut w = Writer { buf: &mut r.nested, len: 0 };
    if let (Some(m), Some((_, layout, _))) = (memory, memory_class(c)) {
        match layout {
            MemLayout::MemParams => {
                w.u32(off::MEM_PARAMS_ATTR, m.location.to_attr());
                w.u64(off::MEM_PARAMS_SIZE, m.bytes);
            }
            MemLayout::Physical => w.u64(off::PHYS_MEM_SIZE, m.bytes),
            MemLayout::Fabric => w.u64(off::FABRIC_ALLOC_SIZE, m.bytes),
            MemLayout::OsDesc => {
                w.u32(off::OSDESC_ATTR, m.location.to_attr());
                w.u64(off::OSDESC_DESCRIPTOR, FAKE_NESTED_PTR);
                w.u64(off::OSDESC_LIMIT, m.bytes.wrapping_sub(1));
            }
            MemLayout::Virtual => {
                w.u64(off::VIRT_OFFSET, 0);
                w.u64(off::VIRT_LIMIT, m.bytes.wrapping_sub(1));
            }
        }
    }
    if let Some(d) = device_instance {
        w.u32(off::DEVICE_ID, d);
    }
    if let Some(s) = subdevice_instance {
        w.u32(off::SUBDEVICE_ID, s);
    }
    w.set_len(len);
    let n = w.len;
    r.nested_len = n as u16;
    r.nested_ptr = if n > 0 { FAKE_NESTED_PTR } else { 0 };
    n
}

fn encode_malformed_frontend(r: &mut IoctlRecord, nr: u32, reason: MalformedReason, abi: &DriverAbi) {
    use MalformedReason::*;
    r.nr = nr;
    r.size = valid_frontend_size(nr, abi);
    r.main_len = 0;
    match reason {
        // The XFER flag itself follows `IoctlEvent::xfer`.
        FaultXfer => r.hdr.flags |= flags::FAULT_XFER,
        FaultMain => r.hdr.flags |= flags::FAULT_MAIN,
        BadSize => {
            // A size the driver rejects: one byte more than the struct (0 for the array escapes).
            r.size = match nr {
                esc::CARD_INFO | esc::REGISTER_FD | esc::CHECK_VERSION_STR => 0,
                _ => r.size + 1,
            };
        }
        FaultNested | ShortNested => {
            // A successful allocation of video memory whose size cannot be read.
            let mut w = Writer { buf: &mut r.main, len: 0 };
            w.u32(off::ALLOC_H_CLASS, class::NV01_MEMORY_LOCAL_USER);
            w.u32(off::NVOS21_STATUS, nv::NV_OK);
            finish_main(r, size::NVOS21 as usize);
            r.size = size::NVOS21;
            if reason == FaultNested {
                r.hdr.flags |= flags::FAULT_NESTED;
                r.nested_ptr = FAKE_NESTED_PTR;
            }
        }
        ShortMain | FaultTail | ShortTail | BadTailOffset => {}
    }
}

fn encode_uvm(r: &mut IoctlRecord, op: &IoctlOp, abi: &DriverAbi) {
    use IoctlOp::*;
    r.size = 0;
    r.nr = uvm_cmd(op).unwrap_or(match op {
        Malformed { nr, .. } | OtherDevice { nr } => *nr,
        other => frontend_nr(other).unwrap_or(0),
    });
    let mut w = Writer { buf: &mut r.main, len: 0 };
    let len = match op {
        UvmInitialize { flags, status } => {
            w.u64(0, *flags);
            w.u32(uvm::INITIALIZE_STATUS, *status);
            uvm::INITIALIZE_SIZE
        }
        UvmMmInitialize { uvm_fd, status } => {
            w.i32(nv::UVM_MM_INITIALIZE_FD, *uvm_fd);
            w.u32(nv::UVM_MM_INITIALIZE_STATUS, *status);
            uvm::MM_INITIALIZE_SIZE
        }
        UvmRegisterGpu { uuid, rm_ctrl_fd, client, status } => {
            w.put(uvm::REGISTER_GPU_UUID, uuid);
            w.i32(uvm::REGISTER_GPU_RM_CTRL_FD, *rm_ctrl_fd);
            w.u32(uvm::REGISTER_GPU_H_CLIENT, *client);
            w.u32(uvm::REGISTER_GPU_STATUS, *status);
            uvm::REGISTER_GPU_SIZE
        }
        UvmUnregisterGpu { uuid, status } => {
            w.put(0, uuid);
            w.u32(uvm::UNREGISTER_GPU_STATUS, *status);
            uvm::UNREGISTER_GPU_SIZE
        }
        UvmCreateExternalRange { base, length, status } => {
            w.u64(0, *base);
            w.u64(8, *length);
            w.u32(uvm::CREATE_EXTERNAL_RANGE_STATUS, *status);
            uvm::CREATE_EXTERNAL_RANGE_SIZE
        }
        UvmMapExternal { base, length, offset, rm_ctrl_fd, client, memory_handle, status } => {
            w.u64(0, *base);
            w.u64(8, *length);
            w.u64(16, *offset);
            let mut t = Writer { buf: &mut r.tail, len: 0 };
            t.i32(nv::UVM_MAP_EXTERNAL_TAIL_RM_CTRL_FD, *rm_ctrl_fd);
            t.u32(nv::UVM_MAP_EXTERNAL_TAIL_H_CLIENT, *client);
            t.u32(nv::UVM_MAP_EXTERNAL_TAIL_H_MEMORY, *memory_handle);
            t.u32(nv::UVM_MAP_EXTERNAL_TAIL_STATUS, *status);
            r.tail_off = abi.uvm_map_external_tail;
            r.tail_len = uvm::MAP_EXTERNAL_TAIL_LEN as u16;
            uvm::MAP_EXTERNAL_HEAD
        }
        UvmUnmapExternal { base, length, uuid, status } => {
            w.u64(0, *base);
            w.u64(8, *length);
            w.put(nv::UVM_UNMAP_EXTERNAL_UUID, uuid);
            w.u32(nv::UVM_UNMAP_EXTERNAL_STATUS, *status);
            uvm::UNMAP_EXTERNAL_SIZE
        }
        UvmFree { base, status } => {
            w.u64(0, *base);
            w.u32(abi.uvm_free_status, *status);
            abi.uvm_free_size
        }
        UvmPageableMemAccess { enabled, status } => {
            w.u8(0, *enabled as u8);
            w.u32(nv::UVM_PAGEABLE_MEM_ACCESS_STATUS, *status);
            uvm::PAGEABLE_MEM_ACCESS_SIZE
        }
        UvmValidateVaRange { base, length, status } => {
            w.u64(0, *base);
            w.u64(8, *length);
            w.u32(nv::UVM_VALIDATE_VA_RANGE_STATUS, *status);
            uvm::VALIDATE_VA_RANGE_SIZE
        }
        Malformed { nr, reason } => {
            let nr = *nr;
            let head = if nr == uvm::MAP_EXTERNAL_ALLOCATION { uvm::MAP_EXTERNAL_HEAD } else { 0 };
            let tail_off = abi.uvm_map_external_tail;
            match reason {
                MalformedReason::FaultMain => {
                    r.hdr.flags |= flags::FAULT_MAIN;
                    0
                }
                MalformedReason::FaultTail => {
                    r.hdr.flags |= flags::FAULT_TAIL;
                    r.tail_off = tail_off;
                    head
                }
                MalformedReason::ShortTail => {
                    r.tail_off = tail_off;
                    head
                }
                MalformedReason::BadTailOffset => {
                    r.tail_off = tail_off ^ 0x10;
                    r.tail_len = uvm::MAP_EXTERNAL_TAIL_LEN as u16;
                    head
                }
                _ => 0,
            }
        }
        _ => 0,
    };
    finish_main(r, len as usize);
}

/// `s` as a NUL-padded fixed array (truncated to `N` bytes).
fn fixed<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let b = s.as_bytes();
    let n = b.len().min(N);
    out[..n].copy_from_slice(&b[..n]);
    out
}
