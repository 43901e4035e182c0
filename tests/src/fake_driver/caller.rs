//! Access to the calling process, the way the real driver has it through `copy_from_user` and
//! `fget`: nested parameter structs are read with `process_vm_readv`, fds are resolved through
//! `/proc/PID/fd`.

use std::path::PathBuf;

/// Why a read of the caller's memory failed (the driver would see a failed `copy_from_user`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CallerFault {
    /// The pointer was NULL.
    #[error("NULL pointer")]
    Null,
    /// The range is not (entirely) mapped readable in the caller, or the caller is gone.
    #[error("unreadable caller memory (errno {0})")]
    Unreadable(i32),
}

/// The process making a request.
pub trait Caller {
    /// Thread-group id of the caller (FUSE reports the calling thread's id; this maps it).
    fn tgid(&self) -> u32;
    /// Copy `buf.len()` bytes from the caller's address `addr`.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), CallerFault>;
    /// What the caller's fd `fd` refers to (`readlink /proc/PID/fd/FD`).
    fn fd_path(&self, fd: i32) -> Option<PathBuf>;
}

/// A real process, addressed by the thread id FUSE puts in each request header.
#[derive(Debug, Clone, Copy)]
pub struct ProcessCaller {
    tid: u32,
    tgid: u32,
}

impl ProcessCaller {
    /// The caller whose thread id is `tid` (in the fake driver's pid namespace).
    pub fn new(tid: u32) -> Self {
        Self { tid, tgid: tgid_of(tid).unwrap_or(tid) }
    }

    /// The caller whose thread and thread-group ids are known already (the kernel-module
    /// double's requests carry both).
    pub fn with_ids(tid: u32, tgid: u32) -> Self {
        Self { tid, tgid }
    }
}

/// The thread-group id of thread `tid`, from `/proc/TID/status`.
pub fn tgid_of(tid: u32) -> Option<u32> {
    u32::try_from(tracer_agent::proc::status(std::path::Path::new("/proc"), tid).ok()?.tgid).ok()
}

impl Caller for ProcessCaller {
    fn tgid(&self) -> u32 {
        self.tgid
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), CallerFault> {
        if addr == 0 {
            return Err(CallerFault::Null);
        }
        if buf.is_empty() {
            return Ok(());
        }
        let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let remote = libc::iovec { iov_base: addr as usize as *mut libc::c_void, iov_len: buf.len() };
        // SAFETY: `local` describes `buf`, which we own mutably for the call; the remote side is
        // only read by the kernel, which checks it against the target's address space.
        let n = unsafe { libc::process_vm_readv(self.tid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(CallerFault::Unreadable(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)));
        }
        if n as usize != buf.len() {
            // A partial read: the range runs into an unmapped or protected page.
            return Err(CallerFault::Unreadable(libc::EFAULT));
        }
        Ok(())
    }

    fn fd_path(&self, fd: i32) -> Option<PathBuf> {
        if fd < 0 {
            return None;
        }
        std::fs::read_link(format!("/proc/{}/fd/{fd}", self.tid)).ok()
    }
}
