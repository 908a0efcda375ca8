//! Compiles every `.proto` under the workspace's `proto/` with a vendored `protoc`, so building
//! needs no system protobuf compiler.

use std::{env, path::PathBuf};

const PROTOS: &[&str] = &[
    "common/v1/common.proto",
    "gateway/v1/gateway.proto",
    "orders/v1/orders.proto",
    "orders/v1/webhooks.proto",
    "payment/v1/payment.proto",
    "bank/v1/bank.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);

    let files: Vec<PathBuf> = PROTOS.iter().map(|p| proto_root.join(p)).collect();
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("descriptor.bin"))
        .compile_with_config(config, &files, std::slice::from_ref(&proto_root))?;

    println!("cargo:rerun-if-changed={}", proto_root.display());
    Ok(())
}
