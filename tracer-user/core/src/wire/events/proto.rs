//! Decoded events ([`Event`], with the [`EventContext`] the pipeline joined to them) as
//! `gputracer.v1.Event` messages.

use gpu_tracer_proto::v1::{self, event::Payload};
use tracer_common::{flags, kind, nv};

use crate::decode::{
    Device, DeviceKind, Event, Header, IoctlEvent, IoctlOp, Location, MalformedReason, MemoryAlloc, MemoryKind,
    RmAllocForm,
};
use crate::model::EventContext;

/// The protobuf form of a container identity.
pub(crate) fn container_proto(c: &crate::identity::ContainerIdentity) -> v1::ContainerIdentity {
    let s = |v: &Option<String>| v.clone().unwrap_or_default();
    v1::ContainerIdentity {
        kind: c.kind.into(),
        runtime: c.runtime.unwrap_or_default().into(),
        container_id: s(&c.container_id),
        pod_uid: s(&c.pod_uid),
        qos: c.qos.unwrap_or_default().into(),
        namespace: s(&c.namespace),
        pod: s(&c.pod),
        container: s(&c.container),
        owner_kind: s(&c.owner_kind),
        owner_name: s(&c.owner_name),
        labels: c.labels.clone().into_iter().collect(),
        allocated_gpus: c.allocated_gpus.clone(),
        allocations_known: c.allocations_known,
    }
}

/// A guardrail violation as an event (user space makes it; `ktime_ns` is when it was raised).
pub fn violation_to_proto(
    v: &crate::guardrails::Violation,
    cgroup_id: u64,
    ktime_ns: u64,
    e: &EventContext,
) -> v1::Event {
    let h = Header { ktime_ns, tgid: v.pid, pid: v.pid, cgroup_id };
    let g = v.gpu.clone().unwrap_or_default();
    let payload = Payload::Violation(v1::Violation {
        kind: v.kind.as_str().into(),
        namespace: v.namespace.clone(),
        pod: v.pod.clone(),
        container: v.container.clone(),
        gpu_uuid: g.uuid.unwrap_or_default(),
        gpu_minor: g.minor,
        gpu_index: g.index,
        mig_uuid: g.mig_uuid.unwrap_or_default(),
        device_path: v.evidence.device_path.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        nvml_uuid: v.evidence.nvml_uuid.clone().unwrap_or_default(),
        nvidia_visible_devices: v.evidence.visible_devices.nvidia.clone(),
        cuda_visible_devices: v.evidence.visible_devices.cuda.clone(),
        allocated: v.evidence.allocated.clone(),
    });
    message(&h, e, None, Call::default(), None, None, payload)
}

/// Converts one decoded event into its `gputracer.v1` message. `header.kind` always matches the
/// payload case, and `device`/`fd` are set exactly for events on an NVIDIA fd.
pub fn to_proto(ev: &Event, e: &EventContext) -> v1::Event {
    let no_call = Call::default();
    match ev {
        Event::FdOpened { header, device, fd, open_flags, seeded } => {
            // A seeded fd was found by the /proc scan: there was no syscall to report.
            let call = if *seeded { no_call } else { Call { duration_ns: 0, ret: i64::from(*fd) } };
            let payload = Payload::FdOpened(v1::FdOpened { open_flags: *open_flags, seeded: *seeded });
            message(header, e, None, call, Some(device), Some(*fd), payload)
        }
        Event::FdClosed { header, device, fd, replaced } => {
            let payload = Payload::FdClosed(v1::FdClosed { replaced_by_dup: *replaced });
            message(header, e, None, no_call, Some(device), Some(*fd), payload)
        }
        Event::FdDuped { header, device, old_fd, new_fd } => {
            let call = Call { duration_ns: 0, ret: i64::from(*new_fd) };
            let payload = Payload::FdDuped(v1::FdDuped { new_fd: *new_fd });
            message(header, e, None, call, Some(device), Some(*old_fd), payload)
        }
        Event::Ioctl(io) => {
            let call = Call { duration_ns: io.duration_ns, ret: io.ret };
            message(&io.header, e, None, call, Some(&io.device), Some(io.fd), ioctl_payload(io, e))
        }
        Event::UvmMapped { header, device, fd, addr, len, ret, .. } => {
            // `addr` is mmap's hint; a successful mmap returns the address actually mapped, which
            // is the one a later munmap (ManagedUnmap) names.
            let mapped = if (-4095..0).contains(ret) { *addr } else { *ret as u64 };
            let payload = Payload::ManagedMap(v1::ManagedMap { addr: mapped, length: *len });
            message(header, e, None, Call { duration_ns: 0, ret: *ret }, Some(device), Some(*fd), payload)
        }
        Event::UvmUnmapped { header, addr, len, ret } => {
            let payload = Payload::ManagedUnmap(v1::ManagedUnmap { addr: *addr, length: *len });
            message(header, e, None, Call { duration_ns: 0, ret: *ret }, None, None, payload)
        }
        Event::ProcessExec { header, comm } => {
            message(header, e, Some(comm), no_call, None, None, Payload::ProcessExec(v1::ProcessExec {}))
        }
        Event::ProcessExit { header, comm } => {
            message(header, e, Some(comm), no_call, None, None, Payload::ProcessExit(v1::ProcessExit {}))
        }
        Event::ProcessFork { header, child_pid } => {
            let payload = Payload::ProcessFork(v1::ProcessFork { child_pid: *child_pid });
            message(header, e, None, no_call, None, None, payload)
        }
        Event::CudaAlloc { header, entry, result, ptr, bytes, start_ktime_ns } => {
            let payload = Payload::CudaAlloc(v1::CudaAlloc {
                entry_point: cuda_entry_name(*entry).into(),
                result: *result,
                success: *result == 0,
                ptr: *ptr,
                bytes: *bytes,
            });
            // Recorded at entry (0 from a record that has none): the call's time inside libcuda.
            let duration_ns = if *start_ktime_ns == 0 { 0 } else { header.ktime_ns.saturating_sub(*start_ktime_ns) };
            message(header, e, None, Call { duration_ns, ret: i64::from(*result) }, None, None, payload)
        }
        Event::CudaFree { header, entry, ptr } => {
            let payload = Payload::CudaFree(v1::CudaFree {
                entry_point: cuda_entry_name(*entry).into(),
                ptr: *ptr,
                bytes_released: e.released_bytes.unwrap_or(0),
            });
            message(header, e, None, no_call, None, None, payload)
        }
        Event::CudaFunction { header, entry, result, handle, source, name } => {
            let payload = Payload::CudaFunction(v1::CudaFunction {
                entry_point: cuda_entry_name(*entry).into(),
                result: *result,
                handle: *handle,
                source: *source,
                name: if name.is_empty() { e.kernel_name.clone().unwrap_or_default() } else { name.clone() },
            });
            message(header, e, None, no_call, None, None, payload)
        }
        Event::CudaLaunch { header, entry, function, stream, grid, block, shared_mem_bytes } => {
            let payload = Payload::CudaLaunch(v1::CudaLaunch {
                entry_point: cuda_entry_name(*entry).into(),
                function: *function,
                kernel_name: e.kernel_name.clone().unwrap_or_default(),
                stream: *stream,
                grid: grid.to_vec(),
                block: block.to_vec(),
                shared_mem_bytes: *shared_mem_bytes,
            });
            message(header, e, None, no_call, None, None, payload)
        }
        Event::CudaTimed { header, entry, result, start_ktime_ns, args } => {
            use tracer_common::timed;
            let class = match timed::class(*entry) {
                Some(timed::Class::Synchronize) => "synchronize",
                Some(timed::Class::Query) => "query",
                Some(timed::Class::Wait) => "wait",
                Some(timed::Class::Record) => "record",
                Some(timed::Class::Copy) => "copy",
                Some(timed::Class::Set) => "memset",
                None => "",
            };
            let payload = Payload::CudaCall(v1::CudaCall {
                entry_point: cuda_entry_name(*entry).into(),
                class: class.into(),
                result: *result,
                success: *result == 0,
                stream: timed::stream(*entry, args),
                event: timed::event(*entry, args),
                bytes: timed::bytes(*entry, args),
                direction: if class == "copy" { timed::direction(*entry).into() } else { String::new() },
                r#async: timed::is_async(*entry),
            });
            let call = Call { duration_ns: header.ktime_ns.saturating_sub(*start_ktime_ns), ret: i64::from(*result) };
            message(header, e, None, call, None, None, payload)
        }
        Event::CgroupRemoved { header, cgroup_id, level, path } => {
            let payload =
                Payload::CgroupRemoved(v1::CgroupRemoved { cgroup_id: *cgroup_id, level: *level, path: path.clone() });
            message(header, e, None, no_call, None, None, payload)
        }
    }
}

/// The kind [`to_proto`] would give `ev`, without building the message (an ioctl's payload is
/// built, which is plain numbers): lets a consumer that keeps only some kinds skip the rest cheaply.
pub fn kind_of(ev: &Event, e: &EventContext) -> v1::EventKind {
    use v1::EventKind as K;
    match ev {
        Event::FdOpened { .. } => K::FdOpened,
        Event::FdClosed { .. } => K::FdClosed,
        Event::FdDuped { .. } => K::FdDuped,
        Event::Ioctl(io) => event_kind(&ioctl_payload(io, e)),
        Event::UvmMapped { .. } => K::ManagedMap,
        Event::UvmUnmapped { .. } => K::ManagedUnmap,
        Event::ProcessExec { .. } => K::ProcessExec,
        Event::ProcessExit { .. } => K::ProcessExit,
        Event::ProcessFork { .. } => K::ProcessFork,
        Event::CudaAlloc { .. } => K::CudaAlloc,
        Event::CudaFree { .. } => K::CudaFree,
        Event::CudaFunction { .. } => K::CudaFunction,
        Event::CudaLaunch { .. } => K::CudaLaunch,
        Event::CudaTimed { .. } => K::CudaCall,
        Event::CgroupRemoved { .. } => K::CgroupRemoved,
    }
}

/// A batch of launches counted in the kernel (`cuda_entry` id `entry`) for one process, as an event.
pub fn launch_batch_to_proto(
    tgid: u32,
    cgroup_id: u64,
    entry: u32,
    launches: u64,
    interval_ns: u64,
    ktime_ns: u64,
    e: &EventContext,
) -> v1::Event {
    let h = Header { ktime_ns, tgid, pid: tgid, cgroup_id };
    let payload = Payload::CudaLaunchBatch(v1::CudaLaunchBatch {
        entry_point: cuda_entry_name(entry).into(),
        launches,
        interval_ns,
    });
    message(&h, e, None, Call::default(), None, None, payload)
}

/// The exported symbol of a `cuda_entry` id.
fn cuda_entry_name(id: u32) -> &'static str {
    tracer_common::cuda_entry::ALL.get(id as usize).map(|e| e.1).unwrap_or("unknown")
}

/// The syscall part of a header: zero for events that are not system calls.
#[derive(Clone, Copy, Default)]
struct Call {
    duration_ns: u64,
    ret: i64,
}

fn message(
    h: &Header,
    e: &EventContext,
    own_comm: Option<&String>,
    call: Call,
    device: Option<&Device>,
    fd: Option<i32>,
    payload: Payload,
) -> v1::Event {
    // Exec and exit carry the task's comm at the event, which beats a cached one.
    let comm = match own_comm {
        Some(c) if !c.is_empty() => c.clone(),
        _ => e.comm.clone().unwrap_or_default(),
    };
    v1::Event {
        header: Some(v1::Header {
            kind: event_kind(&payload) as i32,
            ktime_ns: h.ktime_ns,
            wall_time_unix_ns: e.wall_time_unix_ns,
            tgid: h.tgid,
            pid: h.pid,
            process_start_time_ns: e.process_start_time_ns,
            cgroup_id: h.cgroup_id,
            cgroup_path: e.cgroup_path.clone().unwrap_or_default(),
            comm,
            duration_ns: call.duration_ns,
            syscall_ret: call.ret,
            container: e.container.as_deref().map(container_proto),
        }),
        device: device.map(device_proto),
        fd,
        payload: Some(payload),
    }
}

/// The `EventKind` that names a payload case (one definition, so header and payload cannot differ).
pub(crate) fn event_kind(p: &Payload) -> v1::EventKind {
    use v1::EventKind as K;
    match p {
        Payload::Violation(_) => K::Violation,
        Payload::Bill(_) => K::Bill,
        Payload::FdOpened(_) => K::FdOpened,
        Payload::FdClosed(_) => K::FdClosed,
        Payload::FdDuped(_) => K::FdDuped,
        Payload::RmAlloc(_) => K::RmAlloc,
        Payload::RmFree(_) => K::RmFree,
        Payload::VidHeapAlloc(_) => K::VidHeapAlloc,
        Payload::VidHeapFree(_) => K::VidHeapFree,
        Payload::AllocMemory(_) => K::AllocMemory,
        Payload::RmControl(_) => K::RmControl,
        Payload::RmDupObject(_) => K::RmDupObject,
        Payload::RmMapMemory(_) => K::RmMapMemory,
        Payload::UvmRegisterGpu(_) => K::UvmRegisterGpu,
        Payload::UvmMapExternal(_) => K::UvmMapExternal,
        Payload::UvmFree(_) => K::UvmFree,
        Payload::UvmOther(_) => K::UvmOther,
        Payload::OtherIoctl(_) => K::OtherIoctl,
        Payload::ManagedMap(_) => K::ManagedMap,
        Payload::ManagedUnmap(_) => K::ManagedUnmap,
        Payload::ProcessExec(_) => K::ProcessExec,
        Payload::ProcessExit(_) => K::ProcessExit,
        Payload::ProcessFork(_) => K::ProcessFork,
        Payload::CgroupRemoved(_) => K::CgroupRemoved,
        Payload::CudaAlloc(_) => K::CudaAlloc,
        Payload::CudaFree(_) => K::CudaFree,
        Payload::CudaFunction(_) => K::CudaFunction,
        Payload::CudaLaunch(_) => K::CudaLaunch,
        Payload::CudaCall(_) => K::CudaCall,
        Payload::CudaLaunchBatch(_) => K::CudaLaunchBatch,
        Payload::Malformed(_) => K::Malformed,
    }
}

pub(super) fn device_proto(d: &Device) -> v1::Device {
    let kind = match d.kind {
        DeviceKind::Unknown => v1::DeviceKind::Unknown,
        DeviceKind::Ctl => v1::DeviceKind::Ctl,
        DeviceKind::Gpu => v1::DeviceKind::Gpu,
        DeviceKind::Uvm => v1::DeviceKind::Uvm,
        DeviceKind::UvmTools => v1::DeviceKind::UvmTools,
        DeviceKind::Modeset => v1::DeviceKind::Modeset,
        DeviceKind::Caps => v1::DeviceKind::Caps,
    };
    v1::Device { kind: kind as i32, minor: d.minor, file_id: d.file_id }
}

fn location_proto(l: Location) -> v1::MemoryLocation {
    match l {
        Location::Vidmem => v1::MemoryLocation::Vidmem,
        Location::Sysmem => v1::MemoryLocation::Sysmem,
        Location::Any => v1::MemoryLocation::Any,
        Location::Unknown => v1::MemoryLocation::Unknown,
    }
}

fn memory_kind_proto(k: MemoryKind) -> v1::MemoryKind {
    match k {
        MemoryKind::Physical => v1::MemoryKind::Physical,
        MemoryKind::VirtualOnly => v1::MemoryKind::VirtualOnly,
        MemoryKind::OsDescriptor => v1::MemoryKind::OsDescriptor,
        MemoryKind::Fabric => v1::MemoryKind::Fabric,
    }
}

/// bytes, location and kind of an optional memory description (zeros: not memory / unreadable).
fn memory_fields(m: Option<&MemoryAlloc>) -> (u64, i32, i32) {
    match m {
        Some(m) => (m.bytes, location_proto(m.location) as i32, memory_kind_proto(m.kind) as i32),
        None => (0, v1::MemoryLocation::Unknown as i32, v1::MemoryKind::None as i32),
    }
}

fn ioctl_payload(io: &IoctlEvent, e: &EventContext) -> Payload {
    use IoctlOp::*;
    let success = io.succeeded();
    let released = e.released_bytes.unwrap_or(0);
    // `cmd` is the outer command: its size is the inner one's only without XFER.
    let other =
        |nr: u32| Payload::OtherIoctl(v1::OtherIoctl { nr, size: if io.xfer { 0 } else { nv::ioc_size(io.cmd) } });
    let uvm_other = || Payload::UvmOther(v1::UvmOther { cmd: io.cmd });
    match &io.op {
        RmAlloc { client, parent, handle, class, status, form, memory, .. } => {
            let (bytes, location, memory_kind) = memory_fields(memory.as_ref());
            let form = match form {
                RmAllocForm::Nvos21 => v1::RmAllocForm::Nvos21,
                RmAllocForm::Nvos64 => v1::RmAllocForm::Nvos64,
                // NV_ESC_RM_ALLOC_OBJECT has no value of its own in gputracer.v1.
                RmAllocForm::Nvos05 => v1::RmAllocForm::Unspecified,
            };
            Payload::RmAlloc(v1::RmAlloc {
                client: *client,
                parent: *parent,
                handle: *handle,
                class_id: *class,
                status: *status,
                success,
                bytes,
                location,
                memory_kind,
                form: form as i32,
            })
        }
        RmFree { client, parent, handle, status } => Payload::RmFree(v1::RmFree {
            client: *client,
            parent: *parent,
            handle: *handle,
            status: *status,
            success,
            bytes_released: released,
        }),
        VidHeapAlloc { client, parent, handle, bytes, virtual_only, location, status } => {
            let kind = if *virtual_only { v1::MemoryKind::VirtualOnly } else { v1::MemoryKind::Physical };
            Payload::VidHeapAlloc(v1::VidHeapAlloc {
                client: *client,
                parent: *parent,
                handle: *handle,
                status: *status,
                success,
                bytes: *bytes,
                location: location_proto(*location) as i32,
                memory_kind: kind as i32,
                flags: 0,
                attr: 0,
            })
        }
        VidHeapFree { client, parent, handle, status } => Payload::VidHeapFree(v1::VidHeapFree {
            client: *client,
            parent: *parent,
            handle: *handle,
            status: *status,
            success,
            bytes_released: released,
        }),
        AllocMemory { client, parent, handle, class, memory, status } => {
            let (bytes, location, memory_kind) = memory_fields(Some(memory));
            Payload::AllocMemory(v1::AllocMemory {
                client: *client,
                parent: *parent,
                handle: *handle,
                class_id: *class,
                status: *status,
                success,
                bytes,
                location,
                memory_kind,
                flags: 0,
            })
        }
        RmControl { client, object, cmd, status } => Payload::RmControl(v1::RmControl {
            client: *client,
            object: *object,
            cmd: *cmd,
            status: *status,
            success,
            params_size: 0,
        }),
        RmDupObject { client, parent, handle, src_client, src_handle, status } => {
            Payload::RmDupObject(v1::RmDupObject {
                client: *client,
                parent: *parent,
                handle: *handle,
                src_client: *src_client,
                src_object: *src_handle,
                status: *status,
                success,
            })
        }
        RmMapMemory { client, device, memory, offset, length, status, .. } => Payload::RmMapMemory(v1::RmMapMemory {
            client: *client,
            device: *device,
            memory: *memory,
            offset: *offset,
            length: *length,
            linear_address: 0,
            status: *status,
            success,
        }),
        UvmRegisterGpu { uuid, rm_ctrl_fd, client, status } => Payload::UvmRegisterGpu(v1::UvmRegisterGpu {
            uuid: uuid.to_vec(),
            rm_ctrl_fd: *rm_ctrl_fd,
            client: *client,
            status: *status,
            success,
        }),
        UvmMapExternal { base, length, offset, client, memory_handle, status, .. } => {
            Payload::UvmMapExternal(v1::UvmMapExternal {
                base: *base,
                length: *length,
                offset: *offset,
                client: *client,
                memory: *memory_handle,
                status: *status,
                success,
            })
        }
        UvmFree { base, status } => Payload::UvmFree(v1::UvmFree { base: *base, status: *status, success }),
        RmUnmapMemory { .. } => other(nv::esc::RM_UNMAP_MEMORY),
        VidHeapOther { .. } => other(nv::esc::RM_VID_HEAP_CONTROL),
        RegisterFd { .. } => other(nv::esc::REGISTER_FD),
        CardInfo { .. } => other(nv::esc::CARD_INFO),
        CheckVersion { .. } => other(nv::esc::CHECK_VERSION_STR),
        OtherFrontend { nr } => other(*nr),
        // uvm-tools commands are plain integers like UVM's; modeset and caps use _IOC encoding.
        OtherDevice { nr } if io.device.kind == DeviceKind::UvmTools => Payload::UvmOther(v1::UvmOther { cmd: *nr }),
        OtherDevice { nr } => Payload::OtherIoctl(v1::OtherIoctl { nr: *nr, size: nv::ioc_size(io.cmd) }),
        UvmInitialize { .. }
        | UvmMmInitialize { .. }
        | UvmUnregisterGpu { .. }
        | UvmCreateExternalRange { .. }
        | UvmUnmapExternal { .. }
        | UvmPageableMemAccess { .. }
        | UvmValidateVaRange { .. } => uvm_other(),
        UvmOther { cmd } => Payload::UvmOther(v1::UvmOther { cmd: *cmd }),
        Malformed { nr, reason } => Payload::Malformed(v1::Malformed {
            reason: reason.as_str().to_string(),
            nr: *nr,
            cmd: io.cmd,
            flags: u32::from(malformed_flags(*reason, io.xfer)),
            record_kind: u32::from(kind::IOCTL),
        }),
    }
}

/// The record flags a malformed ioctl is known to have had: the fault its reason names, and XFER.
/// (Flags that do not survive decoding, such as TRUNCATED, are not reconstructed.)
fn malformed_flags(reason: MalformedReason, xfer: bool) -> u16 {
    let fault = match reason {
        MalformedReason::FaultMain => flags::FAULT_MAIN,
        MalformedReason::FaultTail => flags::FAULT_TAIL,
        MalformedReason::FaultNested => flags::FAULT_NESTED,
        MalformedReason::FaultXfer => flags::FAULT_XFER,
        MalformedReason::ShortMain
        | MalformedReason::ShortTail
        | MalformedReason::ShortNested
        | MalformedReason::BadSize
        | MalformedReason::BadTailOffset => 0,
    };
    fault | if xfer { flags::XFER } else { 0 }
}
