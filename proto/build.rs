//! Generates the Rust types for `gputracer/v1/*.proto` with protox (a pure-Rust protobuf compiler,
//! so no `protoc` is needed on the build machine) and prost-build; with the `api` feature the same
//! package with the tonic client and server of the agent's API (`gputracer.v1.GpuTracer`); with the
//! kubelet pod-resources API's messages (`podresources/v1/api.proto`), and with the `kubelet`
//! feature its tonic client and server.

use std::path::PathBuf;

const PROTOS: &[&str] = &["gputracer/v1/events.proto", "gputracer/v1/snapshot.proto", "gputracer/v1/api.proto"];
const KUBELET_PROTOS: &[&str] = &["podresources/v1/api.proto"];
/// The subset of Perfetto's trace format `gpu-tracer profile` writes (package `perfetto.protos`).
const PERFETTO_PROTOS: &[&str] = &["perfetto/trace_subset.proto"];
/// Only with the `serde` feature; cfg_attr keeps the generated file the same either way.
const SERDE: &str = "#[cfg_attr(feature = \"serde\", derive(serde::Serialize, serde::Deserialize))]";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    for proto in PROTOS.iter().chain(KUBELET_PROTOS).chain(PERFETTO_PROTOS) {
        println!("cargo:rerun-if-changed={}", root.join(proto).display());
    }
    let fds = protox::compile(PROTOS, [&root])?;
    #[cfg(feature = "api")]
    {
        tonic_prost_build::configure()
            .build_client(true)
            .build_server(false)
            .build_transport(false)
            .type_attribute(".gputracer", SERDE)
            .compile_fds(fds.clone())?;
        // The server alone, over the messages above, except that its `Subscribe` stream sends
        // `EncodedSubscribeResponse`: each event is encoded once by the agent and the same bytes go
        // to every subscriber (clients decode plain `SubscribeResponse`s: the bytes are the same).
        let server = PathBuf::from(std::env::var("OUT_DIR")?).join("server");
        std::fs::create_dir_all(&server)?;
        tonic_prost_build::configure()
            .build_client(false)
            .build_server(true)
            .build_transport(false)
            .extern_path(".gputracer.v1.SubscribeResponse", "crate::EncodedSubscribeResponse")
            // `ProfileResponse` shares `SubscribeResponse`'s field numbers for events: same bytes.
            .extern_path(".gputracer.v1.ProfileResponse", "crate::EncodedSubscribeResponse")
            .extern_path(".gputracer.v1", "crate::v1")
            .out_dir(&server)
            .compile_fds(fds)?;
    }
    #[cfg(not(feature = "api"))]
    {
        let mut config = prost_build::Config::new();
        config.type_attribute(".", SERDE);
        config.compile_fds(fds)?;
    }
    kubelet(&root)?;
    prost_build::Config::new().compile_fds(protox::compile(PERFETTO_PROTOS, [&root])?)?;
    Ok(())
}

/// `v1.rs`: the messages; with the `kubelet` feature, `kubelet/v1.rs`: `pod_resources_lister_client`
/// and `pod_resources_lister_server` over them. The transport-free codegen: the caller picks the
/// channel (tracer-agent connects over a Unix socket).
fn kubelet(root: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(KUBELET_PROTOS, [root])?;
    prost_build::Config::new().compile_fds(fds.clone())?;
    #[cfg(feature = "kubelet")]
    {
        let services = PathBuf::from(std::env::var("OUT_DIR")?).join("kubelet");
        std::fs::create_dir_all(&services)?;
        tonic_prost_build::configure()
            .build_client(true)
            .build_server(true)
            .build_transport(false)
            .extern_path(".v1", "crate::podresources::v1")
            .out_dir(&services)
            .compile_fds(fds)?;
    }
    Ok(())
}
