# syntax=docker/dockerfile:1
#
# The Tollgate server image. Build from the repository root:
#
#   docker build -t tollgate .
#   docker build --build-arg FEATURES="cluster envoy" -t tollgate .
#
# The runtime stage holds the binary and an example rules file, runs as an
# unprivileged user, and takes its secrets from the environment
# (TOLLGATE_AUTH_TOKEN, TOLLGATE_ADMIN_TOKEN; see deploy/README.md). The command lines below
# are run with --print-config by tests/deploy.rs, so they cannot drift from
# the CLI; scripts/lint-deploy.sh (in .ci/run) lints this file with hadolint.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=trixie

FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS builder
# protoc compiles the .proto files of the gRPC front ends (cargo features
# `cluster` and `envoy`); the default build does not need it, but an image
# built with those features must not fail halfway.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# Space-separated cargo features of the `tollgate` package; empty: the
# default build.
ARG FEATURES=""
# The release profile keeps line tables for profiling; the image does not
# need them.
ENV CARGO_PROFILE_RELEASE_DEBUG=0
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p tollgate --bin tollgate \
        ${FEATURES:+--features "$FEATURES"} \
 && install -D -m 0755 target/release/tollgate /out/tollgate

FROM debian:${DEBIAN_RELEASE}-slim
# A fixed uid/gid, so Kubernetes' runAsNonRoot can verify it and volumes can
# be owned by it.
RUN groupadd --system --gid 10001 tollgate \
 && useradd --system --uid 10001 --gid tollgate --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin tollgate
COPY --from=builder /out/tollgate /usr/local/bin/tollgate
COPY config/rules.example.yaml /etc/tollgate/rules.example.yaml
USER 10001:10001
# 7700: the binary protocol; 7701: the admin HTTP API (health, metrics).
EXPOSE 7700 7701
# The binary asks its own admin API: no curl in the image, and no auth token
# needed (the admin API does not take the protocol's token).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["tollgate", "health", "--admin", "127.0.0.1:7701", "--timeout", "2s"]
ENTRYPOINT ["tollgate"]
CMD ["serve", "--listen", "0.0.0.0:7700", "--admin", "0.0.0.0:7701", "--log-format", "json"]
