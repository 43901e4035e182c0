//! Finding libcuda and attaching the `cuda` family's uprobes to it.
//!
//! A uprobe on a file covers every process that maps that inode, so each distinct library inode is
//! attached once, whatever path reaches it. Each entry point is placed where the kernel can emulate
//! the probed instruction (`placement`), with the entry id as the attach cookie. A symbol a library
//! lacks is reported, not fatal.
use std::{
    collections::HashSet,
    os::{
        fd::{AsFd, OwnedFd},
        unix::fs::MetadataExt,
    },
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeLinkId, UProbeScope},
    },
};
use tracer_common::{cuda_entry, prog_names};

use super::placement;
use tracer_core::{
    config::{CudaAttach, CudaEntryPrograms},
    model::probes::{EntryReport, FamilyStatus, LibraryReport, Method},
};

pub mod multi;
pub mod tracefs;
pub(crate) use multi::MultiPrograms;

/// Where libcuda is looked for when `cuda_libraries` is empty: distribution paths, the NVIDIA
/// container toolkit's, and the GPU operator's driver container; Debian's multiarch directory is
/// the build's architecture's.
pub const SEARCH_PATHS: &[&str] = &[
    #[cfg(not(target_arch = "aarch64"))]
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    #[cfg(target_arch = "aarch64")]
    "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
    "/usr/local/cuda/compat/libcuda.so.1",
    #[cfg(not(target_arch = "aarch64"))]
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    #[cfg(target_arch = "aarch64")]
    "/run/nvidia/driver/usr/lib/aarch64-linux-gnu/libcuda.so.1",
    "/run/nvidia/driver/usr/lib64/libcuda.so.1",
];

/// Why libcuda could not be probed. The messages are what `doctor` and the logs show.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AttachError {
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
    #[cfg(test)]
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

    /// The cuda family's status after this error: nothing to probe (no libcuda on this node) or
    /// failed.
    pub(crate) fn family_status(&self) -> FamilyStatus {
        if self.is_nothing_to_probe() {
            FamilyStatus::NothingToProbe { error: self.to_string() }
        } else {
            FamilyStatus::Failed { error: self.to_string() }
        }
    }

    /// True when there was nothing to probe (no library), as opposed to probes that failed.
    pub(crate) fn is_nothing_to_probe(&self) -> bool {
        matches!(self, AttachError::NoLibrary { .. })
    }
}

/// The libraries to attach to: the configured ones, else those of [`SEARCH_PATHS`] that exist.
pub(crate) fn library_candidates(configured: &[PathBuf]) -> Vec<PathBuf> {
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

/// How [`attach_library`] attaches: the cuda programs loaded for multi links, or why not.
pub enum Backend {
    /// Multi links; when the kernel refuses one and `fallback` is set, perf events instead.
    Multi { programs: MultiPrograms, fallback: bool },
    /// Perf events only; `why` not multi links; `entries`: which entry programs.
    Perf { why: String, entries: EntryPrograms },
}

/// The entry probes' programs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryPrograms {
    /// One program per shape (`cuda_count`, `cuda_alloc_enter`, …), the entry id as the attach
    /// cookie: wherever the kernel has `bpf_get_attach_cookie` (Linux 5.15+).
    Shared,
    /// One program per entry point, its id a constant (`prog_names::CUDA_PER_ENTRY`), attached
    /// without a cookie; `why`: the kernel refused the cookie programs.
    PerEntry { why: String },
}

impl EntryPrograms {
    /// Shared where the kernel loads the cookie programs; per entry point where it has no
    /// `bpf_get_attach_cookie` (helper 174: the verifier says `unknown func` / `unknown#174`, and
    /// aya's probe agrees). Any other load failure is returned: it is not the helper.
    pub fn choose(ebpf: &mut Ebpf) -> Result<EntryPrograms, String> {
        match load(ebpf, prog_names::CUDA_COUNT) {
            Ok(_) => Ok(EntryPrograms::Shared),
            Err(e) if no_cookie_helper(&e, aya::features().bpf_cookie()) => Ok(EntryPrograms::PerEntry {
                why: "one program per entry point: this kernel has no bpf_get_attach_cookie (Linux 5.15+)".into(),
            }),
            Err(e) => Err(e),
        }
    }

    /// The program for entry point `id`'s entry probe whose shared program is `shared`.
    fn entry_program(&self, id: u32, shared: &'static str) -> &'static str {
        match self {
            EntryPrograms::Shared => shared,
            EntryPrograms::PerEntry { .. } => prog_names::CUDA_PER_ENTRY[id as usize],
        }
    }

    /// The attach cookie of entry point `id`'s probes.
    fn cookie(&self, id: u32) -> Option<u64> {
        match self {
            EntryPrograms::Shared => Some(id as u64),
            EntryPrograms::PerEntry { .. } => None,
        }
    }
}

/// Why multi-uprobe links could not be had, in one line for `doctor` and the report (the
/// verifier's log stays in the debug log).
fn multi_refused(load_error: &str) -> String {
    format!("no multi-uprobe links: {}", crate::bpf::load_failure_in_one_line(load_error))
}

/// Does this load failure of a cookie program mean the kernel lacks `bpf_get_attach_cookie`? The
/// verifier's own words for a helper it does not know, or aya's feature probe saying so.
fn no_cookie_helper(load_error: &str, probe_says_supported: bool) -> bool {
    load_error.contains("unknown#174") || (load_error.contains("invalid func") && !probe_says_supported)
}

impl Backend {
    /// The backend `setting` asks for on this kernel. `ebpf` is the loaded object (none of its maps
    /// taken yet). An error only when multi links are required and cannot be had.
    pub fn new(
        setting: CudaAttach,
        entry_programs: CudaEntryPrograms,
        ebpf: &mut Ebpf,
        object: &[u8],
    ) -> Result<Backend, String> {
        if entry_programs == CudaEntryPrograms::PerEntry {
            if setting == CudaAttach::UprobeMulti {
                return Err("cuda_entry_programs = \"per-entry\" attaches perf events, not multi-uprobe links: \
                            set cuda_attach = \"auto\" or \"perf-event\""
                    .into());
            }
            let why = "one program per entry point: cuda_entry_programs = \"per-entry\"".to_string();
            return Ok(Backend::Perf {
                why: "cuda_entry_programs = \"per-entry\"".into(),
                entries: EntryPrograms::PerEntry { why },
            });
        }
        let perf = |why: String, ebpf: &mut Ebpf| -> Result<Backend, String> {
            let entries = EntryPrograms::choose(ebpf)?;
            if let EntryPrograms::PerEntry { why } = &entries {
                tracing::info!(form = %why, "libcuda entry probes without attach cookies");
            }
            Ok(Backend::Perf { why, entries })
        };
        match setting {
            CudaAttach::PerfEvent => perf("cuda_attach = \"perf-event\"".into(), ebpf),
            CudaAttach::UprobeMulti => MultiPrograms::load(object, ebpf)
                .map(|programs| Backend::Multi { programs, fallback: false })
                .map_err(|e| format!("cuda_attach = \"uprobe-multi\", but {e} (needs Linux 6.6+)")),
            CudaAttach::Auto => match MultiPrograms::load(object, ebpf) {
                Ok(programs) => Ok(Backend::Multi { programs, fallback: true }),
                Err(e) => {
                    tracing::debug!(error = %e, "loading the cuda programs for multi-uprobe links");
                    let why = multi_refused(&e);
                    tracing::info!(why = %why, "no multi-uprobe links on this kernel: one perf event per libcuda probe");
                    perf(why, ebpf)
                }
            },
        }
    }

    /// A backend without multi links, for tests and tools that never attach.
    pub fn perf(why: &str) -> Backend {
        Backend::Perf { why: why.into(), entries: EntryPrograms::Shared }
    }

    /// The entry programs a perf-event attach uses (multi links, on 6.6+, always have cookies).
    fn entries(&self) -> &EntryPrograms {
        match self {
            Backend::Perf { entries, .. } => entries,
            Backend::Multi { .. } => &EntryPrograms::Shared,
        }
    }
}

/// The uprobe links of one library (or of several), so they can be detached when no process uses
/// it any more: perf-event links, still owned by their programs, and multi links.
#[derive(Default)]
pub struct Links {
    perf: Vec<(&'static str, UProbeLinkId)>,
    multi: Vec<OwnedFd>,
    tracefs: Vec<tracefs::TracefsProbe>,
}

impl Links {
    /// Kernel links held: one per perf-event probe (tracefs ones too), one per program for multi
    /// links.
    pub fn len(&self) -> usize {
        self.perf.len() + self.multi.len() + self.tracefs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn extend(&mut self, other: Links) {
        self.perf.extend(other.perf);
        self.multi.extend(other.multi);
        self.tracefs.extend(other.tracefs);
    }
}

/// A link that detaches when dropped.
#[allow(dead_code, reason = "each link is held for its Drop, which detaches it")]
pub(crate) enum OwnedLink {
    Perf(UProbeLink),
    Multi(OwnedFd),
    /// Also removes its trace event from tracefs.
    Tracefs(tracefs::TracefsProbe),
}

/// Detach links attached with [`attach_library`] or [`attach_all`], all at once: each is taken
/// from its program and dropped on a thread of its own. Unregistering uprobes waits for an RCU
/// grace period in the kernel (about 0.1 s on these kernels, measured in the bench's section 5c):
/// once per perf-event probe (a library's 35 took 3.8 s one after the other, 3.0 s all at once:
/// the kernel unregisters them one at a time under `event_mutex`), once per multi link. Returns
/// how many links were detached.
pub fn detach(ebpf: &mut Ebpf, links: Links) -> usize {
    let owned = take_links(ebpf, links);
    let n = owned.len();
    drop_concurrently(owned);
    n
}

/// The owned links behind `links` (taken from their programs, so dropping one detaches it).
pub(crate) fn take_links(ebpf: &mut Ebpf, links: Links) -> Vec<OwnedLink> {
    let mut out = Vec::with_capacity(links.len());
    for (prog, id) in links.perf {
        if let Some(Ok(p)) = ebpf.program_mut(prog).map(<&mut UProbe>::try_from)
            && let Ok(link) = p.take_link(id)
        {
            out.push(OwnedLink::Perf(link));
        }
    }
    out.extend(links.multi.into_iter().map(OwnedLink::Multi));
    out.extend(links.tracefs.into_iter().map(OwnedLink::Tracefs));
    out
}

/// Drop (detach) `links` concurrently, one thread each; returns when all are detached. A thread
/// that cannot be started drops its link on the caller's thread instead. On kernels without perf
/// links (before 5.15: a perf-event uprobe's program goes with the event when it is closed) one
/// after the other: closing them from several threads at once locked 5.10 up in the guest (soft
/// lockups on both CPUs and an RCU stall for minutes, `uprobe-detach` threads and the caller).
pub(crate) fn drop_concurrently(links: Vec<OwnedLink>) {
    if !aya::features().bpf_perf_link() {
        for link in links {
            drop(link);
        }
        return;
    }
    std::thread::scope(|s| {
        for link in links {
            // When the thread cannot start, the closure, and the link in it, is dropped right here.
            let _ = std::thread::Builder::new().name("uprobe-detach".into()).spawn_scoped(s, move || drop(link));
        }
    });
}

/// One uprobe: the program and the file offset it goes at.
type Probe = (&'static str, u64);

/// Where one entry point's probes go; their cookie is the entry id.
struct Planned {
    id: u32,
    symbol: &'static str,
    /// Placed: the probes and the placement's description; not: (`missing`|`failed`, why).
    placed: Result<(Vec<Probe>, String), (&'static str, String)>,
}

fn plan(bytes: &[u8], id: u32, symbol: &'static str, action: cuda_entry::Action, entries: &EntryPrograms) -> Planned {
    let enter = |shared: &'static str| entries.entry_program(id, shared);
    let placed = (|| {
        let place = placement::place(bytes, symbol).map_err(|e| {
            let status = if e.is_missing_symbol() { "missing" } else { "failed" };
            (status, e.to_string())
        })?;
        let ret = |prog: &'static str| {
            // A return probe hijacks the return address on the stack: it needs a point before any push.
            placement::place_for_return(bytes, symbol)
                .map(|r| (prog, r.file_offset))
                .map_err(|e| ("failed", e.to_string()))
        };
        let probes = match action {
            cuda_entry::Action::Count => vec![(enter(prog_names::CUDA_COUNT), place.file_offset)],
            cuda_entry::Action::Free => vec![(enter(prog_names::CUDA_FREE), place.file_offset)],
            cuda_entry::Action::Lookup => {
                vec![(enter(prog_names::CUDA_LOOKUP_ENTER), place.file_offset), ret(prog_names::CUDA_LOOKUP_RETURN)?]
            }
            cuda_entry::Action::Alloc | cuda_entry::Action::AllocPitch => {
                vec![(enter(prog_names::CUDA_ALLOC_ENTER), place.file_offset), ret(prog_names::CUDA_ALLOC_RETURN)?]
            }
            cuda_entry::Action::Timed => {
                vec![(enter(prog_names::CUDA_TIMED_ENTER), place.file_offset), ret(prog_names::CUDA_TIMED_RETURN)?]
            }
        };
        Ok((probes, placement::describe(&place)))
    })();
    Planned { id, symbol, placed }
}

/// One multi link per program for every placed probe of `planned`; all or nothing.
fn attach_multi(multi: &MultiPrograms, lib: &Path, planned: &[Planned]) -> Result<Vec<OwnedFd>, String> {
    let mut by_prog: Vec<(&'static str, Vec<u64>, Vec<u64>)> = Vec::new();
    for p in planned {
        let Ok((probes, _)) = &p.placed else { continue };
        for &(prog, offset) in probes {
            match by_prog.iter_mut().find(|(name, _, _)| *name == prog) {
                Some((_, offsets, cookies)) => {
                    offsets.push(offset);
                    cookies.push(p.id as u64);
                }
                None => by_prog.push((prog, vec![offset], vec![p.id as u64])),
            }
        }
    }
    // On an error the links made so far drop with `fds`: nothing stays half attached.
    let mut fds = Vec::with_capacity(by_prog.len());
    for (prog, offsets, cookies) in &by_prog {
        fds.push(multi.attach(prog, lib, offsets, cookies)?);
    }
    Ok(fds)
}

/// Attach every entry point of one library, with multi links when `multi` is given (falling back
/// to perf-event uprobes when the kernel refuses them); returns its report and links. Fails when
/// nothing could be attached.
/// With `timed`, also the [`cuda_entry::Action::Timed`] entry points (synchronisation, events,
/// copies, memsets: an entry and a return probe each, which every call pays, profiled or not), as
/// `profile` and `events --per-event-*` ask; without, they are not probed at all.
pub(crate) fn attach_library(
    ebpf: &mut Ebpf,
    backend: &Backend,
    lib: &Path,
    timed: bool,
) -> Result<(LibraryReport, Links), AttachError> {
    let md = std::fs::metadata(lib).map_err(|error| AttachError::Stat { path: lib.into(), error })?;
    let bytes = std::fs::read(lib).map_err(|error| AttachError::Read { path: lib.into(), error })?;
    let planned: Vec<Planned> = cuda_entry::ALL
        .into_iter()
        .filter(|(_, _, action)| timed || *action != cuda_entry::Action::Timed)
        .map(|(id, symbol, action)| plan(&bytes, id, symbol, action, backend.entries()))
        .collect();
    let planned_probes = planned.iter().filter_map(|p| p.placed.as_ref().ok()).map(|(probes, _)| probes.len()).sum();
    let mut links = Links::default();
    let mut method = Method::PerfEvent;
    let method_detail: String = match backend {
        Backend::Perf { why, entries: EntryPrograms::Shared } => why.clone(),
        Backend::Perf { why, entries: EntryPrograms::PerEntry { why: form } } if form.contains(why.as_str()) => {
            form.clone()
        }
        Backend::Perf { why, entries: EntryPrograms::PerEntry { why: form } } => format!("{why}; {form}"),
        Backend::Multi { programs, fallback } => match attach_multi(programs, lib, &planned) {
            Ok(fds) => {
                links.multi = fds;
                method = Method::UprobeMulti;
                String::new()
            }
            Err(e) if *fallback => {
                tracing::warn!(lib = %lib.display(), error = %e, "multi-uprobe links refused; one perf event per probe");
                format!("uprobe_multi refused ({e})")
            }
            Err(e) => {
                let why = format!("cuda_attach = \"uprobe-multi\": {e}");
                return Err(AttachError::NoEntryPoint { path: lib.into(), why });
            }
        },
    };
    let mut method_detail = method_detail;
    // Set once the kernel refused the uprobe PMU and tracefs took over: the root of tracefs.
    let mut through_tracefs: Option<PathBuf> = None;
    let mut entries = Vec::new();
    for p in planned {
        let report = match p.placed {
            Err((status, detail)) => EntryReport { symbol: p.symbol, status, detail },
            Ok((_, detail)) if method == Method::UprobeMulti => {
                EntryReport { symbol: p.symbol, status: "attached", detail }
            }
            Ok((probes, detail)) => {
                let mut attached = Ok(());
                for (prog, offset) in probes {
                    // Return probes share one program and need no cookie (the entry's state carries the id).
                    let cookie = backend.entries().cookie(p.id);
                    attached = match &through_tracefs {
                        Some(root) => attach_through_tracefs(ebpf, &mut links.tracefs, root, prog, lib, offset, cookie),
                        None => match attach_at(ebpf, &mut links.perf, prog, lib, offset, cookie) {
                            Err((refused, true)) => match tracefs::root() {
                                // What bpftrace does after the same refusal.
                                Some(root) => {
                                    let r = attach_through_tracefs(
                                        ebpf,
                                        &mut links.tracefs,
                                        &root,
                                        prog,
                                        lib,
                                        offset,
                                        cookie,
                                    )
                                    .map_err(|e| format!("{refused}; through tracefs: {e}"));
                                    if r.is_ok() {
                                        tracing::info!(lib = %lib.display(), error = %refused, tracefs = %root.display(), "the kernel refused perf-event uprobes; making them through tracefs");
                                        method_detail = format!(
                                            "{}{}the uprobe PMU refused without CAP_SYS_ADMIN; uprobes made through {}",
                                            method_detail,
                                            if method_detail.is_empty() { "" } else { "; " },
                                            root.join("uprobe_events").display()
                                        );
                                        method = Method::Tracefs;
                                        through_tracefs = Some(root);
                                    }
                                    r
                                }
                                None => Err(format!(
                                    "{refused}; tracefs (uprobe_events) not found at {:?} either",
                                    tracefs::ROOTS
                                )),
                            },
                            other => other.map_err(|(e, _)| e),
                        },
                    };
                    if attached.is_err() {
                        break;
                    }
                }
                match attached {
                    Ok(()) => EntryReport { symbol: p.symbol, status: "attached", detail },
                    Err(e) => EntryReport { symbol: p.symbol, status: "failed", detail: e },
                }
            }
        };
        entries.push(report);
    }
    let uprobes = match method {
        Method::UprobeMulti => planned_probes,
        Method::PerfEvent | Method::Tracefs => links.perf.len() + links.tracefs.len(),
    };
    let report = LibraryReport {
        path: lib.display().to_string(),
        inode: md.ino(),
        method,
        method_detail,
        uprobes,
        links: links.len(),
        entries,
    };
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

/// Attach one probe as a perf event on the uprobe PMU. Err: the message, and whether the kernel
/// refused it (EACCES/EPERM: no CAP_SYS_ADMIN).
fn attach_at(
    ebpf: &mut Ebpf,
    links: &mut Vec<(&'static str, UProbeLinkId)>,
    prog: &'static str,
    lib: &Path,
    offset: u64,
    cookie: Option<u64>,
) -> Result<(), (String, bool)> {
    let p = load(ebpf, prog).map_err(|e| (e, false))?;
    let point = UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie };
    let id = p.attach(point, lib, UProbeScope::AllProcesses).map_err(|e| {
        let (msg, denied) = crate::bpf::error_with_causes(&format!("attaching {prog}"), &e);
        if denied {
            let why = format!(
                "{msg}: the kernel allows perf-event uprobes only with CAP_SYS_ADMIN (multi-uprobe links, Linux \
                 6.6+, need only CAP_BPF + CAP_PERFMON; Helm: cudaTracefsUprobes=true lets the agent make them \
                 through tracefs, cudaPerfEventUprobes=true adds SYS_ADMIN)"
            );
            (why, true)
        } else {
            (msg, false)
        }
    })?;
    links.push((prog, id));
    Ok(())
}

/// Attach one probe through tracefs ([`tracefs::attach`]), with the program aya loaded.
fn attach_through_tracefs(
    ebpf: &mut Ebpf,
    links: &mut Vec<tracefs::TracefsProbe>,
    root: &Path,
    prog: &'static str,
    lib: &Path,
    offset: u64,
    cookie: Option<u64>,
) -> Result<(), String> {
    let p = load(ebpf, prog)?;
    let ret = multi::PROGRAMS.iter().any(|(name, ret)| *name == prog && *ret);
    let fd = p.fd().map_err(|e| format!("{prog}: {e}"))?;
    let probe = tracefs::attach(root, fd.as_fd(), lib, offset, ret, cookie).map_err(|e| {
        if e.contains("paranoid") || e.contains("Permission denied") || e.contains("Operation not permitted") {
            format!(
                "{e} (kernel.perf_event_paranoid is {}: at 3 or more, a Debian or Ubuntu kernel opens no perf event \
                 without CAP_SYS_ADMIN)",
                std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap_or_default().trim()
            )
        } else if e.contains("Read-only file system") {
            format!("{e} (the tracefs mount is read-only: Helm cudaTracefsUprobes=true makes it writable)")
        } else {
            e
        }
    })?;
    links.push(probe);
    Ok(())
}

/// Attach every entry point of every library (distinct inodes only). Returns the per-library
/// report and the links (for [`detach`]); an error only when nothing could be attached at all
/// ([`AttachError::NoLibrary`] when `libs` is empty).
pub(crate) fn attach_all(
    ebpf: &mut Ebpf,
    backend: &Backend,
    libs: &[PathBuf],
    timed: bool,
) -> Result<(Vec<LibraryReport>, Links), AttachError> {
    if libs.is_empty() {
        return Err(AttachError::NoLibrary { searched: SEARCH_PATHS });
    }
    // Uprobe events of ours that a killed agent left in tracefs.
    if let Some(root) = tracefs::root() {
        tracefs::remove_stale(&root, Path::new("/proc"));
    }
    let mut seen = HashSet::new();
    let mut reports = Vec::new();
    let mut all_links = Links::default();
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
        match attach_library(ebpf, backend, lib, timed) {
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

#[cfg(test)]
mod tests;
