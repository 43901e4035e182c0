//! Per-process tables: the fd table and the RM handle ledger (objects per client, with parent links).
//!
//! These are plain data structures; the accounting of bytes (charges on process, cgroup, GPU and
//! totals) is done by [`super::TracerState`], which owns the allocations the objects point to.

use std::collections::{HashMap, HashSet};

use crate::decode::{Device, DeviceKind};

use super::{ProcessKey, snapshot::Usage};

/// Id of a live allocation in [`super::TracerState`].
pub(super) type AllocId = u64;

/// One RM object handle inside a client.
#[derive(Debug, Clone)]
pub(super) struct Object {
    /// Parent handle; `None` for the client itself.
    pub parent: Option<u32>,
    /// RM class, `None` for a placeholder (an object we never saw allocated: created before the
    /// agent started, or named as a parent/source before it was seen).
    pub class: Option<u32>,
    pub children: HashSet<u32>,
    /// The memory this handle refers to (shared by dups).
    pub alloc: Option<AllocId>,
    /// `NV0080_ALLOC_PARAMETERS.deviceId` for device objects.
    pub device_instance: Option<u32>,
}

impl Object {
    pub fn new(parent: Option<u32>, class: Option<u32>) -> Self {
        Object { parent, class, children: HashSet::new(), alloc: None, device_instance: None }
    }
}

/// An RM client (`hRoot`) and every object allocated under it.
#[derive(Debug, Clone, Default)]
pub(super) struct Client {
    /// `file_id` of the ctl file the client was allocated through: released with it.
    pub file_id: Option<u64>,
    pub objects: HashMap<u32, Object>,
}

/// An open NVIDIA fd.
#[derive(Debug, Clone, Copy)]
pub(super) struct FdEntry {
    pub device: Device,
    /// Opened with `O_CLOEXEC`: closed by exec without a `close` record.
    pub cloexec: bool,
}

/// A managed-memory mapping (mmap of a UVM fd).
#[derive(Debug, Clone, Copy)]
pub(super) struct ManagedMapping {
    pub len: u64,
    /// The cgroup charged when it was mapped.
    pub cgroup_id: u64,
}

/// Everything known about one live process.
#[derive(Debug, Clone)]
pub(super) struct Process {
    pub key: ProcessKey,
    pub comm: Option<String>,
    /// The cgroup of its latest event.
    pub cgroup_id: u64,
    /// ktime of its latest event (for eviction order).
    pub last_ktime: u64,
    pub fds: HashMap<i32, FdEntry>,
    /// Open fds per `file_id` (an fd and its dups share one).
    pub file_refs: HashMap<u64, u32>,
    pub clients: HashMap<u32, Client>,
    /// Objects across all clients (bounded by `max_handles_per_process`).
    pub handles: usize,
    pub managed: HashMap<u64, ManagedMapping>,
    pub usage: Usage,
    /// How complete this process's ledger is (found running at start; records lost).
    pub completeness: super::snapshot::Completeness,
}

impl Process {
    pub fn new(key: ProcessKey, cgroup_id: u64, ktime: u64) -> Self {
        Process {
            key,
            comm: None,
            cgroup_id,
            last_ktime: ktime,
            fds: HashMap::new(),
            file_refs: HashMap::new(),
            clients: HashMap::new(),
            handles: 0,
            managed: HashMap::new(),
            usage: Usage::default(),
            completeness: Default::default(),
        }
    }

    /// Distinct `/dev/nvidiaN` minors this process has open.
    pub fn gpu_minors(&self) -> Vec<u32> {
        let mut m: Vec<u32> =
            self.fds.values().filter(|f| f.device.kind == DeviceKind::Gpu).map(|f| f.device.minor).collect();
        m.sort_unstable();
        m.dedup();
        m
    }

    /// Make sure `client` exists (as a placeholder if it was never seen allocated). Returns false
    /// if the handle table is full.
    pub(crate) fn ensure_client(&mut self, client: u32, file_id: Option<u64>, max_handles: usize) -> bool {
        if let Some(c) = self.clients.get_mut(&client) {
            if c.file_id.is_none() {
                c.file_id = file_id;
            }
            return true;
        }
        if self.handles >= max_handles {
            return false;
        }
        let mut c = Client { file_id, objects: HashMap::new() };
        c.objects.insert(client, Object::new(None, None));
        self.clients.insert(client, c);
        self.handles += 1;
        true
    }

    /// Insert `handle` under `parent` in `client` (which must exist), creating a placeholder parent
    /// if needed. The handle must not exist. Returns false if the handle table is full.
    pub fn insert_object(&mut self, client: u32, parent: u32, handle: u32, obj: Object, max_handles: usize) -> bool {
        let Some(c) = self.clients.get_mut(&client) else { return false };
        let need = 1 + usize::from(parent != client && !c.objects.contains_key(&parent));
        if self.handles + need > max_handles {
            return false;
        }
        match c.objects.entry(parent) {
            std::collections::hash_map::Entry::Occupied(mut p) => {
                p.get_mut().children.insert(handle);
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                let mut p = Object::new(Some(client), None);
                p.children.insert(handle);
                v.insert(p);
                if let Some(root) = c.objects.get_mut(&client) {
                    root.children.insert(parent);
                }
                self.handles += 1;
            }
        }
        c.objects.insert(handle, Object { parent: Some(parent), ..obj });
        self.handles += 1;
        true
    }

    /// Remove `handle` and all its descendants from `client` (the whole client if `handle` is the
    /// client). Returns the allocations the removed handles referred to, with their handles, or
    /// `None` if the handle is unknown.
    pub(crate) fn remove_subtree(&mut self, client: u32, handle: u32) -> Option<Vec<(u32, AllocId)>> {
        if handle == client {
            let c = self.clients.remove(&client)?;
            self.handles = self.handles.saturating_sub(c.objects.len());
            return Some(c.objects.into_iter().filter_map(|(h, o)| o.alloc.map(|a| (h, a))).collect());
        }
        let c = self.clients.get_mut(&client)?;
        let root = c.objects.remove(&handle)?;
        if let Some(p) = root.parent.and_then(|p| c.objects.get_mut(&p)) {
            p.children.remove(&handle);
        }
        let mut released = Vec::new();
        let mut removed = 1usize;
        if let Some(a) = root.alloc {
            released.push((handle, a));
        }
        // Iterative walk: each handle is removed once, so even a corrupted (cyclic) graph ends.
        let mut stack: Vec<u32> = root.children.into_iter().collect();
        while let Some(h) = stack.pop() {
            if let Some(o) = c.objects.remove(&h) {
                removed += 1;
                if let Some(a) = o.alloc {
                    released.push((h, a));
                }
                stack.extend(o.children);
            }
        }
        self.handles = self.handles.saturating_sub(removed);
        Some(released)
    }

    /// The device instance of the nearest device ancestor of `handle` (itself included):
    /// `Some(Some(d))` a device with a known instance, `Some(None)` a device whose instance is
    /// unknown, `None` no device found.
    pub(crate) fn device_of(&self, client: u32, handle: u32) -> Option<Option<u32>> {
        let c = self.clients.get(&client)?;
        let mut h = handle;
        // Bounded walk (the RM hierarchy is a few levels deep).
        for _ in 0..64 {
            let o = c.objects.get(&h)?;
            if o.class == Some(tracer_common::nv::class::NV01_DEVICE_0) || o.device_instance.is_some() {
                return Some(o.device_instance);
            }
            h = o.parent?;
        }
        None
    }

    /// Every (client, handle, allocation) this process refers to.
    pub(crate) fn all_allocs(&self) -> Vec<(u32, u32, AllocId)> {
        let mut v = Vec::new();
        for (&client, c) in &self.clients {
            for (&h, o) in &c.objects {
                if let Some(a) = o.alloc {
                    v.push((client, h, a));
                }
            }
        }
        v
    }
}
