fn main() {
    // Rebuild hint only; the crate is compiled for bpfel by tracer-user's build.rs (aya-build).
    println!("cargo:rerun-if-env-changed=CARGO_CFG_BPF_TARGET_ARCH");
}
