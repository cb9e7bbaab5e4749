# syntax=docker/dockerfile:1
# jobwarden's container image: a release build on a distroless base with CA
# certificates, running as the non-root user 65532.
#
#   docker build -t jobwarden .
#   docker run --rm jobwarden --version
#
# The same build without Docker: cargo build --locked --release (README.md, "Deploying").
# k8s/ runs this image as the workers' sidecar (`run`, the default command) and as the
# migration Job (`migrate`).

# Rust >= 1.92 (the crate's rust-version); pinned so a rebuild compiles the same way.
FROM rust:1.95.0-slim-bookworm AS builder
WORKDIR /build
# make: jemalloc (the command's allocator) is built from its C sources by its own Makefile.
RUN apt-get update \
    && apt-get install -y --no-install-recommends make=4.3-4.1 \
    && rm -rf /var/lib/apt/lists/*
# Only what the build reads (.dockerignore keeps the rest out of the context): the
# manifests, the sources and the migrations embedded into the binary.
COPY Cargo.toml Cargo.lock ./
COPY migrations ./migrations
COPY src ./src
# The registry and target/ live in BuildKit cache mounts, so a source change recompiles
# only jobwarden, not its dependencies. The binary is copied out of the cache mount.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/build/target,sharing=locked \
    cargo build --locked --release \
    && install -D -m 0755 target/release/jobwarden /out/jobwarden

# glibc, libgcc, CA certificates and a nonroot user (65532); no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/jobwarden /usr/local/bin/jobwarden
USER 65532:65532
# worker.ops_listen: /metrics, /livez, /readyz, GET /v1/drain. The local API
# (127.0.0.1:7433) is for the application in the same pod and is not exposed.
EXPOSE 7434
ENTRYPOINT ["/usr/local/bin/jobwarden"]
CMD ["run"]
