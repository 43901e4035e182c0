//! What the state shows: the ledger as a [`Snapshot`] (per process, cgroup and GPU, and the
//! totals), and the check that its sums agree.
use super::*;

impl TracerState {
    /// The state at this moment.
    pub fn snapshot(&self) -> Snapshot {
        let mut processes: Vec<ProcessRow> = self
            .processes
            .values()
            .map(|p| ProcessRow {
                tgid: p.key.tgid,
                start_time_ticks: p.key.start_time_ticks,
                comm: p.comm.clone(),
                cgroup_id: p.cgroup_id,
                fds: p.fds.len(),
                gpu_minors: p.gpu_minors(),
                clients: p.clients.len(),
                handles: p.handles,
                usage: p.usage,
                completeness: p.completeness,
            })
            .collect();
        processes.sort_by_key(|p| p.tgid);
        // Completeness of cgroups, GPUs and the totals: over their live processes.
        let mut by_cgroup: HashMap<u64, Completeness> = HashMap::new();
        let mut by_gpu: HashMap<Option<u32>, Completeness> = HashMap::new();
        let mut total = Completeness::default();
        for p in &processes {
            by_cgroup.entry(p.cgroup_id).or_default().merge(&p.completeness);
            for m in &p.gpu_minors {
                by_gpu.entry(Some(*m)).or_default().merge(&p.completeness);
            }
            total.merge(&p.completeness);
        }
        by_gpu.insert(None, total);
        let mut cgroups: Vec<CgroupRow> = self
            .cgroups
            .iter()
            .map(|(&id, c)| CgroupRow {
                cgroup_id: id,
                path: c.path.clone(),
                processes: c.processes,
                removed: c.removed,
                usage: c.usage,
                completeness: by_cgroup.get(&id).copied().unwrap_or_default(),
            })
            .collect();
        cgroups.sort_by_key(|c| c.cgroup_id);
        let mut gpus: Vec<GpuRow> = self
            .gpus
            .iter()
            .map(|(&minor, &usage)| GpuRow {
                minor,
                usage,
                completeness: by_gpu.get(&minor).copied().unwrap_or_default(),
            })
            .collect();
        // A GPU whose ledger holds nothing yet, used by a process whose ledger is incomplete,
        // still gets a row: its zero is not known to be a zero.
        for (minor, c) in &by_gpu {
            if !c.exact() && !self.gpus.contains_key(minor) {
                gpus.push(GpuRow { minor: *minor, usage: Usage::default(), completeness: *c });
            }
        }
        // Minors in order, the unknown bucket last.
        gpus.sort_by_key(|g| (g.minor.is_none(), g.minor));
        Snapshot {
            totals: Totals {
                usage: self.totals,
                processes: self.processes.len(),
                cgroups: self.cgroups.len(),
                live_allocations: self.allocs.len(),
                completeness: total,
            },
            cgroups,
            processes,
            gpus,
            counters: self.counters.clone(),
        }
    }

    #[cfg(test)]
    /// Check that every byte bucket adds up across processes, cgroups, GPUs and the total, and
    /// agrees with the live allocations. Returns the first discrepancy.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        type Field = (&'static str, fn(&Usage) -> u64);
        let fields: [Field; 6] = [
            ("vidmem_bytes", |u| u.vidmem_bytes),
            ("sysmem_bytes", |u| u.sysmem_bytes),
            ("va_reserved_bytes", |u| u.va_reserved_bytes),
            ("managed_bytes", |u| u.managed_bytes),
            ("inferred_vidmem_bytes", |u| u.inferred_vidmem_bytes),
            ("live_allocations", |u| u.live_allocations),
        ];
        for (name, f) in fields {
            let total = f(&self.totals) as u128;
            let p: u128 = self.processes.values().map(|p| f(&p.usage) as u128).sum();
            let c: u128 = self.cgroups.values().map(|c| f(&c.usage) as u128).sum();
            let g: u128 = self.gpus.values().map(|u| f(u) as u128).sum();
            if p != total || c != total || g != total {
                return Err(format!("{name}: processes {p}, cgroups {c}, gpus {g}, total {total}"));
            }
        }
        let mut by_bucket = [0u128; 3];
        for a in self.allocs.values() {
            by_bucket[a.bucket as usize] += a.bytes as u128;
            if a.refs.is_empty() {
                return Err("a live allocation without references".into());
            }
            if !self.processes.contains_key(&a.owner) {
                return Err(format!("allocation charged to gone process {}", a.owner));
            }
        }
        let t = &self.totals;
        if by_bucket != [t.vidmem_bytes as u128, t.sysmem_bytes as u128, t.va_reserved_bytes as u128] {
            return Err(format!("allocations {by_bucket:?} vs totals {t:?}"));
        }
        if self.allocs.len() as u64 != t.live_allocations {
            return Err(format!("{} allocations vs {} live", self.allocs.len(), t.live_allocations));
        }
        let managed: u128 = self.processes.values().flat_map(|p| p.managed.values()).map(|m| m.len as u128).sum();
        if managed != t.managed_bytes as u128 {
            return Err(format!("managed mappings {managed} vs total {}", t.managed_bytes));
        }
        for (&id, c) in &self.cgroups {
            let n = self.processes.values().filter(|p| p.cgroup_id == id).count();
            if n != c.processes {
                return Err(format!("cgroup {id}: {} processes counted, {n} live", c.processes));
            }
        }
        Ok(())
    }

    // ---- processes and cgroups ----
}
