//! Thin, checked wrappers around the syscalls the workload makes.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Open a device file read-write and close-on-exec, as libcuda does.
pub fn open_device(path: &Path) -> io::Result<OwnedFd> {
    let f = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(path)?;
    Ok(OwnedFd::from(f))
}

/// `ioctl(fd, cmd, arg)`; the return value, or the errno as an error.
///
/// # Safety
/// `arg` must be what `cmd` expects for the kernel to read and write (or a deliberately bad
/// pointer: the kernel validates user pointers, so an invalid one yields `EFAULT`, never UB here,
/// as long as it does not alias memory Rust code is concurrently using non-atomically).
pub unsafe fn ioctl(fd: RawFd, cmd: u32, arg: *mut libc::c_void) -> io::Result<i32> {
    // SAFETY: forwarded to the caller.
    let r = unsafe { libc::ioctl(fd, cmd as libc::c_ulong, arg) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// The page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// Round `n` up to a multiple of the page size.
pub fn page_round_up(n: u64) -> u64 {
    let p = page_size() as u64;
    n.div_ceil(p).saturating_mul(p)
}

/// An anonymous mapping, unmapped on drop unless [`AnonMapping::leak`]ed.
#[derive(Debug)]
pub struct AnonMapping {
    ptr: *mut u8,
    len: usize,
}

impl AnonMapping {
    /// Map `len` bytes of anonymous memory with `prot` (private, no swap reservation).
    pub fn new(len: usize, prot: i32) -> io::Result<Self> {
        // SAFETY: a fresh anonymous mapping at a kernel-chosen address touches no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED { Err(io::Error::last_os_error()) } else { Ok(Self { ptr: p.cast(), len }) }
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Start pointer.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never, for a successful mapping).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Change the protection of `[offset, offset + len)`.
    pub fn protect(&self, offset: usize, len: usize, prot: i32) -> io::Result<()> {
        assert!(offset + len <= self.len);
        // SAFETY: the range lies inside our own mapping, which no Rust reference points into.
        let r = unsafe { libc::mprotect(self.ptr.add(offset).cast(), len, prot) };
        if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
    }

    /// Keep the mapping for the life of the process (e.g. a VA reservation the "GPU" uses).
    pub fn leak(self) -> (u64, usize) {
        let r = (self.addr(), self.len);
        std::mem::forget(self);
        r
    }
}

impl Drop for AnonMapping {
    fn drop(&mut self) {
        // SAFETY: we own the mapping and nothing borrows it past this point.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// `mmap(addr, len, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_FIXED, fd, offset)`.
///
/// # Safety
/// `[addr, addr + len)` must be a range this process owns and that no Rust reference points into
/// (e.g. a PROT_NONE reservation), since MAP_FIXED replaces whatever is there.
pub unsafe fn mmap_shared_fixed(addr: u64, len: usize, fd: &OwnedFd, offset: u64) -> io::Result<u64> {
    // SAFETY: forwarded to the caller.
    let p = unsafe {
        libc::mmap(
            addr as usize as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED { Err(io::Error::last_os_error()) } else { Ok(p as u64) }
}

/// `munmap(addr, len)`.
///
/// # Safety
/// The range must not be referenced by any live Rust reference.
pub unsafe fn munmap(addr: u64, len: usize) -> io::Result<()> {
    // SAFETY: forwarded to the caller.
    let r = unsafe { libc::munmap(addr as usize as *mut libc::c_void, len) };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// `dup(fd)`.
pub fn dup(fd: &OwnedFd) -> io::Result<OwnedFd> {
    fd.try_clone()
}

/// `dup2(fd, target)` (`dup3(fd, target, O_CLOEXEC)` when `cloexec`). `target` must not be an fd
/// this process owns elsewhere: it would be silently closed.
pub fn dup_to(fd: &OwnedFd, target: RawFd, cloexec: bool) -> io::Result<OwnedFd> {
    // SAFETY: plain fd syscalls; the caller guarantees `target` is not owned elsewhere.
    let r = unsafe {
        if cloexec { libc::dup3(fd.as_raw_fd(), target, libc::O_CLOEXEC) } else { libc::dup2(fd.as_raw_fd(), target) }
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `r` is a freshly created fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// `fcntl(fd, F_DUPFD, min)` (or `F_DUPFD_CLOEXEC`).
pub fn fcntl_dupfd(fd: &OwnedFd, min: RawFd, cloexec: bool) -> io::Result<OwnedFd> {
    let cmd = if cloexec { libc::F_DUPFD_CLOEXEC } else { libc::F_DUPFD };
    // SAFETY: plain fd syscall.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, min) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `r` is a freshly created fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// Fork `n` children that exit at once (inheriting every open fd, the NVIDIA ones included), then
/// reap them all: a fork storm. Returns how many were forked.
pub fn fork_exit(n: u64) -> Result<u64, String> {
    let mut pids = Vec::with_capacity(n as usize);
    for _ in 0..n {
        // SAFETY: the child only calls _exit, which is async-signal-safe, so forking a
        // multi-threaded process is sound.
        match unsafe { libc::fork() } {
            // SAFETY: _exit ends the child without running the parent's destructors or atexit hooks.
            0 => unsafe { libc::_exit(0) },
            -1 => return Err(format!("fork: {}", io::Error::last_os_error())),
            pid => pids.push(pid),
        }
    }
    for pid in &pids {
        let mut status = 0;
        // SAFETY: waits for a child this process forked above.
        unsafe { libc::waitpid(*pid, &mut status, 0) };
    }
    Ok(pids.len() as u64)
}
