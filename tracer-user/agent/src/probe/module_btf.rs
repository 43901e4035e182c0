//! A kernel module's BTF, for fentry/fexit on its functions: which function has which type id
//! (read from `/sys/kernel/btf/<module>`, split BTF on top of `/sys/kernel/btf/vmlinux`), and the
//! module's BTF object as an fd (`BPF_BTF_GET_NEXT_ID` / `BPF_BTF_GET_FD_BY_ID`), which a program
//! names at load time as `attach_btf_obj_fd`.
//!
//! Reading the files needs nothing but read access to sysfs; the fd needs CAP_SYS_ADMIN (the
//! kernel checks it for `BPF_BTF_GET_FD_BY_ID` and `BPF_BTF_GET_NEXT_ID`), which is why fentry on
//! a module is not open to an agent with only CAP_BPF and CAP_PERFMON.
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use crate::bpf as raw;

pub(crate) const SYSFS: &str = "/sys/kernel/btf";

const MAGIC: u16 = 0xeb9f;
const KIND_FUNC: u32 = 12;

/// The parts of one BTF blob (`struct btf_header`, then the type and string sections).
struct Blob<'a> {
    types: &'a [u8],
    strings: &'a [u8],
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

fn parse(data: &[u8]) -> Result<Blob<'_>, String> {
    let magic = data.get(0..2).map(|m| u16::from_le_bytes([m[0], m[1]]));
    if magic != Some(MAGIC) {
        return Err("not BTF (bad magic; a big-endian or truncated file?)".into());
    }
    let field = |off| u32_at(data, off).map(|v| v as usize).ok_or("truncated BTF header");
    let hdr_len = field(4)?;
    let (type_off, type_len, str_off, str_len) = (field(8)?, field(12)?, field(16)?, field(20)?);
    let section = |off: usize, len: usize| {
        data.get(hdr_len + off..hdr_len + off + len).ok_or_else(|| "a BTF section runs past the end".to_string())
    };
    Ok(Blob { types: section(type_off, type_len)?, strings: section(str_off, str_len)? })
}

/// Each type of a blob's type section, in id order: (`name_off`, kind). Errors on a kind this
/// reader does not know the size of (a newer kernel's), which would misnumber every later type.
fn types(b: &Blob<'_>) -> Result<Vec<(u32, u32)>, String> {
    let mut out = Vec::new();
    let mut off = 0usize;
    while off < b.types.len() {
        let (Some(name_off), Some(info)) = (u32_at(b.types, off), u32_at(b.types, off + 4)) else {
            return Err(format!("a BTF type at byte {off} is truncated"));
        };
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        let extra = match kind {
            1 | 14 | 17 => 4,                            // INT, VAR, DECL_TAG
            2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0, // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
            3 => 12,                                     // ARRAY
            4 | 5 | 15 | 19 => 12 * vlen,                // STRUCT, UNION, DATASEC, ENUM64
            6 | 13 => 8 * vlen,                          // ENUM, FUNC_PROTO
            k => return Err(format!("BTF kind {k} at byte {off} is unknown to this agent")),
        };
        out.push((name_off, kind));
        off += 12 + extra;
    }
    Ok(out)
}

fn string(strings: &[u8], off: usize) -> Option<&str> {
    let s = strings.get(off..)?;
    std::str::from_utf8(&s[..s.iter().position(|&c| c == 0)?]).ok()
}

/// The type ids of the functions `wanted` in `module` (split BTF) on top of `base` (vmlinux).
/// A function missing from the module's BTF is missing from the map.
pub(crate) fn function_ids(base: &[u8], module: &[u8], wanted: &[&str]) -> Result<HashMap<String, u32>, String> {
    let b = parse(base).map_err(|e| format!("vmlinux BTF: {e}"))?;
    let m = parse(module).map_err(|e| format!("module BTF: {e}"))?;
    // Split BTF continues the base's numbering (id 0 is void) and its string offsets.
    let first_id = types(&b).map_err(|e| format!("vmlinux BTF: {e}"))?.len() as u32 + 1;
    let base_strings = b.strings.len();
    let mut out = HashMap::new();
    for (i, (name_off, kind)) in types(&m).map_err(|e| format!("module BTF: {e}"))?.into_iter().enumerate() {
        if kind != KIND_FUNC {
            continue;
        }
        let off = name_off as usize;
        let name = if off < base_strings { string(b.strings, off) } else { string(m.strings, off - base_strings) };
        if let Some(n) = name.filter(|n| wanted.contains(n)) {
            out.insert(n.to_string(), first_id + i as u32);
        }
    }
    Ok(out)
}

/// Why `module` has no BTF at `path`: a kernel before 5.11 loads none (module BTF came with 5.11's
/// `CONFIG_DEBUG_INFO_BTF_MODULES`); later, the module was built without it.
fn no_btf(module: &str, path: &Path, kernel: &str) -> String {
    if crate::proc::kernel_before(kernel, 5, 11) {
        format!("{module}.ko has no BTF (kernel {kernel} loads no module BTF: that came with 5.11)")
    } else {
        format!(
            "{module}.ko has no BTF ({} does not exist: modules built without pahole, as DKMS usually builds \
             NVIDIA's, or a kernel without CONFIG_DEBUG_INFO_BTF_MODULES)",
            path.display()
        )
    }
}

/// `module`'s functions `wanted`, by type id, from the sysfs files. An error says why fentry
/// cannot be used (no BTF for the module: the usual case for DKMS-built NVIDIA modules).
pub(crate) fn functions_in(module: &str, wanted: &[&str]) -> Result<HashMap<String, u32>, String> {
    let dir = Path::new(SYSFS);
    let path = dir.join(module);
    let data = std::fs::read(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => no_btf(module, &path, &crate::proc::kernel_release()),
        _ => format!("reading {}: {e}", path.display()),
    })?;
    let base = std::fs::read(dir.join("vmlinux")).map_err(|e| format!("reading {SYSFS}/vmlinux: {e}"))?;
    let ids = function_ids(&base, &data, wanted)?;
    let missing: Vec<&str> = wanted.iter().copied().filter(|w| !ids.contains_key(*w)).collect();
    if !missing.is_empty() {
        return Err(format!("{module}'s BTF has no {}", missing.join(", ")));
    }
    Ok(ids)
}

/// `struct bpf_btf_info`.
#[repr(C)]
#[derive(Default)]
struct BtfInfo {
    btf: u64,
    btf_size: u32,
    id: u32,
    name: u64,
    name_len: u32,
    kernel_btf: u32,
}

#[repr(C)]
#[derive(Default)]
struct IdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

#[repr(C)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The kernel's BTF object of `module`, as an fd.
pub(crate) fn object_fd(module: &str) -> Result<OwnedFd, String> {
    let mut id = 0u32;
    loop {
        let mut next = IdAttr { id, ..Default::default() };
        match raw::sys_bpf(raw::BPF_BTF_GET_NEXT_ID, &mut next) {
            Ok(_) => id = next.next_id,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Err(format!("no BTF object of the kernel is named {module} (BPF_BTF_GET_NEXT_ID)"));
            }
            Err(e) => return Err(denied("listing the kernel's BTF objects (BPF_BTF_GET_NEXT_ID)", e)),
        }
        let fd = match raw::sys_bpf_fd(raw::BPF_BTF_GET_FD_BY_ID, &mut IdAttr { id, ..Default::default() }) {
            Ok(fd) => fd,
            // Unloaded between the two calls.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(denied(&format!("opening BTF object {id} (BPF_BTF_GET_FD_BY_ID)"), e)),
        };
        let mut name = [0u8; 64];
        let mut info = BtfInfo { name: name.as_mut_ptr() as u64, name_len: name.len() as u32, ..Default::default() };
        let mut attr = InfoAttr {
            bpf_fd: fd.as_raw_fd() as u32,
            info_len: size_of::<BtfInfo>() as u32,
            info: &mut info as *mut BtfInfo as u64,
        };
        raw::sys_bpf(raw::BPF_OBJ_GET_INFO_BY_FD, &mut attr)
            .map_err(|e| format!("reading BTF object {id}'s info: {e}"))?;
        let len = name.iter().position(|&c| c == 0).unwrap_or(name.len());
        if info.kernel_btf != 0 && &name[..len] == module.as_bytes() {
            return Ok(fd);
        }
    }
}

fn denied(what: &str, e: std::io::Error) -> String {
    if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) {
        format!("{what}: {e} (the kernel allows it only with CAP_SYS_ADMIN)")
    } else {
        format!("{what}: {e}")
    }
}

#[cfg(test)]
mod tests;
