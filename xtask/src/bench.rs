//! `cargo xtask bench`: setup, then the benchmark suite (the `gpu-tracer-bench` crate in bench/),
//! which rewrites docs/benchmarks.md. Arguments after `bench` go to `gpu-tracer-bench`.

use crate::{cmd, setup};

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let env = setup::run_setup()?;
    let mut bench = env.cargo();
    bench.args(["run", "--release", "-p", "gpu-tracer-bench", "--", "--write", "docs/benchmarks.md"]).args(args);
    cmd::run(&mut bench)
}
