//! Generates the Rust code of `proto/*.proto` with tonic-prost-build, using
//! the protoc binary that the protoc-bin-vendored crate ships (nothing to
//! install on the machine).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure().compile_with_config(config, &["proto/rollout.proto"], &["proto"])?;
    Ok(())
}
