//! Builds the kernel programs (`tracer-ebpf`) for bpfel with aya-build and the nightly toolchain
//! (override with `AYA_EBPF_TOOLCHAIN`, e.g. `stable` together with `RUSTC_BOOTSTRAP=1`).
//! `cargo xtask setup` installs what this needs (rust-src, bpf-linker); see docs/toolchain.md.
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=AYA_EBPF_TOOLCHAIN");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tracer-ebpf");
    let tc = std::env::var("AYA_EBPF_TOOLCHAIN").ok();
    let toolchain = match tc.as_deref() {
        Some(t) if !t.is_empty() && t != "nightly" => Toolchain::Custom(t),
        _ => Toolchain::Nightly,
    };
    println!("cargo:rerun-if-changed={root}/../tracer-common/src");
    aya_build::build_ebpf([Package { name: "tracer-ebpf", root_dir: root, ..Default::default() }], toolchain)
        .map_err(|e| anyhow::anyhow!("building the eBPF programs failed: {e:#}\n  hint: run `cargo xtask setup` (installs rust-src and bpf-linker)"))
}
