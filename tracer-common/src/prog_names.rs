/// One program per attach mode for syscall entry and exit; all share one handler.
pub const SYS_ENTER_TP: &str = "sys_enter_tp";
pub const SYS_EXIT_TP: &str = "sys_exit_tp";
pub const SYS_ENTER_RAW: &str = "sys_enter_raw";
pub const SYS_EXIT_RAW: &str = "sys_exit_raw";
pub const SYS_ENTER_BTF: &str = "sys_enter_btf";
pub const SYS_EXIT_BTF: &str = "sys_exit_btf";
pub const PROC_EXEC: &str = "proc_exec";
pub const PROC_EXIT: &str = "proc_exit";
pub const PROC_FORK: &str = "proc_fork";
pub const CGROUP_RMDIR: &str = "cgroup_rmdir";
/// The lifecycle programs as `tp_btf` (no perf event to open).
pub const PROC_EXEC_BTF: &str = "proc_exec_btf";
pub const PROC_EXIT_BTF: &str = "proc_exit_btf";
pub const PROC_FORK_BTF: &str = "proc_fork_btf";
pub const CGROUP_RMDIR_BTF: &str = "cgroup_rmdir_btf";
/// libcuda uprobes (the attach cookie is the `cuda_entry` id).
pub const CUDA_COUNT: &str = "cuda_count";
pub const CUDA_ALLOC_ENTER: &str = "cuda_alloc_enter";
pub const CUDA_ALLOC_RETURN: &str = "cuda_alloc_return";
pub const CUDA_FREE: &str = "cuda_free";
pub const CUDA_LOOKUP_ENTER: &str = "cuda_lookup_enter";
pub const CUDA_LOOKUP_RETURN: &str = "cuda_lookup_return";
pub const CUDA_TIMED_ENTER: &str = "cuda_timed_enter";
pub const CUDA_TIMED_RETURN: &str = "cuda_timed_return";
/// The entry probes without attach cookies (kernels before 5.15), by `cuda_entry` id: one program
/// per entry point, its id a constant (`tracer-ebpf`'s `cuda_per_entry!`). The return probes
/// need no cookie and stay shared.
pub const CUDA_PER_ENTRY: [&str; crate::cuda_entry::COUNT as usize] = [
    "cuda_e0", "cuda_e1", "cuda_e2", "cuda_e3", "cuda_e4", "cuda_e5", "cuda_e6", "cuda_e7", "cuda_e8", "cuda_e9",
    "cuda_e10", "cuda_e11", "cuda_e12", "cuda_e13", "cuda_e14", "cuda_e15", "cuda_e16", "cuda_e17", "cuda_e18",
    "cuda_e19", "cuda_e20", "cuda_e21", "cuda_e22", "cuda_e23", "cuda_e24", "cuda_e25", "cuda_e26", "cuda_e27",
    "cuda_e28", "cuda_e29", "cuda_e30", "cuda_e31", "cuda_e32", "cuda_e33", "cuda_e34", "cuda_e35", "cuda_e36",
    "cuda_e37", "cuda_e38", "cuda_e39", "cuda_e40", "cuda_e41", "cuda_e42", "cuda_e43", "cuda_e44", "cuda_e45",
    "cuda_e46", "cuda_e47", "cuda_e48", "cuda_e49", "cuda_e50", "cuda_e51", "cuda_e52", "cuda_e53", "cuda_e54",
    "cuda_e55", "cuda_e56", "cuda_e57", "cuda_e58", "cuda_e59",
];
/// Driver-entry mode: kprobes on the NVIDIA driver's own file operations (`nvidia.ko`'s and
/// `nvidia-uvm.ko`'s open, ioctl and release), and the kretprobes of open and ioctl (their
/// fentry/fexit twins: `DRIVER_ENTRY_TRAMPOLINE`).
pub const DE_NV_OPEN: &str = "de_nv_open";
pub const DE_UVM_OPEN: &str = "de_uvm_open";
pub const DE_OPEN_RET: &str = "de_open_ret";
pub const DE_NV_IOCTL: &str = "de_nv_ioctl";
pub const DE_UVM_IOCTL: &str = "de_uvm_ioctl";
pub const DE_IOCTL_RET: &str = "de_ioctl_ret";
pub const DE_RELEASE: &str = "de_release";
pub const DE_UVM_MMAP: &str = "de_uvm_mmap";
pub const DE_UVM_VM_CLOSE: &str = "de_uvm_vm_close";
/// Every driver-entry program.
pub const DRIVER_ENTRY: [&str; 9] = [
    DE_NV_OPEN,
    DE_UVM_OPEN,
    DE_OPEN_RET,
    DE_NV_IOCTL,
    DE_UVM_IOCTL,
    DE_IOCTL_RET,
    DE_RELEASE,
    DE_UVM_MMAP,
    DE_UVM_VM_CLOSE,
];
/// Each driver-entry program's twin on BPF trampolines (`def_…`), used where the NVIDIA module
/// has BTF: (kprobe program, the function it is on or "" for any, trampoline program, fexit?).
/// The ioctls differ: an fexit has the arguments, so their entry keeps only the clock and their
/// return (one program per driver) does what the kprobe did at entry.
pub const DRIVER_ENTRY_TRAMPOLINE: [(&str, &str, &str, bool); 11] = [
    (DE_NV_OPEN, "", "def_nv_open", false),
    (DE_UVM_OPEN, "", "def_uvm_open", false),
    (DE_OPEN_RET, "", "def_open_ret", true),
    (DE_NV_IOCTL, "", "def_ioctl_clock", false),
    (DE_UVM_IOCTL, "", "def_ioctl_clock", false),
    (DE_IOCTL_RET, "uvm_mmap_entry", "def_ioctl_ret", true),
    (DE_IOCTL_RET, "uvm_unlocked_ioctl_entry", "def_uvm_ioctl_ret", true),
    (DE_IOCTL_RET, "", "def_nv_ioctl_ret", true),
    (DE_RELEASE, "", "def_release", false),
    (DE_UVM_MMAP, "", "def_uvm_mmap", false),
    (DE_UVM_VM_CLOSE, "", "def_uvm_vm_close", false),
];
/// Empty programs for measuring each attach mechanism's floor (benchmark only).
pub const NOOP_TP: &str = "noop_tp";
pub const NOOP_RAW: &str = "noop_raw";
pub const NOOP_BTF: &str = "noop_btf";
pub const NOOP_KPROBE: &str = "noop_kprobe";
pub const NOOP_KRETPROBE: &str = "noop_kretprobe";
pub const NOOP_FENTRY: &str = "noop_fentry";
pub const NOOP_FEXIT: &str = "noop_fexit";
