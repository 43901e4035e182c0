use super::*;

fn key(cg: u64, tgid: u32, entry: u32) -> CudaCountKey {
    CudaCountKey { cgroup_id: cg, tgid, entry }
}

#[test]
fn live_bytes_follow_alloc_free_and_exit() {
    let mut l = CudaLedger::default();
    l.alloc(10, 5, cuda_entry::MEM_ALLOC, 0, 0x1000, 1 << 20);
    l.alloc(10, 5, cuda_entry::MEM_ALLOC_MANAGED, 0, 0x2000, 1 << 21);
    l.alloc(10, 5, cuda_entry::MEM_ALLOC, 2, 0, 1 << 30); // CUDA_ERROR_OUT_OF_MEMORY
    l.alloc(11, 6, cuda_entry::MEM_ALLOC_HOST, 0, 0x3000, 4096);
    let s = l.snapshot(&mut |_| None);
    assert_eq!(s.totals.device_bytes, 1 << 20);
    assert_eq!(s.totals.managed_bytes, 1 << 21);
    assert_eq!(s.totals.host_bytes, 4096);
    assert_eq!(s.totals.failed_allocs, 1);
    assert_eq!(l.free(10, 0x1000), Some(1 << 20));
    assert_eq!(l.free(10, 0x1000), None, "double free is unknown");
    l.process_exit(11);
    let s = l.snapshot(&mut |_| None);
    assert_eq!((s.totals.device_bytes, s.totals.host_bytes, s.unknown_frees), (0, 0, 1));
    // The exited process's allocation count stays with its cgroup.
    let cg6 = s.cgroups.iter().find(|c| c.cgroup_id == 6).unwrap();
    assert_eq!(cg6.usage.allocs, 1);
    assert_eq!(s.totals.managed_bytes, 1 << 21);
}

#[test]
fn counts_survive_process_exit_in_their_cgroup_and_rates_are_deltas() {
    let mut l = CudaLedger::default();
    l.update_counts(vec![
        (key(5, 10, cuda_entry::LAUNCH_KERNEL), CudaCount { calls: 100, bytes: 0 }),
        (key(5, 10, cuda_entry::GRAPH_LAUNCH), CudaCount { calls: 3, bytes: 0 }),
        (key(6, 11, cuda_entry::LAUNCH_KERNEL_PTSZ), CudaCount { calls: 7, bytes: 0 }),
    ]);
    std::thread::sleep(std::time::Duration::from_millis(210));
    l.update_counts(vec![(key(5, 10, cuda_entry::LAUNCH_KERNEL), CudaCount { calls: 200, bytes: 0 })]);
    let rate =
        |l: &CudaLedger| l.snapshot(&mut |_| None).cgroups.iter().find(|c| c.cgroup_id == 5).unwrap().usage.launch_rate;
    let r = rate(&l);
    assert!(r > 0.0);
    // A second read right after (one snapshot reads twice) keeps the window's rate.
    l.update_counts(vec![(key(5, 10, cuda_entry::LAUNCH_KERNEL), CudaCount { calls: 200, bytes: 0 })]);
    assert_eq!(rate(&l), r);
    let s = l.snapshot(&mut |id| Some(format!("/cg{id}")));
    let cg5 = s.cgroups.iter().find(|c| c.cgroup_id == 5).unwrap();
    assert_eq!((cg5.usage.launches, cg5.usage.graph_launches), (200, 3));
    assert_eq!(cg5.path.as_deref(), Some("/cg5"));
    l.process_exit(10);
    let s = l.snapshot(&mut |_| None);
    let cg5 = s.cgroups.iter().find(|c| c.cgroup_id == 5).unwrap();
    assert_eq!(cg5.usage.launches, 200, "exited counts stay with the cgroup");
    assert_eq!(cg5.usage.launch_rate, 0.0, "an exited process launches nothing");
    assert!(s.processes.iter().all(|p| p.tgid != 10));
    assert_eq!(s.calls_by_entry.get("cuLaunchKernel_ptsz"), Some(&7));
}

/// A removed cgroup's row goes once its processes have exited (at once when none is left, at the
/// last exit otherwise); what it counted stays in the totals and per entry point, which never go
/// down.
#[test]
fn a_removed_cgroup_leaves_no_row_and_the_totals_keep_its_counts() {
    let mut l = CudaLedger::default();
    l.update_counts(vec![
        (key(5, 10, cuda_entry::LAUNCH_KERNEL), CudaCount { calls: 100, bytes: 0 }),
        (key(6, 11, cuda_entry::LAUNCH_KERNEL), CudaCount { calls: 7, bytes: 0 }),
        (key(6, 12, cuda_entry::GRAPH_LAUNCH), CudaCount { calls: 2, bytes: 0 }),
    ]);
    l.alloc(10, 5, cuda_entry::MEM_ALLOC, 0, 0x1000, 4096);
    l.alloc(11, 6, cuda_entry::MEM_ALLOC, 0, 0x2000, 4096);
    let before = l.snapshot(&mut |_| None);
    // Cgroup 5: its process exits, then the cgroup is removed: the row goes at once.
    l.process_exit(10);
    l.cgroup_removed(5);
    // Cgroup 6: removed while its processes are still in the ledger (their exits are read later).
    l.cgroup_removed(6);
    assert_eq!(l.removed_pending(), 1);
    let s = l.snapshot(&mut |_| None);
    assert_eq!(s.cgroups.iter().map(|c| c.cgroup_id).collect::<Vec<_>>(), [6]);
    l.process_exit(11);
    assert_eq!(l.removed_pending(), 1, "process 12 of cgroup 6 is still there");
    l.process_exit(12);
    assert_eq!(l.removed_pending(), 0);
    let after = l.snapshot(&mut |_| None);
    assert!(after.cgroups.is_empty() && after.processes.is_empty(), "{after:?}");
    assert!(l.is_empty());
    assert_eq!(
        (after.totals.launches, after.totals.graph_launches, after.totals.allocs, after.totals.frees),
        (before.totals.launches, before.totals.graph_launches, before.totals.allocs, before.totals.frees)
    );
    assert_eq!((after.totals.launches, after.totals.allocs), (107, 2));
    assert_eq!(after.calls_by_entry, before.calls_by_entry);
    // A removal for a cgroup the ledger never saw is nothing.
    l.cgroup_removed(99);
    assert_eq!(l.removed_pending(), 0);
}
