//! A fake NVIDIA kernel driver served over FUSE, or behind the kernel-module double.
//!
//! One RM model ([`RmServer`]), two transports: [`fs`] (FUSE, any kernel, regular files) and
//! [`kmod`] (`tests/kmod`'s `nvidia.ko` / `nvidia-uvm.ko`, real character devices with the real
//! driver's entry points, for Debian's 6.1 kernel in `cargo xtask kernel-matrix`). The rest of
//! this page is about the FUSE transport; [`kmod`] says what differs.
//!
//! `fake-nvidia-driver --mount DIR --gpus N` serves `nvidiactl`, `nvidia0..N-1`, `nvidia-uvm`,
//! `nvidia-uvm-tools` and `nvidia-modeset` as **regular files** in `DIR` (CUSE is not available on
//! these machines, and the tracer identifies NVIDIA fds by path, so regular files are enough),
//! plus a read-only `.fake-driver-stats` JSON file ([`stats::DriverStats`]).
//!
//! # What reaches the fake, and what does not
//!
//! * **Frontend ioctls** (`nvidiactl`, `nvidiaN`) are `_IOWR('F', nr, size)`. FUSE passes ioctls on
//!   regular files in *restricted* mode: the kernel itself copies `_IOC_SIZE(cmd)` bytes in (for
//!   `_IOC_WRITE`) and back out (for `_IOC_READ`), so the parameter struct arrives intact and the
//!   fake's edits (new handles, `status`) land in the caller's buffer. As in the real driver the
//!   ioctl returns 0 and the RM result is the struct's `status`; `-EINVAL` answers a wrong
//!   `_IOC_SIZE`, a call on the wrong node (ctl-only escape on `nvidiaN` or vice versa) and an
//!   unknown escape. A bad argument pointer (NULL, unmapped, running into a guard page) never
//!   reaches the fake: the kernel's copy-in fails and the caller gets `-EFAULT`, which is also what
//!   the real driver returns.
//! * **Nested parameters** (`pAllocParms`, e.g. `NV_MEMORY_ALLOCATION_PARAMS`) live in the caller's
//!   memory and FUSE does not transfer them. The fake reads them itself with `process_vm_readv`
//!   (it runs as root), as the real driver copies them in, so RM_ALLOC of memory classes is sized
//!   and charged against the GPU's capacity, and `NV01_DEVICE_0` picks its GPU from `deviceId`. It
//!   never writes nested parameters back (no size rounding, no returned addresses). A NULL
//!   `pAllocParms` for a class that needs parameters gets `NV_ERR_INVALID_ARGUMENT`, an unreadable
//!   one `NV_ERR_INVALID_ADDRESS`.
//! * **UVM ioctls** (`nvidia-uvm`) are plain integers (`0x30000001`, `37`, ...) whose `_IOC`
//!   direction bits are 0, so FUSE transfers **no data** in either direction: the fake answers 0
//!   for every command number the UVM driver routes (INITIALIZE, DEINITIALIZE, 23..=80) and
//!   `-EINVAL` otherwise, and the caller's `rmStatus` stays as the caller left it. The tracer reads
//!   UVM parameters from the caller's memory itself, so this is enough for a double. `nvidia-uvm-tools`
//!   and `nvidia-modeset` answer 0 to everything.
//! * **`mmap`** of a FUSE file goes through the page cache unless the file was opened `direct_io`;
//!   a `direct_io` file refuses `MAP_SHARED` with `ENODEV` (unless `FUSE_DIRECT_IO_ALLOW_MMAP` is
//!   negotiated). The device files are therefore opened without `direct_io`, and
//!   `mmap(addr, len, RW, MAP_SHARED|MAP_FIXED, uvm_fd, offset = addr)` works at any offset a
//!   regular file allows (up to `MAX_LFS_FILESIZE`). FUSE never tells the server about mmap, so the
//!   fake does not see managed mappings at all; the pages must not be touched (the file is empty,
//!   so a touch is `SIGBUS`). A mapping keeps its file open: release (and client cleanup) happens
//!   after the last fd is closed *and* the last mapping is gone.
//!
//! # Semantics emulated
//!
//! RM_ALLOC (NVOS21 32-byte and NVOS64 48-byte forms; 40 bytes for drivers before 535.43.02): a
//! root class (0x0/0x1/0x41) creates a client (`0xc1d0_0000 | n` when `hObjectNew` is 0); other
//! classes need a client created through the same open file (`NV_ERR_INVALID_CLIENT`) and an
//! existing parent (`NV_ERR_INVALID_OBJECT_PARENT`), and get `0xcaf0_0000 | n` when `hObjectNew` is
//! 0; a taken handle is `NV_ERR_INSERT_DUPLICATE_NAME`. VID_HEAP_CONTROL ALLOC_SIZE / FREE,
//! RM_FREE (an object and its subtree; `hObjectOld == hRoot` frees the client;
//! `NV_ERR_INVALID_OBJECT_HANDLE` for an unknown handle), RM_CONTROL (status only; no control
//! payload is filled in), RM_DUP_OBJECT (shares the allocation), RM_MAP/UNMAP_MEMORY, ALLOC_MEMORY
//! (NVOS02, `limit + 1` bytes, only on `nvidiaN`), CARD_INFO, REGISTER_FD (the fd must resolve to a
//! `nvidiactl` in the caller; once per file), CHECK_VERSION_STR (strict / relaxed / query against
//! the configured version, default `535.261.03`), OS events, STATUS_CODE, ATTACH_GPUS_TO_FD,
//! SYS_PARAMS, WAIT_OPEN_COMPLETE. Releasing a file (last close) frees every client created through
//! it, as `rm_cleanup_file_private` does. FUSE sends that release asynchronously, so observers
//! should poll the stats rather than expect it the instant `close()` returns.
//!
//! Capacity: physical video memory (RM_ALLOC class 0x40 / 0xf8, VID_HEAP ALLOC_SIZE with a video
//! memory location, ALLOC_MEMORY with LOCATION_VIDMEM) counts against the per-GPU capacity and
//! fails with `NV_ERR_NO_MEMORY` beyond it. System memory, `NVOS32_ALLOC_FLAGS_VIRTUAL` and VA-only
//! classes are tracked but not charged.

pub mod caller;
pub mod fs;
pub mod kmod;
pub mod rm;
pub mod stats;

#[cfg(test)]
mod tests;

use std::io;
use std::path::Path;

pub use fs::{FakeNvidiaFs, mount};
pub use rm::{DriverConfig, Node, RmServer};
pub use stats::{DriverStats, STATS_FILE_NAME};

/// Whether `path` is a FUSE mount whose server is gone (`ENOTCONN` on `stat`).
pub fn is_stale_mount(path: &Path) -> bool {
    matches!(std::fs::metadata(path), Err(e) if e.raw_os_error() == Some(libc::ENOTCONN))
}

/// Lazily unmount `path` (`umount2(MNT_DETACH)`): it disappears from the namespace now and is torn
/// down when its last user goes.
pub fn detach(path: &Path) -> io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// The `fsname` (mount source) of the fake driver's mounts.
pub const FSNAME: &str = "fake-nvidia";

/// One line of `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// Mount point.
    pub point: std::path::PathBuf,
    /// Filesystem type (`fuse`, `fuse.<subtype>`, `cgroup2`, ...).
    pub fstype: String,
    /// Mount source (for FUSE, the `fsname`).
    pub source: String,
}

/// The current mount table, from `/proc/self/mountinfo` (read as the agent reads it).
pub fn mount_table() -> Vec<MountEntry> {
    tracer_agent::proc::mounts(Path::new("/proc"))
        .into_iter()
        .map(|m| MountEntry { point: m.point, fstype: m.fs_type, source: m.source.unwrap_or_default() })
        .collect()
}

/// Mount points whose filesystem type is `fstype` (e.g. `cgroup2`).
pub fn mounts_of_type(fstype: &str) -> Vec<std::path::PathBuf> {
    mount_table().into_iter().filter(|m| m.fstype == fstype).map(|m| m.point).collect()
}

/// Mount points of fake-driver filesystems (FUSE mounts named [`FSNAME`]). A direct `mount(2)`
/// shows type `fuse`; one made through `fusermount3` shows `fuse.fake-nvidia-driver`.
pub fn fake_driver_mounts() -> Vec<std::path::PathBuf> {
    mount_table()
        .into_iter()
        .filter(|m| (m.fstype == "fuse" || m.fstype.starts_with("fuse.")) && m.source == FSNAME)
        .map(|m| m.point)
        .collect()
}
