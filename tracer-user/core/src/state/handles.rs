//! The RM handle ledger: fds and the files behind them, managed mappings, clients and objects with
//! their parent links, allocations charged and uncharged, dups, frees, and the ioctls that drive
//! them.
use super::*;

impl TracerState {
    pub(super) fn add_fd(&mut self, tgid: u32, fd: i32, device: Device, cloexec: bool) {
        let max = self.cfg.max_fds_per_process;
        let Some(p) = self.processes.get_mut(&tgid) else { return };
        if p.fds.len() >= max {
            self.counters.fd_table_full += 1;
            return;
        }
        p.fds.insert(fd, FdEntry { device, cloexec });
        *p.file_refs.entry(device.file_id).or_default() += 1;
    }

    /// Close an fd; when it was the last one on its file, release the clients created through it.
    pub(super) fn close_fd(&mut self, tgid: u32, fd: i32) {
        let Some(p) = self.processes.get_mut(&tgid) else { return };
        let Some(entry) = p.fds.remove(&fd) else {
            self.counters.unknown_fd_closes += 1;
            return;
        };
        let file_id = entry.device.file_id;
        let last = match p.file_refs.get_mut(&file_id) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => {
                p.file_refs.remove(&file_id);
                true
            }
        };
        if !last {
            return;
        }
        let clients: Vec<u32> = p.clients.iter().filter(|(_, c)| c.file_id == Some(file_id)).map(|(&h, _)| h).collect();
        for client in clients {
            self.free_in(tgid, client, client, Some(Cause::FdRelease));
        }
    }

    // ---- managed memory ----

    pub(super) fn map_managed(&mut self, tgid: u32, addr: u64, len: u64) {
        let max = self.cfg.max_managed_per_process;
        let Some(p) = self.processes.get_mut(&tgid) else { return };
        if let Some(old) = p.managed.remove(&addr) {
            self.uncharge_managed(tgid, old);
        }
        let Some(p) = self.processes.get_mut(&tgid) else { return };
        if p.managed.len() >= max {
            self.counters.managed_table_full += 1;
            return;
        }
        let m = ManagedMapping { len, cgroup_id: p.cgroup_id };
        p.managed.insert(addr, m);
        let f = |u: &mut Usage| {
            u.managed_bytes = u.managed_bytes.saturating_add(len);
            u.managed_mappings += 1;
        };
        self.rows(tgid, m.cgroup_id, None, f);
    }

    pub(super) fn unmap_managed(&mut self, tgid: u32, addr: u64) {
        match self.processes.get_mut(&tgid).and_then(|p| p.managed.remove(&addr)) {
            Some(m) => self.uncharge_managed(tgid, m),
            None => self.counters.unknown_munmaps += 1,
        }
    }

    pub(super) fn uncharge_managed(&mut self, tgid: u32, m: ManagedMapping) {
        self.released_any = true;
        self.released_bytes = self.released_bytes.saturating_add(m.len);
        let f = |u: &mut Usage| {
            u.managed_bytes = u.managed_bytes.saturating_sub(m.len);
            u.managed_mappings = u.managed_mappings.saturating_sub(1);
        };
        self.rows(tgid, m.cgroup_id, None, f);
        self.maybe_drop_cgroup(m.cgroup_id);
    }

    // ---- accounting ----

    /// Apply `f` to the rows of a process, a cgroup, a GPU bucket and the total.
    pub(super) fn rows(&mut self, tgid: u32, cgroup_id: u64, gpu: Option<u32>, f: impl Fn(&mut Usage)) {
        if let Some(p) = self.processes.get_mut(&tgid) {
            f(&mut p.usage);
        }
        match self.processes.get(&tgid).map(|p| p.last_ktime) {
            Some(ktime) => f(&mut self.cgroup_mut(cgroup_id, ktime).usage),
            // A record read after its process's exit: its cgroup's row, if it still has one (a
            // row dropped with its removed cgroup is not brought back).
            None => {
                if let Some(c) = self.cgroups.get_mut(&cgroup_id) {
                    f(&mut c.usage);
                }
            }
        }
        f(self.gpus.entry(gpu).or_default());
        f(&mut self.totals);
    }

    pub(super) fn charge(&mut self, a: &Allocation, new: bool) {
        let (bytes, bucket, inferred) = (a.bytes, a.bucket, a.inferred);
        let f = |u: &mut Usage| {
            match bucket {
                Bucket::Vidmem => u.vidmem_bytes = u.vidmem_bytes.saturating_add(bytes),
                Bucket::Sysmem => u.sysmem_bytes = u.sysmem_bytes.saturating_add(bytes),
                Bucket::VaOnly => u.va_reserved_bytes = u.va_reserved_bytes.saturating_add(bytes),
            }
            if inferred && bucket == Bucket::Vidmem {
                u.inferred_vidmem_bytes = u.inferred_vidmem_bytes.saturating_add(bytes);
            }
            u.live_allocations += 1;
            if new {
                u.allocations += 1;
            }
        };
        self.rows(a.owner, a.cgroup_id, a.gpu, f);
    }

    pub(super) fn uncharge(&mut self, a: &Allocation, release: bool) {
        let (bytes, bucket, inferred) = (a.bytes, a.bucket, a.inferred);
        let f = |u: &mut Usage| {
            match bucket {
                Bucket::Vidmem => u.vidmem_bytes = u.vidmem_bytes.saturating_sub(bytes),
                Bucket::Sysmem => u.sysmem_bytes = u.sysmem_bytes.saturating_sub(bytes),
                Bucket::VaOnly => u.va_reserved_bytes = u.va_reserved_bytes.saturating_sub(bytes),
            }
            if inferred && bucket == Bucket::Vidmem {
                u.inferred_vidmem_bytes = u.inferred_vidmem_bytes.saturating_sub(bytes);
            }
            u.live_allocations = u.live_allocations.saturating_sub(1);
            if release {
                u.frees += 1;
            }
        };
        self.rows(a.owner, a.cgroup_id, a.gpu, f);
        self.maybe_drop_cgroup(a.cgroup_id);
    }

    /// Drop one reference to an allocation: release it with the last one, or move the charge if
    /// the owner no longer refers to it.
    pub(super) fn drop_ref(&mut self, id: AllocId, r: ObjRef, cause: Cause) {
        let Some(a) = self.allocs.get_mut(&id) else { return };
        a.refs.retain(|x| *x != r);
        if a.refs.is_empty() {
            let Some(a) = self.allocs.remove(&id) else { return };
            self.uncharge(&a, true);
            self.counters.frees += 1;
            *self.counters.released_by.entry(cause.as_str()).or_default() += 1;
            self.released_any = true;
            if a.bucket != Bucket::VaOnly {
                self.released_bytes = self.released_bytes.saturating_add(a.bytes);
            }
            return;
        }
        if a.owner == r.tgid && !a.refs.iter().any(|x| x.tgid == a.owner) {
            let new_owner = a.refs[0].tgid;
            let old = a.clone();
            self.uncharge(&old, false);
            let cgroup_id = self.processes.get(&new_owner).map_or(old.cgroup_id, |p| p.cgroup_id);
            if let Some(a) = self.allocs.get_mut(&id) {
                a.owner = new_owner;
                a.cgroup_id = cgroup_id;
                let moved = a.clone();
                self.charge(&moved, false);
                self.counters.ownership_transfers += 1;
            }
        }
    }

    // ---- RM handles ----

    /// The process that holds `client`: the caller if it does, else the recorded owner.
    pub(super) fn client_holder(&self, tgid: u32, client: u32) -> Option<u32> {
        if self.processes.get(&tgid).is_some_and(|p| p.clients.contains_key(&client)) {
            return Some(tgid);
        }
        let owner = *self.client_owner.get(&client)?;
        self.processes.get(&owner).filter(|p| p.clients.contains_key(&client)).map(|_| owner)
    }

    /// Free `handle` (and descendants) of `client` held by `owner`. `forced` overrides the cause.
    pub(super) fn free_in(&mut self, owner: u32, client: u32, handle: u32, forced: Option<Cause>) -> bool {
        let Some(removed) = self.processes.get_mut(&owner).and_then(|p| p.remove_subtree(client, handle)) else {
            return false;
        };
        if handle == client && self.client_owner.get(&client) == Some(&owner) {
            self.client_owner.remove(&client);
        }
        for (h, a) in removed {
            let cause = forced.unwrap_or(if handle == client {
                Cause::ClientFree
            } else if h == handle {
                Cause::Free
            } else {
                Cause::ParentFree
            });
            self.drop_ref(a, ObjRef { tgid: owner, client, handle: h }, cause);
        }
        true
    }

    pub(super) fn free_handle(&mut self, tgid: u32, client: u32, handle: u32) {
        let freed = match self.client_holder(tgid, client) {
            Some(owner) => self.free_in(owner, client, handle, None),
            None => false,
        };
        if !freed {
            self.counters.unknown_handle_frees += 1;
        }
    }

    /// Make room for a new `handle` in `client` of `tgid` (replacing a stale one) and make sure the
    /// client exists. Returns false if the handle table is full.
    pub(super) fn prepare_object(&mut self, tgid: u32, dev: &Device, client: u32, handle: u32) -> bool {
        let file_id = (dev.kind == DeviceKind::Ctl).then_some(dev.file_id);
        let max = self.cfg.max_handles_per_process;
        let exists = self
            .processes
            .get(&tgid)
            .and_then(|p| p.clients.get(&client))
            .is_some_and(|c| c.objects.contains_key(&handle));
        if exists {
            self.counters.stale_handles_replaced += 1;
            self.free_in(tgid, client, handle, Some(Cause::Replaced));
        }
        let Some(p) = self.processes.get_mut(&tgid) else { return false };
        if !p.ensure_client(client, file_id, max) {
            return false;
        }
        self.client_owner.entry(client).or_insert(tgid);
        true
    }

    /// A new RM object, optionally with memory.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new_object(
        &mut self,
        tgid: u32,
        dev: &Device,
        client: u32,
        parent: u32,
        handle: u32,
        class: Option<u32>,
        memory: Option<MemoryAlloc>,
        device_instance: Option<u32>,
    ) {
        if let Some(c) = class
            && class::is_root(c)
        {
            self.new_client(tgid, dev, handle, c);
            return;
        }
        // An object cannot be its own parent, nor replace its client.
        let parent = if parent == handle { client } else { parent };
        if handle == client {
            return;
        }
        let max = self.cfg.max_handles_per_process;
        let inserted = self.prepare_object(tgid, dev, client, handle)
            && self.processes.get_mut(&tgid).is_some_and(|p| {
                let mut o = Object::new(Some(parent), class);
                o.device_instance = device_instance;
                p.insert_object(client, parent, handle, o, max)
            });
        if !inserted {
            self.counters.handle_table_full += 1;
            if memory.is_some() {
                self.counters.untracked_allocations += 1;
            }
            return;
        }
        let Some(mut m) = memory else { return };
        if m.bytes > MAX_PLAUSIBLE_ALLOCATION_BYTES {
            // The size read back from user memory is garbage (e.g. rewritten by another thread
            // during the call): keep the object so its free matches, but charge nothing.
            self.counters.implausible_sizes += 1;
            m.bytes = 0;
        }
        let deviceless = class == Some(class::NV01_MEMORY_DEVICELESS);
        let (gpu, inferred) = self.attribute(tgid, client, handle, deviceless);
        let cgroup_id = self.processes.get(&tgid).map_or(0, |p| p.cgroup_id);
        let id = self.next_alloc;
        self.next_alloc += 1;
        let a = Allocation {
            bytes: m.bytes,
            bucket: Bucket::of(&m),
            gpu,
            inferred,
            owner: tgid,
            cgroup_id,
            refs: vec![ObjRef { tgid, client, handle }],
        };
        self.charge(&a, true);
        self.allocs.insert(id, a);
        self.counters.allocations += 1;
        if let Some(o) = self
            .processes
            .get_mut(&tgid)
            .and_then(|p| p.clients.get_mut(&client))
            .and_then(|c| c.objects.get_mut(&handle))
        {
            o.alloc = Some(id);
        }
    }

    pub(super) fn new_client(&mut self, tgid: u32, dev: &Device, handle: u32, class: u32) {
        // A client handle still tracked (here or in another process) was freed unseen.
        if let Some(owner) = self.client_holder(tgid, handle) {
            self.counters.stale_handles_replaced += 1;
            self.free_in(owner, handle, handle, Some(Cause::Replaced));
        }
        let file_id = (dev.kind == DeviceKind::Ctl).then_some(dev.file_id);
        let max = self.cfg.max_handles_per_process;
        let Some(p) = self.processes.get_mut(&tgid) else { return };
        if !p.ensure_client(handle, file_id, max) {
            self.counters.handle_table_full += 1;
            return;
        }
        if let Some(root) = p.clients.get_mut(&handle).and_then(|c| c.objects.get_mut(&handle)) {
            root.class = Some(class);
        }
        self.client_owner.insert(handle, tgid);
    }

    /// Which GPU bucket memory under `handle` goes to, and whether that was inferred.
    pub(super) fn attribute(&mut self, tgid: u32, client: u32, handle: u32, deviceless: bool) -> (Option<u32>, bool) {
        let Some(p) = self.processes.get(&tgid) else { return (None, false) };
        if !deviceless {
            let minors = p.gpu_minors();
            if let [only] = minors.as_slice()
                && let Some(m) = gpu_key(*only)
            {
                return (Some(m), false);
            }
            if let Some(Some(d)) = p.device_of(client, handle)
                && let Some(m) = gpu_key(d)
            {
                self.counters.inferred_gpu_attributions += 1;
                return (Some(m), true);
            }
        }
        self.counters.unknown_gpu_attributions += 1;
        (None, false)
    }

    pub(super) fn dup_object(
        &mut self,
        tgid: u32,
        dev: &Device,
        client: u32,
        parent: u32,
        handle: u32,
        src: (u32, u32),
    ) {
        let (src_client, src_handle) = src;
        let source = self.client_holder(tgid, src_client).and_then(|owner| {
            let o = self.processes.get(&owner)?.clients.get(&src_client)?.objects.get(&src_handle)?;
            Some((o.class, o.device_instance, o.alloc))
        });
        let (class, device_instance, alloc) = match source {
            Some(s) => s,
            None => {
                self.counters.dup_unknown_source += 1;
                (None, None, None)
            }
        };
        if class.is_some_and(class::is_root) || handle == client {
            return;
        }
        let parent = if parent == handle { client } else { parent };
        let max = self.cfg.max_handles_per_process;
        let inserted = self.prepare_object(tgid, dev, client, handle)
            && self.processes.get_mut(&tgid).is_some_and(|p| {
                let mut o = Object::new(Some(parent), class);
                o.device_instance = device_instance;
                p.insert_object(client, parent, handle, o, max)
            });
        if !inserted {
            self.counters.handle_table_full += 1;
            return;
        }
        // The source may have been the replaced handle itself (dup onto its own handle).
        let Some(id) = alloc.filter(|id| self.allocs.contains_key(id)) else { return };
        if let Some(a) = self.allocs.get_mut(&id) {
            a.refs.push(ObjRef { tgid, client, handle });
        }
        if let Some(o) = self
            .processes
            .get_mut(&tgid)
            .and_then(|p| p.clients.get_mut(&client))
            .and_then(|c| c.objects.get_mut(&handle))
        {
            o.alloc = Some(id);
        }
        self.counters.dup_references += 1;
    }

    /// Apply an ioctl of `tgid`, made in `record_cgroup` (the record's cgroup: used only when the
    /// process is not known, i.e. a count-only record read after the process's exit).
    pub(super) fn ioctl(&mut self, tgid: u32, record_cgroup: u64, e: &IoctlEvent) {
        let op_name = e.op.kind_name();
        *self.counters.ioctls_by_op.entry(op_name).or_default() += 1;
        *self.counters.ioctls_by_device.entry(e.device.kind.as_str()).or_default() += 1;
        let gpu_row = if e.device.kind == DeviceKind::Gpu { gpu_key(e.device.minor) } else { None };
        let cgroup_id = self.processes.get(&tgid).map_or(record_cgroup, |p| p.cgroup_id);
        self.count_rows(tgid, cgroup_id, gpu_row, |u| u.ioctls += 1);
        if let IoctlOp::RmControl { cmd, .. } = e.op {
            let max = self.cfg.max_control_cmds;
            let table = &mut self.counters.rm_control_by_cmd;
            if let Some(n) = table.get_mut(&cmd) {
                *n += 1;
            } else if table.len() < max {
                table.insert(cmd, 1);
            } else {
                self.counters.rm_control_other += 1;
            }
        }
        if let IoctlOp::Malformed { reason, .. } = e.op {
            *self.counters.malformed_by_reason.entry(reason.as_str()).or_default() += 1;
            return;
        }
        if !e.succeeded() {
            *self.counters.failed_by_op.entry(op_name).or_default() += 1;
            self.count_rows(tgid, cgroup_id, gpu_row, |u| u.failed_calls += 1);
            return;
        }
        let dev = &e.device;
        match e.op {
            IoctlOp::RmAlloc { client, parent, handle, class, memory, device_instance, .. } => {
                self.new_object(tgid, dev, client, parent, handle, Some(class), memory, device_instance);
            }
            IoctlOp::AllocMemory { client, parent, handle, class, memory, .. } => {
                self.new_object(tgid, dev, client, parent, handle, Some(class), Some(memory), None);
            }
            IoctlOp::VidHeapAlloc { client, parent, handle, bytes, virtual_only, location, .. } => {
                let kind = if virtual_only { MemoryKind::VirtualOnly } else { MemoryKind::Physical };
                let m = MemoryAlloc { bytes, location, kind };
                self.new_object(tgid, dev, client, parent, handle, None, Some(m), None);
            }
            IoctlOp::RmFree { client, handle, .. } | IoctlOp::VidHeapFree { client, handle, .. } => {
                self.free_handle(tgid, client, handle);
            }
            IoctlOp::RmDupObject { client, parent, handle, src_client, src_handle, .. } => {
                self.dup_object(tgid, dev, client, parent, handle, (src_client, src_handle));
            }
            IoctlOp::UvmMapExternal { .. } => self.counters.uvm_map_external += 1,
            IoctlOp::UvmUnmapExternal { .. } => self.counters.uvm_unmap_external += 1,
            IoctlOp::UvmFree { .. } => self.counters.uvm_free += 1,
            _ => {}
        }
    }

    /// Count on the process, its current cgroup, a GPU row (only for ioctls on a GPU node) and the
    /// total (without a process: the cgroup's row if it has one, the GPU row and the total). Counts
    /// are not byte buckets: the GPU rows do not sum to the total.
    pub(super) fn count_rows(&mut self, tgid: u32, cgroup_id: u64, gpu: Option<u32>, f: impl Fn(&mut Usage)) {
        if let Some(p) = self.processes.get_mut(&tgid) {
            f(&mut p.usage);
        }
        match self.processes.get(&tgid).map(|p| p.last_ktime) {
            Some(ktime) => f(&mut self.cgroup_mut(cgroup_id, ktime).usage),
            // A record read after its process's exit: its cgroup's row, if it still has one (a
            // row dropped with its removed cgroup is not brought back).
            None => {
                if let Some(c) = self.cgroups.get_mut(&cgroup_id) {
                    f(&mut c.usage);
                }
            }
        }
        if gpu.is_some() {
            f(self.gpus.entry(gpu).or_default());
        }
        f(&mut self.totals);
    }
}
