//! `nv-workload`: act like a CUDA application at the ioctl level, one phase per command.
//!
//! Interactive (default): one command per stdin line, one answer line per command on stdout.
//! `--script "init 0; alloc-rm 1G; sleep-ms 500; free-client; close-all"` runs a fixed sequence,
//! and `--loop` repeats it forever (for demos and the simulated node).

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use gpu_tracer_tests::fake_driver::rm::parse_version;
use gpu_tracer_tests::workload::{CudaLikeClient, HELP, WorkloadOptions, render};

#[derive(Parser, Debug)]
#[command(about = "A CUDA-like workload at the ioctl level", after_help = HELP)]
struct Args {
    /// Directory with nvidiactl, nvidiaN, nvidia-uvm.
    #[arg(long, default_value = "/dev")]
    dev_dir: PathBuf,
    /// Driver version whose struct layouts and version string to use.
    #[arg(long, default_value = "535.261.03")]
    driver_version: String,
    /// Run these commands (separated by ';' or newlines) instead of reading stdin.
    #[arg(long)]
    script: Option<String>,
    /// With --script: repeat it forever.
    #[arg(long, requires = "script")]
    r#loop: bool,
    /// With --loop: pause between iterations, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    loop_sleep_ms: u64,
    /// dlopen this libcuda.so.1 at start-up for the cuda-* commands.
    #[arg(long)]
    libcuda: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let driver_version = parse_version(&args.driver_version)
        .with_context(|| format!("--driver-version {:?} is not major.minor.patch", args.driver_version))?;
    let mut client = CudaLikeClient::new(WorkloadOptions { dev_dir: args.dev_dir, driver_version });
    if let Some(lib) = &args.libcuda {
        client.load_libcuda(lib).map_err(anyhow::Error::msg).context("--libcuda")?;
    }
    let stdout = std::io::stdout();

    let Some(script) = args.script else {
        for line in std::io::stdin().lock().lines() {
            let line = line.context("read stdin")?;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            answer(&stdout, &client.execute(line))?;
            if client.exit_requested() {
                // Exit without freeing or closing anything: the kernel closes the fds.
                std::process::exit(0);
            }
        }
        return Ok(());
    };

    let commands: Vec<&str> =
        script.split([';', '\n']).map(str::trim).filter(|c| !c.is_empty() && !c.starts_with('#')).collect();
    loop {
        for c in &commands {
            let outcome = client.execute(c);
            answer(&stdout, &outcome)?;
            if client.exit_requested() {
                std::process::exit(0);
            }
            if outcome.is_err() {
                if !args.r#loop {
                    std::process::exit(1);
                }
                // Start the next iteration from a clean slate.
                client.close_all();
                break;
            }
        }
        if !args.r#loop {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(args.loop_sleep_ms));
    }
}

fn answer(stdout: &std::io::Stdout, outcome: &gpu_tracer_tests::workload::Outcome) -> anyhow::Result<()> {
    let mut out = stdout.lock();
    writeln!(out, "{}", render(outcome)).and_then(|()| out.flush()).context("write stdout")
}
