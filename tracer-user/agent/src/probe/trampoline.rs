//! Driver-entry mode on BPF trampolines: the driver-entry programs' fentry/fexit twins
//! (`prog_names::DRIVER_ENTRY_TRAMPOLINE`) attached to the NVIDIA modules' functions, where the
//! module has BTF. Same code, same maps as the kprobes; a cheaper mechanism (a direct call from
//! the function's ftrace site, no breakpoint, no perf event), measured in docs/kernels.md.
//!
//! aya 0.14 loads fentry only against vmlinux's BTF (it passes no `attach_btf_obj_fd`), so each
//! program is loaded here once per target function with [`raw`](crate::bpf), naming the module's BTF object
//! and the function's type id in it, and attached with `BPF_RAW_TRACEPOINT_OPEN`.
use crate::bpf as raw;
use std::os::fd::{AsRawFd, OwnedFd};

use aya::Ebpf;
use tracer_common::prog_names;

use super::module_btf;

/// The links (and their programs); dropping them detaches.
#[derive(Default)]
pub struct Links {
    fds: Vec<(OwnedFd, OwnedFd)>,
}

impl std::fmt::Debug for Links {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("trampoline::Links").field("links", &self.fds.len()).finish()
    }
}

impl Links {
    pub fn len(&self) -> usize {
        self.fds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fds.is_empty()
    }

    pub fn extend(&mut self, other: Links) {
        self.fds.extend(other.fds);
    }
}

/// The trampoline twin of kprobe program `prog` on `func`: (its name, whether it is an fexit).
/// The first row of `DRIVER_ENTRY_TRAMPOLINE` for `prog` that names `func`, or names none.
pub fn twin(prog: &str, func: &str) -> Option<(&'static str, bool)> {
    prog_names::DRIVER_ENTRY_TRAMPOLINE
        .iter()
        .find(|(k, f, _, _)| *k == prog && (f.is_empty() || *f == func))
        .map(|(_, _, t, exit)| (*t, *exit))
}

/// Whether fentry/fexit can go on every function of `plan` in `module`: the module's BTF has them
/// (read from sysfs; no privilege needed). The error says why not.
pub fn available(module: &str, plan: &[(&str, &str)]) -> Result<(), String> {
    let funcs: Vec<&str> = plan.iter().map(|(_, f)| *f).collect();
    module_btf::functions_in(module, &funcs).map(|_| ())
}

/// Attach the twins of `plan` ((kprobe program, function) pairs) to `module`'s functions, adding
/// to `links`; returns what was attached (`fentry/FUNC`, `fexit/FUNC`). On an error nothing of
/// this call stays attached.
pub fn attach(
    object: &[u8],
    ebpf: &Ebpf,
    module: &str,
    plan: &[(&str, &str)],
    links: &mut Links,
) -> Result<Vec<String>, String> {
    let mut twins = Vec::new();
    for (prog, func) in plan {
        let (name, exit) =
            twin(prog, func).ok_or_else(|| format!("{prog} has no fentry/fexit twin (build mismatch)"))?;
        twins.push((name, exit, *func));
    }
    attach_programs(object, ebpf, module, &twins, links)
}

/// Attach programs of `object` ((name, fexit?, function) triples) to `module`'s functions as fentry
/// or fexit, adding to `links`; all or none.
pub fn attach_programs(
    object: &[u8],
    ebpf: &Ebpf,
    module: &str,
    plan: &[(&str, bool, &str)],
    links: &mut Links,
) -> Result<Vec<String>, String> {
    let funcs: Vec<&str> = plan.iter().map(|(_, _, f)| *f).collect();
    let ids = module_btf::functions_in(module, &funcs)?;
    let btf = module_btf::object_fd(module)?;
    let programs = raw::Programs::parse(object, ebpf)?;
    let mut mine = Vec::new();
    let mut attached = Vec::new();
    for (name, exit, func) in plan {
        let how = raw::LoadAs {
            prog_type: raw::BPF_PROG_TYPE_TRACING,
            expected_attach_type: if *exit { raw::BPF_TRACE_FEXIT } else { raw::BPF_TRACE_FENTRY },
            attach_btf_id: ids[*func],
            attach_btf_obj_fd: Some(btf.as_raw_fd()),
        };
        let kind = if *exit { "fexit" } else { "fentry" };
        let p = programs.load(name, &how).map_err(|e| format!("{kind}/{func}: {e}"))?;
        let link = raw::attach_tracing(&p).map_err(|e| format!("attaching {kind}/{func}: {e}"))?;
        mine.push((p, link));
        attached.push(format!("{kind}/{func}"));
    }
    links.fds.extend(mine);
    Ok(attached)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::driver_entry::{NVIDIA_545, NVIDIA_FRONTEND, UVM, UVM_MMAP};

    #[test]
    fn each_kprobe_program_has_its_twin_and_the_ioctl_returns_go_by_driver() {
        for (prog, _, _, _) in prog_names::DRIVER_ENTRY_TRAMPOLINE {
            assert!(prog_names::DRIVER_ENTRY.contains(&prog), "{prog}");
        }
        for prog in prog_names::DRIVER_ENTRY {
            assert!(twin(prog, "any_function").is_some(), "{prog} has no twin");
        }
        for f in [NVIDIA_545.ioctl, NVIDIA_FRONTEND.ioctl] {
            assert_eq!(twin(prog_names::DE_IOCTL_RET, f), Some(("def_nv_ioctl_ret", true)));
            assert_eq!(twin(prog_names::DE_NV_IOCTL, f), Some(("def_ioctl_clock", false)));
        }
        assert_eq!(twin(prog_names::DE_IOCTL_RET, UVM.ioctl), Some(("def_uvm_ioctl_ret", true)));
        assert_eq!(twin(prog_names::DE_IOCTL_RET, UVM_MMAP), Some(("def_ioctl_ret", true)));
        assert_eq!(twin(prog_names::DE_UVM_MMAP, UVM_MMAP), Some(("def_uvm_mmap", false)));
    }
}
