//! The kernel-module transport: the same [`RmServer`] behind real character devices.
//!
//! `tests/kmod` builds `nvidia.ko` and `nvidia-uvm.ko` (`cargo xtask kmod`, for Debian's 6.1
//! kernel). They register `/dev/nvidiactl`, `/dev/nvidia0..N-1` (major 195) and
//! `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools` (a dynamic major) with the real driver's
//! file-operation entry points (`nvidia_unlocked_ioctl`, `uvm_unlocked_ioctl_entry`, ...), and keep
//! no RM state: each open, release and ioctl becomes a [`Request`] read from the control device
//! `/dev/nvidia-double`, and the calling thread sleeps until [`KmodServer`] writes the [`Answer`].
//!
//! What differs from the FUSE transport ([`super::fs`]):
//!
//! * **ioctl data**: for `nvidiactl` / `nvidiaN` the module copies `_IOC_SIZE(cmd)` bytes in
//!   whatever the direction bits say (as the real driver does; over 4096 is `-EINVAL`, a bad
//!   pointer `-EFAULT` before the server sees anything) and the answered bytes back on success.
//!   UVM commands carry no data, as over FUSE.
//! * **release** is synchronous: the caller's `close()` (or exit, or `munmap` of the last mapping)
//!   returns after the server freed the file's clients, so the stats are exact at once.
//! * **stats** go to a file ([`KmodServer::new`]'s `stats_file`), rewritten atomically before each
//!   answer that changed them, so a caller whose syscall returned reads its effect.
//! * **no server**: calls fail with `ENODEV`; a server that dies with calls pending fails them with
//!   `EIO` at once.
//!
//! The protocol structs mirror `tests/kmod/nvidia-double.h`; change both together.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};

use super::caller::{Caller, ProcessCaller};
use super::rm::{DriverConfig, FileId, Node, RmServer};
use crate::le::{i32_at, put_i32, put_u32, put_u64, u32_at, u64_at};

/// `"NVD1"`, the first field of every request (`NVD_MAGIC`).
pub const MAGIC: u32 = 0x3144_564e;
/// The control device the server reads requests from.
pub const CONTROL_DEVICE: &str = "/dev/nvidia-double";
/// Most data bytes a request or answer carries (`NVD_MAX_DATA`).
pub const MAX_DATA: usize = 4096;
/// The module's `gpus` parameter.
pub const GPUS_PARAMETER: &str = "/sys/module/nvidia/parameters/gpus";

/// `enum nvd_kind`.
pub mod kind {
    /// An `open()` of a device node.
    pub const OPEN: u32 = 1;
    /// The last reference to an open file went away.
    pub const RELEASE: u32 = 2;
    /// An `ioctl()`.
    pub const IOCTL: u32 = 3;
}

/// `enum nvd_node`.
pub mod node {
    /// `/dev/nvidiactl`.
    pub const CTL: u32 = 0;
    /// `/dev/nvidia<minor>`.
    pub const GPU: u32 = 1;
    /// `/dev/nvidia-uvm`.
    pub const UVM: u32 = 2;
    /// `/dev/nvidia-uvm-tools`.
    pub const UVM_TOOLS: u32 = 3;
}

/// `struct nvd_request`: what one `read()` of the control device returns, followed by `size`
/// data bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// [`MAGIC`].
    pub magic: u32,
    /// A [`kind`] constant.
    pub kind: u32,
    /// Echoed in the answer.
    pub id: u64,
    /// One id per open file description, never reused.
    pub file: u64,
    /// A [`node`] constant.
    pub node: u32,
    /// The GPU's minor for [`node::GPU`].
    pub minor: u32,
    /// The caller's thread-group id in the server's pid namespace (0 if not visible there).
    pub tgid: u32,
    /// The calling thread's id.
    pub tid: u32,
    /// The ioctl command.
    pub cmd: u32,
    /// Data bytes following the header.
    pub size: u32,
}

const _: () = assert!(size_of::<Request>() == 48);

/// `struct nvd_answer`: what one `write()` to the control device takes, followed by `size` data
/// bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// The request's id.
    pub id: u64,
    /// 0 or `-errno`: what the caller's syscall returns.
    pub ret: i32,
    /// Data bytes following the header.
    pub size: u32,
}

const _: () = assert!(size_of::<Answer>() == 16);

/// A request the server cannot make sense of: the module and the server disagree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// Fewer bytes than a header.
    #[error("short request: {0} bytes")]
    Short(usize),
    /// Not [`MAGIC`]: a module built from other sources.
    #[error("bad magic {0:#x} (expected {MAGIC:#x}): nvidia.ko and fake-nvidia-driver come from different sources")]
    BadMagic(u32),
    /// The header's size does not match the bytes that came with it.
    #[error("request declares {declared} data bytes, {got} came")]
    Size {
        /// `size` in the header.
        declared: u32,
        /// Bytes after the header.
        got: usize,
    },
}

impl Request {
    /// The header and its data from one `read()`.
    pub fn decode(buf: &[u8]) -> Result<(Request, &[u8]), ProtocolError> {
        const H: usize = size_of::<Request>();
        if buf.len() < H {
            return Err(ProtocolError::Short(buf.len()));
        }
        let r = Request {
            magic: u32_at(buf, offset_of!(Request, magic)),
            kind: u32_at(buf, offset_of!(Request, kind)),
            id: u64_at(buf, offset_of!(Request, id)),
            file: u64_at(buf, offset_of!(Request, file)),
            node: u32_at(buf, offset_of!(Request, node)),
            minor: u32_at(buf, offset_of!(Request, minor)),
            tgid: u32_at(buf, offset_of!(Request, tgid)),
            tid: u32_at(buf, offset_of!(Request, tid)),
            cmd: u32_at(buf, offset_of!(Request, cmd)),
            size: u32_at(buf, offset_of!(Request, size)),
        };
        if r.magic != MAGIC {
            return Err(ProtocolError::BadMagic(r.magic));
        }
        let data = &buf[H..];
        if r.size as usize != data.len() {
            return Err(ProtocolError::Size { declared: r.size, got: data.len() });
        }
        Ok((r, data))
    }

    /// The bytes the module would hand over for this request and `data` (for tests).
    pub fn encode(&self, data: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; size_of::<Request>()];
        put_u32(&mut b, offset_of!(Request, magic), self.magic);
        put_u32(&mut b, offset_of!(Request, kind), self.kind);
        put_u64(&mut b, offset_of!(Request, id), self.id);
        put_u64(&mut b, offset_of!(Request, file), self.file);
        put_u32(&mut b, offset_of!(Request, node), self.node);
        put_u32(&mut b, offset_of!(Request, minor), self.minor);
        put_u32(&mut b, offset_of!(Request, tgid), self.tgid);
        put_u32(&mut b, offset_of!(Request, tid), self.tid);
        put_u32(&mut b, offset_of!(Request, cmd), self.cmd);
        put_u32(&mut b, offset_of!(Request, size), self.size);
        b.extend_from_slice(data);
        b
    }
}

impl Answer {
    /// The bytes of one `write()`: the header, then `data`.
    pub fn encode(id: u64, ret: i32, data: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; size_of::<Answer>()];
        put_u64(&mut b, offset_of!(Answer, id), id);
        put_i32(&mut b, offset_of!(Answer, ret), ret);
        put_u32(&mut b, offset_of!(Answer, size), data.len() as u32);
        b.extend_from_slice(data);
        b
    }

    /// The header and data of encoded answer bytes (for tests).
    pub fn decode(buf: &[u8]) -> Option<(Answer, &[u8])> {
        let h = size_of::<Answer>();
        let a = Answer {
            id: u64_at(buf.get(..h)?, offset_of!(Answer, id)),
            ret: i32_at(buf, offset_of!(Answer, ret)),
            size: u32_at(buf, offset_of!(Answer, size)),
        };
        (buf.len() == h + a.size as usize).then(|| (a, &buf[h..]))
    }
}

/// The node a request is about.
fn node_of(r: &Request) -> Option<Node> {
    match r.node {
        node::CTL => Some(Node::Ctl),
        node::GPU => Some(Node::Gpu(r.minor)),
        node::UVM => Some(Node::Uvm),
        node::UVM_TOOLS => Some(Node::UvmTools),
        _ => None,
    }
}

/// Serves the module's requests with one [`RmServer`].
#[derive(Debug)]
pub struct KmodServer {
    rm: RmServer,
    /// The module's file ids → the RM model's.
    files: HashMap<u64, FileId>,
    stats_file: Option<PathBuf>,
    /// What the stats file holds now.
    written: Vec<u8>,
    trace: bool,
}

impl KmodServer {
    /// A server for a driver configured as `cfg`, writing its stats (JSON [`super::DriverStats`])
    /// to `stats_file` if given.
    pub fn new(cfg: DriverConfig, stats_file: Option<PathBuf>, trace: bool) -> Self {
        Self { rm: RmServer::new(cfg), files: HashMap::new(), stats_file, written: Vec::new(), trace }
    }

    /// The RM model.
    pub fn rm(&self) -> &RmServer {
        &self.rm
    }

    /// Answer one request: the return value (0 or `-errno`) and the data to send back.
    pub fn handle(&mut self, r: &Request, data: &[u8], caller: &dyn Caller) -> (i32, Vec<u8>) {
        let Some(node) = node_of(r) else { return (-libc::EINVAL, Vec::new()) };
        match r.kind {
            kind::OPEN => {
                if matches!(node, Node::Gpu(m) if m >= self.rm.config().gpus) {
                    return (-libc::ENODEV, Vec::new());
                }
                let id = self.rm.open(node, r.tgid);
                if let Some(old) = self.files.insert(r.file, id) {
                    // The module never reuses a file id; if it did, the old file is gone.
                    self.rm.release(old);
                }
                (0, Vec::new())
            }
            kind::RELEASE => {
                if let Some(id) = self.files.remove(&r.file) {
                    self.rm.release(id);
                }
                (0, Vec::new())
            }
            kind::IOCTL => {
                // A file opened before this server started (another server's) is unknown here.
                let Some(&id) = self.files.get(&r.file) else { return (-libc::EBADF, Vec::new()) };
                let mut buf = data.to_vec();
                match self.rm.ioctl(id, r.cmd, &mut buf, caller) {
                    Ok(()) => (0, buf),
                    Err(errno) => (-errno, Vec::new()),
                }
            }
            _ => (-libc::EINVAL, Vec::new()),
        }
    }

    /// The caller stopped waiting before its answer arrived (killed, or timed out). An open it
    /// made never returned a file, so the model must not keep one.
    pub fn abandoned(&mut self, r: &Request) {
        if r.kind == kind::OPEN
            && let Some(id) = self.files.remove(&r.file)
        {
            self.rm.release(id);
        }
    }

    /// Write the stats file (temp file + rename) if they changed since the last write.
    pub fn write_stats(&mut self) -> io::Result<()> {
        let Some(path) = &self.stats_file else { return Ok(()) };
        let mut json = serde_json::to_vec_pretty(&self.rm.stats()).map_err(io::Error::other)?;
        json.push(b'\n');
        if json == self.written {
            return Ok(());
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, &json).and_then(|()| std::fs::rename(&tmp, path))?;
        self.written = json;
        Ok(())
    }

    /// Serve requests from `control` (the opened [`CONTROL_DEVICE`]) until reading fails.
    pub fn serve(&mut self, control: &mut File) -> io::Result<()> {
        let mut buf = vec![0u8; size_of::<Request>() + MAX_DATA];
        loop {
            let n = match control.read(&mut buf) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "control device closed")),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let (r, data) = Request::decode(&buf[..n]).map_err(io::Error::other)?;
            let caller = ProcessCaller::with_ids(r.tid, r.tgid);
            let (ret, out) = self.handle(&r, data, &caller);
            if self.trace {
                eprintln!(
                    "fake-nvidia-driver: kind={} node={:?} file={} tgid={} cmd={:#010x} size={} -> {ret}",
                    r.kind,
                    node_of(&r),
                    r.file,
                    r.tgid,
                    r.cmd,
                    r.size
                );
            }
            // Before the answer: once the caller's syscall returns, the stats show its effect.
            self.write_stats()?;
            match control.write(&Answer::encode(r.id, ret, &out)) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    self.abandoned(&r);
                    self.write_stats()?;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The loaded module's `gpus` parameter (`None`: `nvidia.ko` is not loaded, or is not the double).
pub fn module_gpus(parameter: &Path) -> Option<u32> {
    std::fs::read_to_string(parameter).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_driver::DriverStats;
    use crate::workload::encode::{self, RmAllocArgs};
    use tracer_common::nv::{self, DriverAbi, class, esc, off};

    fn me() -> ProcessCaller {
        ProcessCaller::new(std::process::id())
    }

    fn req(kind: u32, node: u32, minor: u32, file: u64) -> Request {
        Request {
            magic: MAGIC,
            kind,
            id: file * 10 + u64::from(kind),
            file,
            node,
            minor,
            tgid: std::process::id(),
            ..Default::default()
        }
    }

    fn ioctl(s: &mut KmodServer, file: u64, cmd: u32, data: &[u8]) -> (i32, Vec<u8>) {
        let r = Request { cmd, size: data.len() as u32, ..req(kind::IOCTL, node::CTL, 0, file) };
        s.handle(&r, data, &me())
    }

    #[test]
    fn requests_and_answers_round_trip_in_the_c_layout() {
        let r = Request { cmd: 0xc030_462b, size: 3, ..req(kind::IOCTL, node::GPU, 1, 7) };
        let bytes = r.encode(&[1, 2, 3]);
        assert_eq!(bytes.len(), 48 + 3);
        assert_eq!(&bytes[..4], b"NVD1", "the magic reads NVD1 in memory");
        assert_eq!(u64_at(&bytes, 8), r.id, "id at offset 8, after magic and kind");
        assert_eq!(u32_at(&bytes, 44), 3, "size is the last field");
        assert_eq!(Request::decode(&bytes), Ok((r, &[1u8, 2, 3][..])));

        assert_eq!(Request::decode(&bytes[..47]), Err(ProtocolError::Short(47)));
        assert_eq!(Request::decode(&bytes[..50]), Err(ProtocolError::Size { declared: 3, got: 2 }));
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert!(matches!(Request::decode(&bad), Err(ProtocolError::BadMagic(_))));

        let a = Answer::encode(9, -libc::EINVAL, &[4, 5]);
        assert_eq!(a.len(), 16 + 2);
        assert_eq!((u64_at(&a, 0), i32_at(&a, 8), u32_at(&a, 12)), (9, -22, 2));
        assert_eq!(Answer::decode(&a), Some((Answer { id: 9, ret: -22, size: 2 }, &[4u8, 5][..])));
        assert_eq!(Answer::decode(&a[..17]), None);
    }

    #[test]
    fn open_ioctl_release_drive_the_rm_model() {
        let cfg = DriverConfig { gpus: 2, ..Default::default() };
        let mut s = KmodServer::new(cfg, None, false);
        assert_eq!(s.handle(&req(kind::OPEN, node::CTL, 0, 1), &[], &me()), (0, Vec::new()));
        assert_eq!(s.handle(&req(kind::OPEN, node::GPU, 2, 2), &[], &me()).0, -libc::ENODEV, "no nvidia2");
        assert_eq!(s.handle(&req(kind::OPEN, node::UVM, 0, 3), &[], &me()).0, 0);

        let abi = DriverAbi::for_version(nv::DEFAULT_DRIVER_VERSION);
        let b = encode::nvos64(&RmAllocArgs { h_class: class::NV01_ROOT_CLIENT, ..Default::default() }, &abi);
        let (ret, out) = ioctl(&mut s, 1, nv::iowr(esc::RM_ALLOC, b.len() as u32), &b);
        assert_eq!(ret, 0);
        let client = u32_at(&out, off::ALLOC_H_NEW);
        assert_eq!(u32_at(&out, off::NVOS64_STATUS), nv::NV_OK);
        assert!(s.rm().stats().client(client).is_some());
        // A wrong size is the model's EINVAL; an unknown file (another server's) is EBADF.
        assert_eq!(ioctl(&mut s, 1, nv::iowr(esc::RM_ALLOC, 40), &[0; 40]).0, -libc::EINVAL);
        assert_eq!(ioctl(&mut s, 99, nv::iowr(esc::RM_ALLOC, b.len() as u32), &b).0, -libc::EBADF);
        let uvm = Request { cmd: nv::uvm::INITIALIZE, ..req(kind::IOCTL, node::UVM, 0, 3) };
        assert_eq!(s.handle(&uvm, &[], &me()), (0, Vec::new()));

        assert_eq!(s.handle(&req(kind::RELEASE, node::CTL, 0, 1), &[], &me()).0, 0);
        let st = s.rm().stats();
        assert!(st.clients.is_empty(), "the release freed the file's client");
        assert_eq!(st.open_files.len(), 1, "nvidia-uvm stays open");
        assert_eq!(s.handle(&req(99, node::CTL, 0, 5), &[], &me()).0, -libc::EINVAL);
        assert_eq!(s.handle(&req(kind::OPEN, 42, 0, 5), &[], &me()).0, -libc::EINVAL);
    }

    #[test]
    fn an_abandoned_open_leaves_no_file() {
        let mut s = KmodServer::new(DriverConfig::default(), None, false);
        let r = req(kind::OPEN, node::CTL, 0, 4);
        s.handle(&r, &[], &me());
        assert_eq!(s.rm().stats().open_files.len(), 1);
        s.abandoned(&r);
        assert!(s.rm().stats().open_files.is_empty());
    }

    #[test]
    fn stats_are_written_atomically_when_they_change() {
        let dir = std::env::temp_dir().join(format!("kmod-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stats.json");
        let mut s = KmodServer::new(DriverConfig::default(), Some(path.clone()), false);
        s.write_stats().unwrap();
        let read = || serde_json::from_slice::<DriverStats>(&std::fs::read(&path).unwrap()).unwrap();
        assert!(read().open_files.is_empty());
        s.handle(&req(kind::OPEN, node::CTL, 0, 1), &[], &me());
        std::fs::remove_file(&path).unwrap();
        s.write_stats().unwrap();
        assert_eq!(read().open_files.len(), 1);
        std::fs::remove_file(&path).unwrap();
        s.write_stats().unwrap();
        assert!(!path.exists(), "unchanged stats are not rewritten");
        assert!(!path.with_extension("tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
