//! The fake driver's own view of the world, served read-only as `.fake-driver-stats` in the mount.
//!
//! Integration tests compare this with what the tracer reports: every live RM object per client
//! (with the memory behind it), per-GPU accounted bytes, open files and ioctl counts. Each open of
//! the stats file takes one consistent snapshot.

use serde::{Deserialize, Serialize};

/// File name of the stats file inside the mount.
pub const STATS_FILE_NAME: &str = ".fake-driver-stats";

/// Everything the fake driver knows, at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverStats {
    /// The version string the driver answers `CHECK_VERSION_STR` with.
    pub driver_version: String,
    /// One entry per `/dev/nvidiaN` served.
    pub gpus: Vec<GpuStats>,
    /// Files currently open on the mount (one per `open()`, shared by dup'd fds).
    pub open_files: Vec<OpenFileStats>,
    /// Live RM clients and their objects.
    pub clients: Vec<ClientStats>,
    /// ioctl counts by node kind and number.
    pub ioctls: Vec<IoctlStats>,
    /// Running totals since the mount.
    pub totals: Totals,
}

/// One fake GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuStats {
    /// Minor number (`/dev/nvidia<minor>`), which is also the device instance (`deviceId`).
    pub minor: u32,
    /// Capacity enforced for video-memory allocations.
    pub capacity_bytes: u64,
    /// Video memory currently accounted to live allocations on this GPU.
    pub used_bytes: u64,
}

/// One open file description.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenFileStats {
    /// The FUSE file handle (unique per open on this mount).
    pub id: u64,
    /// File name: `nvidiactl`, `nvidia0`, `nvidia-uvm`, ...
    pub node: String,
    /// Thread-group id of the process that opened it.
    pub pid: u32,
    /// Whether `NV_ESC_REGISTER_FD` linked it to a control fd.
    pub registered: bool,
}

/// A live RM client (root object).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientStats {
    /// Client handle (`hRoot`).
    pub handle: u32,
    /// The root class it was allocated with.
    pub class: u32,
    /// Thread-group id of the allocating process.
    pub pid: u32,
    /// The open file (see [`OpenFileStats::id`]) it was created through; released with it.
    pub file: u64,
    /// Its objects, in handle order (the client itself is not listed).
    pub objects: Vec<ObjectStats>,
}

/// An RM object inside a client.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectStats {
    pub handle: u32,
    pub parent: u32,
    pub class: u32,
    /// The GPU it belongs to, when it hangs below a device.
    pub gpu: Option<u32>,
    /// The memory behind it, for memory objects.
    pub memory: Option<MemoryStats>,
}

/// A memory allocation; shared by the original object and its duplicates.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStats {
    /// Allocation id (equal for an object and its `RM_DUP_OBJECT` copies).
    pub id: u64,
    /// Requested size in bytes.
    pub bytes: u64,
    /// `vidmem` or `sysmem`.
    pub location: String,
    /// `rm_alloc`, `vid_heap` or `alloc_memory`.
    pub source: String,
    /// Whether it counts against the GPU's capacity (physical video memory, not VA-only).
    pub accounted: bool,
    /// Number of live objects referring to it.
    pub refs: u32,
}

/// ioctl counts for one (node kind, number) pair.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoctlStats {
    /// `frontend` (nvidiactl / nvidiaN), `uvm`, `uvm-tools` or `modeset`.
    pub node: String,
    /// `_IOC_NR(cmd)` for frontend ioctls, the whole command for the others.
    pub nr: u32,
    /// Escape / command name, or `unknown`.
    pub name: String,
    /// Calls that reached the driver (faulting argument copies never do: FUSE fails them first).
    pub calls: u64,
    /// Calls answered with an errno (e.g. `-EINVAL`).
    pub errno: u64,
    /// Calls that returned 0 but set a non-`NV_OK` status in the parameter struct.
    pub rm_errors: u64,
}

/// Running totals since the mount.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub opens: u64,
    pub releases: u64,
    pub clients_created: u64,
    pub clients_freed: u64,
    pub objects_created: u64,
    pub objects_freed: u64,
    pub allocations_created: u64,
    pub allocations_freed: u64,
}

impl DriverStats {
    /// The live client with handle `h`.
    pub fn client(&self, h: u32) -> Option<&ClientStats> {
        self.clients.iter().find(|c| c.handle == h)
    }

    /// The live object `h` of client `client`.
    pub fn object(&self, client: u32, h: u32) -> Option<&ObjectStats> {
        self.client(client)?.objects.iter().find(|o| o.handle == h)
    }

    /// Number of live objects over all clients (clients themselves not counted).
    pub fn live_objects(&self) -> usize {
        self.clients.iter().map(|c| c.objects.len()).sum()
    }

    /// Accounted video memory on GPU `minor`.
    pub fn used_bytes(&self, minor: u32) -> u64 {
        self.gpus.iter().find(|g| g.minor == minor).map_or(0, |g| g.used_bytes)
    }

    /// Calls of the ioctl named `name` (e.g. `RM_ALLOC`, `UVM_INITIALIZE`), over all nodes.
    pub fn ioctl_calls(&self, name: &str) -> u64 {
        self.ioctls.iter().filter(|i| i.name == name).map(|i| i.calls).sum()
    }

    /// Errno answers of the ioctl named `name`, over all nodes.
    pub fn ioctl_errnos(&self, name: &str) -> u64 {
        self.ioctls.iter().filter(|i| i.name == name).map(|i| i.errno).sum()
    }

    /// Live clients created by process `pid`.
    pub fn clients_of(&self, pid: u32) -> impl Iterator<Item = &ClientStats> {
        self.clients.iter().filter(move |c| c.pid == pid)
    }
}
