//! The fake resource manager: the state machine behind the FUSE files, free of any FUSE types so
//! it can be driven directly by unit tests.
//!
//! [`RmServer::ioctl`] gets the command and the bytes FUSE copied in (exactly `_IOC_SIZE(cmd)` for
//! `_IOWR` commands), edits them in place, and returns either `Ok` (the ioctl returns 0 and the
//! bytes are copied back) or an errno.

use std::collections::BTreeMap;

use tracer_common::nv::{
    self, DriverAbi, DriverVersion, NV_ERR_INSERT_DUPLICATE_NAME, NV_ERR_INVALID_ADDRESS, NV_ERR_INVALID_ARGUMENT,
    NV_ERR_INVALID_CLIENT, NV_ERR_INVALID_FUNCTION, NV_ERR_INVALID_LIMIT, NV_ERR_INVALID_OBJECT_HANDLE,
    NV_ERR_INVALID_OBJECT_NEW, NV_ERR_INVALID_OBJECT_PARENT, NV_ERR_NO_MEMORY, NV_OK, class, esc, off, size, uvm,
};

use super::caller::{Caller, CallerFault};
use super::stats::{ClientStats, DriverStats, GpuStats, IoctlStats, MemoryStats, ObjectStats, OpenFileStats, Totals};
use crate::le::{cstr_at, i32_at, put_cstr, put_u32, put_u64, u32_at, u64_at};

/// Default per-GPU capacity: 80 GiB, an H100's worth.
pub const DEFAULT_GPU_MEMORY_BYTES: u64 = 80 << 30;
/// The highest number of GPUs the driver's minor-number space allows (minors 0..=247).
pub const MAX_GPUS: u32 = 248;
/// `NV_MAX_DEVICES`: the CARD_INFO array a client passes usually has this many entries.
pub const NV_MAX_DEVICES: u32 = 32;

const CLIENT_HANDLE_BASE: u32 = 0xc1d0_0000;
const OBJECT_HANDLE_BASE: u32 = 0xcaf0_0000;
const HANDLE_SEQ_MASK: u32 = 0x000f_ffff;

/// How the fake driver is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverConfig {
    /// Number of GPUs (`/dev/nvidia0..N-1`).
    pub gpus: u32,
    /// Video memory per GPU.
    pub gpu_memory_bytes: u64,
    /// The driver version reported by `CHECK_VERSION_STR`; it also picks the struct sizes checked.
    pub version: DriverVersion,
}

impl Default for DriverConfig {
    fn default() -> Self {
        Self { gpus: 1, gpu_memory_bytes: DEFAULT_GPU_MEMORY_BYTES, version: nv::DEFAULT_DRIVER_VERSION }
    }
}

/// Format a driver version the way the driver prints it (`535.261.03`).
pub fn version_string(v: DriverVersion) -> String {
    format!("{}.{}.{:02}", v.major, v.minor, v.patch)
}

/// Parse `major.minor.patch` (e.g. `535.261.03`).
pub fn parse_version(s: &str) -> Option<DriverVersion> {
    let mut it = s.trim().split('.').map(|p| p.parse::<u32>().ok());
    let v = DriverVersion::new(it.next()??, it.next()??, it.next()??);
    it.next().is_none().then_some(v)
}

/// Which device file an open file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Node {
    /// `/dev/nvidiactl`.
    Ctl,
    /// `/dev/nvidia<minor>`.
    Gpu(u32),
    /// `/dev/nvidia-uvm`.
    Uvm,
    /// `/dev/nvidia-uvm-tools`.
    UvmTools,
    /// `/dev/nvidia-modeset`.
    Modeset,
}

impl Node {
    /// The file name in the device directory.
    pub fn file_name(self) -> String {
        match self {
            Node::Ctl => "nvidiactl".into(),
            Node::Gpu(m) => format!("nvidia{m}"),
            Node::Uvm => "nvidia-uvm".into(),
            Node::UvmTools => "nvidia-uvm-tools".into(),
            Node::Modeset => "nvidia-modeset".into(),
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Node::Ctl | Node::Gpu(_) => "frontend",
            Node::Uvm => "uvm",
            Node::UvmTools => "uvm-tools",
            Node::Modeset => "modeset",
        }
    }
}

/// Identifies one open file description on the mount (the FUSE file handle).
pub type FileId = u64;

/// What the ioctl returns when it is not 0: a positive errno.
pub type Errno = i32;

/// The result of an RM operation: a handle or other success, or the `NV_STATUS` to report.
type RmResult<T> = Result<T, u32>;

#[derive(Debug)]
struct OpenFile {
    node: Node,
    pid: u32,
    registered: bool,
}

#[derive(Debug)]
struct Client {
    class: u32,
    file: FileId,
    pid: u32,
    objects: BTreeMap<u32, RmObject>,
}

#[derive(Debug, Clone)]
struct RmObject {
    parent: u32,
    class: u32,
    gpu: Option<u32>,
    allocation: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Location {
    Vidmem,
    Sysmem,
}

#[derive(Debug, Clone, Copy)]
enum Source {
    RmAlloc,
    VidHeap,
    AllocMemory,
}

#[derive(Debug)]
struct Allocation {
    gpu: Option<u32>,
    bytes: u64,
    location: Location,
    source: Source,
    /// Counted against the GPU's capacity (physical video memory).
    accounted: bool,
    refs: u32,
}

/// A memory request, before capacity is checked.
struct MemoryRequest {
    gpu: Option<u32>,
    bytes: u64,
    location: Location,
    source: Source,
    physical: bool,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counter {
    calls: u64,
    errno: u64,
    rm_errors: u64,
}

/// The fake resource manager for one mount.
#[derive(Debug)]
pub struct RmServer {
    cfg: DriverConfig,
    abi: DriverAbi,
    version_string: String,
    files: BTreeMap<FileId, OpenFile>,
    next_file: FileId,
    clients: BTreeMap<u32, Client>,
    next_client_seq: u32,
    next_object_seq: u32,
    allocations: BTreeMap<u64, Allocation>,
    next_allocation: u64,
    gpu_used: Vec<u64>,
    ioctls: BTreeMap<(&'static str, u32), Counter>,
    totals: Totals,
}

impl RmServer {
    /// A driver with no open files and no clients.
    pub fn new(mut cfg: DriverConfig) -> Self {
        cfg.gpus = cfg.gpus.min(MAX_GPUS);
        Self {
            abi: DriverAbi::for_version(cfg.version),
            version_string: version_string(cfg.version),
            gpu_used: vec![0; cfg.gpus as usize],
            cfg,
            files: BTreeMap::new(),
            next_file: 1,
            clients: BTreeMap::new(),
            next_client_seq: 0,
            next_object_seq: 0,
            allocations: BTreeMap::new(),
            next_allocation: 1,
            ioctls: BTreeMap::new(),
            totals: Totals::default(),
        }
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &DriverConfig {
        &self.cfg
    }

    /// Record an `open()` of `node` by process `pid`; returns the file handle.
    pub fn open(&mut self, node: Node, pid: u32) -> FileId {
        let id = self.next_file;
        self.next_file += 1;
        self.files.insert(id, OpenFile { node, pid, registered: false });
        self.totals.opens += 1;
        id
    }

    /// The last reference to `file` went away: free every client created through it, as the
    /// real driver does in `rm_cleanup_file_private`.
    pub fn release(&mut self, file: FileId) {
        if self.files.remove(&file).is_none() {
            return;
        }
        self.totals.releases += 1;
        let owned: Vec<u32> = self.clients.iter().filter(|(_, c)| c.file == file).map(|(h, _)| *h).collect();
        for h in owned {
            self.free_client(h);
        }
    }

    /// Handle one ioctl on `file`. `data` holds the parameter struct (at least `_IOC_SIZE(cmd)`
    /// bytes); on `Ok` it is copied back to the caller.
    pub fn ioctl(&mut self, file: FileId, cmd: u32, data: &mut [u8], caller: &dyn Caller) -> Result<(), Errno> {
        let Some(node) = self.files.get(&file).map(|f| f.node) else {
            return Err(libc::EBADF);
        };
        let (nr, outcome) = match node {
            Node::Ctl | Node::Gpu(_) => (nv::ioc_nr(cmd), self.frontend(file, node, cmd, data, caller)),
            Node::Uvm => (cmd, uvm_ioctl(cmd)),
            Node::UvmTools | Node::Modeset => (cmd, Ok(None)),
        };
        let counter = self.ioctls.entry((node.kind(), nr)).or_default();
        counter.calls += 1;
        match outcome {
            Ok(Some(status)) if status != NV_OK => counter.rm_errors += 1,
            Ok(_) => {}
            Err(_) => counter.errno += 1,
        }
        outcome.map(|_| ())
    }

    /// A frontend escape. Returns the `NV_STATUS` written into the struct, if it has one.
    fn frontend(
        &mut self,
        file: FileId,
        node: Node,
        cmd: u32,
        data: &mut [u8],
        caller: &dyn Caller,
    ) -> Result<Option<u32>, Errno> {
        let nr = nv::ioc_nr(cmd);
        let sz = nv::ioc_size(cmd);
        if data.len() < sz as usize {
            return Err(libc::EINVAL);
        }
        let data = &mut data[..sz as usize];
        let on_ctl = node == Node::Ctl;
        let require = |ok: bool| if ok { Ok(()) } else { Err(libc::EINVAL) };
        let abi = self.abi;
        match nr {
            esc::RM_ALLOC => {
                let status_off = if sz == size::NVOS21 {
                    off::NVOS21_STATUS
                } else if sz == abi.nvos64_size {
                    abi.nvos64_status
                } else {
                    return Err(libc::EINVAL);
                };
                let h_class = u32_at(data, off::ALLOC_H_CLASS);
                // Only event objects may be allocated through a GPU node.
                require(on_ctl || class::is_event(h_class))?;
                let status = match self.rm_alloc(file, data, caller) {
                    Ok(h) => {
                        put_u32(data, off::ALLOC_H_NEW, h);
                        NV_OK
                    }
                    Err(st) => st,
                };
                put_u32(data, status_off, status);
                Ok(Some(status))
            }
            esc::RM_ALLOC_OBJECT => {
                require(sz == size::NVOS05 && on_ctl)?;
                let status = self
                    .create_object(
                        file,
                        u32_at(data, off::ALLOC_H_ROOT),
                        u32_at(data, off::ALLOC_H_PARENT),
                        u32_at(data, off::ALLOC_H_NEW),
                        u32_at(data, off::ALLOC_H_CLASS),
                        0,
                        caller,
                    )
                    .map(|h| put_u32(data, off::ALLOC_H_NEW, h))
                    .err()
                    .unwrap_or(NV_OK);
                Ok(Some(set_status(data, off::NVOS05_STATUS, status)))
            }
            esc::RM_FREE => {
                require(sz == size::NVOS00 && on_ctl)?;
                let status = self
                    .rm_free(file, u32_at(data, off::FREE_H_ROOT), u32_at(data, off::FREE_H_OBJECT))
                    .err()
                    .unwrap_or(NV_OK);
                Ok(Some(set_status(data, off::FREE_STATUS, status)))
            }
            esc::RM_CONTROL => {
                require(sz == size::NVOS54 && on_ctl)?;
                let status = self
                    .check_object(file, u32_at(data, off::CTRL_H_CLIENT), u32_at(data, off::CTRL_H_OBJECT))
                    .err()
                    .unwrap_or(NV_OK);
                Ok(Some(set_status(data, off::CTRL_STATUS, status)))
            }
            esc::RM_VID_HEAP_CONTROL => {
                require(sz == size::NVOS32 && on_ctl)?;
                let status = self.vid_heap(file, data).err().unwrap_or(NV_OK);
                Ok(Some(set_status(data, off::VHC_STATUS, status)))
            }
            esc::RM_DUP_OBJECT => {
                require(sz == size::NVOS55 && on_ctl)?;
                let status = match self.dup_object(file, data) {
                    Ok(h) => {
                        put_u32(data, off::DUP_H_OBJECT, h);
                        NV_OK
                    }
                    Err(st) => st,
                };
                Ok(Some(set_status(data, off::DUP_STATUS, status)))
            }
            esc::RM_MAP_MEMORY => {
                require(sz == size::NVOS33_WITH_FD && on_ctl)?;
                let h_memory = u32_at(data, off::MAP_H_MEMORY);
                let status = match self.check_object(file, u32_at(data, off::MAP_H_CLIENT), h_memory) {
                    Ok(()) => {
                        // A cookie the caller would pass to mmap() on the fd it named; never mapped here.
                        put_u64(data, off::MAP_P_LINEAR, u64::from(h_memory) << 12);
                        NV_OK
                    }
                    Err(st) => st,
                };
                Ok(Some(set_status(data, off::MAP_STATUS, status)))
            }
            esc::RM_UNMAP_MEMORY => {
                require(sz == size::NVOS34 && on_ctl)?;
                let status = self
                    .check_object(file, u32_at(data, off::UNMAP_H_CLIENT), u32_at(data, off::UNMAP_H_MEMORY))
                    .err()
                    .unwrap_or(NV_OK);
                Ok(Some(set_status(data, off::UNMAP_STATUS, status)))
            }
            esc::RM_ALLOC_MEMORY => {
                let Node::Gpu(minor) = node else { return Err(libc::EINVAL) };
                require(sz == size::NVOS02_WITH_FD)?;
                let status = match self.alloc_memory(minor, data) {
                    Ok(h) => {
                        put_u32(data, off::NVOS02_H_NEW, h);
                        NV_OK
                    }
                    Err(st) => st,
                };
                Ok(Some(set_status(data, off::NVOS02_STATUS, status)))
            }
            esc::RM_SHARE => {
                require(sz == size::NVOS57 && on_ctl)?;
                let status = self.check_client(file, u32_at(data, 0)).err().unwrap_or(NV_OK);
                Ok(Some(set_status(data, off::NVOS57_STATUS, status)))
            }
            esc::RM_ALLOC_CONTEXT_DMA2 => {
                require(sz == size::NVOS39 && on_ctl)?;
                Ok(Some(set_status(data, off::NVOS39_STATUS, NV_OK)))
            }
            esc::RM_MAP_MEMORY_DMA => {
                let v580 = abi.version.at_least(DriverVersion::new(580, 65, 6));
                let (want, st) = if v580 {
                    (size::NVOS46, off::NVOS46_STATUS)
                } else {
                    (size::NVOS46_PRE580, off::NVOS46_PRE580_STATUS)
                };
                require(sz == want && on_ctl)?;
                Ok(Some(set_status(data, st, NV_OK)))
            }
            esc::RM_UNMAP_MEMORY_DMA => {
                let v550 = abi.version.at_least(DriverVersion::new(550, 54, 4));
                let (want, st) = if v550 {
                    (size::NVOS47, off::NVOS47_STATUS)
                } else {
                    (size::NVOS47_PRE550, off::NVOS47_PRE550_STATUS)
                };
                require(sz == want && on_ctl)?;
                Ok(Some(set_status(data, st, NV_OK)))
            }
            esc::RM_UPDATE_DEVICE_MAPPING_INFO => {
                require(sz == size::NVOS56 && on_ctl)?;
                Ok(Some(set_status(data, off::NVOS56_STATUS, NV_OK)))
            }
            esc::CARD_INFO => {
                require(on_ctl && sz > 0 && sz.is_multiple_of(size::CARD_INFO_ENTRY))?;
                self.card_info(data);
                Ok(None)
            }
            esc::REGISTER_FD => {
                require(sz == size::REGISTER_FD)?;
                self.register_fd(file, i32_at(data, off::REGISTER_FD_CTL_FD), caller)?;
                Ok(None)
            }
            esc::ALLOC_OS_EVENT | esc::FREE_OS_EVENT => {
                require(sz == size::OS_EVENT)?;
                let status = if self.clients.contains_key(&u32_at(data, off::OS_EVENT_H_CLIENT)) {
                    NV_OK
                } else {
                    NV_ERR_INVALID_CLIENT
                };
                Ok(Some(set_status(data, off::OS_EVENT_STATUS, status)))
            }
            esc::STATUS_CODE => {
                require(sz == size::STATUS_CODE && on_ctl)?;
                Ok(Some(set_status(data, off::STATUS_CODE_STATUS, NV_OK)))
            }
            esc::CHECK_VERSION_STR => {
                require(sz == size::RM_API_VERSION && on_ctl)?;
                self.check_version(data)?;
                Ok(None)
            }
            esc::ATTACH_GPUS_TO_FD => {
                require(on_ctl && sz > 0 && sz.is_multiple_of(size::ATTACH_GPUS_ENTRY))?;
                Ok(None)
            }
            esc::SYS_PARAMS => {
                require(sz == size::SYS_PARAMS && on_ctl)?;
                Ok(None)
            }
            esc::WAIT_OPEN_COMPLETE => {
                require(sz == size::WAIT_OPEN_COMPLETE)?;
                put_u32(data, off::WAIT_OPEN_COMPLETE_RC, 0);
                put_u32(data, off::WAIT_OPEN_COMPLETE_ADAPTER_STATUS, NV_OK);
                Ok(None)
            }
            // Unknown escapes, and the few real ones this double does not emulate (XFER_CMD,
            // IDLE_CHANNELS, I2C, registry, NUMA, dma-buf export): -EINVAL, as the real driver
            // answers an escape it does not know.
            _ => Err(libc::EINVAL),
        }
    }

    // ----- RM objects ---------------------------------------------------------------------------

    fn rm_alloc(&mut self, file: FileId, data: &[u8], caller: &dyn Caller) -> RmResult<u32> {
        let h_root = u32_at(data, off::ALLOC_H_ROOT);
        let h_parent = u32_at(data, off::ALLOC_H_PARENT);
        let h_new = u32_at(data, off::ALLOC_H_NEW);
        let h_class = u32_at(data, off::ALLOC_H_CLASS);
        let p_params = u64_at(data, off::ALLOC_P_PARAMS);
        if class::is_root(h_class) {
            return self.alloc_client(file, h_new, h_class, caller.tgid());
        }
        self.create_object(file, h_root, h_parent, h_new, h_class, p_params, caller)
    }

    fn alloc_client(&mut self, file: FileId, h_new: u32, h_class: u32, pid: u32) -> RmResult<u32> {
        let h = if h_new == 0 {
            let mut seq = self.next_client_seq;
            let h = loop {
                seq = (seq + 1) & HANDLE_SEQ_MASK;
                let h = CLIENT_HANDLE_BASE | seq;
                if seq != 0 && !self.clients.contains_key(&h) {
                    break h;
                }
            };
            self.next_client_seq = seq;
            h
        } else if self.clients.contains_key(&h_new) {
            return Err(NV_ERR_INSERT_DUPLICATE_NAME);
        } else {
            h_new
        };
        self.clients.insert(h, Client { class: h_class, file, pid, objects: BTreeMap::new() });
        self.totals.clients_created += 1;
        Ok(h)
    }

    /// The client `h` if it exists and was created through `file` (clients are private to the
    /// file that created them unless duplicated).
    fn check_client(&self, file: FileId, h: u32) -> RmResult<&Client> {
        match self.clients.get(&h) {
            Some(c) if c.file == file => Ok(c),
            _ => Err(NV_ERR_INVALID_CLIENT),
        }
    }

    /// `h` names the client itself or one of its objects.
    fn check_object(&self, file: FileId, h_client: u32, h: u32) -> RmResult<()> {
        let c = self.check_client(file, h_client)?;
        if h == h_client || c.objects.contains_key(&h) { Ok(()) } else { Err(NV_ERR_INVALID_OBJECT_HANDLE) }
    }

    fn new_object_handle(&mut self, client: u32) -> u32 {
        let objects = &self.clients[&client].objects;
        let mut seq = self.next_object_seq;
        let h = loop {
            seq = (seq + 1) & HANDLE_SEQ_MASK;
            let h = OBJECT_HANDLE_BASE | seq;
            if seq != 0 && !objects.contains_key(&h) && h != client {
                break h;
            }
        };
        self.next_object_seq = seq;
        h
    }

    /// Resolve the handle for a new object: RM picks one when the caller passed 0.
    fn pick_handle(&mut self, client: u32, h_new: u32) -> RmResult<u32> {
        if h_new == 0 {
            return Ok(self.new_object_handle(client));
        }
        let c = &self.clients[&client];
        if h_new == client || c.objects.contains_key(&h_new) || self.clients.contains_key(&h_new) {
            return Err(NV_ERR_INSERT_DUPLICATE_NAME);
        }
        Ok(h_new)
    }

    #[allow(clippy::too_many_arguments)]
    fn create_object(
        &mut self,
        file: FileId,
        h_root: u32,
        h_parent: u32,
        h_new: u32,
        h_class: u32,
        p_params: u64,
        caller: &dyn Caller,
    ) -> RmResult<u32> {
        let client = self.check_client(file, h_root)?;
        let (parent_class, parent_gpu) = if h_parent == h_root {
            (client.class, None)
        } else {
            let p = client.objects.get(&h_parent).ok_or(NV_ERR_INVALID_OBJECT_PARENT)?;
            (p.class, p.gpu)
        };
        let parent_is_client = h_parent == h_root;
        let mut gpu = parent_gpu;
        let mut memory = None;
        match h_class {
            class::NV01_DEVICE_0 => {
                if !parent_is_client {
                    return Err(NV_ERR_INVALID_OBJECT_PARENT);
                }
                // NV0080_ALLOC_PARAMETERS is optional; deviceId defaults to 0.
                let mut p = [0u8; size::NV0080_ALLOC_PARAMETERS as usize];
                if p_params != 0 {
                    read_params(caller, p_params, &mut p)?;
                }
                let device_id = u32_at(&p, off::DEVICE_ID);
                if device_id >= self.cfg.gpus {
                    return Err(NV_ERR_INVALID_ARGUMENT);
                }
                gpu = Some(device_id);
            }
            class::NV20_SUBDEVICE_0 if parent_class != class::NV01_DEVICE_0 => {
                return Err(NV_ERR_INVALID_OBJECT_PARENT);
            }
            class::NV01_MEMORY_LOCAL_USER | class::NV01_MEMORY_SYSTEM | class::NV50_MEMORY_VIRTUAL => {
                if parent_gpu.is_none() {
                    return Err(NV_ERR_INVALID_OBJECT_PARENT);
                }
                memory = Some(self.memory_params(h_class, parent_gpu, p_params, caller)?);
            }
            class::NV01_MEMORY_DEVICELESS | class::NV_MEMORY_FABRIC | class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => {
                memory = Some(self.memory_params(h_class, parent_gpu, p_params, caller)?);
            }
            _ => {}
        }
        let h = self.pick_handle(h_root, h_new)?;
        let allocation = match memory {
            Some(m) => Some(self.allocate(m)?),
            None => None,
        };
        self.insert_object(h_root, h, RmObject { parent: h_parent, class: h_class, gpu, allocation });
        Ok(h)
    }

    /// Read the allocation parameters of a memory class from the caller, the way RM copies them
    /// in (size derived from the class, not from `paramsSize`).
    fn memory_params(&self, h_class: u32, gpu: Option<u32>, p: u64, caller: &dyn Caller) -> RmResult<MemoryRequest> {
        let req = |bytes, location, physical| MemoryRequest { gpu, bytes, location, source: Source::RmAlloc, physical };
        match h_class {
            class::NV_MEMORY_FABRIC => {
                let mut b = [0u8; size::NV00F8_ALLOCATION_PARAMETERS as usize];
                read_params(caller, p, &mut b)?;
                Ok(req(u64_at(&b, off::FABRIC_ALLOC_SIZE), Location::Vidmem, true))
            }
            class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => {
                let mut b = [0u8; size::NV_OS_DESC_MEMORY_ALLOCATION_PARAMS as usize];
                read_params(caller, p, &mut b)?;
                let bytes = u64_at(&b, off::OSDESC_LIMIT).wrapping_add(1);
                Ok(req(bytes, Location::Sysmem, true))
            }
            _ => {
                // NV_MEMORY_ALLOCATION_PARAMS (0x40, 0x3e, 0x50a0, 0x90ce).
                let mut b = vec![0u8; self.abi.mem_alloc_params_size as usize];
                read_params(caller, p, &mut b)?;
                let bytes = u64_at(&b, off::MEM_PARAMS_SIZE);
                if bytes == 0 {
                    return Err(NV_ERR_INVALID_ARGUMENT);
                }
                let flags = u32_at(&b, off::MEM_PARAMS_FLAGS);
                let location =
                    if h_class == class::NV01_MEMORY_LOCAL_USER { Location::Vidmem } else { Location::Sysmem };
                let physical = h_class != class::NV50_MEMORY_VIRTUAL && flags & nv::NVOS32_ALLOC_FLAGS_VIRTUAL == 0;
                Ok(req(bytes, location, physical))
            }
        }
    }

    /// Create an allocation, enforcing the GPU's capacity for physical video memory.
    fn allocate(&mut self, m: MemoryRequest) -> RmResult<u64> {
        let accounted = m.physical && m.location == Location::Vidmem && m.gpu.is_some();
        if accounted {
            let g = m.gpu.expect("accounted allocations have a GPU") as usize;
            let used = self.gpu_used[g];
            if used.checked_add(m.bytes).is_none_or(|t| t > self.cfg.gpu_memory_bytes) {
                return Err(NV_ERR_NO_MEMORY);
            }
            self.gpu_used[g] = used + m.bytes;
        }
        let id = self.next_allocation;
        self.next_allocation += 1;
        self.allocations.insert(
            id,
            Allocation { gpu: m.gpu, bytes: m.bytes, location: m.location, source: m.source, accounted, refs: 0 },
        );
        self.totals.allocations_created += 1;
        Ok(id)
    }

    fn insert_object(&mut self, client: u32, h: u32, obj: RmObject) {
        if let Some(a) = obj.allocation.and_then(|id| self.allocations.get_mut(&id)) {
            a.refs += 1;
        }
        self.clients.get_mut(&client).expect("caller checked the client").objects.insert(h, obj);
        self.totals.objects_created += 1;
    }

    fn rm_free(&mut self, file: FileId, h_root: u32, h_old: u32) -> RmResult<()> {
        let client = self.check_client(file, h_root)?;
        if h_old == h_root {
            self.free_client(h_root);
            return Ok(());
        }
        if !client.objects.contains_key(&h_old) {
            return Err(NV_ERR_INVALID_OBJECT_HANDLE);
        }
        self.free_subtree(h_root, h_old);
        Ok(())
    }

    fn free_client(&mut self, h: u32) {
        let Some(client) = self.clients.remove(&h) else { return };
        for obj in client.objects.values() {
            self.release_allocation(obj.allocation);
        }
        self.totals.objects_freed += client.objects.len() as u64;
        self.totals.clients_freed += 1;
    }

    /// Free `h` and everything below it, children first.
    fn free_subtree(&mut self, client: u32, h: u32) {
        let objects = &self.clients[&client].objects;
        let mut doomed = vec![h];
        let mut i = 0;
        while i < doomed.len() {
            let parent = doomed[i];
            doomed.extend(objects.iter().filter(|(_, o)| o.parent == parent).map(|(k, _)| *k));
            i += 1;
        }
        for h in doomed.into_iter().rev() {
            let obj = self.clients.get_mut(&client).and_then(|c| c.objects.remove(&h));
            if let Some(obj) = obj {
                self.release_allocation(obj.allocation);
                self.totals.objects_freed += 1;
            }
        }
    }

    fn release_allocation(&mut self, id: Option<u64>) {
        let Some(id) = id else { return };
        let Some(a) = self.allocations.get_mut(&id) else { return };
        a.refs = a.refs.saturating_sub(1);
        if a.refs > 0 {
            return;
        }
        let a = self.allocations.remove(&id).expect("present");
        if a.accounted {
            let g = a.gpu.expect("accounted allocations have a GPU") as usize;
            self.gpu_used[g] -= a.bytes;
        }
        self.totals.allocations_freed += 1;
    }

    // ----- VID_HEAP_CONTROL, ALLOC_MEMORY, DUP_OBJECT -------------------------------------------

    fn vid_heap(&mut self, file: FileId, data: &mut [u8]) -> RmResult<()> {
        let h_root = u32_at(data, off::VHC_H_ROOT);
        let h_parent = u32_at(data, off::VHC_H_PARENT);
        let function = u32_at(data, off::VHC_FUNCTION);
        let client = self.check_client(file, h_root)?;
        let gpu = client.objects.get(&h_parent).and_then(|o| o.gpu);
        let result = match function {
            nv::NVOS32_FUNCTION_ALLOC_SIZE => {
                let gpu = gpu.ok_or(NV_ERR_INVALID_OBJECT_PARENT)?;
                let flags = u32_at(data, off::VHC_ALLOC_FLAGS);
                let attr = u32_at(data, off::VHC_ALLOC_ATTR);
                let bytes = u64_at(data, off::VHC_ALLOC_SIZE);
                if bytes == 0 {
                    return Err(NV_ERR_INVALID_ARGUMENT);
                }
                let h_given = u32_at(data, off::VHC_H_MEMORY);
                let provided = flags & nv::NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED != 0;
                if provided && h_given == 0 {
                    return Err(NV_ERR_INVALID_OBJECT_NEW);
                }
                let h = self.pick_handle(h_root, if provided { h_given } else { 0 })?;
                let location =
                    if nv::attr_location(attr) == nv::ATTR_LOCATION_PCI { Location::Sysmem } else { Location::Vidmem };
                let physical = flags & nv::NVOS32_ALLOC_FLAGS_VIRTUAL == 0;
                let id = self.allocate(MemoryRequest {
                    gpu: Some(gpu),
                    bytes,
                    location,
                    source: Source::VidHeap,
                    physical,
                })?;
                let class = if location == Location::Vidmem {
                    class::NV01_MEMORY_LOCAL_USER
                } else {
                    class::NV01_MEMORY_SYSTEM
                };
                self.insert_object(
                    h_root,
                    h,
                    RmObject { parent: h_parent, class, gpu: Some(gpu), allocation: Some(id) },
                );
                put_u32(data, off::VHC_H_MEMORY, h);
                Ok(())
            }
            nv::NVOS32_FUNCTION_FREE => {
                let h = u32_at(data, off::VHC_H_MEMORY);
                if h == h_root {
                    return Err(NV_ERR_INVALID_OBJECT_HANDLE);
                }
                self.rm_free(file, h_root, h)
            }
            NVOS32_FUNCTION_INFO => Ok(()),
            _ => Err(NV_ERR_INVALID_FUNCTION),
        };
        // Like RM, report the heap's total and free bytes of the device's GPU.
        if let Some(g) = gpu {
            put_u64(data, off::VHC_TOTAL, self.cfg.gpu_memory_bytes);
            put_u64(data, off::VHC_FREE, self.cfg.gpu_memory_bytes - self.gpu_used[g as usize]);
        }
        result
    }

    fn alloc_memory(&mut self, minor: u32, data: &[u8]) -> RmResult<u32> {
        let h_root = u32_at(data, off::NVOS02_H_ROOT);
        let h_parent = u32_at(data, off::NVOS02_H_PARENT);
        let h_new = u32_at(data, off::NVOS02_H_NEW);
        let h_class = u32_at(data, off::NVOS02_H_CLASS);
        let flags = u32_at(data, off::NVOS02_FLAGS);
        let limit = u64_at(data, off::NVOS02_LIMIT);
        // This arrives on a GPU fd, not the ctl fd that owns the client (the GPU fd was linked to
        // it by REGISTER_FD), so only the client's existence is checked.
        let client = self.clients.get(&h_root).ok_or(NV_ERR_INVALID_CLIENT)?;
        if h_parent != h_root && !client.objects.contains_key(&h_parent) {
            return Err(NV_ERR_INVALID_OBJECT_PARENT);
        }
        let bytes = limit.checked_add(1).ok_or(NV_ERR_INVALID_LIMIT)?;
        let location =
            if nv::nvos02_location(flags) == nv::NVOS02_LOCATION_VIDMEM { Location::Vidmem } else { Location::Sysmem };
        let h = self.pick_handle(h_root, h_new)?;
        let id = self.allocate(MemoryRequest {
            gpu: Some(minor),
            bytes,
            location,
            source: Source::AllocMemory,
            physical: true,
        })?;
        self.insert_object(
            h_root,
            h,
            RmObject { parent: h_parent, class: h_class, gpu: Some(minor), allocation: Some(id) },
        );
        Ok(h)
    }

    fn dup_object(&mut self, file: FileId, data: &[u8]) -> RmResult<u32> {
        let h_client = u32_at(data, off::DUP_H_CLIENT);
        let h_parent = u32_at(data, off::DUP_H_PARENT);
        let h_new = u32_at(data, off::DUP_H_OBJECT);
        let h_client_src = u32_at(data, off::DUP_H_CLIENT_SRC);
        let h_src = u32_at(data, off::DUP_H_OBJECT_SRC);
        let dst = self.check_client(file, h_client)?;
        if h_parent != h_client && !dst.objects.contains_key(&h_parent) {
            return Err(NV_ERR_INVALID_OBJECT_PARENT);
        }
        // The source may belong to another client (that is what DUP_OBJECT is for).
        let src = self.clients.get(&h_client_src).ok_or(NV_ERR_INVALID_CLIENT)?;
        let src_obj = src.objects.get(&h_src).ok_or(NV_ERR_INVALID_OBJECT_HANDLE)?.clone();
        let h = self.pick_handle(h_client, h_new)?;
        self.insert_object(h_client, h, RmObject { parent: h_parent, ..src_obj });
        Ok(h)
    }

    // ----- misc escapes -------------------------------------------------------------------------

    fn card_info(&self, data: &mut [u8]) {
        data.fill(0);
        for (i, e) in data.chunks_mut(size::CARD_INFO_ENTRY as usize).enumerate() {
            let i = i as u32;
            if i >= self.cfg.gpus {
                break;
            }
            e[off::CARD_INFO_VALID] = 1;
            put_u32(e, off::CARD_INFO_PCI_DOMAIN, 0);
            e[off::CARD_INFO_PCI_BUS] = (i + 1) as u8;
            e[off::CARD_INFO_PCI_SLOT] = 0;
            e[off::CARD_INFO_PCI_FUNCTION] = 0;
            e[off::CARD_INFO_PCI_VENDOR_ID..off::CARD_INFO_PCI_VENDOR_ID + 2].copy_from_slice(&0x10deu16.to_le_bytes());
            // 0x2330: H100 SXM5 80GB.
            e[off::CARD_INFO_PCI_DEVICE_ID..off::CARD_INFO_PCI_DEVICE_ID + 2].copy_from_slice(&0x2330u16.to_le_bytes());
            put_u32(e, off::CARD_INFO_GPU_ID, (i + 1) << 8);
            put_u64(e, off::CARD_INFO_FB_SIZE, self.cfg.gpu_memory_bytes);
            put_u32(e, off::CARD_INFO_MINOR_NUMBER, i);
            put_cstr(e, off::CARD_INFO_DEV_NAME, 10, "nvidia");
        }
    }

    fn register_fd(&mut self, file: FileId, ctl_fd: i32, caller: &dyn Caller) -> Result<(), Errno> {
        let target = caller.fd_path(ctl_fd).ok_or(libc::EINVAL)?;
        if target.file_name().and_then(|n| n.to_str()) != Some("nvidiactl") {
            return Err(libc::EINVAL);
        }
        let f = self.files.get_mut(&file).ok_or(libc::EBADF)?;
        if f.registered {
            return Err(libc::EINVAL);
        }
        f.registered = true;
        Ok(())
    }

    fn check_version(&self, data: &mut [u8]) -> Result<(), Errno> {
        let cmd = u32_at(data, off::RM_API_VERSION_CMD);
        let len = nv::NV_RM_API_VERSION_STRING_LENGTH;
        let theirs = cstr_at(data, off::RM_API_VERSION_STRING, len);
        let ours = self.version_string.clone();
        let matches = match cmd {
            nv::NV_RM_API_VERSION_CMD_QUERY => true,
            // Relaxed: only the branch (the part before the first '.') has to agree.
            nv::NV_RM_API_VERSION_CMD_RELAXED => theirs.split('.').next() == ours.split('.').next(),
            _ => theirs == ours,
        };
        if cmd == nv::NV_RM_API_VERSION_CMD_QUERY || !matches {
            put_cstr(data, off::RM_API_VERSION_STRING, len, &ours);
        }
        if matches {
            put_u32(data, off::RM_API_VERSION_REPLY, nv::NV_RM_API_VERSION_REPLY_RECOGNIZED);
            Ok(())
        } else {
            put_u32(data, off::RM_API_VERSION_REPLY, nv::NV_RM_API_VERSION_REPLY_UNRECOGNIZED);
            Err(libc::EINVAL)
        }
    }

    // ----- stats ----------------------------------------------------------------------------------

    /// A consistent snapshot of everything the driver knows.
    pub fn stats(&self) -> DriverStats {
        let memory = |id: Option<u64>| {
            let id = id?;
            let a = self.allocations.get(&id)?;
            Some(MemoryStats {
                id,
                bytes: a.bytes,
                location: match a.location {
                    Location::Vidmem => "vidmem",
                    Location::Sysmem => "sysmem",
                }
                .into(),
                source: match a.source {
                    Source::RmAlloc => "rm_alloc",
                    Source::VidHeap => "vid_heap",
                    Source::AllocMemory => "alloc_memory",
                }
                .into(),
                accounted: a.accounted,
                refs: a.refs,
            })
        };
        DriverStats {
            driver_version: self.version_string.clone(),
            gpus: (0..self.cfg.gpus)
                .map(|g| GpuStats {
                    minor: g,
                    capacity_bytes: self.cfg.gpu_memory_bytes,
                    used_bytes: self.gpu_used[g as usize],
                })
                .collect(),
            open_files: self
                .files
                .iter()
                .map(|(id, f)| OpenFileStats {
                    id: *id,
                    node: f.node.file_name(),
                    pid: f.pid,
                    registered: f.registered,
                })
                .collect(),
            clients: self
                .clients
                .iter()
                .map(|(h, c)| ClientStats {
                    handle: *h,
                    class: c.class,
                    pid: c.pid,
                    file: c.file,
                    objects: c
                        .objects
                        .iter()
                        .map(|(oh, o)| ObjectStats {
                            handle: *oh,
                            parent: o.parent,
                            class: o.class,
                            gpu: o.gpu,
                            memory: memory(o.allocation),
                        })
                        .collect(),
                })
                .collect(),
            ioctls: self
                .ioctls
                .iter()
                .map(|(&(node, nr), c)| IoctlStats {
                    node: node.into(),
                    nr,
                    name: ioctl_name(node, nr).into(),
                    calls: c.calls,
                    errno: c.errno,
                    rm_errors: c.rm_errors,
                })
                .collect(),
            totals: self.totals.clone(),
        }
    }
}

/// `NVOS32_FUNCTION_INFO`: report the heap's total and free bytes.
const NVOS32_FUNCTION_INFO: u32 = 5;

fn set_status(data: &mut [u8], off: usize, status: u32) -> u32 {
    put_u32(data, off, status);
    status
}

/// Copy nested parameters in from the caller, mapping faults to the status RM reports.
fn read_params(caller: &dyn Caller, p: u64, buf: &mut [u8]) -> RmResult<()> {
    caller.read(p, buf).map_err(|e| match e {
        // rmapiParamsCopyInit: a NULL pointer where the class requires parameters.
        CallerFault::Null => NV_ERR_INVALID_ARGUMENT,
        // portMemExCopyFromUser -> os_memcpy_from_user failing.
        CallerFault::Unreadable(_) => NV_ERR_INVALID_ADDRESS,
    })
}

/// `/dev/nvidia-uvm`: commands are plain integers, so FUSE moves no parameter bytes either way and
/// the caller's `rmStatus` stays whatever it put there. Known commands answer 0; others -EINVAL
/// (`uvm_ioctl`'s default case).
fn uvm_ioctl(cmd: u32) -> Result<Option<u32>, Errno> {
    match cmd {
        uvm::INITIALIZE | uvm::DEINITIALIZE | 23..=80 => Ok(None),
        _ => Err(libc::EINVAL),
    }
}

/// A readable name for an ioctl, for the stats file.
pub fn ioctl_name(node: &str, nr: u32) -> &'static str {
    match node {
        "frontend" => match nr {
            esc::RM_ALLOC_MEMORY => "RM_ALLOC_MEMORY",
            esc::RM_ALLOC_OBJECT => "RM_ALLOC_OBJECT",
            esc::RM_FREE => "RM_FREE",
            esc::RM_CONTROL => "RM_CONTROL",
            esc::RM_ALLOC => "RM_ALLOC",
            esc::RM_DUP_OBJECT => "RM_DUP_OBJECT",
            esc::RM_SHARE => "RM_SHARE",
            esc::RM_I2C_ACCESS => "RM_I2C_ACCESS",
            esc::RM_IDLE_CHANNELS => "RM_IDLE_CHANNELS",
            esc::RM_VID_HEAP_CONTROL => "RM_VID_HEAP_CONTROL",
            esc::RM_ACCESS_REGISTRY => "RM_ACCESS_REGISTRY",
            esc::RM_MAP_MEMORY => "RM_MAP_MEMORY",
            esc::RM_UNMAP_MEMORY => "RM_UNMAP_MEMORY",
            esc::RM_ALLOC_CONTEXT_DMA2 => "RM_ALLOC_CONTEXT_DMA2",
            esc::RM_MAP_MEMORY_DMA => "RM_MAP_MEMORY_DMA",
            esc::RM_UNMAP_MEMORY_DMA => "RM_UNMAP_MEMORY_DMA",
            esc::RM_BIND_CONTEXT_DMA => "RM_BIND_CONTEXT_DMA",
            esc::RM_UPDATE_DEVICE_MAPPING_INFO => "RM_UPDATE_DEVICE_MAPPING_INFO",
            esc::CARD_INFO => "CARD_INFO",
            esc::REGISTER_FD => "REGISTER_FD",
            esc::ALLOC_OS_EVENT => "ALLOC_OS_EVENT",
            esc::FREE_OS_EVENT => "FREE_OS_EVENT",
            esc::STATUS_CODE => "STATUS_CODE",
            esc::CHECK_VERSION_STR => "CHECK_VERSION_STR",
            esc::IOCTL_XFER_CMD => "IOCTL_XFER_CMD",
            esc::ATTACH_GPUS_TO_FD => "ATTACH_GPUS_TO_FD",
            esc::QUERY_DEVICE_INTR => "QUERY_DEVICE_INTR",
            esc::SYS_PARAMS => "SYS_PARAMS",
            esc::NUMA_INFO => "NUMA_INFO",
            esc::SET_NUMA_STATUS => "SET_NUMA_STATUS",
            esc::EXPORT_TO_DMABUF_FD => "EXPORT_TO_DMABUF_FD",
            esc::WAIT_OPEN_COMPLETE => "WAIT_OPEN_COMPLETE",
            _ => "unknown",
        },
        "uvm" => match nr {
            uvm::INITIALIZE => "UVM_INITIALIZE",
            uvm::DEINITIALIZE => "UVM_DEINITIALIZE",
            uvm::CREATE_RANGE_GROUP => "UVM_CREATE_RANGE_GROUP",
            uvm::REGISTER_GPU_VASPACE => "UVM_REGISTER_GPU_VASPACE",
            uvm::REGISTER_CHANNEL => "UVM_REGISTER_CHANNEL",
            uvm::MAP_EXTERNAL_ALLOCATION => "UVM_MAP_EXTERNAL_ALLOCATION",
            uvm::FREE => "UVM_FREE",
            uvm::REGISTER_GPU => "UVM_REGISTER_GPU",
            uvm::UNREGISTER_GPU => "UVM_UNREGISTER_GPU",
            uvm::PAGEABLE_MEM_ACCESS => "UVM_PAGEABLE_MEM_ACCESS",
            uvm::UNMAP_EXTERNAL => "UVM_UNMAP_EXTERNAL",
            uvm::ALLOC_SEMAPHORE_POOL => "UVM_ALLOC_SEMAPHORE_POOL",
            uvm::VALIDATE_VA_RANGE => "UVM_VALIDATE_VA_RANGE",
            uvm::CREATE_EXTERNAL_RANGE => "UVM_CREATE_EXTERNAL_RANGE",
            uvm::MM_INITIALIZE => "UVM_MM_INITIALIZE",
            _ => "unknown",
        },
        _ => "unknown",
    }
}
