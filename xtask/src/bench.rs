//! `cargo xtask bench`: benchmarks.

pub fn run(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("`cargo xtask bench` is not implemented yet")
}
