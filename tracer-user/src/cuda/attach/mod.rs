//! Finding libcuda and attaching the `cuda` family's uprobes to it.
//!
//! A uprobe on a file covers every process that maps that inode, so each distinct library inode is
//! attached once, whatever path reaches it. Each entry point is placed where the kernel can emulate
//! the probed instruction (`placement`), with the entry id as the attach cookie. A symbol a library
//! lacks is reported, not fatal.
use std::{
    collections::HashSet,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeLinkId, UProbeScope},
    },
};
use serde::Serialize;
use tracer_common::{cuda_entry, prog_names};

use super::placement;

/// Where libcuda is looked for when `cuda_libraries` is empty: distribution paths, the NVIDIA
/// container toolkit's, and the GPU operator's driver container.
pub const SEARCH_PATHS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
    "/usr/local/cuda/compat/libcuda.so.1",
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/run/nvidia/driver/usr/lib64/libcuda.so.1",
];

/// Why libcuda could not be probed. The messages are what `doctor` and the logs show.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// No library to probe: none configured and none at [`SEARCH_PATHS`]. Expected on a node
    /// without the CUDA driver library; not a fault of the probes.
    #[error("no libcuda.so.1 found (searched {}); set `cuda_libraries` in the config", searched.join(", "))]
    NoLibrary { searched: &'static [&'static str] },
    /// The library file cannot be examined.
    #[error("{}: {error}", path.display())]
    Stat { path: PathBuf, error: std::io::Error },
    /// The library file cannot be read.
    #[error("reading {}: {error}", path.display())]
    Read { path: PathBuf, error: std::io::Error },
    /// No entry point of this library could be attached (`why`: the first few failures).
    #[error("no entry point of {} could be attached: {why}", path.display())]
    NoEntryPoint { path: PathBuf, why: String },
    /// Of all the libraries, no entry point could be attached (`why`: the first few failures).
    #[error("no libcuda entry point could be attached: {why}")]
    NothingAttached { why: String },
}

impl AttachError {
    /// A short label for logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            AttachError::NoLibrary { .. } => "no_library",
            AttachError::Stat { .. } => "stat",
            AttachError::Read { .. } => "read",
            AttachError::NoEntryPoint { .. } => "no_entry_point",
            AttachError::NothingAttached { .. } => "nothing_attached",
        }
    }

    /// True when there was nothing to probe (no library), as opposed to probes that failed.
    pub fn is_nothing_to_probe(&self) -> bool {
        matches!(self, AttachError::NoLibrary { .. })
    }
}

/// How one entry point fared.
#[derive(Clone, Debug, Serialize)]
pub struct EntryReport {
    pub symbol: &'static str,
    /// `attached`, `missing` (the library lacks it) or `failed`.
    pub status: &'static str,
    pub detail: String,
}

/// How one library fared.
#[derive(Clone, Debug, Serialize)]
pub struct LibraryReport {
    pub path: String,
    pub inode: u64,
    pub entries: Vec<EntryReport>,
}

impl LibraryReport {
    pub fn attached(&self) -> usize {
        self.entries.iter().filter(|e| e.status == "attached").count()
    }
}

/// The libraries to attach to: the configured ones, else those of [`SEARCH_PATHS`] that exist.
pub fn library_candidates(configured: &[PathBuf]) -> Vec<PathBuf> {
    if !configured.is_empty() {
        return configured.to_vec();
    }
    SEARCH_PATHS.iter().map(PathBuf::from).filter(|p| p.exists()).collect()
}

fn load<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe, String> {
    let p: &mut UProbe = ebpf
        .program_mut(name)
        .ok_or_else(|| format!("program {name} missing from the object (build mismatch)"))?
        .try_into()
        .map_err(|e| format!("{name}: {e}"))?;
    if p.fd().is_err() {
        p.load().map_err(|e| format!("loading {name}: {e:#}"))?;
    }
    Ok(p)
}

/// The uprobe links of one library, so they can be detached when no process uses it any more.
pub type Links = Vec<(&'static str, UProbeLinkId)>;

fn attach_at(
    ebpf: &mut Ebpf,
    links: &mut Links,
    prog: &'static str,
    lib: &Path,
    offset: u64,
    entry: u32,
) -> Result<(), String> {
    let p = load(ebpf, prog)?;
    let point =
        UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: Some(entry as u64) };
    let id = p.attach(point, lib, UProbeScope::AllProcesses).map_err(|e| format!("attaching {prog}: {e:#}"))?;
    links.push((prog, id));
    Ok(())
}

/// Detach links attached with [`attach_library`] or [`attach_all`], all at once: each is taken
/// from its program and dropped on a thread of its own. Unregistering a uprobe waits for an RCU
/// grace period in the kernel (about 0.1 s on these kernels, measured in the bench's section 5c);
/// one after the other, a library's 35 took 3.8 s, while concurrent waits share grace periods.
/// Returns how many were detached.
pub fn detach(ebpf: &mut Ebpf, links: Links) -> usize {
    let owned = take_links(ebpf, links);
    let n = owned.len();
    drop_concurrently(owned);
    n
}

/// The owned links behind `links` (taken from their programs, so dropping one detaches it).
pub fn take_links(ebpf: &mut Ebpf, links: Links) -> Vec<UProbeLink> {
    let mut out = Vec::with_capacity(links.len());
    for (prog, id) in links {
        if let Some(Ok(p)) = ebpf.program_mut(prog).map(<&mut UProbe>::try_from)
            && let Ok(link) = p.take_link(id)
        {
            out.push(link);
        }
    }
    out
}

/// Drop (detach) `links` concurrently, one thread each; returns when all are detached. A thread
/// that cannot be started drops its link on the caller's thread instead.
pub fn drop_concurrently(links: Vec<UProbeLink>) {
    std::thread::scope(|s| {
        for link in links {
            // When the thread cannot start, the closure, and the link in it, is dropped right here.
            let _ = std::thread::Builder::new().name("uprobe-detach".into()).spawn_scoped(s, move || drop(link));
        }
    });
}

/// Attach every entry point of one library; returns its report and links. Fails when nothing
/// could be attached.
pub fn attach_library(ebpf: &mut Ebpf, lib: &Path) -> Result<(LibraryReport, Links), AttachError> {
    let md = std::fs::metadata(lib).map_err(|error| AttachError::Stat { path: lib.into(), error })?;
    let bytes = std::fs::read(lib).map_err(|error| AttachError::Read { path: lib.into(), error })?;
    let mut links = Links::new();
    let mut entries = Vec::new();
    for (id, symbol, action) in cuda_entry::ALL {
        let result = attach_entry(ebpf, &mut links, lib, &bytes, id, symbol, action);
        entries.push(match result {
            Ok(detail) => EntryReport { symbol, status: "attached", detail },
            Err((status, detail)) => EntryReport { symbol, status, detail },
        });
    }
    let report = LibraryReport { path: lib.display().to_string(), inode: md.ino(), entries };
    if report.attached() == 0 {
        let why: Vec<String> = report
            .entries
            .iter()
            .filter(|e| e.status == "failed")
            .map(|e| format!("{}: {}", e.symbol, e.detail))
            .take(3)
            .collect();
        detach(ebpf, links);
        return Err(AttachError::NoEntryPoint { path: lib.into(), why: why.join("; ") });
    }
    Ok((report, links))
}

/// Attach every entry point of every library (distinct inodes only). Returns the per-library
/// report and the links (for [`detach`]); an error only when nothing could be attached at all ([`AttachError::NoLibrary`] when
/// `libs` is empty).
pub fn attach_all(ebpf: &mut Ebpf, libs: &[PathBuf]) -> Result<(Vec<LibraryReport>, Links), AttachError> {
    if libs.is_empty() {
        return Err(AttachError::NoLibrary { searched: SEARCH_PATHS });
    }
    let mut seen = HashSet::new();
    let mut reports = Vec::new();
    let mut all_links = Links::new();
    let mut errors = Vec::new();
    for lib in libs {
        let md = match std::fs::metadata(lib) {
            Ok(m) => m,
            Err(error) => {
                errors.push(AttachError::Stat { path: lib.clone(), error }.to_string());
                continue;
            }
        };
        if !seen.insert((md.dev(), md.ino())) {
            continue; // another path to a library already attached
        }
        // The host's libraries stay attached for the agent's life; their links are kept so that
        // the end detaches them all at once (`detach`), not one by one as the programs drop.
        match attach_library(ebpf, lib) {
            Ok((report, links)) => {
                reports.push(report);
                all_links.extend(links);
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    if reports.iter().all(|r| r.attached() == 0) {
        let why: Vec<String> = reports
            .iter()
            .flat_map(|r| {
                r.entries.iter().filter(|e| e.status == "failed").map(|e| format!("{}: {}", e.symbol, e.detail))
            })
            .chain(errors)
            .take(3)
            .collect();
        return Err(AttachError::NothingAttached { why: why.join("; ") });
    }
    Ok((reports, all_links))
}

fn attach_entry(
    ebpf: &mut Ebpf,
    links: &mut Links,
    lib: &Path,
    bytes: &[u8],
    id: u32,
    symbol: &'static str,
    action: cuda_entry::Action,
) -> Result<String, (&'static str, String)> {
    let place = placement::place(bytes, symbol).map_err(|e| {
        let status = if e.is_missing_symbol() { "missing" } else { "failed" };
        (status, e.to_string())
    })?;
    let failed = |e: String| ("failed", e);
    match action {
        cuda_entry::Action::Count => {
            attach_at(ebpf, links, prog_names::CUDA_COUNT, lib, place.file_offset, id).map_err(failed)?
        }
        cuda_entry::Action::Free => {
            attach_at(ebpf, links, prog_names::CUDA_FREE, lib, place.file_offset, id).map_err(failed)?
        }
        cuda_entry::Action::Lookup => {
            attach_at(ebpf, links, prog_names::CUDA_LOOKUP_ENTER, lib, place.file_offset, id).map_err(failed)?;
            let ret = placement::place_for_return(bytes, symbol).map_err(|e| failed(e.to_string()))?;
            attach_at(ebpf, links, prog_names::CUDA_LOOKUP_RETURN, lib, ret.file_offset, id).map_err(failed)?;
        }
        cuda_entry::Action::Alloc | cuda_entry::Action::AllocPitch => {
            attach_at(ebpf, links, prog_names::CUDA_ALLOC_ENTER, lib, place.file_offset, id).map_err(failed)?;
            // A return probe hijacks the return address on the stack: it needs a point before any push.
            let ret = placement::place_for_return(bytes, symbol).map_err(|e| failed(e.to_string()))?;
            attach_at(ebpf, links, prog_names::CUDA_ALLOC_RETURN, lib, ret.file_offset, id).map_err(failed)?;
        }
    }
    Ok(placement::describe(&place))
}

#[cfg(test)]
mod tests;
