//! Map keys and values the kernel side keeps and user space sets: the driver family's in-flight
//! state, capture plans and their slots, the device check, the tracer's configuration, the lifecycle
//! layout.
use crate::DeviceRef;

/// Per-syscall state kept from entry to exit (`INFLIGHT`, keyed by pid_tgid).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inflight {
    pub sysno: u32,
    pub fd: i32,
    pub args: [u64; 4],
    pub enter_ktime: u64,
    pub dev: DeviceRef,
    /// For dup2/dup3: the device of the fd being replaced (kind 0 if none).
    pub replaced: DeviceRef,
}

/// `UVM_MAPS` key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UvmMapKey {
    pub tgid: u32,
    pub _pad: u32,
    pub addr: u64,
}

/// `CAPTURE_PLANS` key: `space` is 0 for frontend escapes (`cmd` = nr), 1 for UVM (`cmd` = command).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CaptureKey {
    pub space: u32,
    pub cmd: u32,
}
pub const SPACE_FRONTEND: u32 = 0;
pub const SPACE_UVM: u32 = 1;

/// `nested_ptr_off` value meaning "no nested block".
pub const NO_NESTED: u32 = u32::MAX;

/// What to copy from an ioctl argument, chosen per command by user space for the running driver
/// version. Frontend commands without a plan copy `min(_IOC_SIZE, IOCTL_MAIN_MAX)` bytes; UVM
/// commands without a plan copy nothing (they are still counted and reported).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CapturePlan {
    pub main_len: u32,
    pub tail_off: u32,
    pub tail_len: u32,
    /// Offset of a u64 user pointer inside the main window to follow, or [`NO_NESTED`].
    pub nested_ptr_off: u32,
    /// Bytes to copy from the nested pointer; if `nested_by_class` is 1 the length is looked up in
    /// `ALLOC_PARAM_SIZES` by the u32 class at `class_off` in the main window (0 ⇒ nothing).
    pub nested_len: u32,
    pub nested_by_class: u32,
    pub class_off: u32,
    /// 1: the command's records feed the memory ledger (allocations, frees, duplicates) and go
    /// through the ledger ring (`EVENTS`); 0: they only count and go through the bulk ring
    /// (`BULK_EVENTS`). Commands without a plan only count.
    pub ledger: u32,
}

/// `CAPTURE_PLANS` entry: a direct-mapped slot (see [`plan_slot`]) holding its command, so a
/// command that shares a slot with a planned one is never mistaken for it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanSlot {
    /// The command (frontend nr or UVM command) whose plan this is.
    pub cmd: u32,
    /// 1 if the slot holds a plan.
    pub present: u32,
    pub plan: CapturePlan,
}

/// Slots of `CAPTURE_PLANS`: 256 per space.
pub const CAPTURE_PLAN_SLOTS: u32 = 512;

/// The `CAPTURE_PLANS` slot of a command: its space's half, indexed by the command's low byte
/// (frontend nrs are one byte; UVM commands are small numbers plus two 0x3000_000x ones). An array
/// load on the hot path instead of a hash lookup; user space refuses a plan table with two
/// commands in one slot.
#[inline(always)]
pub const fn plan_slot(space: u32, cmd: u32) -> u32 {
    (space & 1) * 256 + (cmd & 0xff)
}

/// `ALLOC_PARAM_SIZES` entry: an RM class and the bytes of its nested parameters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassSize {
    pub class: u32,
    pub size: u32,
}

/// Slots of `ALLOC_PARAM_SIZES`.
pub const ALLOC_PARAM_SLOTS: u32 = 256;

/// The `ALLOC_PARAM_SIZES` slot of an RM class (classes are 16-bit numbers; the two bytes folded
/// together spread the memory classes over distinct slots). The slot holds its class; user space
/// refuses two classes in one slot.
#[inline(always)]
pub const fn class_slot(class: u32) -> u32 {
    (class ^ (class >> 8)) & 0xff
}

/// Bytes of the device-directory prefix (e.g. `/dev/nvidia`) the kernel matches opens against.
pub const DEV_PREFIX_MAX: usize = 64;

/// Character-device majors the device check accepts (195 and the driver's dynamic ones).
pub const DEVICE_MAJORS_MAX: usize = 8;

/// The NVIDIA frontend major (`nvidiactl`, `nvidiaN`, `nvidia-modeset`).
pub const NVIDIA_MAJOR: u32 = 195;

/// Whether `major` is one the kernel hands out dynamically (`alloc_chrdev_region`: 254 down to
/// 234, then 511 down to 384), as `nvidia-uvm` and `nvidia-caps` get. One definition for the kernel
/// side's device check and user space's `/proc` scan.
#[inline(always)]
pub const fn is_dynamic_major(major: u32) -> bool {
    (major >= 234 && major <= 254) || (major >= 384 && major <= 511)
}

/// How the kernel side decides that an opened file is an NVIDIA device, not just a file with an
/// NVIDIA name: the open file's inode is read through `current->files->fdt->fd[fd]->f_inode` at
/// open exit (offsets from the kernel's BTF, found by user space) and must be a character device
/// with an accepted major, or a simulated device listed in `SIM_DEVICES` by (device, inode).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCheck {
    /// 1: check every matched open; 0: no kernel BTF, the path alone decides (reported by `doctor`).
    pub enabled: u32,
    /// Accepted majors; 0 ends the list. [`NVIDIA_MAJOR`] first, then `/proc/devices`' `nvidia*`.
    pub majors: [u32; DEVICE_MAJORS_MAX],
    /// Byte offsets: `task_struct.files`, `files_struct.fdt`, `fdtable.max_fds`, `fdtable.fd`,
    /// `file.f_inode`, `inode.i_mode`, `inode.i_rdev`, `inode.i_ino`, `inode.i_sb`,
    /// `super_block.s_dev`; for driver-entry mode's UVM mappings `vm_area_struct.vm_start`,
    /// `.vm_end`, `.vm_flags`, `.vm_pgoff`.
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdt_max_fds: u32,
    pub fdt_fd: u32,
    pub file_inode: u32,
    pub inode_mode: u32,
    pub inode_rdev: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    pub vma_start: u32,
    pub vma_end: u32,
    pub vma_flags: u32,
    pub vma_pgoff: u32,
}

/// A simulated device file (`SIM_DEVICES` key): its file system's kernel `dev_t`
/// (`major << 20 | minor`) and inode number.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SimDeviceKey {
    pub dev: u32,
    pub _pad: u32,
    pub ino: u64,
}

/// `CONFIG[0]`, written by user space before attaching.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracerConfig {
    /// The agent's own tgid: its opens are never tracked.
    pub agent_tgid: u32,
    /// Length of `dev_prefix` (the configured device directory followed by `/nvidia`).
    pub dev_prefix_len: u32,
    /// Consider a wake-up of user space every this many ring-buffer records per CPU (0 or 1: wake
    /// at every record); see `wakeup_bytes`.
    pub wakeup_every: u32,
    /// Bit set of enabled families ([`family`]).
    pub families: u32,
    /// Kernel-side diagnostics through aya-log (a copy that faulted, a capture plan that did not
    /// match): 1 on, 0 off (the default). Switched at run time; off costs one load and a branch.
    pub diagnostics: u32,
    /// Every `wakeup_every` records per CPU the kernel wakes user space only if one of the rings
    /// holds at least this many unread bytes (0: always). User space also drains on its timer.
    pub wakeup_bytes: u32,
    pub dev_prefix: [u8; DEV_PREFIX_MAX],
    pub device_check: DeviceCheck,
    pub lifecycle: LifecycleLayout,
    /// 1: time NVIDIA ioctls (`duration_ns`) in the modes whose entry program would otherwise do
    /// nothing for them (btf and raw tracepoints); 0: their entry returns at once and
    /// `duration_ns` is 0. `Config::ioctl_durations`.
    pub ioctl_durations: u32,
    /// Driver-entry mode: mixed into each open file's `struct file *` to make its `file_id` and
    /// file slot ([`NvFile`]), so no kernel address reaches user space. Random per agent start.
    pub file_salt: u64,
}

impl Default for TracerConfig {
    fn default() -> Self {
        Self {
            agent_tgid: 0,
            dev_prefix_len: 0,
            wakeup_every: 64,
            families: 0,
            diagnostics: 0,
            wakeup_bytes: 0,
            dev_prefix: [0; DEV_PREFIX_MAX],
            device_check: DeviceCheck::default(),
            lifecycle: LifecycleLayout::default(),
            ioctl_durations: 0,
            file_salt: 0,
        }
    }
}

/// Where the lifecycle tracepoints keep their fields on the running kernel, read by user space
/// from their `format` files (the layouts change between kernels: `sched_process_fork`'s comms
/// became `__data_loc` strings, `sched_process_exit` gained `group_dead`), how the exit
/// program tells that a process's last thread exited ([`exit_by`]), and for the `tp_btf`
/// programs (which get the kernel objects, not a record) the BTF offsets of the fields they read.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LifecycleLayout {
    /// `sched_process_fork.child_pid`.
    pub fork_child_pid: u32,
    /// `sched_process_exit.group_dead`, for [`exit_by::GROUP_DEAD`].
    pub exit_group_dead: u32,
    /// One of [`exit_by`].
    pub exit_by: u32,
    /// BTF offsets `task_struct.signal` and `signal_struct.live`, for [`exit_by::SIGNAL_LIVE`].
    pub task_signal: u32,
    pub signal_live: u32,
    /// `cgroup_rmdir.level`, `.id` and `.path` (a `__data_loc` string).
    pub rmdir_level: u32,
    pub rmdir_id: u32,
    pub rmdir_path: u32,
    /// BTF offsets for the `tp_btf` programs: `task_struct.pid` (the forked child's id),
    /// `cgroup.level`, `cgroup.kn` and `kernfs_node.id` (a cgroup's id is its kernfs node's).
    pub task_pid: u32,
    pub cgroup_level: u32,
    pub cgroup_kn: u32,
    pub kernfs_id: u32,
}

/// How `sched_process_exit` knows the whole process is gone.
pub mod exit_by {
    /// The tracepoint's own `group_dead` field (recent kernels).
    pub const GROUP_DEAD: u32 = 1;
    /// `current->signal->live` is 0 (it is decremented before the tracepoint fires), read at
    /// offsets from the kernel's BTF: exact on kernels without `group_dead`.
    pub const SIGNAL_LIVE: u32 = 2;
    /// The thread-group leader exits (no BTF either): early when the leader exits before its
    /// other threads, which CUDA programs do not do in practice.
    pub const LEADER: u32 = 3;
}

impl Default for LifecycleLayout {
    /// The layout of kernel 6.18 (the development machines').
    fn default() -> Self {
        Self {
            fork_child_pid: 20,
            exit_group_dead: 32,
            exit_by: exit_by::GROUP_DEAD,
            task_signal: 0,
            signal_live: 0,
            rmdir_level: 12,
            rmdir_id: 16,
            rmdir_path: 24,
            task_pid: 0,
            cgroup_level: 0,
            cgroup_kn: 0,
            kernfs_id: 0,
        }
    }
}
