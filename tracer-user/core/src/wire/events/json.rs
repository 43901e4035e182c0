//! The readable JSON form of a `gputracer.v1.Event` message.

use gpu_tracer_proto::v1::{self, event::Payload};
use serde_json::{Map, Value};

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
        Payload::CudaCall(x) => {
            m.insert("entry_point".into(), x.entry_point.clone().into());
            m.insert("class".into(), x.class.clone().into());
            m.insert("result".into(), x.result.into());
            m.insert("success".into(), x.success.into());
            if let Some(s) = x.stream {
                hex(m, "stream", s);
            }
            if let Some(ev) = x.event {
                hex(m, "event", ev);
            }
            if x.class == "copy" || x.class == "memset" {
                m.insert("bytes".into(), x.bytes.into());
                m.insert("async".into(), x.r#async.into());
            }
            if !x.direction.is_empty() {
                m.insert("direction".into(), x.direction.clone().into());
            }
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
        Payload::Bill(x) => {
            m.insert("node".into(), x.node.clone().into());
            m.insert("agent_start_unix_ns".into(), x.agent_start_unix_ns.into());
            m.insert("end_unix_ns".into(), x.end_unix_ns.into());
            m.insert("price_per_gpu_hour".into(), x.price_per_gpu_hour.into());
            m.insert("first".into(), x.first.into());
            let containers: Vec<Value> = x
                .containers
                .iter()
                .map(|c| {
                    let labels: Map<String, Value> =
                        c.labels.iter().map(|(k, v)| (k.clone(), Value::from(v.clone()))).collect();
                    serde_json::json!({
                        "namespace": c.namespace, "pod": c.pod, "container": c.container,
                        "labels": labels, "nano": c.nano,
                    })
                })
                .collect();
            m.insert("containers".into(), containers.into());
            m.insert("idle_nano".into(), x.idle_nano.into());
            m.insert("driver_reserved_nano".into(), x.driver_reserved_nano.into());
            m.insert("unattributed_nano".into(), x.unattributed_nano.into());
            m.insert("evicted_nano".into(), x.evicted_nano.into());
            m.insert("total_nano".into(), x.total_nano.into());
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
