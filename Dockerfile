# The gpu-tracer node agent image (docs/image.md).
#
# The binary is built on the host, not in a stage here: `cargo xtask build --release` builds the
# eBPF programs with the nightly toolchain and bpf-linker that `cargo xtask setup` installs, which a
# build stage would have to install again on every cold cache. This file strips that binary and packs
# it on a slim glibc base. It needs only libc6 and libgcc-s1 (`ldd target/release/gpu-tracer`: libc,
# libm, libgcc_s) and the CA bundle (rustls-native-certs reads /etc/ssl/certs); NVML is dlopen'ed at
# run time from the host's driver libraries (the chart mounts them at /host/driver-lib; the NVIDIA
# container toolkit mounts them too), so no NVIDIA library is in the image.
#
# With a registry at hand:
#   cargo xtask build
#   docker build -t gpu-tracer:0.1.0 --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) .
# Without one (buildah + mmdebstrap; no daemon, no registry): `cargo xtask image`, which builds this
# file with BASE = a Debian root file system with binutils and ca-certificates, and RUNTIME_BASE = one
# with only base-files, libc6, libgcc-s1 and netbase, both made from the Debian mirror.

# Where `strip` runs: any Debian with apt (or with binutils and ca-certificates already there).
ARG BASE=debian:bookworm-slim
# What the image is made of.
ARG RUNTIME_BASE=${BASE}

FROM ${BASE} AS strip
# The binary to pack, relative to the build context (`cargo xtask image --binary PATH` passes its own).
ARG BINARY=target/release/gpu-tracer
RUN if ! command -v strip >/dev/null || [ ! -s /etc/ssl/certs/ca-certificates.crt ]; then \
        apt-get update \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends binutils ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi
COPY ${BINARY} /tmp/gpu-tracer
# --strip-debug: the release binary carries full debug info (about 170 MB, 24 MB without); the
# symbol table stays, so a panic's backtrace still names functions. The nonroot user (uid 65532, as
# distroless calls it) is added to the base's passwd and group, so tools that resolve names see it.
RUN mkdir -p /out/usr/local/bin /out/etc/ssl/certs \
    && strip --strip-debug -o /out/usr/local/bin/gpu-tracer /tmp/gpu-tracer \
    && /out/usr/local/bin/gpu-tracer --version \
    && cp /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/ca-certificates.crt \
    && { cat /etc/passwd; echo 'nonroot:x:65532:65532:nonroot:/nonexistent:/usr/sbin/nologin'; } > /out/etc/passwd \
    && { cat /etc/group; echo 'nonroot:x:65532:'; } > /out/etc/group

FROM ${RUNTIME_BASE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=
LABEL org.opencontainers.image.title="gpu-tracer" \
      org.opencontainers.image.description="Per-container accounting of shared NVIDIA GPUs (memory, compute, energy, cost per pod) from eBPF and NVML: the node agent and its CLI." \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=strip /out/ /
# Non-root by default: `gpu-tracer cost`, `api`, `events --connect` and `--help` need no privilege.
# The agent does: the chart's DaemonSet sets runAsUser: 0 with every capability dropped but
# BPF, PERFMON, SYS_PTRACE and DAC_READ_SEARCH (docs/security.md), because Kubernetes has no ambient
# capabilities, so a non-root process could not hold them.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gpu-tracer"]
CMD ["agent"]
