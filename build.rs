//! Build script: with the `envoy` feature, compiles the Envoy rate limit
//! service's .proto files (proto/) into Rust with tonic-prost-build, which
//! needs `protoc` (scripts/deps.sh installs it). Without the feature it
//! does nothing, so the default build needs no protoc.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "envoy")]
    envoy();
}

#[cfg(feature = "envoy")]
fn envoy() {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .compile_protos(&["proto/envoy/service/ratelimit/v3/rls.proto"], &["proto"])
        .unwrap_or_else(|e| {
            panic!(
                "compiling proto/ (feature `envoy`) failed: {e}\n\
                 it needs protoc and the google/protobuf includes: \
                 run scripts/deps.sh (Debian: protobuf-compiler libprotobuf-dev)"
            )
        });
}
