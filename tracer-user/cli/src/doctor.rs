//! `gpu-tracer doctor`: what works on this node and why not.
use std::io::Write;

use anyhow::{Context, Result};
use clap::Args;
use tracer_agent::doctor;
use tracer_core::config::Config;

#[derive(Args)]
pub(crate) struct DoctorArgs {
    /// JSON output.
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) async fn run_doctor(cfg: Config, a: DoctorArgs) -> Result<()> {
    let report = doctor::run(&cfg).await;
    let text = if a.json { report.to_json()? + "\n" } else { report.render_text() };
    let mut stdout = std::io::stdout();
    stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).context("writing the report to stdout")?;
    if report.failed() {
        std::process::exit(1);
    }
    Ok(())
}
