//! `cargo xtask sim`: simulation runs.

pub fn run(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("`cargo xtask sim` is not implemented yet")
}
