# The Gatehouse image for people who build with Docker (BuildKit). It produces the same
# filesystem as `make image` (image/build, buildah): the binary comes from the same script,
# scripts/build-static, and paths, modes, user, entrypoint and labels follow image/spec;
# image/check compares this file with the image image/build produced.
#
#   docker build -t gatehouse:0.1.0 .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN scripts/build-static /out && mkdir -m 1777 /out/tmp

FROM scratch
# The mount point of the pod's writable /tmp (the root filesystem is read-only).
COPY --from=build --chmod=1777 /out/tmp /tmp
COPY --from=build --chmod=0755 /out/gatehouse /gatehouse
USER 65532:65532
WORKDIR /
ENTRYPOINT ["/gatehouse"]
LABEL org.opencontainers.image.title="gatehouse" \
      org.opencontainers.image.source="https://github.com/gatehouse-dev/gatehouse" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.description="Gatehouse: a Kubernetes Gateway API implementation that never reloads"
