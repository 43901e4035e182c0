//! Builds the fake `libcuda.so.1` (tests/fake_libcuda/) in its three prologue variants with the
//! system C compiler, into `$OUT_DIR/fake-libcuda/<variant>/libcuda.so.1`, and tells the crate
//! where (`FAKE_LIBCUDA_DIR`). The variants differ only in the first instruction a uprobe on an
//! exported entry point meets; see tests/fake_libcuda/fake_libcuda.c.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Flags every variant shares: the frame set-up (`push %rbp`) is the first thing in every function,
/// and only the API is exported. `-O0`, because at `-O1` gcc 12 drops the frame from leaf functions
/// that never touch the stack (cuInit, cuDeviceGet, ...) even with `-fno-omit-frame-pointer`; it
/// also keeps identical bodies (`cuLaunchKernel`/`cuLaunchKernel_ptsz`) apart. The tests check the
/// first instruction of every entry point.
const COMMON_FLAGS: &[&str] = &[
    "-shared",
    "-fPIC",
    "-std=gnu11",
    "-O0",
    "-fno-omit-frame-pointer",
    "-fvisibility=hidden",
    "-pthread",
    "-Wall",
    "-Wextra",
    "-Wl,-soname,libcuda.so.1",
    "-Wl,-z,noexecstack",
];

/// (variant, its own flags, its sources besides fake_libcuda.c).
const VARIANTS: &[(&str, &[&str], &[&str])] = &[
    ("push", &["-fcf-protection=none"], &[]),
    ("endbr64", &["-fcf-protection=full"], &[]),
    ("thunk", &["-fcf-protection=none", "-DFAKE_LIBCUDA_THUNK"], &["thunks.S"]),
];

/// The arm64 build's variants (cross-built with Debian's `aarch64-linux-gnu-gcc`): `stp`, a plain
/// frame set-up first (`stp x29, x30, [sp, #-N]!`, single-stepped by the kernel), and `pac`,
/// built for branch protection: `paciasp` (pointer authentication, also a BTI landing pad) first
/// where the function saves its return address, `bti c` first elsewhere; and `thunk`, the real
/// arm64 535 library's stubs (thunks_aarch64.S).
const VARIANTS_AARCH64: &[(&str, &[&str], &[&str])] = &[
    ("stp", &["-mbranch-protection=none"], &[]),
    ("pac", &["-mbranch-protection=standard"], &[]),
    ("thunk", &["-mbranch-protection=none", "-DFAKE_LIBCUDA_THUNK"], &["thunks_aarch64.S"]),
];

const SOURCES: &[&str] = &["fake_libcuda.c", "symbols.h", "thunks.S", "thunks_aarch64.S"];

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let src = manifest.join("fake_libcuda");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("fake-libcuda");
    println!("cargo:rerun-if-changed=build.rs");
    for s in SOURCES {
        println!("cargo:rerun-if-changed=fake_libcuda/{s}");
    }
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo:rerun-if-env-changed=CC_aarch64_unknown_linux_gnu");

    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let (variants, cc) = match arch.as_str() {
        "x86_64" => (VARIANTS, compiler(&["cc", "gcc"])),
        "aarch64" => (VARIANTS_AARCH64, compiler(&["aarch64-linux-gnu-gcc"])),
        _ => fail(&format!(
            "the fake libcuda.so.1 (tests/fake_libcuda) is built for x86_64 and aarch64, and this build targets {arch}"
        )),
    };
    for (variant, flags, extra) in variants {
        let dir = out.join(variant);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| fail(&format!("mkdir {}: {e}", dir.display())));
        let lib = dir.join("libcuda.so.1");
        let mut cmd = Command::new(&cc);
        cmd.args(COMMON_FLAGS).args(*flags).arg("-I").arg(&src).arg("-o").arg(&lib).arg(src.join("fake_libcuda.c"));
        cmd.args(extra.iter().map(|s| src.join(s)));
        run(&mut cmd, variant, &src);
    }
    println!("cargo:rustc-env=FAKE_LIBCUDA_DIR={}", out.display());
}

/// `$CC_<target>` or `$CC` (as the `cc` crate reads them), else the first of `defaults` that runs.
fn compiler(defaults: &[&str]) -> String {
    let target = std::env::var("TARGET").unwrap_or_default().replace('-', "_");
    let candidates: Vec<String> = [format!("CC_{target}"), "CC".into()]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .into_iter()
        .chain(defaults.iter().map(|s| s.to_string()))
        .collect();
    for c in &candidates {
        if Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()) {
            return c.clone();
        }
    }
    fail(&format!(
        "no C compiler found (tried {candidates:?}); the fake libcuda.so.1 (tests/fake_libcuda) is C (and x86_64 \
         assembly) built with gcc. Install it: `apt-get install gcc` (Debian package gcc; for arm64 \
         gcc-aarch64-linux-gnu, which `cargo xtask arm64` installs), or set CC"
    ))
}

fn run(cmd: &mut Command, variant: &str, src: &Path) {
    let shown = format!("{cmd:?}");
    let output = cmd.output().unwrap_or_else(|e| fail(&format!("run {shown}: {e}")));
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        fail(&format!(
            "building the {variant} variant of the fake libcuda.so.1 from {} failed ({}):\n{shown}\n{stderr}",
            src.display(),
            output.status
        ));
    }
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        println!("cargo:warning=fake libcuda ({variant}): {line}");
    }
}

fn fail(msg: &str) -> ! {
    panic!("{msg}");
}
