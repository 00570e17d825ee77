# syntax=docker/dockerfile:1
# The weir image: the `weir` binary (sidecar, CLI and injection webhook) on distroless/cc.
#
#   scripts/image                      # docker, podman or buildah; tags weir:<version>
#   docker build -t weir:0.1.0 .       # the same by hand
#
# Runtime: gcr.io/distroless/cc-debian12:nonroot holds glibc, libgcc_s, CA certificates,
# /etc/passwd with nonroot (65532) and no shell or package manager. weir is linked against
# glibc 2.36 (Debian 12, as the build stage) and needs libc, libm and libgcc_s only
# (scripts/image --check runs it in a root holding just those files, as uid 65532, read-only).
# The binary is built with the `image` profile: release without debug info, stripped.

ARG RUST_VERSION=1.95

# The full image (not -slim): jemalloc's build needs make.
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# The registry and target caches speed up rebuilds where the builder supports cache mounts
# (BuildKit, podman and buildah >= 1.24).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --profile image -p proxy --bin weir \
 && install -D -m 0755 target/image/weir /out/usr/local/bin/weir

FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="weir" \
      org.opencontainers.image.description="DAGOR overload control as a Kubernetes sidecar proxy" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/ /
# The chart runs it as 65532:65532 too (sidecar.runAsUser/runAsGroup).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/weir"]
CMD ["run"]
