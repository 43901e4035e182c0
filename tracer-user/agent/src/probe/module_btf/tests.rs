use super::*;

/// A BTF blob from (name_off, kind, vlen, extra bytes) types and a string section.
fn blob(types: &[(u32, u32, u32, usize)], strings: &[u8]) -> Vec<u8> {
    let mut t = Vec::new();
    for &(name_off, kind, vlen, extra) in types {
        t.extend(name_off.to_le_bytes());
        t.extend(((kind << 24) | vlen).to_le_bytes());
        t.extend(0u32.to_le_bytes());
        t.extend(std::iter::repeat_n(0u8, extra));
    }
    let mut out = Vec::new();
    out.extend(MAGIC.to_le_bytes());
    out.extend([1u8, 0]);
    for v in [24u32, 0, t.len() as u32, t.len() as u32, strings.len() as u32] {
        out.extend(v.to_le_bytes());
    }
    out.extend(t);
    out.extend(strings);
    out
}

// Base: 1 INT "int", 2 PTR, 3 FUNC_PROTO (2 params), 4 STRUCT (3 members), 5 FUNC "base_fn".
const BASE_STRINGS: &[u8] = b"\0int\0base_fn\0";
fn base() -> Vec<u8> {
    blob(&[(1, 1, 0, 4), (0, 2, 0, 0), (0, 13, 2, 16), (0, 4, 3, 36), (5, 12, 0, 0)], BASE_STRINGS)
}

#[test]
fn split_btf_continues_the_bases_ids_and_string_offsets() {
    let b = BASE_STRINGS.len() as u32;
    // Module: 6 ENUM (2 values), 7 FUNC "mod_open" (module string), 8 FUNC_PROTO, 9 FUNC
    // "base_fn" (a name shared with the base: its offset is the base's), 10 FUNC "mod_ioctl".
    let module = blob(
        &[(0, 6, 2, 16), (b + 1, 12, 0, 0), (0, 13, 3, 24), (5, 12, 0, 0), (b + 10, 12, 0, 0)],
        b"\0mod_open\0mod_ioctl\0",
    );
    let ids = function_ids(&base(), &module, &["mod_open", "mod_ioctl", "base_fn", "absent"]).unwrap();
    assert_eq!(ids.get("mod_open"), Some(&7));
    assert_eq!(ids.get("mod_ioctl"), Some(&10));
    assert_eq!(ids.get("base_fn"), Some(&9));
    assert_eq!(ids.get("absent"), None);
}

#[test]
fn garbage_and_unknown_kinds_are_errors_not_wrong_ids() {
    assert!(function_ids(b"\x9f\xeb", &base(), &[]).unwrap_err().contains("truncated"));
    assert!(function_ids(b"ELF.............................", &base(), &[]).unwrap_err().contains("bad magic"));
    let unknown = blob(&[(0, 30, 0, 0)], b"\0");
    let e = function_ids(&base(), &unknown, &["x"]).unwrap_err();
    assert!(e.contains("module BTF") && e.contains("kind 30"), "{e}");
    let mut cut = base();
    cut.truncate(cut.len() - 20);
    assert!(function_ids(&cut, &base(), &[]).unwrap_err().contains("past the end"));
}

#[test]
fn this_kernels_btf_parses_to_the_end() {
    // Every kind of a real vmlinux BTF has a known size, or every id after it would be off.
    let vmlinux = std::fs::read("/sys/kernel/btf/vmlinux").expect("this machine's kernel has BTF");
    let b = parse(&vmlinux).unwrap();
    let n = types(&b).unwrap().len();
    assert!(n > 10_000, "{n} types");
}

#[test]
fn a_missing_module_btf_is_explained_by_the_kernel_before_5_11() {
    let path = Path::new("/sys/kernel/btf/nvidia");
    let old = no_btf("nvidia", path, "5.10.0-46-amd64");
    assert!(old.contains("kernel 5.10.0-46-amd64 loads no module BTF") && old.contains("5.11"), "{old}");
    let new = no_btf("nvidia", path, "6.1.0-57-amd64");
    assert!(new.contains("/sys/kernel/btf/nvidia does not exist") && new.contains("DKMS"), "{new}");
    // An unreadable release is not taken for an old kernel.
    assert!(no_btf("nvidia", path, "").contains("does not exist"));
}
