//! Decoded events as `gputracer.v1.Event` messages (see `proto/gputracer/v1/events.proto`), and a
//! writer for the event stream.
//!
//! [`to_proto`] maps every [`Event`] and every [`IoctlOp`] onto the schema. Operations without a
//! dedicated message become [`v1::OtherIoctl`] (frontend escapes and other NVIDIA nodes) or
//! [`v1::UvmOther`] (UVM commands), so every ioctl is still counted by consumers. [`to_json`] is the
//! readable form of the same message; [`EventWriter`] writes either.
//!
//! What the decoded event does not carry is written as the schema's zero ("unknown"): the raw
//! NVOS32/NVOS02 `flags`/`attr`, `RmControl.params_size`, `RmMapMemory.linear_address`, and
//! `OtherIoctl.size` for commands that came through `NV_ESC_IOCTL_XFER_CMD` (the event keeps only
//! the outer command). `NV_ESC_RM_ALLOC_OBJECT` allocations have form `UNSPECIFIED`: v1 has no value
//! for NVOS05.

use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::Path,
};

use gpu_tracer_proto::{
    prost::Message,
    v1::{self, event::Payload},
};
use serde_json::{Map, Value};
use tracer_common::{flags, kind, nv};

use crate::decode::{
    Device, DeviceKind, Event, Header, IoctlEvent, IoctlOp, Location, MalformedReason, MemoryAlloc, MemoryKind,
    RmAllocForm,
};
use crate::model::EventContext;

/// The protobuf form of a container identity.
pub fn container_proto(c: &crate::identity::ContainerIdentity) -> v1::ContainerIdentity {
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
        Event::CudaAlloc { header, entry, result, ptr, bytes } => {
            let payload = Payload::CudaAlloc(v1::CudaAlloc {
                entry_point: cuda_entry_name(*entry).into(),
                result: *result,
                success: *result == 0,
                ptr: *ptr,
                bytes: *bytes,
            });
            message(header, e, None, no_call, None, None, payload)
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
        Event::CgroupRemoved { header, cgroup_id, level, path } => {
            let payload =
                Payload::CgroupRemoved(v1::CgroupRemoved { cgroup_id: *cgroup_id, level: *level, path: path.clone() });
            message(header, e, None, no_call, None, None, payload)
        }
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
pub fn event_kind(p: &Payload) -> v1::EventKind {
    use v1::EventKind as K;
    match p {
        Payload::Violation(_) => K::Violation,
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
        Payload::CudaLaunchBatch(_) => K::CudaLaunchBatch,
        Payload::Malformed(_) => K::Malformed,
    }
}

fn device_proto(d: &Device) -> v1::Device {
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

/// A readable JSON object for one message: the header's fields, `device` as
/// `{"kind", "minor", "file_id"}`, `fd`, and the payload's fields flattened beside them. Enum fields
/// are lower-case labels (`"rm_alloc"`, `"vidmem"`, `"physical"`); RM handles, classes, commands and
/// addresses come as numbers and again as `<name>_hex` strings. Payload fields whose names would
/// clash with the header's are renamed (`removed_cgroup_id`, `device_handle`, `record_kind`).
pub fn to_json(ev: &v1::Event) -> Value {
    let mut m = Map::new();
    let h = ev.header.clone().unwrap_or_default();
    m.insert(
        "kind".into(),
        label(h.kind, v1::EventKind::try_from(h.kind).ok().map(|k| k.as_str_name()), "EVENT_KIND_"),
    );
    m.insert("ktime_ns".into(), h.ktime_ns.into());
    m.insert("wall_time_unix_ns".into(), h.wall_time_unix_ns.into());
    m.insert("tgid".into(), h.tgid.into());
    m.insert("pid".into(), h.pid.into());
    m.insert("process_start_time_ns".into(), h.process_start_time_ns.into());
    m.insert("cgroup_id".into(), h.cgroup_id.into());
    m.insert("cgroup_path".into(), h.cgroup_path.into());
    m.insert("comm".into(), h.comm.into());
    if let Some(c) = h.container {
        m.insert(
            "container".into(),
            serde_json::json!({
                "kind": c.kind, "runtime": c.runtime, "container_id": c.container_id, "pod_uid": c.pod_uid,
                "qos": c.qos, "namespace": c.namespace, "pod": c.pod, "container": c.container,
                "owner_kind": c.owner_kind, "owner_name": c.owner_name, "labels": c.labels,
                "allocated_gpus": c.allocated_gpus, "allocations_known": c.allocations_known,
            }),
        );
    }
    m.insert("duration_ns".into(), h.duration_ns.into());
    m.insert("syscall_ret".into(), h.syscall_ret.into());
    let device = ev.device.as_ref().map(|d| {
        let mut o = Map::new();
        o.insert(
            "kind".into(),
            label(d.kind, v1::DeviceKind::try_from(d.kind).ok().map(|k| k.as_str_name()), "DEVICE_KIND_"),
        );
        o.insert("minor".into(), d.minor.into());
        o.insert("file_id".into(), d.file_id.into());
        Value::Object(o)
    });
    m.insert("device".into(), device.unwrap_or(Value::Null));
    m.insert("fd".into(), ev.fd.map_or(Value::Null, Value::from));
    if let Some(p) = &ev.payload {
        payload_json(&mut m, p);
    }
    Value::Object(m)
}

fn payload_json(m: &mut Map<String, Value>, p: &Payload) {
    match p {
        Payload::FdOpened(x) => {
            m.insert("open_flags".into(), x.open_flags.into());
            m.insert("seeded".into(), x.seeded.into());
        }
        Payload::FdClosed(x) => {
            m.insert("replaced_by_dup".into(), x.replaced_by_dup.into());
        }
        Payload::FdDuped(x) => {
            m.insert("new_fd".into(), x.new_fd.into());
        }
        Payload::RmAlloc(x) => {
            hex(m, "client", x.client);
            hex(m, "parent", x.parent);
            hex(m, "handle", x.handle);
            hex(m, "class", x.class_id);
            status(m, x.status, x.success);
            memory(m, x.bytes, x.location, x.memory_kind);
            m.insert(
                "form".into(),
                label(x.form, v1::RmAllocForm::try_from(x.form).ok().map(|f| f.as_str_name()), "RM_ALLOC_FORM_"),
            );
        }
        Payload::RmFree(x) => {
            hex(m, "client", x.client);
            hex(m, "parent", x.parent);
            hex(m, "handle", x.handle);
            status(m, x.status, x.success);
            m.insert("bytes_released".into(), x.bytes_released.into());
        }
        Payload::VidHeapAlloc(x) => {
            hex(m, "client", x.client);
            hex(m, "parent", x.parent);
            hex(m, "handle", x.handle);
            status(m, x.status, x.success);
            memory(m, x.bytes, x.location, x.memory_kind);
            hex(m, "flags", x.flags);
            hex(m, "attr", x.attr);
        }
        Payload::VidHeapFree(x) => {
            hex(m, "client", x.client);
            hex(m, "parent", x.parent);
            hex(m, "handle", x.handle);
            status(m, x.status, x.success);
            m.insert("bytes_released".into(), x.bytes_released.into());
        }
        Payload::AllocMemory(x) => {
            hex(m, "client", x.client);
            hex(m, "parent", x.parent);
            hex(m, "handle", x.handle);
            hex(m, "class", x.class_id);
            status(m, x.status, x.success);
            memory(m, x.bytes, x.location, x.memory_kind);
            hex(m, "flags", x.flags);
        }
        Payload::RmControl(x) => {
            hex(m, "client", x.client);
            hex(m, "object", x.object);
            hex(m, "cmd", x.cmd);
            status(m, x.status, x.success);
            m.insert("params_size".into(), x.params_size.into());
        }
        Payload::RmDupObject(x) => {
            hex(m, "client", x.client);
            hex(m, "parent", x.parent);
            hex(m, "handle", x.handle);
            hex(m, "src_client", x.src_client);
            hex(m, "src_object", x.src_object);
            status(m, x.status, x.success);
        }
        Payload::RmMapMemory(x) => {
            hex(m, "client", x.client);
            hex(m, "device_handle", x.device);
            hex(m, "memory", x.memory);
            m.insert("offset".into(), x.offset.into());
            m.insert("length".into(), x.length.into());
            hex(m, "linear_address", x.linear_address);
            status(m, x.status, x.success);
        }
        Payload::UvmRegisterGpu(x) => {
            m.insert("uuid".into(), gpu_uuid(&x.uuid).into());
            m.insert("rm_ctrl_fd".into(), x.rm_ctrl_fd.into());
            hex(m, "client", x.client);
            status(m, x.status, x.success);
        }
        Payload::UvmMapExternal(x) => {
            hex(m, "base", x.base);
            m.insert("length".into(), x.length.into());
            m.insert("offset".into(), x.offset.into());
            hex(m, "client", x.client);
            hex(m, "memory", x.memory);
            status(m, x.status, x.success);
        }
        Payload::UvmFree(x) => {
            hex(m, "base", x.base);
            status(m, x.status, x.success);
        }
        Payload::UvmOther(x) => hex(m, "cmd", x.cmd),
        Payload::OtherIoctl(x) => {
            hex(m, "nr", x.nr);
            m.insert("size".into(), x.size.into());
        }
        Payload::ManagedMap(x) => {
            hex(m, "addr", x.addr);
            m.insert("length".into(), x.length.into());
        }
        Payload::ManagedUnmap(x) => {
            hex(m, "addr", x.addr);
            m.insert("length".into(), x.length.into());
        }
        Payload::ProcessExec(_) | Payload::ProcessExit(_) => {}
        Payload::ProcessFork(x) => {
            m.insert("child_pid".into(), x.child_pid.into());
        }
        Payload::CudaAlloc(x) => {
            m.insert("entry_point".into(), x.entry_point.clone().into());
            m.insert("result".into(), x.result.into());
            m.insert("success".into(), x.success.into());
            hex(m, "ptr", x.ptr);
            m.insert("bytes".into(), x.bytes.into());
        }
        Payload::CudaFree(x) => {
            m.insert("entry_point".into(), x.entry_point.clone().into());
            hex(m, "ptr", x.ptr);
            m.insert("bytes_released".into(), x.bytes_released.into());
        }
        Payload::CudaFunction(x) => {
            m.insert("entry_point".into(), x.entry_point.clone().into());
            m.insert("result".into(), x.result.into());
            hex(m, "handle", x.handle);
            hex(m, "source", x.source);
            m.insert("name".into(), x.name.clone().into());
        }
        Payload::CudaLaunch(x) => {
            m.insert("entry_point".into(), x.entry_point.clone().into());
            hex(m, "function", x.function);
            m.insert("kernel_name".into(), x.kernel_name.clone().into());
            hex(m, "stream", x.stream);
            m.insert("grid".into(), x.grid.clone().into());
            m.insert("block".into(), x.block.clone().into());
            m.insert("shared_mem_bytes".into(), x.shared_mem_bytes.into());
        }
        Payload::Violation(x) => {
            m.insert("violation".into(), x.kind.clone().into());
            m.insert("namespace".into(), x.namespace.clone().into());
            m.insert("pod".into(), x.pod.clone().into());
            m.insert("container".into(), x.container.clone().into());
            m.insert("gpu_uuid".into(), x.gpu_uuid.clone().into());
            m.insert("gpu_minor".into(), x.gpu_minor.map_or(Value::Null, Value::from));
            m.insert("gpu_index".into(), x.gpu_index.map_or(Value::Null, Value::from));
            m.insert("mig_uuid".into(), x.mig_uuid.clone().into());
            m.insert("device_path".into(), x.device_path.clone().into());
            m.insert("nvml_uuid".into(), x.nvml_uuid.clone().into());
            m.insert(
                "nvidia_visible_devices".into(),
                x.nvidia_visible_devices.clone().map_or(Value::Null, Value::from),
            );
            m.insert("cuda_visible_devices".into(), x.cuda_visible_devices.clone().map_or(Value::Null, Value::from));
            m.insert("allocated".into(), x.allocated.clone().into());
        }
        Payload::CudaLaunchBatch(x) => {
            m.insert("entry_point".into(), x.entry_point.clone().into());
            m.insert("launches".into(), x.launches.into());
            m.insert("interval_ns".into(), x.interval_ns.into());
        }
        Payload::CgroupRemoved(x) => {
            m.insert("removed_cgroup_id".into(), x.cgroup_id.into());
            m.insert("level".into(), x.level.into());
            m.insert("path".into(), x.path.clone().into());
        }
        Payload::Malformed(x) => {
            m.insert("reason".into(), x.reason.clone().into());
            hex(m, "nr", x.nr);
            hex(m, "cmd", x.cmd);
            hex(m, "flags", x.flags);
            m.insert("record_kind".into(), x.record_kind.into());
        }
    }
}

/// `name` as a number and `name_hex` as `"0x…"`.
fn hex(m: &mut Map<String, Value>, name: &str, v: impl Into<u64>) {
    let v: u64 = v.into();
    m.insert(name.into(), v.into());
    m.insert(format!("{name}_hex"), format!("{v:#x}").into());
}

fn status(m: &mut Map<String, Value>, status: u32, success: bool) {
    hex(m, "status", status);
    m.insert("success".into(), success.into());
}

fn memory(m: &mut Map<String, Value>, bytes: u64, location: i32, kind: i32) {
    m.insert("bytes".into(), bytes.into());
    let loc = v1::MemoryLocation::try_from(location).ok().map(|l| l.as_str_name());
    m.insert("location".into(), label(location, loc, "MEMORY_LOCATION_"));
    let k = v1::MemoryKind::try_from(kind).ok().map(|k| k.as_str_name());
    m.insert("memory_kind".into(), label(kind, k, "MEMORY_KIND_"));
}

/// An enum value as its lower-case proto name without the type prefix (`MEMORY_LOCATION_VIDMEM` →
/// `"vidmem"`); a value this build does not know (from a newer producer) stays a number.
fn label(value: i32, name: Option<&str>, prefix: &str) -> Value {
    match name {
        Some(n) => n.strip_prefix(prefix).unwrap_or(n).to_ascii_lowercase().into(),
        None => value.into(),
    }
}

/// A 16-byte GPU UUID in NVML's text form (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`); other
/// lengths as plain hex.
fn gpu_uuid(b: &[u8]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    if b.len() != 16 {
        return h;
    }
    format!("GPU-{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// How the event stream is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EventFormat {
    /// Length-delimited `gputracer.v1.Event` messages (a varint length, then the message).
    #[default]
    Protobuf,
    /// One [`to_json`] object per line.
    JsonLines,
}

/// Writes events in one [`EventFormat`] and counts what it wrote.
pub struct EventWriter<W: Write> {
    out: W,
    format: EventFormat,
    /// Reused encoding buffer, so each event is one `write_all`.
    buf: Vec<u8>,
    events: u64,
    bytes: u64,
}

impl EventWriter<Box<dyn Write + Send>> {
    /// A buffered writer to the file at `path` (created or truncated), or to stdout when `path` is
    /// `None` or `-`.
    pub fn to_path(path: Option<&Path>, format: EventFormat) -> io::Result<Self> {
        let out: Box<dyn Write + Send> = match path {
            Some(p) if p != Path::new("-") => Box::new(BufWriter::new(File::create(p)?)),
            _ => Box::new(BufWriter::new(io::stdout())),
        };
        Ok(EventWriter::new(out, format))
    }
}

impl<W: Write> EventWriter<W> {
    /// A writer to `out` (which it does not buffer itself).
    pub fn new(out: W, format: EventFormat) -> Self {
        EventWriter { out, format, buf: Vec::with_capacity(256), events: 0, bytes: 0 }
    }

    /// Writes one event. On error the stream may end with a partial event.
    pub fn write(&mut self, ev: &v1::Event) -> io::Result<()> {
        self.buf.clear();
        match self.format {
            EventFormat::Protobuf => {
                // Writing into a Vec only fails when it cannot grow, which aborts first.
                ev.encode_length_delimited(&mut self.buf).map_err(io::Error::other)?
            }
            EventFormat::JsonLines => {
                serde_json::to_writer(&mut self.buf, &to_json(ev))?;
                self.buf.push(b'\n');
            }
        }
        self.out.write_all(&self.buf)?;
        self.events += 1;
        self.bytes += self.buf.len() as u64;
        Ok(())
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Events written so far.
    pub fn events_written(&self) -> u64 {
        self.events
    }

    /// Bytes written so far (handed to the underlying writer, not necessarily flushed).
    pub fn bytes_written(&self) -> u64 {
        self.bytes
    }

    /// The format this writer writes.
    pub fn format(&self) -> EventFormat {
        self.format
    }

    /// The underlying writer (not flushed).
    pub fn into_inner(self) -> W {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use tracer_common::nv::{DEFAULT_DRIVER_VERSION, DriverAbi};

    use super::*;
    use crate::decode::{self, CardInfoEntry, encode};

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
    fn events() -> Vec<Event> {
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
        assert_eq!(
            (j["tgid"].as_u64(), j["pid"].as_u64(), j["cgroup_id"].as_u64()),
            (Some(4242), Some(4243), Some(7777))
        );
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
}
