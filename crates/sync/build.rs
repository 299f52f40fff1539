//! Generates the `ConfigSync` service's client and server stubs.
//!
//! There is no `protoc` on the build machines and the messages are few, so the messages are
//! hand-written prost structs (`src/wire.rs`) and only the service plumbing (the tower service
//! that routes `/gatehouse.sync.v1.ConfigSync/Stream`, the client and the streaming codec
//! glue) is generated, by tonic-build's manual builder, which needs no `.proto` file. The
//! committed `proto/gatehouse/sync/v1/sync.proto` documents the same wire format for other
//! implementations; `tests/wire_format.rs` keeps the two in step.

fn main() {
    let stream = tonic_build::manual::Method::builder()
        .name("stream")
        .route_name("Stream")
        .input_type("crate::wire::DataPlaneMessage")
        .output_type("crate::wire::ControlPlaneMessage")
        .codec_path("tonic_prost::ProstCodec")
        .client_streaming()
        .server_streaming()
        .build();
    let service = tonic_build::manual::Service::builder()
        .name("ConfigSync")
        .package("gatehouse.sync.v1")
        .comment("Configuration of one Gateway, from the control plane to its data planes.")
        .method(stream)
        .build();
    tonic_build::manual::Builder::new().compile(&[service]);
    println!("cargo:rerun-if-changed=build.rs");
}
