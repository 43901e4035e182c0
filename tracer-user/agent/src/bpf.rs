//! The few `bpf(2)` commands aya 0.14 does not issue for us, on the same object and maps: loading a
//! program with an expected attach type aya does not pass (multi-uprobe links, fentry/fexit on a
//! module function with its BTF object), and attaching such a program; and how a refusal from the
//! kernel reads ([`error_with_causes`]). Used by `probe` and `cuda::attach` alike.
//!
//! The object is parsed again with aya-obj (the crate aya itself parses with), its map references
//! pointed at the maps aya created, so every copy loaded here shares aya's maps.
use std::{
    collections::HashSet,
    ffi::CString,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd},
};

use aya::{Ebpf, maps::Map};

pub(crate) const BPF_PROG_LOAD: libc::c_long = 5;
pub const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
pub(crate) const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
pub(crate) const BPF_BTF_GET_FD_BY_ID: libc::c_long = 19;
pub(crate) const BPF_BTF_GET_NEXT_ID: libc::c_long = 23;
pub(crate) const BPF_LINK_CREATE: libc::c_long = 28;

pub(crate) const BPF_PROG_TYPE_KPROBE: u32 = 2;
pub(crate) const BPF_PROG_TYPE_TRACING: u32 = 26;
pub(crate) const BPF_TRACE_FENTRY: u32 = 24;
pub(crate) const BPF_TRACE_FEXIT: u32 = 25;
pub const BPF_TRACE_UPROBE_MULTI: u32 = 48;

/// The leading fields of `union bpf_attr` for `BPF_PROG_LOAD`, up to `attach_btf_obj_fd` (the
/// kernel zero-fills the rest).
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
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
    attach_btf_obj_fd: u32,
    _pad: u32,
}

/// `bpf(cmd, attr, sizeof attr)` for a command that returns a new fd.
pub(crate) fn sys_bpf_fd<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<OwnedFd> {
    let fd = sys_bpf(cmd, attr)?;
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `bpf(cmd, attr, sizeof attr)`; its non-negative return.
pub(crate) fn sys_bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, fully initialised `repr(C)` prefix of `union bpf_attr` for `cmd`,
    // and its size is passed with it; the kernel copies it in (and out, for info commands).
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, size_of::<T>() as u32) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(rc)
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

/// The programs of `object`, relocated against the maps of `ebpf` (loaded from the same object,
/// with none of its maps taken yet) and against the kernel's BTF where the object needs it.
pub struct Programs {
    obj: aya_obj::Object,
}

impl Programs {
    pub fn parse(object: &[u8], ebpf: &Ebpf) -> Result<Programs, String> {
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
        Ok(Programs { obj })
    }

    /// Load program `name` as `how` says; the error ends with the verifier's last lines.
    pub fn load(&self, name: &str, how: &LoadAs) -> Result<OwnedFd, String> {
        let p = self.obj.programs.get(name).ok_or_else(|| format!("program {name} missing from the object"))?;
        let f = self
            .obj
            .functions
            .get(&p.function_key())
            .ok_or_else(|| format!("program {name}: its function is missing from the object"))?;
        load_program(name, &f.instructions, &p.license, how)
    }
}

/// How a program is loaded: its type, expected attach type and, for fentry/fexit, its target.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadAs {
    pub prog_type: u32,
    pub expected_attach_type: u32,
    /// The target function's type id in the BTF of `attach_btf_obj_fd` (0: none).
    pub attach_btf_id: u32,
    /// A kernel BTF object (a module's); `None`: vmlinux.
    pub attach_btf_obj_fd: Option<RawFd>,
}

fn load_program(
    name: &str,
    insns: &[aya_obj::generated::bpf_insn],
    license: &CString,
    how: &LoadAs,
) -> Result<OwnedFd, String> {
    let mut prog_name = [0u8; 16];
    let n = name.len().min(15);
    prog_name[..n].copy_from_slice(&name.as_bytes()[..n]);
    let attr = |log: &mut Vec<u8>| ProgLoadAttr {
        prog_type: how.prog_type,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: if log.is_empty() { 0 } else { 1 },
        log_size: log.len() as u32,
        log_buf: if log.is_empty() { 0 } else { log.as_mut_ptr() as u64 },
        prog_name,
        expected_attach_type: how.expected_attach_type,
        attach_btf_id: how.attach_btf_id,
        attach_btf_obj_fd: how.attach_btf_obj_fd.map_or(0, |fd| fd as u32),
        ..Default::default()
    };
    let mut no_log = Vec::new();
    match sys_bpf_fd(BPF_PROG_LOAD, &mut attr(&mut no_log)) {
        Ok(fd) => Ok(fd),
        Err(e) => {
            // Again with the verifier's log, for the error message.
            let mut log = vec![0u8; 1 << 20];
            let again = sys_bpf_fd(BPF_PROG_LOAD, &mut attr(&mut log));
            let text = String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)]).into_owned();
            let tail: Vec<&str> = text.lines().rev().take(6).collect::<Vec<_>>().into_iter().rev().collect();
            match again {
                Ok(fd) => Ok(fd),
                Err(_) => Err(format!("loading {name}: {e}; verifier: {}", tail.join(" | "))),
            }
        }
    }
}

/// BPF helpers this agent's programs call that older kernels lack: (number, name, first Linux).
const LATE_HELPERS: [(u32, &str, &str); 4] = [
    (174, "bpf_get_attach_cookie", "5.15"),
    (183, "bpf_get_func_arg", "5.17"),
    (184, "bpf_get_func_ret", "5.17"),
    (185, "bpf_get_func_arg_cnt", "5.17"),
];

/// A program load failure in one line for `doctor`, the probe report and the log: the message up
/// to the verifier's log (aya's `Verifier output:`, ours `; verifier:`), and where the verifier
/// did not know a helper (`invalid func unknown#N`), which one and the release that added it.
pub(crate) fn load_failure_in_one_line(e: &str) -> String {
    let head = e.split("; verifier:").next().unwrap_or(e);
    let head = head.split(". Verifier output:").next().unwrap_or(head).trim();
    let helper = e
        .split("unknown#")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse::<u32>().ok());
    match helper {
        Some(n) => match LATE_HELPERS.iter().find(|(id, _, _)| *id == n) {
            Some((_, name, since)) => format!("{head}: this kernel lacks {name} (Linux {since}+)"),
            None => format!("{head}: this kernel lacks BPF helper #{n}"),
        },
        None => head.to_string(),
    }
}

/// `BPF_RAW_TRACEPOINT_OPEN` with no name: attaches a loaded fentry/fexit program to the target
/// it was loaded for; the link lives as long as the returned fd.
pub(crate) fn attach_tracing(prog: &OwnedFd) -> std::io::Result<OwnedFd> {
    #[repr(C)]
    struct RawTpAttr {
        name: u64,
        prog_fd: u32,
        _pad: u32,
    }
    sys_bpf_fd(BPF_RAW_TRACEPOINT_OPEN, &mut RawTpAttr { name: 0, prog_fd: prog.as_raw_fd() as u32, _pad: 0 })
}

/// `what: e: cause: cause...` (aya's messages leave out their causes, the syscall's errno among
/// them), and whether a cause is EACCES/EPERM: the kernel refused.
pub(crate) fn error_with_causes(what: &str, e: &(dyn std::error::Error + 'static)) -> (String, bool) {
    let mut msg = format!("{what}: {e}");
    let mut denied = false;
    let mut cause = e.source();
    while let Some(c) = cause {
        msg.push_str(&format!(": {c}"));
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            denied |= matches!(io.raw_os_error(), Some(libc::EACCES | libc::EPERM));
        }
        cause = c.source();
    }
    (msg, denied)
}
