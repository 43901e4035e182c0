//! Loading the kernel-module double (`tests/kmod`'s `nvidia.ko` and `nvidia-uvm.ko`) for
//! [`super::FakeDriverBuilder::start_kmod`], with `finit_module(2)` and `delete_module(2)`
//! directly (no kmod tools needed).
//!
//! The modules stay loaded when a test ends (the next test reuses them); they are reloaded only
//! when a test asks for another number of GPUs.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::{HarnessError, Result};
use crate::fake_driver::kmod::{GPUS_PARAMETER, module_gpus};

/// Where `cargo xtask kmod` writes the modules for kernel `release` (`GPU_TRACER_KMOD_DIR`
/// overrides the directory).
pub fn module_dir(release: &str) -> PathBuf {
    match std::env::var_os("GPU_TRACER_KMOD_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            let tests = Path::new(env!("CARGO_MANIFEST_DIR"));
            tests.parent().unwrap_or(tests).join("target/kmod").join(release)
        }
    }
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Whether the running kernel loads a module's BTF (`CONFIG_DEBUG_INFO_BTF_MODULES`, 5.11 and
/// later; on for every Debian kernel since): where it does not (5.10), `cargo xtask kmod` builds the
/// double without BTF only, and driver-entry mode can only take kprobes.
pub fn kernel_loads_module_btf() -> bool {
    super::kernel_at_least(5, 11)
}

/// Make sure `nvidia` (with `gpus`) and `nvidia_uvm` are loaded, with module BTF or without as
/// `btf` says: load them if absent, reload them if loaded with another GPU count or the other
/// build, refuse a real NVIDIA driver.
pub fn ensure_loaded(gpus: u32, btf: bool) -> Result<()> {
    let release = kernel_release();
    let dir = if btf { module_dir(&release) } else { module_dir(&release).join(NO_BTF) };
    let nvidia = dir.join("nvidia.ko");
    let uvm = dir.join("nvidia-uvm.ko");
    if btf && !kernel_loads_module_btf() {
        return Err(HarnessError::KernelModule(format!(
            "the double with module BTF asked for, but this kernel ({release}) loads no module BTF (5.11+): \
             ask for it without (`module_btf(false)`)"
        )));
    }
    for m in [&nvidia, &uvm] {
        if !m.is_file() {
            return Err(HarnessError::KernelModule(format!(
                "{} not found: this double is built for Debian's 6.1 and 5.10 kernels by `cargo xtask kmod \
                 [--kernel 5.10]` and runs in `cargo xtask kernel-matrix [--kernel 5.10] --test driver_double` \
                 (this kernel is {release})",
                m.display()
            )));
        }
    }
    if Path::new("/sys/module/nvidia").exists() {
        let has_btf = Path::new(MODULE_BTF).exists();
        match module_gpus(Path::new(GPUS_PARAMETER)) {
            Some(n) if n == gpus && has_btf == btf => {}
            Some(n) => {
                // Reload with the count and build asked for; fails with EBUSY while files are open.
                for name in ["nvidia_uvm", "nvidia"] {
                    if Path::new("/sys/module").join(name).exists() {
                        unload(name).map_err(|e| {
                            HarnessError::KernelModule(format!(
                                "nvidia.ko is loaded with gpus={n} (module BTF: {has_btf}), gpus={gpus} (module \
                                 BTF: {btf}) asked for, and unloading {name} failed: {e} (a process still has a \
                                 device open, or a server is attached?)"
                            ))
                        })?;
                    }
                }
            }
            None => {
                return Err(HarnessError::KernelModule(format!(
                    "an nvidia module without {GPUS_PARAMETER} is loaded: a real NVIDIA driver, not the double; \
                     run these tests where it is not loaded"
                )));
            }
        }
    }
    if !Path::new("/sys/module/nvidia").exists() {
        load(&nvidia, &format!("gpus={gpus}"))?;
    }
    if !Path::new("/sys/module/nvidia_uvm").exists() {
        load(&uvm, "")?;
    }
    if Path::new(MODULE_BTF).exists() != btf {
        return Err(HarnessError::KernelModule(format!(
            "{} loaded, but {MODULE_BTF} {}: `cargo xtask kmod` encodes the BTF with pahole against this \
             kernel's vmlinux (a mismatch makes the kernel drop it: see the kernel log)",
            nvidia.display(),
            if btf { "is missing" } else { "exists" }
        )));
    }
    Ok(())
}

/// Where the kernel shows a loaded module's BTF.
pub const MODULE_BTF: &str = "/sys/kernel/btf/nvidia";
/// The subdirectory of [`module_dir`] with the modules built without BTF.
pub const NO_BTF: &str = "no-btf";

/// Unload the double's modules if they are loaded (a module with the double's `gpus` parameter;
/// a real NVIDIA driver is left alone). The FUSE double's tests call this first: with the module
/// double loaded, `attach_mode = auto` would choose driver-entry mode on it and see nothing of
/// the FUSE devices. Unloading fails (and is reported) while a process holds one of its devices.
pub fn unload_double() -> Result<()> {
    if !Path::new(GPUS_PARAMETER).exists() {
        return Ok(());
    }
    for name in ["nvidia_uvm", "nvidia"] {
        if Path::new("/sys/module").join(name).exists() {
            unload(name).map_err(|e| {
                HarnessError::KernelModule(format!(
                    "the kernel-module double is loaded and unloading {name} failed: {e} (a process still has \
                     one of its devices open?)"
                ))
            })?;
        }
    }
    Ok(())
}

/// `finit_module(fd, params, 0)`; a module that is already there (a race) is fine.
fn load(path: &Path, params: &str) -> Result<()> {
    let file = std::fs::File::open(path).map_err(|e| HarnessError::io(format!("open {}", path.display()), e))?;
    let params = CString::new(params).expect("no NUL in module parameters");
    // SAFETY: the fd is open for the call and `params` is a valid NUL-terminated string.
    let rc = unsafe { libc::syscall(libc::SYS_finit_module, file.as_raw_fd(), params.as_ptr(), 0) };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EEXIST) {
        return Ok(());
    }
    let hint = match e.raw_os_error() {
        Some(libc::ENOEXEC) | Some(libc::EINVAL) => {
            " (built for another kernel? `cargo xtask kmod [--kernel 5.10]` builds for Debian's 6.1 or 5.10; see the kernel log)"
        }
        Some(libc::ENOENT) => " (nvidia-uvm.ko needs nvidia.ko loaded first)",
        Some(libc::EPERM) => " (needs root, CAP_SYS_MODULE, and modules not disabled)",
        _ => "",
    };
    Err(HarnessError::KernelModule(format!("finit_module {} {:?}: {e}{hint}", path.display(), params)))
}

/// `delete_module(name, O_NONBLOCK)`.
fn unload(name: &str) -> std::io::Result<()> {
    let c = CString::new(name).expect("no NUL in a module name");
    // SAFETY: `c` is a valid NUL-terminated module name.
    let rc = unsafe { libc::syscall(libc::SYS_delete_module, c.as_ptr(), libc::O_NONBLOCK) };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}
