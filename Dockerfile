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
# The binary is built with the `image` profile (release without debug info, stripped, fat LTO in
# one codegen unit) and, by default, profile-guided (scripts/pgo: an instrumented build runs
# as a sidecar under the benchmark runners' workloads, then weir is built again with the
# counts; scripts/pgo --quick took 8 min of a fresh-clone CI run on 2 cores, the full
# training ~2 min more). `--build-arg PGO=0` skips the training.

ARG RUST_VERSION=1.95

# The full image (not -slim): jemalloc's build needs make.
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
ARG PGO=1
WORKDIR /src
COPY . .
# The registry and target caches speed up rebuilds where the builder supports cache mounts
# (BuildKit, podman and buildah >= 1.24). The training's app is nginx besides the runners'
# own (scripts/pgo); taskset and setpriv come with the image's util-linux.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    if [ "$PGO" = 1 ]; then \
      apt-get update -qq && apt-get install -y -qq --no-install-recommends nginx-light >/dev/null \
      && scripts/pgo --profile image \
      && install -D -m 0755 target/pgo/weir /out/usr/local/bin/weir; \
    else \
      cargo build --locked --profile image -p proxy --bin weir \
      && install -D -m 0755 target/image/weir /out/usr/local/bin/weir; \
    fi

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
