//! `cargo xtask gpu-check`: prepare the real-GPU check. The device machine (the `device` tool's
//! `run`) reaches no package registry, so everything it needs is built here: a release
//! `gpu-tracer`, stripped of debug info to stay well under the 64 MiB the tool carries, at
//! `target/gpu-check/gpu-tracer`. There, `scripts/gpu-check/run.sh` runs the agent against the real
//! driver, libcuda and a PyTorch workload and writes `$OUT/report.md` (tracer vs nvidia-smi vs
//! torch.cuda).

use anyhow::Context;

use crate::{cmd, setup};

pub fn run() -> anyhow::Result<()> {
    let env = setup::run_setup()?;
    let mut build = env.cargo();
    build.args(["build", "--release", "-p", "gpu-tracer", "--bin", "gpu-tracer"]);
    cmd::run(&mut build)?;
    std::fs::create_dir_all("target/gpu-check").context("creating target/gpu-check")?;
    let mut strip = std::process::Command::new("objcopy");
    strip.args(["--strip-debug", "target/release/gpu-tracer", "target/gpu-check/gpu-tracer"]);
    cmd::run(&mut strip).context("objcopy (Debian package binutils) strips the binary for the device")?;
    let size = std::fs::metadata("target/gpu-check/gpu-tracer")?.len();
    println!("gpu-check: target/gpu-check/gpu-tracer ready ({:.1} MiB)", size as f64 / (1 << 20) as f64);
    println!("gpu-check: on the device machine run, from the repo root, carrying target/gpu-check:");
    println!("  GPU_TRACER=target/gpu-check/gpu-tracer OUT=$OUT bash scripts/gpu-check/run.sh");
    println!("gpu-check: it writes $OUT/report.md (tracer vs nvidia-smi vs torch.cuda) and the raw files beside it");
    Ok(())
}
