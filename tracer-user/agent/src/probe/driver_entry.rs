//! Driver-entry mode's attach points: the NVIDIA driver's file operations, found by name in
//! `/proc/kallsyms` for the running driver version.
//!
//! | driver | `nvidia.ko` open / release / ioctl | `nvidia-uvm.ko` open / release / ioctl |
//! |---|---|---|
//! | ≤ 535 | `nvidia_frontend_open` / `nvidia_frontend_close` / `nvidia_frontend_unlocked_ioctl` | `uvm_open_entry` / `uvm_release_entry` / `uvm_unlocked_ioctl_entry` |
//! | ≥ 545 | `nvidia_open` / `nvidia_close` / `nvidia_unlocked_ioctl` | the same |
//!
//! Read from NVIDIA's open kernel modules at every release tag from 515 to 595 (`nv_frontend_fops`
//! in `nv-frontend.c` until 535, `nvidia_fops` in `nv.c` from 545; `uvm_fops` in `uvm.c`
//! throughout). The proprietary modules build the same `kernel-open`-style interface layer, so the
//! names are the same there. A version this table does not know tries both sets.
use std::path::Path;

use tracer_core::model::probes::{EntryPoints, Functions};

/// `nvidia.ko` from 545 on.
pub(crate) const NVIDIA_545: Functions =
    Functions { open: "nvidia_open", release: "nvidia_close", ioctl: "nvidia_unlocked_ioctl" };
/// `nvidia.ko` up to 535 (the frontend layer).
pub(crate) const NVIDIA_FRONTEND: Functions = Functions {
    open: "nvidia_frontend_open",
    release: "nvidia_frontend_close",
    ioctl: "nvidia_frontend_unlocked_ioctl",
};
/// `nvidia-uvm.ko`, every version.
pub const UVM: Functions =
    Functions { open: "uvm_open_entry", release: "uvm_release_entry", ioctl: "uvm_unlocked_ioctl_entry" };
/// `nvidia-uvm.ko`'s managed-memory entry points, every version 515–595: the mmap file operation
/// (`cudaMallocManaged`'s mapping) and the managed VMA's close (its munmap, or the process's exit).
pub const UVM_MMAP: &str = "uvm_mmap_entry";
pub(crate) const UVM_VM_CLOSE: &str = "uvm_vm_close_managed_entry";

/// The functions of `module` in kallsyms text (`ADDR TYPE NAME\t[MODULE]` lines).
fn module_functions<'a>(kallsyms: &'a str, module: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    kallsyms.lines().filter_map(move |l| {
        let mut it = l.split_whitespace();
        let (_addr, kind, name) = (it.next()?, it.next()?, it.next()?);
        let m = it.next()?.strip_prefix('[')?.strip_suffix(']')?;
        (m == module && matches!(kind, "t" | "T")).then_some(name)
    })
}

/// Whether every function of `f` is in `have`.
fn complete(f: &Functions, have: &[&str]) -> bool {
    [f.open, f.release, f.ioctl].iter().all(|n| have.contains(n))
}

/// The major number of a driver version string (`535.261.03` → 535).
fn major(version: &str) -> Option<u32> {
    version.trim().split('.').next()?.parse().ok()
}

/// Choose the entry points from kallsyms text and the module's version; an error names what is
/// missing (then `auto` uses the next mode).
pub fn choose(kallsyms: &str, driver_version: Option<&str>) -> Result<EntryPoints, String> {
    let nvidia: Vec<&str> = module_functions(kallsyms, "nvidia").collect();
    if nvidia.is_empty() {
        return Err("the nvidia module is not loaded (no [nvidia] functions in /proc/kallsyms)".into());
    }
    let expected = match driver_version.and_then(major) {
        Some(m) if m >= 545 => Some(NVIDIA_545),
        Some(_) => Some(NVIDIA_FRONTEND),
        None => None,
    };
    let (chosen, detail) = match expected {
        Some(f) if complete(&f, &nvidia) => {
            (f, format!("driver {}: {}", driver_version.unwrap_or("?").trim(), f.ioctl))
        }
        _ => {
            let other = [NVIDIA_545, NVIDIA_FRONTEND].into_iter().find(|f| complete(f, &nvidia)).ok_or_else(|| {
                format!(
                    "none of the known entry points of nvidia.ko is in /proc/kallsyms (driver {}; looked for {} and {}): \
                     renamed in this driver?",
                    driver_version.map(str::trim).unwrap_or("of unknown version"),
                    NVIDIA_545.ioctl,
                    NVIDIA_FRONTEND.ioctl
                )
            })?;
            let why = match (expected, driver_version) {
                (Some(e), Some(v)) => format!("driver {} should have {}, which is missing; found", v.trim(), e.ioctl),
                _ => "driver version unknown; found".to_string(),
            };
            (other, format!("{why} {}", other.ioctl))
        }
    };
    let uvm_have: Vec<&str> = module_functions(kallsyms, "nvidia_uvm").collect();
    let uvm = complete(&UVM, &uvm_have).then_some(UVM);
    let uvm_managed = uvm.is_some() && [UVM_MMAP, UVM_VM_CLOSE].iter().all(|f| uvm_have.contains(f));
    let detail = match uvm {
        Some(u) if uvm_managed => format!("{detail} and {}, {UVM_MMAP}, {UVM_VM_CLOSE}", u.ioctl),
        Some(u) => {
            format!("{detail} and {}; {UVM_MMAP} or {UVM_VM_CLOSE} is missing: managed mappings are not seen", u.ioctl)
        }
        None if uvm_have.is_empty() => format!("{detail}; nvidia-uvm is not loaded: UVM calls are not seen"),
        None => format!("{detail}; nvidia-uvm's {} is missing: UVM calls are not seen", UVM.ioctl),
    };
    Ok(EntryPoints {
        driver_version: driver_version.map(|v| v.trim().to_string()),
        nvidia: chosen,
        uvm,
        uvm_managed,
        detail,
    })
}

/// [`choose`] on this node: `/proc/kallsyms` and `/sys/module/nvidia/version`.
pub fn detect() -> Result<EntryPoints, String> {
    if !Path::new("/sys/module/nvidia").exists() {
        return Err("the nvidia module is not loaded (no /sys/module/nvidia)".into());
    }
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").map_err(|e| format!("reading /proc/kallsyms: {e}"))?;
    let version = std::fs::read_to_string(Path::new("/sys/module/nvidia/version")).ok();
    choose(&kallsyms, version.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODERN: &str = "ffffffffc0a00000 t nvidia_open\t[nvidia]\nffffffffc0a00100 t nvidia_close\t[nvidia]\n\
                          ffffffffc0a00200 T nvidia_unlocked_ioctl\t[nvidia]\n\
                          ffffffffc0b00000 t uvm_open_entry\t[nvidia_uvm]\nffffffffc0b00100 t uvm_release_entry\t[nvidia_uvm]\n\
                          ffffffffc0b00200 t uvm_unlocked_ioctl_entry\t[nvidia_uvm]\n\
                          ffffffff81000000 T nvidia_open\n";
    const FRONTEND: &str = "0000000000000000 T nvidia_frontend_open\t[nvidia]\n0000000000000000 T nvidia_frontend_close\t[nvidia]\n\
                            0000000000000000 T nvidia_frontend_unlocked_ioctl\t[nvidia]\n\
                            0000000000000000 T nvidia_ioctl\t[nvidia]\n";

    #[test]
    fn the_version_picks_the_names_and_uvm_follows_when_loaded() {
        let e = choose(MODERN, Some("550.54.14\n")).unwrap();
        assert_eq!((e.nvidia, e.uvm), (NVIDIA_545, Some(UVM)));
        assert_eq!(e.driver_version.as_deref(), Some("550.54.14"));
        assert!(
            e.detail.contains("driver 550.54.14: nvidia_unlocked_ioctl and uvm_unlocked_ioctl_entry"),
            "{}",
            e.detail
        );
        assert!(!e.uvm_managed && e.detail.contains("managed mappings are not seen"), "{}", e.detail);
        let managed = format!(
            "{MODERN}ffffffffc0b00300 t uvm_mmap_entry\t[nvidia_uvm]\n\
             ffffffffc0b00400 t uvm_vm_close_managed_entry\t[nvidia_uvm]\n"
        );
        let m = choose(&managed, Some("550.54.14")).unwrap();
        assert!(m.uvm_managed, "{m:?}");
        assert!(
            m.detail.ends_with("uvm_unlocked_ioctl_entry, uvm_mmap_entry, uvm_vm_close_managed_entry"),
            "{}",
            m.detail
        );
        let f = choose(FRONTEND, Some("535.261.03")).unwrap();
        assert_eq!((f.nvidia, f.uvm, f.uvm_managed), (NVIDIA_FRONTEND, None, false));
        assert!(f.detail.contains("nvidia-uvm is not loaded"), "{}", f.detail);
    }

    #[test]
    fn a_version_whose_names_are_missing_uses_the_set_that_is_there_and_says_so() {
        let e = choose(MODERN, Some("535.261.03")).unwrap();
        assert_eq!(e.nvidia, NVIDIA_545);
        assert!(e.detail.contains("should have nvidia_frontend_unlocked_ioctl, which is missing"), "{}", e.detail);
        let e = choose(FRONTEND, None).unwrap();
        assert_eq!(e.nvidia, NVIDIA_FRONTEND);
        assert!(e.detail.contains("version unknown"), "{}", e.detail);
    }

    #[test]
    fn a_missing_module_or_renamed_functions_are_errors_that_say_which() {
        let core_only = "ffffffff81000000 T nvidia_open\nffffffff81000100 T nvidia_unlocked_ioctl\n";
        assert!(choose(core_only, None).unwrap_err().contains("not loaded"));
        let renamed = "0 t nvidia_open\t[nvidia]\n0 t nvidia_close\t[nvidia]\n0 t nvidia_ioctl_v2\t[nvidia]\n";
        let e = choose(renamed, Some("600.1")).unwrap_err();
        assert!(e.contains("renamed") && e.contains("driver 600.1"), "{e}");
        // A UVM module without its ioctl entry: the frontend still attaches, UVM is named missing.
        let partial = format!("{}0 t uvm_open_entry\t[nvidia_uvm]\n", FRONTEND);
        let e = choose(&partial, Some("535.1")).unwrap();
        assert!(e.uvm.is_none() && e.detail.contains("uvm_unlocked_ioctl_entry is missing"), "{}", e.detail);
    }
}
