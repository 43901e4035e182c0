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
//! are loaded a second time here, from the same object: parsed with aya-obj (the crate aya itself
//! parses with), their map references pointed at the maps aya created (so both copies share every
//! map), and loaded with `BPF_PROG_LOAD` with `expected_attach_type = BPF_TRACE_UPROBE_MULTI`.
use std::{
    collections::{HashMap, HashSet},
    ffi::CString,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd},
    os::unix::ffi::OsStrExt,
    path::Path,
};

use aya::{Ebpf, maps::Map};
use tracer_common::prog_names;

/// The programs loaded for multi links: entry probes and return probes.
pub const PROGRAMS: [(&str, bool); 8] = [
    (prog_names::CUDA_COUNT, false),
    (prog_names::CUDA_FREE, false),
    (prog_names::CUDA_ALLOC_ENTER, false),
    (prog_names::CUDA_ALLOC_RETURN, true),
    (prog_names::CUDA_LOOKUP_ENTER, false),
    (prog_names::CUDA_LOOKUP_RETURN, true),
    (prog_names::CUDA_TIMED_ENTER, false),
    (prog_names::CUDA_TIMED_RETURN, true),
];

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;

/// The leading fields of `union bpf_attr` for `BPF_PROG_LOAD` (the kernel zero-fills the rest).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

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

fn sys_bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a live, fully initialised `repr(C)` prefix of `union bpf_attr` for `cmd`,
    // and its size is passed with it; the kernel copies it in and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, size_of::<T>() as u32) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
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

/// The file descriptor behind one of aya's maps.
fn map_fd(map: &Map) -> RawFd {
    let data = match map {
        Map::Array(d)
        | Map::ArrayOfMaps(d)
        | Map::BloomFilter(d)
        | Map::CgroupArray(d)
        | Map::CgroupStorage(d)
        | Map::CgrpStorage(d)
        | Map::CpuMap(d)
        | Map::DevMap(d)
        | Map::DevMapHash(d)
        | Map::HashMap(d)
        | Map::HashOfMaps(d)
        | Map::InodeStorage(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuCgroupStorage(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::ReusePortSockArray(d)
        | Map::RingBuf(d)
        | Map::SockHash(d)
        | Map::SockMap(d)
        | Map::SkStorage(d)
        | Map::Stack(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d)
        | Map::XskMap(d) => d,
    };
    data.fd().as_fd().as_raw_fd()
}

impl MultiPrograms {
    /// Load the cuda programs of `object` for multi links, sharing the maps of `ebpf` (loaded from
    /// the same object, with none of its maps taken yet). Fails on kernels that do not know the
    /// attach type, or when a map is missing; the caller falls back to perf-event uprobes.
    pub fn load(object: &[u8], ebpf: &Ebpf) -> Result<MultiPrograms, String> {
        let mut obj = aya_obj::Object::parse(object).map_err(|e| format!("parsing the eBPF object: {e}"))?;
        if obj.has_btf_relocations() {
            let btf = aya::Btf::from_sys_fs().map_err(|e| format!("the object needs kernel BTF: {e}"))?;
            obj.relocate_btf(&btf).map_err(|e| format!("BTF relocation: {e}"))?;
        }
        let maps = std::mem::take(&mut obj.maps);
        let mut with_fds = Vec::with_capacity(maps.len());
        for (name, m) in &maps {
            // aya leaves out data sections the kernel cannot hold; a program using one fails below.
            if let Some(map) = ebpf.map(name) {
                with_fds.push((name.as_str(), map_fd(map), m));
            }
        }
        let text_sections: HashSet<usize> = obj.functions.keys().map(|(section, _)| *section).collect();
        obj.relocate_maps(with_fds.into_iter(), &text_sections).map_err(|e| format!("map relocation: {e}"))?;
        obj.relocate_calls(&text_sections).map_err(|e| format!("call relocation: {e}"))?;
        let mut progs = HashMap::new();
        for (name, _) in PROGRAMS {
            let p = obj.programs.get(name).ok_or_else(|| format!("program {name} missing from the object"))?;
            let f = obj
                .functions
                .get(&p.function_key())
                .ok_or_else(|| format!("program {name}: its function is missing from the object"))?;
            let fd = load_program(name, &f.instructions, &p.license)?;
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
            attach_type: BPF_TRACE_UPROBE_MULTI,
            path: path.as_ptr() as u64,
            offsets: offsets.as_ptr() as u64,
            cookies: cookies.as_ptr() as u64,
            cnt: offsets.len() as u32,
            multi_flags: if *ret { BPF_F_UPROBE_MULTI_RETURN } else { 0 },
            ..Default::default()
        };
        sys_bpf(BPF_LINK_CREATE, &mut attr)
            .map_err(|e| format!("BPF_LINK_CREATE uprobe_multi {prog} ({} offsets): {e}", offsets.len()))
    }
}

fn load_program(name: &str, insns: &[aya_obj::generated::bpf_insn], license: &CString) -> Result<OwnedFd, String> {
    let mut prog_name = [0u8; 16];
    let n = name.len().min(15);
    prog_name[..n].copy_from_slice(&name.as_bytes()[..n]);
    let attr = |log: &mut Vec<u8>| ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_KPROBE,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: if log.is_empty() { 0 } else { 1 },
        log_size: log.len() as u32,
        log_buf: if log.is_empty() { 0 } else { log.as_mut_ptr() as u64 },
        prog_name,
        expected_attach_type: BPF_TRACE_UPROBE_MULTI,
        ..Default::default()
    };
    let mut no_log = Vec::new();
    match sys_bpf(BPF_PROG_LOAD, &mut attr(&mut no_log)) {
        Ok(fd) => Ok(fd),
        Err(e) => {
            // Again with the verifier's log, for the error message.
            let mut log = vec![0u8; 1 << 20];
            let again = sys_bpf(BPF_PROG_LOAD, &mut attr(&mut log));
            let text = String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)]).into_owned();
            let tail: Vec<&str> = text.lines().rev().take(6).collect::<Vec<_>>().into_iter().rev().collect();
            match again {
                Ok(fd) => Ok(fd),
                Err(_) => Err(format!("loading {name} for uprobe_multi: {e}; verifier: {}", tail.join(" | "))),
            }
        }
    }
}
