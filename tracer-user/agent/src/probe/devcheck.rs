//! Recognising NVIDIA devices by what they are, not by their name.
//!
//! The kernel side matches opens by path prefix (`<dev_dir>/nvidia…`), which anyone can satisfy: an
//! unprivileged user in its own user and mount namespace can put a tmpfs on `/dev` and create a file
//! called `nvidiactl`. So at open exit the kernel also reads the opened file's inode
//! (`current->files->fdt->fd[fd]->f_inode`) and accepts it only if it is a character device with an
//! NVIDIA major (195, and the dynamic ones `/proc/devices` lists under `nvidia*`), or a simulated
//! device the agent was told to accept (`simulated_devices`: the files in `dev_dir` at start, by file
//! system and inode). This module finds the struct offsets in the kernel's BTF, the majors in
//! `/proc/devices`, and the simulated files; [`Accepted`] applies the same rule to the fds the
//! `/proc` scan finds.
use std::{
    collections::HashSet,
    os::unix::fs::{FileTypeExt, MetadataExt},
    path::Path,
};

use btf_rs::{Btf, Type};
use tracer_common::{DEVICE_MAJORS_MAX, DeviceCheck, NVIDIA_MAJOR, SimDeviceKey, device_kind};

/// The kernel's BTF.
pub(crate) const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The byte offset of `member` in struct `name`, looking through anonymous struct and union
/// members (the kernel nests fields in them).
pub(crate) fn member_offset(btf: &Btf, name: &str, member: &str) -> Result<u32, String> {
    let types = btf.resolve_types_by_name(name).map_err(|e| format!("struct {name}: {e}"))?;
    let s = types
        .iter()
        .find_map(|t| match t {
            Type::Struct(s) if !s.members.is_empty() => Some(s.clone()),
            _ => None,
        })
        .ok_or_else(|| format!("struct {name} not found in the kernel's BTF"))?;
    find_in(btf, &s, member, 0).ok_or_else(|| format!("{name}.{member} not found in the kernel's BTF"))
}

fn find_in(btf: &Btf, s: &btf_rs::Struct, member: &str, base_bits: u32) -> Option<u32> {
    for m in &s.members {
        let bits = base_bits + m.bit_offset();
        let n = btf.resolve_name(m).unwrap_or_default();
        if n == member {
            return bits.is_multiple_of(8).then_some(bits / 8);
        }
        if n.is_empty() {
            // An anonymous struct or union: its members are the outer struct's.
            let inner = btf.type_iter(m).find_map(|t| match t {
                Type::Struct(s) | Type::Union(s) => Some(s),
                _ => None,
            });
            if let Some(inner) = inner
                && let Some(off) = find_in(btf, &inner, member, bits)
            {
                return Some(off);
            }
        }
    }
    None
}

/// The offsets the kernel side needs, from the BTF file at `path` (normally [`VMLINUX_BTF`]).
pub(crate) fn offsets_from_btf(path: &Path) -> Result<DeviceCheck, String> {
    let btf = Btf::from_file(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    Ok(DeviceCheck {
        enabled: 1,
        majors: [0; DEVICE_MAJORS_MAX],
        task_files: member_offset(&btf, "task_struct", "files")?,
        files_fdt: member_offset(&btf, "files_struct", "fdt")?,
        fdt_max_fds: member_offset(&btf, "fdtable", "max_fds")?,
        fdt_fd: member_offset(&btf, "fdtable", "fd")?,
        file_inode: member_offset(&btf, "file", "f_inode")?,
        inode_mode: member_offset(&btf, "inode", "i_mode")?,
        inode_rdev: member_offset(&btf, "inode", "i_rdev")?,
        inode_ino: member_offset(&btf, "inode", "i_ino")?,
        inode_sb: member_offset(&btf, "inode", "i_sb")?,
        sb_dev: member_offset(&btf, "super_block", "s_dev")?,
        vma_start: member_offset(&btf, "vm_area_struct", "vm_start")?,
        vma_end: member_offset(&btf, "vm_area_struct", "vm_end")?,
        vma_flags: member_offset(&btf, "vm_area_struct", "vm_flags")?,
        vma_pgoff: member_offset(&btf, "vm_area_struct", "vm_pgoff")?,
    })
}

/// The character-device majors of the NVIDIA driver: 195, then every `nvidia*` region among the
/// character devices of `/proc/devices` (`nvidia-uvm`, `nvidia-caps`, ...).
pub(crate) fn nvidia_majors(char_devices: &[(u32, String)]) -> Vec<u32> {
    let mut out = vec![NVIDIA_MAJOR];
    for (major, name) in char_devices {
        if name.starts_with("nvidia") && !out.contains(major) && out.len() < DEVICE_MAJORS_MAX {
            out.push(*major);
        }
    }
    out
}

/// Read the majors from `<proc_root>/devices` (195 alone when it cannot be read).
pub(crate) fn read_majors(proc_root: &Path) -> Vec<u32> {
    crate::proc::char_devices(proc_root).map_or_else(|| vec![NVIDIA_MAJOR], |d| nvidia_majors(&d))
}

/// Write `majors` into a [`DeviceCheck`].
pub(crate) fn set_majors(c: &mut DeviceCheck, majors: &[u32]) {
    c.majors = [0; DEVICE_MAJORS_MAX];
    for (slot, m) in c.majors.iter_mut().zip(majors) {
        *slot = *m;
    }
}

/// The kernel's `dev_t` encoding (`major << 20 | minor`) of a user-space `st_dev`.
pub(crate) fn kernel_dev(st_dev: u64) -> u32 {
    (libc::major(st_dev) << 20) | libc::minor(st_dev)
}

/// The files directly in `dev_dir` (and `dev_dir/nvidia-caps`) whose names start with `nvidia`,
/// as simulated devices: what `simulated_devices` trusts.
pub fn simulated_files(dev_dir: &Path) -> Vec<SimDeviceKey> {
    let mut out = Vec::new();
    for dir in [dev_dir.to_path_buf(), dev_dir.join("nvidia-caps")] {
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            if !e.file_name().to_string_lossy().starts_with("nvidia") {
                continue;
            }
            let Ok(m) = std::fs::metadata(e.path()) else { continue };
            if m.is_dir() {
                continue;
            }
            out.push(SimDeviceKey { dev: kernel_dev(m.dev()), _pad: 0, ino: m.ino() });
        }
    }
    out
}

/// Dynamic character majors (`tracer_common::is_dynamic_major`).
fn dynamic_major(major: u32) -> bool {
    tracer_common::is_dynamic_major(major)
}

/// The user-space copy of the kernel's rule, for fds found by the `/proc` scan.
#[derive(Clone, Debug, Default)]
pub struct Accepted {
    /// False when the kernel has no BTF: the path decides (as in the kernel).
    pub enabled: bool,
    pub majors: Vec<u32>,
    pub simulated: HashSet<SimDeviceKey>,
}

impl Accepted {
    /// Whether the file an fd refers to (`metadata` of `/proc/<pid>/fd/<n>`, which follows the
    /// link into the process's own mount namespace) is a device of `kind`.
    pub fn accepts(&self, kind: u8, m: &std::fs::Metadata) -> bool {
        if !self.enabled {
            return true;
        }
        if m.file_type().is_char_device() {
            let major = libc::major(m.rdev());
            return self.majors.contains(&major)
                || (dynamic_major(major)
                    && matches!(kind, device_kind::UVM | device_kind::UVM_TOOLS | device_kind::CAPS));
        }
        self.simulated.contains(&SimDeviceKey { dev: kernel_dev(m.dev()), _pad: 0, ino: m.ino() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majors_come_from_the_character_part_of_proc_devices() {
        let text = "Character devices:\n  1 mem\n195 nvidia-frontend\n195 nvidia\n508 nvidia-uvm\n\
                    509 nvidia-caps\n510 nvidia-nvswitch\n\nBlock devices:\n 8 sd\n240 nvidiablk\n";
        let devices = crate::proc::parse::char_devices(text).unwrap();
        assert_eq!(nvidia_majors(&devices), vec![195, 508, 509, 510]);
        assert_eq!(nvidia_majors(&[]), vec![195]);
    }

    #[test]
    fn offsets_are_found_in_this_kernels_btf() {
        let Ok(c) = offsets_from_btf(Path::new(VMLINUX_BTF)) else {
            // Every machine this project runs its tests on has BTF; say so rather than pass.
            panic!("{VMLINUX_BTF} unreadable: the device check needs kernel BTF");
        };
        assert_eq!(c.enabled, 1);
        // task_struct.files is far into task_struct; inode.i_mode is its first field.
        assert!(c.task_files > 1000, "{c:?}");
        assert_eq!(c.inode_mode, 0, "{c:?}");
        assert!(c.inode_rdev > 0 && c.inode_ino > 0 && c.inode_sb > 0 && c.file_inode > 0, "{c:?}");
        // vm_start is the first field (inside an anonymous struct on newer kernels), vm_end the next.
        assert_eq!((c.vma_start, c.vma_end), (0, 8), "{c:?}");
        assert!(c.vma_flags > 8 && c.vma_pgoff > 8, "{c:?}");
        assert_ne!(c.fdt_fd, c.fdt_max_fds);
    }

    #[test]
    fn a_regular_file_is_accepted_only_when_listed_as_simulated() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("nvidiactl");
        std::fs::write(&f, b"").unwrap();
        let m = std::fs::metadata(&f).unwrap();
        let mut a = Accepted { enabled: true, majors: vec![195], simulated: HashSet::new() };
        assert!(!a.accepts(device_kind::CTL, &m));
        a.simulated.extend(simulated_files(dir.path()));
        assert!(a.accepts(device_kind::CTL, &m));
        // /dev/null is a character device with major 1: never an NVIDIA device.
        let null = std::fs::metadata("/dev/null").unwrap();
        assert!(!a.accepts(device_kind::CTL, &null));
        assert!(!a.accepts(device_kind::UVM, &null));
        // With the check off (no kernel BTF) the path decides, as in the kernel.
        assert!(Accepted::default().accepts(device_kind::CTL, &null));
    }
}
