//! The empty programs (`noop_tp`, `noop_raw`, `noop_btf`, `noop_kprobe`/`noop_kretprobe`,
//! `noop_fentry`/`noop_fexit`) attached
//! the way each attach mode attaches its real programs: what a mode costs before the tracer does any
//! work of its own.
use anyhow::{Context, Result};
use aya::{
    Btf, Ebpf, EbpfLoader,
    programs::{BtfTracePoint, KProbe, RawTracePoint, TracePoint},
};
use tracer_common::{map_names, prog_names};
use tracer_core::config::AttachMode;

/// Attached empty programs; dropping this detaches them.
pub struct Floor {
    _links: tracer_agent::probe::trampoline::Links,
    _objects: Vec<Ebpf>,
}

fn load_object() -> Result<Ebpf> {
    // The noop programs use no map; keep the object's ring buffer at its smallest.
    EbpfLoader::new()
        .map_max_entries(map_names::EVENTS, 4096)
        .map_max_entries(map_names::BULK_EVENTS, 4096)
        .load(tracer_agent::probe::EBPF_OBJECT)
        .context("loading the eBPF object")
}

/// Attach the floor program of `mode` at syscall entry (and exit, with `with_exit`). For the
/// syscall-tracepoint mode it goes on `syscalls:sys_{enter,exit}_<name>` for each of `syscalls`.
pub fn attach(mode: AttachMode, with_exit: bool, syscalls: &[&str]) -> Result<Floor> {
    let mut objects = Vec::new();
    match mode {
        AttachMode::SyscallTracepoint => {
            let mut ebpf = load_object()?;
            let p: &mut TracePoint =
                ebpf.program_mut(prog_names::NOOP_TP).context("noop_tp missing from the object")?.try_into()?;
            p.load().context("loading noop_tp")?;
            for s in syscalls {
                p.attach("syscalls", &format!("sys_enter_{s}")).with_context(|| format!("attaching sys_enter_{s}"))?;
                if with_exit {
                    p.attach("syscalls", &format!("sys_exit_{s}"))
                        .with_context(|| format!("attaching sys_exit_{s}"))?;
                }
            }
            objects.push(ebpf);
        }
        AttachMode::RawTracepoint => {
            let mut ebpf = load_object()?;
            let p: &mut RawTracePoint =
                ebpf.program_mut(prog_names::NOOP_RAW).context("noop_raw missing from the object")?.try_into()?;
            p.load().context("loading noop_raw")?;
            p.attach("sys_enter").context("attaching raw_tracepoint/sys_enter")?;
            if with_exit {
                p.attach("sys_exit").context("attaching raw_tracepoint/sys_exit")?;
            }
            objects.push(ebpf);
        }
        AttachMode::BtfTracepoint => {
            let btf = Btf::from_sys_fs().context("reading /sys/kernel/btf/vmlinux")?;
            // A tp_btf program is bound to its tracepoint at load time: one object per hook.
            let hooks: &[&str] = if with_exit { &["sys_enter", "sys_exit"] } else { &["sys_enter"] };
            for tp in hooks {
                let mut ebpf = load_object()?;
                let p: &mut BtfTracePoint =
                    ebpf.program_mut(prog_names::NOOP_BTF).context("noop_btf missing from the object")?.try_into()?;
                p.load(tp, &btf).with_context(|| format!("loading noop_btf for {tp}"))?;
                p.attach().with_context(|| format!("attaching tp_btf/{tp}"))?;
                objects.push(ebpf);
            }
        }
        other => anyhow::bail!("no floor program for attach mode {}", other.as_str()),
    }
    Ok(Floor { _links: Default::default(), _objects: objects })
}

/// Driver-entry mode's floor: `noop_kprobe` at the entry of the kernel function `function` (a module's
/// too) and `noop_kretprobe` at its return, as that mode attaches its ioctl programs.
pub fn attach_kprobes(function: &str) -> Result<Floor> {
    let mut ebpf = load_object()?;
    for name in [prog_names::NOOP_KPROBE, prog_names::NOOP_KRETPROBE] {
        let p: &mut KProbe =
            ebpf.program_mut(name).with_context(|| format!("{name} missing from the object"))?.try_into()?;
        p.load().with_context(|| format!("loading {name}"))?;
        p.attach(function, 0).with_context(|| format!("attaching {name} to {function}"))?;
    }
    Ok(Floor { _links: Default::default(), _objects: vec![ebpf] })
}

/// The same on BPF trampolines: `noop_fentry` and `noop_fexit` on `function` of `module`, which
/// needs the module's BTF (as driver-entry mode's fentry mechanism does).
pub fn attach_trampolines(module: &str, function: &str) -> Result<Floor> {
    let ebpf = load_object()?;
    let mut links = tracer_agent::probe::trampoline::Links::default();
    tracer_agent::probe::trampoline::attach_programs(
        tracer_agent::probe::EBPF_OBJECT,
        &ebpf,
        module,
        &[(prog_names::NOOP_FENTRY, false, function), (prog_names::NOOP_FEXIT, true, function)],
        &mut links,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(Floor { _links: links, _objects: vec![ebpf] })
}
