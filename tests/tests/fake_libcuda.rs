//! The fake `libcuda.so.1` builds (one per prologue variant) and `nv-workload`'s CUDA mode against
//! them and against the real library. No root needed.
//!
//! The prologue checks read the built libraries' bytes through their ELF tables (a minimal reader
//! below, enough for section headers, symbol tables and RELA relocations), and cross-check with
//! `objdump -d`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use gpu_tracer_tests::fake_libcuda::{
    EXPORTED_SYMBOLS, FAKE_GRANULE, FAKE_VA_BASE, FAKE_VA_END, REAL_LIBCUDA, VARIANTS, thunk_implementation,
};
use gpu_tracer_tests::workload::cuda::{INIT_FUNCTION_NAME, MEM_CREATE_GRANULE};
use gpu_tracer_tests::{Answer, Workload, fake_libcuda};

// ----- a minimal ELF64 reader ---------------------------------------------------------------------

const SHT_SYMTAB: u32 = 2;
const SHT_RELA: u32 = 4;
const SHT_NOBITS: u32 = 8;
const SHT_DYNSYM: u32 = 11;
const SHF_WRITE: u64 = 1;
const STT_FUNC: u8 = 2;
const STB_GLOBAL: u8 = 1;
const R_X86_64_RELATIVE: u32 = 8;

#[derive(Debug)]
struct Section {
    name: String,
    kind: u32,
    flags: u64,
    addr: u64,
    offset: u64,
    size: u64,
    link: u32,
}

#[derive(Debug, Clone)]
struct Symbol {
    name: String,
    value: u64,
    info: u8,
    shndx: u16,
}

impl Symbol {
    fn is_defined_global_function(&self) -> bool {
        self.shndx != 0 && self.info >> 4 == STB_GLOBAL && self.info & 0xf == STT_FUNC
    }
}

#[derive(Debug, Clone, Copy)]
struct Rela {
    offset: u64,
    kind: u32,
    addend: i64,
}

struct Elf {
    data: Vec<u8>,
    sections: Vec<Section>,
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(b[o..o + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

fn c_string(b: &[u8], o: usize) -> String {
    let end = b[o..].iter().position(|&c| c == 0).map_or(b.len(), |n| o + n);
    String::from_utf8_lossy(&b[o..end]).into_owned()
}

impl Elf {
    fn load(path: &Path) -> Elf {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        assert_eq!(&data[..4], b"\x7fELF", "{} is not ELF", path.display());
        assert_eq!((data[4], data[5]), (2, 1), "{} is not ELF64 little-endian", path.display());
        assert_eq!(u16_at(&data, 0x12), 62, "{} is not x86_64", path.display());
        let shoff = u64_at(&data, 0x28) as usize;
        let shentsize = u16_at(&data, 0x3a) as usize;
        let shnum = u16_at(&data, 0x3c) as usize;
        let shstrndx = u16_at(&data, 0x3e) as usize;
        let raw: Vec<(u32, Section)> = (0..shnum)
            .map(|i| {
                let h = shoff + i * shentsize;
                (
                    u32_at(&data, h),
                    Section {
                        name: String::new(),
                        kind: u32_at(&data, h + 4),
                        flags: u64_at(&data, h + 8),
                        addr: u64_at(&data, h + 16),
                        offset: u64_at(&data, h + 24),
                        size: u64_at(&data, h + 32),
                        link: u32_at(&data, h + 40),
                    },
                )
            })
            .collect();
        let names_at = raw[shstrndx].1.offset as usize;
        let sections =
            raw.into_iter().map(|(n, s)| Section { name: c_string(&data, names_at + n as usize), ..s }).collect();
        Elf { data, sections }
    }

    fn symbols(&self, kind: u32) -> Vec<Symbol> {
        let Some(table) = self.sections.iter().find(|s| s.kind == kind) else { return Vec::new() };
        let strings = self.sections[table.link as usize].offset as usize;
        (0..table.size as usize / 24)
            .map(|i| {
                let e = table.offset as usize + i * 24;
                Symbol {
                    name: c_string(&self.data, strings + u32_at(&self.data, e) as usize),
                    info: self.data[e + 4],
                    shndx: u16_at(&self.data, e + 6),
                    value: u64_at(&self.data, e + 8),
                }
            })
            .collect()
    }

    fn relocations(&self) -> Vec<Rela> {
        self.sections
            .iter()
            .filter(|s| s.kind == SHT_RELA)
            .flat_map(|s| {
                (0..s.size as usize / 24).map(move |i| {
                    let e = s.offset as usize + i * 24;
                    Rela {
                        offset: u64_at(&self.data, e),
                        kind: u64_at(&self.data, e + 8) as u32,
                        addend: u64_at(&self.data, e + 16) as i64,
                    }
                })
            })
            .collect()
    }

    /// The allocated section holding virtual address `addr`.
    fn section_at(&self, addr: u64) -> &Section {
        self.sections
            .iter()
            .find(|s| s.addr != 0 && s.addr <= addr && addr < s.addr + s.size)
            .unwrap_or_else(|| panic!("no section holds {addr:#x}"))
    }

    /// `len` file bytes at virtual address `addr`.
    fn bytes_at(&self, addr: u64, len: usize) -> &[u8] {
        let s = self.section_at(addr);
        assert_ne!(s.kind, SHT_NOBITS, "{addr:#x} is in {} (no file bytes)", s.name);
        let o = (s.offset + (addr - s.addr)) as usize;
        &self.data[o..o + len]
    }

    /// Exported `cu*` functions: name -> address.
    fn exported_cuda_functions(&self) -> BTreeMap<String, u64> {
        self.symbols(SHT_DYNSYM)
            .into_iter()
            .filter(|s| s.is_defined_global_function() && s.name.starts_with("cu"))
            .map(|s| (s.name, s.value))
            .collect()
    }
}

fn elf(variant: &str) -> Elf {
    Elf::load(&fake_libcuda(variant))
}

// ----- what the libraries are ---------------------------------------------------------------------

#[test]
fn every_variant_is_built_and_exports_every_entry_point() {
    let expected: BTreeSet<&str> = EXPORTED_SYMBOLS.iter().copied().collect();
    assert_eq!(expected.len(), EXPORTED_SYMBOLS.len(), "EXPORTED_SYMBOLS has duplicates");
    for v in VARIANTS {
        let path = fake_libcuda(v);
        assert_eq!(path.file_name().unwrap(), "libcuda.so.1");
        let exported = elf(v).exported_cuda_functions();
        let names: BTreeSet<&str> = exported.keys().map(String::as_str).collect();
        assert_eq!(names, expected, "{v}: exported cu* functions");
    }
}

#[test]
fn the_rust_symbol_list_matches_the_c_one() {
    let header = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("fake_libcuda/symbols.h")).unwrap();
    let in_header: Vec<&str> = header.lines().filter_map(|l| l.trim().strip_prefix("X(")?.split(')').next()).collect();
    assert_eq!(in_header, EXPORTED_SYMBOLS, "tests/fake_libcuda/symbols.h and fake_libcuda::EXPORTED_SYMBOLS");
}

#[test]
fn the_listed_entry_points_are_all_there() {
    // The brief's list (ABI sheet §6.2), checked by name so that a trimmed list cannot pass.
    for name in [
        "cuInit",
        "cuDeviceGet",
        "cuDevicePrimaryCtxRetain",
        "cuCtxCreate_v2",
        "cuCtxSetCurrent",
        "cuModuleLoadData",
        "cuModuleGetFunction",
        "cuLibraryLoadData",
        "cuLibraryGetKernel",
        "cuKernelGetFunction",
        "cuLaunchKernel",
        "cuLaunchKernel_ptsz",
        "cuLaunchKernelEx",
        "cuLaunchKernelEx_ptsz",
        "cuLaunchCooperativeKernel",
        "cuLaunchCooperativeKernel_ptsz",
        "cuGraphCreate",
        "cuGraphInstantiate",
        "cuGraphLaunch",
        "cuGraphLaunch_ptsz",
        "cuMemAlloc_v2",
        "cuMemAllocAsync",
        "cuMemAllocAsync_ptsz",
        "cuMemAllocManaged",
        "cuMemAllocPitch_v2",
        "cuMemAllocHost_v2",
        "cuMemCreate",
        "cuMemRelease",
        "cuMemFree_v2",
        "cuMemFreeAsync",
        "cuMemFreeAsync_ptsz",
        "cuMemFreeHost",
        "cuGetProcAddress_v2",
        "cuGetProcAddress",
        "cuGetErrorString",
    ] {
        assert!(EXPORTED_SYMBOLS.contains(&name), "{name} is exported");
    }
}

#[test]
fn push_variant_entry_points_start_with_push_rbp() {
    let e = elf("push");
    for (name, addr) in e.exported_cuda_functions() {
        // push %rbp ; mov %rsp,%rbp
        assert_eq!(e.bytes_at(addr, 4), [0x55, 0x48, 0x89, 0xe5], "push: {name} at {addr:#x}");
    }
}

#[test]
fn endbr64_variant_entry_points_start_with_endbr64_then_push_rbp() {
    let e = elf("endbr64");
    for (name, addr) in e.exported_cuda_functions() {
        // endbr64 ; push %rbp
        assert_eq!(e.bytes_at(addr, 5), [0xf3, 0x0f, 0x1e, 0xfa, 0x55], "endbr64: {name} at {addr:#x}");
    }
}

/// One decoded thunk: `cmpl $IMM, FLAG(%rip)` ; `je ERR` ; `jmp *SLOT(%rip)`.
#[derive(Debug)]
struct Thunk {
    flag: u64,
    imm: u32,
    error_path: u64,
    slot: u64,
}

fn decode_thunk(e: &Elf, name: &str, addr: u64) -> Thunk {
    let b = e.bytes_at(addr, 18);
    // 81 /7 with ModRM 0x3d (mod 00, reg 7 = cmp, rm 101 = rip+disp32), then disp32 and imm32.
    assert_eq!(b[..2], [0x81, 0x3d], "{name}: cmpl imm32, disp32(%rip) first, got {b:02x?}");
    let flag = (addr + 10).wrapping_add_signed(i64::from(i32::from_le_bytes(b[2..6].try_into().unwrap())));
    let imm = u32::from_le_bytes(b[6..10].try_into().unwrap());
    assert_eq!(b[10], 0x74, "{name}: je rel8 second, got {b:02x?}");
    let error_path = (addr + 12).wrapping_add_signed(i64::from(b[11] as i8));
    // ff /4 with ModRM 0x25: jmp *disp32(%rip).
    assert_eq!(b[12..14], [0xff, 0x25], "{name}: jmp *disp32(%rip) third, got {b:02x?}");
    let slot = (addr + 18).wrapping_add_signed(i64::from(i32::from_le_bytes(b[14..18].try_into().unwrap())));
    Thunk { flag, imm, error_path, slot }
}

#[test]
fn thunk_variant_entry_points_are_stubs_jumping_through_relative_slots_to_push_implementations() {
    let e = elf("thunk");
    let relocs: BTreeMap<u64, Rela> = e.relocations().into_iter().map(|r| (r.offset, r)).collect();
    let local: BTreeMap<String, Symbol> =
        e.symbols(SHT_SYMTAB).into_iter().filter(|s| s.shndx != 0).map(|s| (s.name.clone(), s)).collect();
    let mut flags = BTreeSet::new();
    let mut slots = BTreeSet::new();
    for (name, addr) in e.exported_cuda_functions() {
        let t = decode_thunk(&e, &name, addr);
        assert_eq!(t.imm, 0x321c_ba00, "{name}: the real stubs' comparison value");
        assert_eq!(e.bytes_at(t.error_path, 6), [0xb8, 0x04, 0, 0, 0, 0xc3], "{name}: je -> mov $4,%eax; ret");
        flags.insert(t.flag);
        assert!(slots.insert(t.slot), "{name}: its own slot");

        let slot_section = e.section_at(t.slot);
        assert!(slot_section.flags & SHF_WRITE != 0, "{name}: slot {:#x} in writable {}", t.slot, slot_section.name);
        let r = relocs.get(&t.slot).unwrap_or_else(|| panic!("{name}: no relocation for slot {:#x}", t.slot));
        assert_eq!(r.kind, R_X86_64_RELATIVE, "{name}: slot relocation type");
        let target = u64::try_from(r.addend).expect("non-negative addend");
        let implementation = &local[&thunk_implementation(&name)];
        assert_eq!(target, implementation.value, "{name}: slot -> {}", implementation.name);
        assert_ne!(target, addr);
        assert_eq!(e.bytes_at(target, 4), [0x55, 0x48, 0x89, 0xe5], "{name}: implementation starts push %rbp");
        assert!(
            !e.exported_cuda_functions().values().any(|&a| a == target),
            "{name}: the implementation is not exported"
        );
    }
    assert_eq!(flags.len(), 1, "every stub tests the same flag");
    let flag = *flags.first().unwrap();
    assert!(e.section_at(flag).flags & SHF_WRITE != 0, "the flag is writable data");
}

/// The first instruction at each symbol in `objdump -d` output: name -> (mnemonic, operands).
fn objdump_first_instructions(path: &Path) -> BTreeMap<String, String> {
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", "--wide"])
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("run objdump (Debian package binutils, installed with gcc): {e}"));
    assert!(out.status.success(), "objdump -d {} failed: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut firsts = BTreeMap::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        // "0000000000002481 <cuLaunchKernel>:"
        let Some(name) = line.strip_suffix(">:").and_then(|l| l.split_once(" <")).map(|(_, n)| n) else { continue };
        let insn = lines.next().unwrap_or_default();
        // "    2481:\tendbr64"
        let text = insn.split_once(":\t").map_or("", |(_, t)| t).split_whitespace().collect::<Vec<_>>().join(" ");
        firsts.insert(name.to_string(), text);
    }
    firsts
}

#[test]
fn objdump_agrees_on_each_variants_first_instruction() {
    let thunk_implementations: Vec<String> = EXPORTED_SYMBOLS.iter().map(|s| thunk_implementation(s)).collect();
    for (v, want) in [("push", "push %rbp"), ("endbr64", "endbr64"), ("thunk", "cmpl $0x321cba00,")] {
        let firsts = objdump_first_instructions(&fake_libcuda(v));
        for name in EXPORTED_SYMBOLS {
            let got = firsts.get(*name).unwrap_or_else(|| panic!("{v}: objdump shows no {name}"));
            assert!(got.starts_with(want), "{v}: {name} starts with {got:?}, expected {want:?}");
            if v == "thunk" {
                assert!(got.contains("(%rip)"), "{v}: {name}: the cmpl is rip-relative: {got:?}");
            }
        }
        if v == "thunk" {
            for name in &thunk_implementations {
                assert_eq!(firsts.get(name).map(String::as_str), Some("push %rbp"), "{v}: {name}");
            }
        }
    }
}

// ----- the workload in CUDA mode ------------------------------------------------------------------

fn workload(lib: &Path) -> Workload {
    Workload::builder(Path::new("/nonexistent-dev"))
        .binary(env!("CARGO_BIN_EXE_nv-workload"))
        .libcuda(lib)
        .spawn()
        .expect("nv-workload starts")
}

fn ok(w: &mut Workload, cmd: &str) -> Answer {
    w.ok(cmd).unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

fn err(w: &mut Workload, cmd: &str) -> Answer {
    let a = w.answer(cmd).unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(!a.ok, "{cmd} should fail, got {:?}", a.line);
    a
}

fn device_pointer(w: &mut Workload, cmd: &str, live: &mut BTreeSet<u64>) -> u64 {
    let p = ok(w, cmd).number("ptr").unwrap();
    assert!((FAKE_VA_BASE..FAKE_VA_END).contains(&p), "{cmd}: {p:#x} in the fake device range");
    assert!(p.is_multiple_of(FAKE_GRANULE), "{cmd}: {p:#x} is 2 MiB aligned");
    assert!(live.insert(p), "{cmd}: {p:#x} is distinct from the live pointers");
    p
}

fn exercise(variant: &str) {
    let mut w = workload(&fake_libcuda(variant));
    // Before cuInit, as with the real library.
    let a = err(&mut w, "cuda-launch 1");
    assert_eq!(a.get("code"), Some("3"), "{variant}: {:?}", a.line);

    let init = ok(&mut w, "cuda-init");
    for key in ["ctx", "func", "module", "library", "kernel", "kernel_func", "stream", "graph_exec"] {
        assert_ne!(init.number(key).unwrap(), 0, "{variant}: cuda-init {key}");
    }
    let handles: BTreeSet<u64> = ["func", "module", "library", "kernel", "kernel_func", "stream", "graph_exec"]
        .iter()
        .map(|k| init.number(k).unwrap())
        .collect();
    assert_eq!(handles.len(), 7, "{variant}: distinct handles in {:?}", init.line);

    for (cmd, n) in [
        ("cuda-launch", 1000),
        ("cuda-launch-ptsz", 10),
        ("cuda-launch-ex", 10),
        ("cuda-launch-ex-ptsz", 10),
        ("cuda-launch-coop", 10),
        ("cuda-launch-coop-ptsz", 10),
        ("cuda-graph-launch", 10),
        ("cuda-graph-launch-ptsz", 10),
        ("cuda-procaddr-launch", 10),
    ] {
        assert_eq!(ok(&mut w, &format!("{cmd} {n}")).number("launched").unwrap(), n, "{variant}: {cmd}");
    }
    let t = ok(&mut w, "cuda-launch-threads 2 500");
    assert_eq!(t.number("launched").unwrap(), 1000, "{variant}");
    assert_eq!(t.number("threads").unwrap(), 2, "{variant}");

    // cuGetProcAddress hands out the exported symbol's own address.
    let p = ok(&mut w, "cuda-procaddr-launch 1");
    assert_eq!(p.number("addr").unwrap(), p.number("dlsym").unwrap(), "{variant}: {:?}", p.line);
    let p = ok(&mut w, "cuda-procaddr cuLaunchKernel 12000 2");
    let ptsz = ok(&mut w, "cuda-procaddr cuLaunchKernel_ptsz");
    assert_eq!(p.number("addr").unwrap(), ptsz.number("dlsym").unwrap(), "{variant}: per-thread stream -> _ptsz");
    let p = ok(&mut w, "cuda-procaddr cuMemAlloc");
    let v2 = ok(&mut w, "cuda-procaddr cuMemAlloc_v2");
    assert_eq!(p.number("addr").unwrap(), v2.number("dlsym").unwrap(), "{variant}: cuMemAlloc -> _v2");
    assert_eq!(err(&mut w, "cuda-procaddr cuNoSuchThing").get("code"), Some("500"));

    // Names map to stable handles; a named function becomes the launch target.
    let f1 = ok(&mut w, "cuda-get-function my_kernel").number("func").unwrap();
    let f2 = ok(&mut w, "cuda-get-function my_kernel").number("func").unwrap();
    assert_eq!(f1, f2, "{variant}: same name, same handle");
    let init_func = ok(&mut w, &format!("cuda-get-function {INIT_FUNCTION_NAME}")).number("func").unwrap();
    assert_eq!(init_func, init.number("func").unwrap());
    assert_ne!(f1, init_func);
    ok(&mut w, "cuda-launch 3");
    let k = ok(&mut w, "cuda-get-kernel lib_kernel");
    assert_eq!(ok(&mut w, "cuda-state").number("func").unwrap(), k.number("kernel").unwrap());
    ok(&mut w, "cuda-launch 3");
    let ctx = ok(&mut w, "cuda-ctx-create").number("ctx").unwrap();
    assert_ne!(ctx, init.number("ctx").unwrap());

    // Allocations: distinct, aligned device pointers; exact frees; double and unknown frees fail.
    let mut live = BTreeSet::new();
    let a = device_pointer(&mut w, "cuda-alloc 1", &mut live);
    let b = device_pointer(&mut w, "cuda-alloc 3M", &mut live);
    let c = device_pointer(&mut w, "cuda-alloc-async 1G", &mut live);
    let d = device_pointer(&mut w, "cuda-alloc-async-ptsz 4096", &mut live);
    let m = device_pointer(&mut w, "cuda-alloc-managed 10M", &mut live);
    let pitch = ok(&mut w, "cuda-alloc-pitch 1000 100");
    assert_eq!(pitch.number("pitch").unwrap(), 1024, "{variant}: 512-byte pitch alignment");
    assert_eq!(pitch.number("bytes").unwrap(), 102_400);
    let pp = pitch.number("ptr").unwrap();
    assert!(live.insert(pp) && pp.is_multiple_of(FAKE_GRANULE));
    assert!(b >= a + FAKE_GRANULE && c >= b + 2 * FAKE_GRANULE, "{variant}: no overlap: {a:#x} {b:#x} {c:#x}");

    ok(&mut w, &format!("cuda-free {a:#x}"));
    assert_eq!(err(&mut w, &format!("cuda-free {a:#x}")).get("code"), Some("1"), "{variant}: double free");
    assert_eq!(err(&mut w, "cuda-free 0x1234").get("code"), Some("1"), "{variant}: unknown pointer");
    assert_eq!(err(&mut w, &format!("cuda-free {:#x}", b + 4096)).get("code"), Some("1"), "{variant}: interior");
    ok(&mut w, &format!("cuda-free-async {b:#x}"));
    ok(&mut w, &format!("cuda-free-async-ptsz {c:#x}"));
    assert_eq!(err(&mut w, &format!("cuda-free-async {c:#x}")).get("code"), Some("1"));
    ok(&mut w, &format!("cuda-free {d:#x}"));
    ok(&mut w, &format!("cuda-free {m:#x}"));
    ok(&mut w, &format!("cuda-free {pp:#x}"));
    // A freed pointer is not reused while the address range lasts.
    let again = ok(&mut w, "cuda-alloc 1").number("ptr").unwrap();
    assert!(!live.contains(&again), "{variant}: {again:#x} is fresh");

    // Host memory is real memory, freed by cuMemFreeHost only.
    let host = ok(&mut w, "cuda-alloc-host 4096").number("ptr").unwrap();
    assert!(host != 0 && !(FAKE_VA_BASE..FAKE_VA_END).contains(&host), "{variant}: host pointer {host:#x}");
    assert_eq!(err(&mut w, &format!("cuda-free {host:#x}")).get("code"), Some("1"));
    ok(&mut w, &format!("cuda-free-host {host:#x}"));
    assert_eq!(err(&mut w, &format!("cuda-free-host {host:#x}")).get("code"), Some("1"));

    // Physical allocations: handles, released once.
    let mc = ok(&mut w, "cuda-mem-create 3M");
    assert_eq!(mc.number("size").unwrap(), 2 * MEM_CREATE_GRANULE);
    let h1 = mc.number("handle").unwrap();
    let h2 = ok(&mut w, "cuda-mem-create 2M").number("handle").unwrap();
    assert!(h1 != 0 && h1 != h2, "{variant}: distinct handles");
    ok(&mut w, &format!("cuda-mem-release {h1:#x}"));
    assert_eq!(err(&mut w, &format!("cuda-mem-release {h1:#x}")).get("code"), Some("1"), "{variant}: double release");

    // A caching allocator: a few big blocks once, then launches, no frees.
    let cp = ok(&mut w, "cuda-caching-pattern 3 256M 500");
    assert_eq!(cp.number("bytes").unwrap(), 3 << 28);
    assert_eq!(cp.number("launched").unwrap(), 500);
    let ptrs: BTreeSet<&str> = cp.get("ptrs").unwrap().split(',').collect();
    assert_eq!(ptrs.len(), 3, "{variant}: {:?}", cp.line);

    // Out of (80 GiB of fake) device memory.
    assert_eq!(err(&mut w, "cuda-alloc 81G").get("code"), Some("2"), "{variant}: larger than the card");
    for _ in 0..2 {
        ok(&mut w, "cuda-alloc 30G");
    }
    assert_eq!(err(&mut w, "cuda-alloc 30G").get("code"), Some("2"), "{variant}: out of memory");

    assert_eq!(w.finish().unwrap().code(), Some(0));
}

#[test]
fn workload_cuda_mode_on_the_push_variant() {
    exercise("push");
}

#[test]
fn workload_cuda_mode_on_the_endbr64_variant() {
    exercise("endbr64");
}

#[test]
fn workload_cuda_mode_on_the_thunk_variant() {
    exercise("thunk");
}

#[test]
fn workload_without_libcuda_refuses_cuda_commands() {
    let mut w = Workload::builder(Path::new("/nonexistent-dev"))
        .binary(env!("CARGO_BIN_EXE_nv-workload"))
        .spawn()
        .expect("nv-workload starts");
    assert!(err(&mut w, "cuda-init").line.starts_with("err state: no libcuda"));
    ok(&mut w, "pid");
}

#[test]
fn workload_refuses_a_library_that_does_not_load() {
    let out = Command::new(env!("CARGO_BIN_EXE_nv-workload"))
        .args(["--libcuda", "/nonexistent/libcuda.so.1", "--script", "pid"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("dlopen /nonexistent/libcuda.so.1"));
}

#[test]
fn the_real_libcuda_answers_errors_without_crashing() {
    assert!(
        Path::new(REAL_LIBCUDA).exists(),
        "{REAL_LIBCUDA} is missing: `cargo xtask setup` installs it (Debian non-free package libcuda1). \
         This test fails instead of skipping on purpose."
    );
    let mut w = workload(Path::new(REAL_LIBCUDA));
    let gpu = Path::new("/dev/nvidiactl").exists();
    let init = w.answer("cuda-init").unwrap();
    if gpu && init.ok {
        // A machine with a working driver: nothing more to check here.
        return;
    }
    assert!(init.line.starts_with("err op=cuInit code="), "{:?}", init.line);
    if !gpu {
        assert_eq!(init.get("code"), Some("100"), "CUDA_ERROR_NO_DEVICE without a GPU: {:?}", init.line);
    }
    // Every entry point then returns an error; launches go out with a NULL function.
    for cmd in [
        "cuda-launch 5",
        "cuda-launch-ptsz 2",
        "cuda-launch-ex 2",
        "cuda-launch-coop 2",
        "cuda-graph-launch 2",
        "cuda-launch-threads 2 5",
        "cuda-procaddr-launch 2",
        "cuda-alloc 1M",
        "cuda-alloc-pitch 100 10",
        "cuda-mem-create 2M",
        "cuda-free 0x700000000000",
        "cuda-caching-pattern 1 1M 1",
    ] {
        let a = err(&mut w, cmd);
        assert!(a.line.starts_with("err op=cu"), "{cmd}: {:?}", a.line);
        assert_ne!(a.get("code"), Some("0"), "{cmd}: {:?}", a.line);
    }
    let l = err(&mut w, "cuda-launch 7");
    assert_eq!((l.number("calls").unwrap(), l.number("failed").unwrap()), (7, 7), "every call is made");
    // The real cuGetProcAddress also returns the exported symbol.
    let p = ok(&mut w, "cuda-procaddr cuLaunchKernel");
    assert_eq!(p.number("addr").unwrap(), p.number("dlsym").unwrap());
    ok(&mut w, "pid");
    assert_eq!(w.finish().unwrap().code(), Some(0), "the workload survived");
}
