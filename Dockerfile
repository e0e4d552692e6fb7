# syntax=docker/dockerfile:1
# The `allot` image: one binary, every service (`allot run inventory`, `allot run collector`, …).
#   docker build -t allot .
# Used by deploy/k8s and the Tiltfile. Needs BuildKit (the default in current Docker) for the
# cache mounts, which keep the cargo registry and target/ between builds.

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin allot \
    && cp target/release/allot /usr/local/bin/allot

FROM debian:bookworm-slim
# ca-certificates: for TLS to NATS once it is enabled. NVML (libnvidia-ml) is not installed
# here: the NVIDIA container runtime injects the node's driver library into collector pods.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 allot \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/allot --shell /usr/sbin/nologin allot \
    && mkdir -p /var/lib/allot \
    && chown allot:allot /var/lib/allot
COPY --from=builder /usr/local/bin/allot /usr/local/bin/allot
USER 10001:10001
WORKDIR /var/lib/allot
ENTRYPOINT ["/usr/local/bin/allot"]
CMD ["--help"]
