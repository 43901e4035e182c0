//! Late libcuda attach: a GPU process may use its own libcuda (a container image's copy, another
//! path or inode than the host's). The first time a process opens an NVIDIA device (libcuda is
//! mapped by then) its mappings are read and any libcuda inode not probed yet is probed through
//! `/proc/PID/root`; a copy is detached when the last process known to map it exits.
use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt,
    path::Path,
};

use crate::cuda::attach::{self, Links};
use tracer_core::model::{PipelineStats, probes::LibraryReport};

/// A library file, by (device, inode).
type Inode = (u64, u64);

/// The libcuda copies probed, and which GPU processes map the late ones.
#[derive(Default)]
pub(super) struct LateLibcuda {
    /// libcuda inodes probed (at start-up or later).
    inodes: HashSet<Inode>,
    /// Processes whose mappings were checked already.
    checked: HashSet<u32>,
    /// Reports of libcuda copies probed after start-up.
    pub(super) reports: Vec<LibraryReport>,
    /// Links of those copies, and the GPU processes seen mapping each (detached when all exit).
    links: HashMap<Inode, (Links, HashSet<u32>)>,
    /// Copies being detached on a thread of their own (a library's uprobes take seconds to
    /// unregister; the pipeline does not wait for them). A copy is attached again only once its
    /// detach has finished, so its calls are never counted twice.
    detaching: HashMap<Inode, std::thread::JoinHandle<()>>,
    /// Probe the timed entry points too (`Config::cuda_timed_calls`).
    timed: bool,
}

impl LateLibcuda {
    /// Knows the libraries probed at start-up, so they are not probed twice.
    pub(super) fn new<'a>(probed_at_start: impl IntoIterator<Item = &'a Path>, timed: bool) -> LateLibcuda {
        let inodes = probed_at_start
            .into_iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|md| (md.dev(), md.ino()))
            .collect();
        LateLibcuda { inodes, timed, ..Default::default() }
    }

    /// `tgid` opened an NVIDIA device: probe the libcuda copies it maps that are not probed yet
    /// (once per process). Calls it made before this point are not seen.
    pub(super) fn process_opened_device(
        &mut self,
        ebpf: &mut aya::Ebpf,
        backend: &attach::Backend,
        proc_root: &Path,
        tgid: u32,
        stats: &mut PipelineStats,
    ) {
        if !self.checked.insert(tgid) {
            return;
        }
        for through_root in crate::proc::mapped_libcuda(proc_root, tgid) {
            let Ok(md) = std::fs::metadata(&through_root) else { continue };
            let inode = (md.dev(), md.ino());
            if let Some((_, users)) = self.links.get_mut(&inode) {
                users.insert(tgid);
            }
            if !self.inodes.insert(inode) {
                continue;
            }
            if let Some(detaching) = self.detaching.remove(&inode) {
                // Rare: a copy detached a moment ago is mapped again. Its old probes go first.
                let _ = detaching.join();
            }
            match attach::attach_library(ebpf, backend, &through_root, self.timed) {
                Ok((report, links)) => {
                    stats.cuda_libraries_found += 1;
                    tracing::info!(tgid, path = %through_root.display(), method = report.method.as_str(), "probing a libcuda copy found in a process's mappings");
                    self.reports.push(report);
                    self.links.insert(inode, (links, [tgid].into_iter().collect()));
                }
                Err(e) => {
                    stats.cuda_library_errors += 1;
                    tracing::warn!(tgid, path = %through_root.display(), error = %e, "cannot probe libcuda copy");
                }
            }
        }
    }

    /// `tgid` exited: detach the copies no known GPU process maps any more (a new process mapping
    /// one is found again when it opens a device).
    pub(super) fn process_exited(&mut self, ebpf: Option<&mut aya::Ebpf>, tgid: u32, stats: &mut PipelineStats) {
        self.checked.remove(&tgid);
        let done: Vec<Inode> = self
            .links
            .iter_mut()
            .filter_map(|(inode, (_, users))| (users.remove(&tgid) && users.is_empty()).then_some(*inode))
            .collect();
        let mut ebpf = ebpf;
        for inode in done {
            if let Some((links, _)) = self.links.remove(&inode) {
                if let Some(e) = ebpf.as_deref_mut() {
                    let owned = attach::take_links(e, links);
                    self.detaching.retain(|_, h| !h.is_finished());
                    match std::thread::Builder::new()
                        .name("libcuda-detach".into())
                        .spawn(move || attach::drop_concurrently(owned))
                    {
                        Ok(h) => {
                            self.detaching.insert(inode, h);
                        }
                        // The closure, and the links in it, were dropped: detached on this thread.
                        Err(e) => tracing::warn!(error = %e, "detaching a libcuda copy on the pipeline thread"),
                    }
                }
                self.inodes.remove(&inode);
                stats.cuda_libraries_detached += 1;
            }
        }
    }
}
