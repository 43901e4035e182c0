//! `cargo xtask build`: setup, then a release build of the default members.

use crate::{cmd, setup};

pub fn run() -> anyhow::Result<()> {
    let env = setup::run_setup()?;
    // Default members only: the eBPF crate cannot be built for the host; tracer-agent's build.rs
    // builds it for bpfel with aya-build (never pass --workspace).
    let mut build = env.cargo();
    build.args(["build", "--release"]);
    cmd::run(&mut build)
}
