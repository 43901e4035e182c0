//! Attaching each family's programs: the driver family in the syscall modes and in driver-entry
//! mode (kprobes or fentry/fexit on the NVIDIA modules, `nvidia-uvm` included when it loads late),
//! and the lifecycle family (BTF tracepoints, else classic ones).
use super::*;

/// The program `name` of the object, as its concrete type.
pub(super) fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, String>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or_else(|| format!("program {name} missing from the object (build mismatch)"))?
        .try_into()
        .map_err(|e| format!("{name}: {e}"))
}

pub(super) fn attach_driver(
    ebpf: &mut Ebpf,
    mode: AttachMode,
    features: &KernelFeatures,
    check: &DeviceCheck,
    probes: (DriverEntryProbes, bool),
    links: &mut trampoline::Links,
) -> Result<Vec<String>, String> {
    let mut attached = Vec::new();
    match mode {
        AttachMode::SyscallTracepoint => {
            for (prog, dir) in [(prog_names::SYS_ENTER_TP, "enter"), (prog_names::SYS_EXIT_TP, "exit")] {
                let p: &mut TracePoint = program(ebpf, prog)?;
                p.load().map_err(|e| format!("loading {prog}: {e:#}"))?;
                for (_, name) in sysno::TRACED {
                    let tp = format!("sys_{dir}_{name}");
                    p.attach("syscalls", &tp).map_err(|e| {
                        format!("attaching syscalls:{tp}: {e:#} (is tracefs mounted at /sys/kernel/tracing?)")
                    })?;
                    attached.push(format!("tracepoint/syscalls/{tp}"));
                }
            }
        }
        AttachMode::RawTracepoint => {
            for (prog, tp) in [(prog_names::SYS_ENTER_RAW, "sys_enter"), (prog_names::SYS_EXIT_RAW, "sys_exit")] {
                let p: &mut RawTracePoint = program(ebpf, prog)?;
                p.load().map_err(|e| format!("loading {prog}: {e:#}"))?;
                p.attach(tp).map_err(|e| format!("attaching raw_tracepoint/{tp}: {e:#}"))?;
                attached.push(format!("raw_tracepoint/{tp}"));
            }
        }
        AttachMode::BtfTracepoint => {
            let btf = Btf::from_sys_fs().map_err(|e| {
                format!("reading kernel BTF (/sys/kernel/btf/vmlinux): {e}; use attach_mode = \"raw-tracepoint\"")
            })?;
            for (prog, tp) in [(prog_names::SYS_ENTER_BTF, "sys_enter"), (prog_names::SYS_EXIT_BTF, "sys_exit")] {
                let p: &mut BtfTracePoint = program(ebpf, prog)?;
                p.load(tp, &btf).map_err(|e| format!("loading {prog}: {e:#}"))?;
                p.attach().map_err(|e| format!("attaching tp_btf/{tp}: {e:#}"))?;
                attached.push(format!("tp_btf/{tp}"));
            }
        }
        AttachMode::DriverEntry => return attach_driver_entry(ebpf, features, check, probes, links),
        AttachMode::Auto => unreachable!("resolved by choose_mode"),
    }
    Ok(attached)
}

/// The driver-entry programs on the NVIDIA driver's open, release and ioctl (and their returns),
/// or an error naming why this node cannot have them. `probes` picks the mechanism: fentry/fexit
/// where the modules have BTF (under `auto`, kprobes when that fails, with the reason in the list),
/// kprobe/kretprobe otherwise. On an error the programs already loaded are unloaded, so a fallback
/// mode starts clean.
pub(super) fn attach_driver_entry(
    ebpf: &mut Ebpf,
    f: &KernelFeatures,
    check: &DeviceCheck,
    probes: (DriverEntryProbes, bool),
    links: &mut trampoline::Links,
) -> Result<Vec<String>, String> {
    let (probes, durations) = probes;
    if !f.kprobes && probes == DriverEntryProbes::Kprobe {
        return Err(format!("attach mode driver-entry: {}", f.driver_entry_detail));
    }
    let Some(points) = &f.driver_entry else {
        return Err(format!("attach mode driver-entry: {}", f.driver_entry_detail));
    };
    if check.enabled == 0 || check.file_inode == 0 || check.inode_rdev == 0 {
        return Err("attach mode driver-entry needs the kernel's BTF (/sys/kernel/btf/vmlinux) to read a file's \
                    device minor; use btf-tracepoint or raw-tracepoint"
            .into());
    }
    let nvidia: Vec<(&str, &str)> = vec![
        (prog_names::DE_NV_OPEN, points.nvidia.open),
        (prog_names::DE_OPEN_RET, points.nvidia.open),
        (prog_names::DE_NV_IOCTL, points.nvidia.ioctl),
        (prog_names::DE_IOCTL_RET, points.nvidia.ioctl),
        (prog_names::DE_RELEASE, points.nvidia.release),
    ];
    let uvm = points.uvm.as_ref().map(|u| uvm_plan(u, points.uvm_managed)).unwrap_or_default();
    let why_not_fentry = match probes {
        DriverEntryProbes::Kprobe => "driver_entry_probes = kprobe".to_string(),
        _ => match attach_trampolines(ebpf, &untimed(&nvidia, durations), &untimed(&uvm, durations), links) {
            Ok(mut attached) => {
                let timed = if durations {
                    "NVIDIA ioctls timed (ioctl_durations)"
                } else {
                    "NVIDIA ioctls untimed: no fentry on the ioctls (ioctl_durations = false)"
                };
                attached.push(format!("({}; fentry/fexit: the modules have BTF; {timed})", points.detail));
                return Ok(attached);
            }
            Err(e) if probes == DriverEntryProbes::Fentry => return Err(format!("driver_entry_probes = fentry: {e}")),
            // One line in the report (5.10 to 5.16 have no bpf_get_func_arg; the verifier's log is
            // in the debug log).
            Err(e) => {
                tracing::debug!(error = %e, "fentry/fexit on the NVIDIA modules refused; kprobes instead");
                crate::bpf::load_failure_in_one_line(&e)
            }
        },
    };
    if !f.kprobes {
        return Err(format!("fentry: {why_not_fentry}; kprobes: {}", f.driver_entry_detail));
    }
    let attach = |ebpf: &mut Ebpf| {
        let mut attached = Vec::new();
        for (prog, func) in nvidia.iter().chain(&uvm) {
            let p: &mut KProbe = program(ebpf, prog)?;
            if p.fd().is_err() {
                p.load().map_err(|e| format!("loading {prog}: {e:#}"))?;
            }
            let kind = probe_kind(p);
            // A kprobe is a perf event of the kprobe PMU: refused without CAP_SYS_ADMIN where
            // perf_event_paranoid is 3 or more on Debian/Ubuntu kernels; the error says so.
            p.attach(func, 0).map_err(|e| {
                tracepoint_error(&format!("attaching {kind}/{func} (not fentry: {why_not_fentry})"), &e)
            })?;
            attached.push(format!("{kind}/{func}"));
        }
        attached.push(format!("({}; kprobes, not fentry: {why_not_fentry})", points.detail));
        Ok(attached)
    };
    attach(ebpf).inspect_err(|_| {
        for name in prog_names::DRIVER_ENTRY {
            if let Ok(p) = program::<KProbe>(ebpf, name) {
                let _ = p.unload();
            }
        }
    })
}

/// `plan` without the ioctls' entry programs unless `durations`: on trampolines the ioctl's
/// return has everything but the entry clock.
pub(super) fn untimed<'a>(plan: &[(&'a str, &'a str)], durations: bool) -> Vec<(&'a str, &'a str)> {
    plan.iter()
        .copied()
        .filter(|(prog, _)| durations || ![prog_names::DE_NV_IOCTL, prog_names::DE_UVM_IOCTL].contains(prog))
        .collect()
}

/// fentry/fexit on `nvidia`'s plan and `uvm`'s, all or none.
pub(super) fn attach_trampolines(
    ebpf: &Ebpf,
    nvidia: &[(&str, &str)],
    uvm: &[(&str, &str)],
    links: &mut trampoline::Links,
) -> Result<Vec<String>, String> {
    trampoline::available(NVIDIA_MODULE, nvidia)?;
    if !uvm.is_empty() {
        trampoline::available(UVM_MODULE, uvm)?;
    }
    let mut mine = trampoline::Links::default();
    let mut attached = trampoline::attach(EBPF_OBJECT, ebpf, NVIDIA_MODULE, nvidia, &mut mine)?;
    if !uvm.is_empty() {
        attached.extend(trampoline::attach(EBPF_OBJECT, ebpf, UVM_MODULE, uvm, &mut mine)?);
    }
    links.extend(mine);
    Ok(attached)
}

/// The modules' names as the kernel knows them (`/sys/module`, `/sys/kernel/btf`).
pub(super) const NVIDIA_MODULE: &str = "nvidia";
pub(super) const UVM_MODULE: &str = "nvidia_uvm";

/// Driver-entry mode's probes in `nvidia-uvm` (program, function): open, release and ioctl, and with
/// `managed` the mmap (its return through the ioctl return program, which handles both) and the
/// managed VMA's close.
pub(super) fn uvm_plan(u: &tracer_core::model::probes::Functions, managed: bool) -> Vec<(&'static str, &'static str)> {
    let mut plan = vec![
        (prog_names::DE_UVM_OPEN, u.open),
        (prog_names::DE_OPEN_RET, u.open),
        (prog_names::DE_UVM_IOCTL, u.ioctl),
        (prog_names::DE_IOCTL_RET, u.ioctl),
        (prog_names::DE_RELEASE, u.release),
    ];
    if managed {
        plan.extend([
            (prog_names::DE_UVM_MMAP, driver_entry::UVM_MMAP),
            (prog_names::DE_IOCTL_RET, driver_entry::UVM_MMAP),
            (prog_names::DE_UVM_VM_CLOSE, driver_entry::UVM_VM_CLOSE),
        ]);
    }
    plan
}

/// `kprobe` or `kretprobe`.
pub(super) fn probe_kind(p: &KProbe) -> &'static str {
    match p.kind() {
        aya::programs::ProbeKind::Entry => "kprobe",
        aya::programs::ProbeKind::Return => "kretprobe",
    }
}

/// The lifecycle programs as `setting` asks: tp_btf (BPF links; the fields at BTF offsets) where
/// it can, classic tracepoints (perf events; the fields at `format` offsets) otherwise. What was
/// attached ends with how its fields are read, and under `auto` why not tp_btf.
pub(super) fn attach_lifecycle(
    ebpf: &mut Ebpf,
    setting: LifecycleAttach,
    layout: &lifecycle_layout::Detected,
) -> Result<Vec<String>, String> {
    let btf_first = match (setting, &layout.btf) {
        (LifecycleAttach::Tracepoint, _) => Err("lifecycle_attach = tracepoint".to_string()),
        (_, Err(e)) => Err(format!("the kernel's BTF lacks what they read: {e}")),
        (_, Ok(())) => Ok(()),
    };
    let tried = btf_first.and_then(|()| attach_lifecycle_btf(ebpf));
    match (tried, setting) {
        (Ok(mut attached), _) => {
            attached.push("(fields at BTF offsets; exit by current->signal->live)".to_string());
            Ok(attached)
        }
        (Err(e), LifecycleAttach::TpBtf) => Err(format!("lifecycle_attach = tp-btf: {e}")),
        (Err(why), _) => {
            let mut attached = attach_lifecycle_tracepoints(ebpf)?;
            attached.push(format!("(tracepoint fields: {})", layout.words));
            if setting == LifecycleAttach::Auto {
                attached.push(format!("(not tp_btf: {why})"));
            }
            Ok(attached)
        }
    }
}

pub(super) const LIFECYCLE_BTF: [(&str, &str); 4] = [
    (prog_names::PROC_EXEC_BTF, "sched_process_exec"),
    (prog_names::PROC_EXIT_BTF, "sched_process_exit"),
    (prog_names::PROC_FORK_BTF, "sched_process_fork"),
    (prog_names::CGROUP_RMDIR_BTF, "cgroup_rmdir"),
];

/// All four tp_btf programs, or none: on a failure the ones already attached are unloaded, so
/// that the tracepoint fallback does not report an event twice.
pub(super) fn attach_lifecycle_btf(ebpf: &mut Ebpf) -> Result<Vec<String>, String> {
    let attach = |ebpf: &mut Ebpf| {
        let btf = Btf::from_sys_fs().map_err(|e| format!("reading kernel BTF (/sys/kernel/btf/vmlinux): {e}"))?;
        let mut attached = Vec::new();
        for (prog, name) in LIFECYCLE_BTF {
            let p: &mut BtfTracePoint = program(ebpf, prog)?;
            p.load(name, &btf).map_err(|e| format!("loading {prog}: {e:#}"))?;
            p.attach().map_err(|e| format!("attaching tp_btf/{name}: {e:#}"))?;
            attached.push(format!("tp_btf/{name}"));
        }
        Ok(attached)
    };
    attach(ebpf).inspect_err(|_| {
        for (prog, _) in LIFECYCLE_BTF {
            if let Ok(p) = program::<BtfTracePoint>(ebpf, prog) {
                let _ = p.unload();
            }
        }
    })
}

pub(super) fn attach_lifecycle_tracepoints(ebpf: &mut Ebpf) -> Result<Vec<String>, String> {
    let mut attached = Vec::new();
    for (prog, cat, name) in [
        (prog_names::PROC_EXEC, "sched", "sched_process_exec"),
        (prog_names::PROC_EXIT, "sched", "sched_process_exit"),
        (prog_names::PROC_FORK, "sched", "sched_process_fork"),
        (prog_names::CGROUP_RMDIR, "cgroup", "cgroup_rmdir"),
    ] {
        let p: &mut TracePoint = program(ebpf, prog)?;
        p.load().map_err(|e| format!("loading {prog}: {e:#}"))?;
        p.attach(cat, name).map_err(|e| tracepoint_error(&format!("attaching tracepoint/{cat}/{name}"), &e))?;
        attached.push(format!("tracepoint/{cat}/{name}"));
    }
    Ok(attached)
}
