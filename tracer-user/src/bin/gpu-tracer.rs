fn main() -> anyhow::Result<()> {
    let cfg = tracer_user::config::Config::default();
    let abi = tracer_common::nv::DriverAbi::for_version(tracer_common::nv::DEFAULT_DRIVER_VERSION);
    for mode in [tracer_user::config::AttachMode::SyscallTracepoint, tracer_user::config::AttachMode::RawTracepoint, tracer_user::config::AttachMode::BtfTracepoint] {
        let cfg = tracer_user::config::Config { attach_mode: mode, ..cfg.clone() };
        let p = tracer_user::probe::Probes::load(&cfg, &abi, &[], &[])?;
        println!("{}", serde_json::to_string_pretty(&p.report)?);
    }
    Ok(())
}
