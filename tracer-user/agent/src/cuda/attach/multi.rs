//! Multi-uprobe links (`BPF_LINK_CREATE` with `BPF_TRACE_UPROBE_MULTI`, Linux 6.6+): one link per
//! program carries every offset of a library, with the entry ids as its cookies.
//!
//! Why: the perf-event path (aya's `UProbe::attach`) opens one perf event per offset, which the
//! kernel allows only with CAP_SYS_ADMIN, and closing each waits for its own RCU grace period
//! (35 probes of a library took 3.8 s to detach one by one). A multi link needs only CAP_BPF and
//! CAP_PERFMON, and the kernel unregisters all of its uprobes under one grace period.
//!
//! aya 0.14 cannot load a program for this attach type (its `UProbe::load` passes no expected
//! attach type, and the kernel picks the cookie helper by it at load time), so the cuda programs
//! are loaded a second time here, from the same object and sharing its maps (`crate::bpf`), with
//! `expected_attach_type = BPF_TRACE_UPROBE_MULTI`.
use std::{
    collections::HashMap,
    ffi::CString,
    os::fd::{AsRawFd, OwnedFd},
    os::unix::ffi::OsStrExt,
    path::Path,
};

use aya::Ebpf;
use tracer_common::prog_names;

use crate::bpf::{self as raw, LoadAs};

/// The programs loaded for multi links: entry probes and return probes.
pub(crate) const PROGRAMS: [(&str, bool); 8] = [
    (prog_names::CUDA_COUNT, false),
    (prog_names::CUDA_FREE, false),
    (prog_names::CUDA_ALLOC_ENTER, false),
    (prog_names::CUDA_ALLOC_RETURN, true),
    (prog_names::CUDA_LOOKUP_ENTER, false),
    (prog_names::CUDA_LOOKUP_RETURN, true),
    (prog_names::CUDA_TIMED_ENTER, false),
    (prog_names::CUDA_TIMED_RETURN, true),
];

const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;

/// `union bpf_attr` for `BPF_LINK_CREATE` of a `uprobe_multi` link.
#[repr(C)]
#[derive(Default)]
struct UprobeMultiLinkAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    _pad: u32,
}

/// The cuda programs, loaded for multi-uprobe links.
pub struct MultiPrograms {
    progs: HashMap<&'static str, OwnedFd>,
}

impl std::fmt::Debug for MultiPrograms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiPrograms").field("programs", &self.progs.len()).finish()
    }
}

impl MultiPrograms {
    /// Load the cuda programs of `object` for multi links, sharing the maps of `ebpf` (loaded from
    /// the same object, with none of its maps taken yet). Fails on kernels that do not know the
    /// attach type, or when a map is missing; the caller falls back to perf-event uprobes.
    pub fn load(object: &[u8], ebpf: &Ebpf) -> Result<MultiPrograms, String> {
        let programs = raw::Programs::parse(object, ebpf)?;
        let mut progs = HashMap::new();
        for (name, _) in PROGRAMS {
            let how = LoadAs {
                prog_type: raw::BPF_PROG_TYPE_KPROBE,
                expected_attach_type: raw::BPF_TRACE_UPROBE_MULTI,
                ..Default::default()
            };
            let fd = programs.load(name, &how).map_err(|e| format!("{e} (for uprobe_multi)"))?;
            progs.insert(name, fd);
        }
        Ok(MultiPrograms { progs })
    }

    /// Attach `prog` at `offsets` (file offsets) of `lib`, cookie `cookies[i]` at `offsets[i]`, as
    /// one link (a return probe when the program is one). Dropping the fd detaches all of them.
    pub fn attach(&self, prog: &str, lib: &Path, offsets: &[u64], cookies: &[u64]) -> Result<OwnedFd, String> {
        let (_, ret) =
            PROGRAMS.iter().find(|(p, _)| *p == prog).ok_or_else(|| format!("{prog}: not a cuda program"))?;
        let fd = self.progs.get(prog).ok_or_else(|| format!("{prog}: not loaded"))?;
        assert_eq!(offsets.len(), cookies.len(), "one cookie per offset");
        let path =
            CString::new(lib.as_os_str().as_bytes()).map_err(|_| format!("{}: NUL in the path", lib.display()))?;
        let mut attr = UprobeMultiLinkAttr {
            prog_fd: fd.as_raw_fd() as u32,
            attach_type: raw::BPF_TRACE_UPROBE_MULTI,
            path: path.as_ptr() as u64,
            offsets: offsets.as_ptr() as u64,
            cookies: cookies.as_ptr() as u64,
            cnt: offsets.len() as u32,
            multi_flags: if *ret { BPF_F_UPROBE_MULTI_RETURN } else { 0 },
            ..Default::default()
        };
        raw::sys_bpf_fd(raw::BPF_LINK_CREATE, &mut attr)
            .map_err(|e| format!("BPF_LINK_CREATE uprobe_multi {prog} ({} offsets): {e}", offsets.len()))
    }
}
