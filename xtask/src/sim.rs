//! `cargo xtask sim`: the main job on a simulated GPU node.
//!
//! Setup, then a release build of the tracer and the test doubles, then `gpu-tracer-sim` (in the
//! tests crate, `tests/src/bin/gpu-tracer-sim.rs`): a fake NVIDIA driver with two GPUs, three pods
//! running CUDA-like workloads, and the real `gpu-tracer top` watching them. Arguments after
//! `sim` go to `gpu-tracer-sim` (e.g. `--duration 60`).

use crate::{cmd, setup};
use anyhow::{Context, bail};
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let env = setup::run_setup()?;
    let build_start = Instant::now();
    let mut build = env.cargo();
    build.args(["build", "--release", "-p", "gpu-tracer", "-p", "gpu-tracer-tests"]);
    cmd::run(&mut build)?;
    println!("xtask sim: build done in {:.1} s", build_start.elapsed().as_secs_f64());

    let sim = target_dir(&env)?.join("release").join("gpu-tracer-sim");
    if !sim.is_file() {
        bail!("{} is missing after the build", sim.display());
    }
    let mut run = Command::new(&sim);
    run.args(args).current_dir(cmd::workspace_root());
    run_in_foreground(&mut run)
}

/// The target directory cargo builds into (honours `CARGO_TARGET_DIR` and cargo config).
fn target_dir(env: &setup::BuildEnv) -> anyhow::Result<PathBuf> {
    let mut meta = env.cargo();
    meta.args(["metadata", "--format-version", "1", "--no-deps"]);
    let out = cmd::output(&mut meta)?;
    let v: serde_json::Value = serde_json::from_str(&out).context("parsing `cargo metadata` output")?;
    v["target_directory"].as_str().map(PathBuf::from).context("`cargo metadata` names no target_directory")
}

/// Runs `cmd` like [`cmd::run`], but leaves Ctrl-C to it: the terminal sends SIGINT to the whole
/// foreground group, and the simulation needs to outlive it to clean up (unmount, remove cgroups)
/// and print its last lines before the shell prompt comes back.
fn run_in_foreground(cmd: &mut Command) -> anyhow::Result<()> {
    let line = cmd::display(cmd);
    println!("+ {line}");
    let mut child = cmd.spawn().with_context(|| format!("could not start `{line}`"))?;
    // SAFETY: setting a signal disposition to SIG_IGN has no preconditions; the child was spawned
    // before, with the default disposition.
    let previous = unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    let status = child.wait();
    // SAFETY: restores the disposition read above.
    unsafe { libc::signal(libc::SIGINT, previous) };
    let status = status.with_context(|| format!("waiting for `{line}`"))?;
    if status.code() == Some(130) {
        bail!("interrupted");
    }
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}
