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
    // Details quote paths, library names and errors from the node.
    let text = if a.json {
        report.to_json()? + "\n"
    } else {
        tracer_core::format::printable(&report.render_text()).into_owned()
    };
    let mut stdout = std::io::stdout();
    stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).context("writing the report to stdout")?;
    if report.failed() {
        std::process::exit(1);
    }
    Ok(())
}
