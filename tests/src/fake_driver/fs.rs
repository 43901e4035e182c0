//! The FUSE filesystem: a flat directory of regular files that route `ioctl` to [`RmServer`].

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, IoctlFlags, LockOwner,
    MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen,
    Request, Session, SessionACL,
};

use super::caller::{ProcessCaller, tgid_of};
use super::rm::{DriverConfig, Node, RmServer};
use super::stats::STATS_FILE_NAME;

const ROOT: u64 = 1;
const INO_CTL: u64 = 2;
const INO_UVM: u64 = 3;
const INO_UVM_TOOLS: u64 = 4;
const INO_MODESET: u64 = 5;
const INO_STATS: u64 = 6;
/// `nvidia<minor>` is inode `INO_GPU_BASE + minor`.
const INO_GPU_BASE: u64 = 16;
/// Stats-file handles live in their own range so they never collide with device-file handles.
const STATS_FH_BIT: u64 = 1 << 63;

const TTL: Duration = Duration::from_secs(1);

/// The filesystem served by `fake-nvidia-driver`.
#[derive(Debug)]
pub struct FakeNvidiaFs {
    server: Mutex<RmServer>,
    gpus: u32,
    snapshots: Mutex<HashMap<u64, Vec<u8>>>,
    next_snapshot: AtomicU64,
    started: SystemTime,
    /// Print one line per ioctl to stderr.
    trace: bool,
}

impl FakeNvidiaFs {
    /// A filesystem for a driver configured as `cfg`.
    pub fn new(cfg: DriverConfig, trace: bool) -> Self {
        let server = RmServer::new(cfg);
        Self {
            gpus: server.config().gpus,
            server: Mutex::new(server),
            snapshots: Mutex::new(HashMap::new()),
            next_snapshot: AtomicU64::new(1),
            started: SystemTime::now(),
            trace,
        }
    }

    fn node(&self, ino: u64) -> Option<Node> {
        match ino {
            INO_CTL => Some(Node::Ctl),
            INO_UVM => Some(Node::Uvm),
            INO_UVM_TOOLS => Some(Node::UvmTools),
            INO_MODESET => Some(Node::Modeset),
            i if i >= INO_GPU_BASE && i < INO_GPU_BASE + u64::from(self.gpus) => {
                Some(Node::Gpu((i - INO_GPU_BASE) as u32))
            }
            _ => None,
        }
    }

    /// Every entry of the root directory, in `readdir` order.
    fn entries(&self) -> Vec<(u64, String)> {
        let mut v = vec![(INO_CTL, "nvidiactl".to_string())];
        v.extend((0..self.gpus).map(|g| (INO_GPU_BASE + u64::from(g), format!("nvidia{g}"))));
        v.push((INO_UVM, "nvidia-uvm".into()));
        v.push((INO_UVM_TOOLS, "nvidia-uvm-tools".into()));
        v.push((INO_MODESET, "nvidia-modeset".into()));
        v.push((INO_STATS, STATS_FILE_NAME.into()));
        v
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, perm, nlink) = match ino {
            ROOT => (FileType::Directory, 0o755, 2),
            INO_STATS => (FileType::RegularFile, 0o444, 1),
            i if self.node(i).is_some() => (FileType::RegularFile, 0o666, 1),
            _ => return None,
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            // Device files are empty: reads see EOF. The stats file is opened direct_io, so its
            // reads are not limited by this size either.
            size: 0,
            blocks: 0,
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RmServer> {
        // A panic while holding the lock would be a bug in the double; keep serving regardless.
        self.server.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current stats as pretty JSON.
    pub fn stats_json(&self) -> Vec<u8> {
        let stats = self.lock().stats();
        let mut v = serde_json::to_vec_pretty(&stats).expect("stats serialize");
        v.push(b'\n');
        v
    }
}

impl Filesystem for FakeNvidiaFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 != ROOT {
            return reply.error(Errno::ENOENT);
        }
        let Some(name) = name.to_str() else { return reply.error(Errno::ENOENT) };
        match self.entries().into_iter().find(|(_, n)| n == name).and_then(|(ino, _)| self.attr(ino)) {
            Some(attr) => reply.entry(&TTL, &attr, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino.0) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino.0 == INO_STATS {
            let id = STATS_FH_BIT | self.next_snapshot.fetch_add(1, Ordering::Relaxed);
            let json = self.stats_json();
            self.snapshots.lock().unwrap_or_else(|e| e.into_inner()).insert(id, json);
            return reply.opened(FileHandle(id), FopenFlags::FOPEN_DIRECT_IO);
        }
        let Some(node) = self.node(ino.0) else { return reply.error(Errno::EISDIR) };
        let pid = tgid_of(req.pid()).unwrap_or(req.pid());
        let fh = self.lock().open(node, pid);
        // Not direct_io: the page-cache path is what makes MAP_SHARED mmap of these files work
        // (a direct_io file refuses shared mappings with ENODEV unless the kernel and the server
        // negotiate FUSE_DIRECT_IO_ALLOW_MMAP).
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino.0 != INO_STATS {
            return reply.data(&[]);
        }
        let snapshots = self.snapshots.lock().unwrap_or_else(|e| e.into_inner());
        let data = snapshots.get(&fh.0).map(Vec::as_slice).unwrap_or(&[]);
        let start = (offset as usize).min(data.len());
        let end = start.saturating_add(size as usize).min(data.len());
        reply.data(&data[start..end]);
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if ino.0 == INO_STATS {
            self.snapshots.lock().unwrap_or_else(|e| e.into_inner()).remove(&fh.0);
        } else {
            self.lock().release(fh.0);
        }
        reply.ok();
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino.0 != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let mut all = vec![(ROOT, FileType::Directory, ".".to_string()), (ROOT, FileType::Directory, "..".to_string())];
        all.extend(self.entries().into_iter().map(|(i, n)| (i, FileType::RegularFile, n)));
        for (i, (ino, kind, name)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        if self.node(ino.0).is_none() {
            return reply.error(Errno::ENOTTY);
        }
        // Restricted FUSE ioctls copy in `_IOC_SIZE` bytes for _IOC_WRITE and copy out
        // `_IOC_SIZE` bytes for _IOC_READ. A frontend command lacking one of the direction bits
        // still gets a struct of its declared size (zero-filled), like the real driver's copy.
        let mut buf = in_data.to_vec();
        let want = (tracer_common::nv::ioc_size(cmd) as usize).max(out_size as usize);
        if buf.len() < want && (cmd >> 30) != 0 {
            buf.resize(want, 0);
        }
        let caller = ProcessCaller::new(req.pid());
        let result = self.lock().ioctl(fh.0, cmd, &mut buf, &caller);
        if self.trace {
            eprintln!(
                "fake-nvidia-driver: ioctl ino={} fh={} pid={} cmd={cmd:#010x} -> {result:?}",
                ino.0,
                fh.0,
                req.pid()
            );
        }
        match result {
            Ok(()) => reply.ioctl(0, &buf[..(out_size as usize).min(buf.len())]),
            Err(errno) => reply.error(Errno::from_i32(errno)),
        }
    }
}

/// Mount `fs` at `mountpoint` (direct `mount(2)` as root; fuser falls back to `fusermount3`
/// otherwise) and return the session once the kernel's INIT handshake is done, i.e. once the
/// mount is usable.
pub fn mount(fs: FakeNvidiaFs, mountpoint: &Path) -> std::io::Result<Session<FakeNvidiaFs>> {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(super::FSNAME.into()),
        MountOption::Subtype("fake-nvidia-driver".into()),
        MountOption::NoExec,
        MountOption::NoSuid,
    ];
    // allow_other: processes of any uid (e.g. a workload that drops privileges) may use the files.
    config.acl = SessionACL::All;
    // One thread: requests are tiny and the state is behind one lock anyway.
    config.n_threads = Some(1);
    Session::new(fs, mountpoint, &config)
}
