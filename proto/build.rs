//! Generates the Rust types for `gputracer/v1/*.proto` with protox (a pure-Rust protobuf compiler,
//! so no `protoc` is needed on the build machine) and prost-build.

use std::path::PathBuf;

const PROTOS: &[&str] = &["gputracer/v1/events.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={}", root.join(proto).display());
    }
    let fds = protox::compile(PROTOS, [&root])?;
    let mut config = prost_build::Config::new();
    // Only with the `serde` feature; cfg_attr keeps the generated file the same either way.
    config.type_attribute(".", "#[cfg_attr(feature = \"serde\", derive(serde::Serialize, serde::Deserialize))]");
    config.compile_fds(fds)?;
    Ok(())
}
