#!/usr/bin/env bash
# Builds the project's image from the Dockerfile with podman, on a base image made here:
# no image registry need be reachable (pytorch/pytorch is never pulled).
#
#   docker/build.sh            # base (unless podman already holds it), then the image
#
# The base, $BASE_IMAGE, is Debian bookworm from debootstrap, imported into podman, with
# Python 3.11 and torch 2.13.0 on top (docker/base/Containerfile): a stand-in for
# pytorch/pytorch with the torch wheel that pip finds here (the local CPU build on these
# machines). Building it takes minutes, so it is skipped when the image exists; remove it
# (`podman rmi $BASE_IMAGE`) to rebuild it. The image, $IMAGE, is then built from the
# repository's Dockerfile with --build-arg BASE_IMAGE=$BASE_IMAGE.
#
# Needs root, podman, runc and debootstrap (`apt-get install podman runc debootstrap`).
# crun, podman's default runtime, cannot set the container's rlimits on these machines, hence
# runc and explicit --ulimit values.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-localhost/gclm:test}
# The torch of the official base image the Dockerfile names (pytorch/pytorch:VERSION-cuda...),
# which the stand-in bundles; pyproject.toml takes a range of torch versions, not a pin.
TORCH_VERSION=${TORCH_VERSION:-$(sed -n 's|^ARG BASE_IMAGE=pytorch/pytorch:\([0-9.]*\)-.*|\1|p' Dockerfile)}
if [ -z "$TORCH_VERSION" ]; then
    echo "docker/build.sh: no torch version in the Dockerfile's BASE_IMAGE (pytorch/pytorch:VERSION-...); set TORCH_VERSION" >&2
    exit 1
fi
# Named after what it is made from, so that an edit to the Containerfile builds a new one.
BASE_RECIPE=$(sha256sum docker/base/Containerfile | cut -c1-12)
BASE_IMAGE=${BASE_IMAGE:-localhost/gclm-base:bookworm-torch$TORCH_VERSION-$BASE_RECIPE}
ROOTFS_IMAGE=localhost/gclm-rootfs:bookworm
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WORK=build/docker
PODMAN=(podman --runtime runc)
# --format docker: the OCI image format has no HEALTHCHECK, and podman would drop it.
BUILD=(build --network host --format docker --ulimit nofile=1024:1024 --ulimit nproc=4096:4096)

mkdir -p "$WORK"
# The builds' pip trusts the host's CA bundle (these machines reach PyPI through a
# TLS-inspecting proxy): a pip config folder mounted for the RUN steps only, so that no
# image keeps it.
host_ca=/etc/ssl/certs/ca-certificates.crt
if [ -f "$host_ca" ]; then
    mkdir -p "$WORK/pip"
    cp "$host_ca" "$WORK/pip/host-ca.crt"
    printf '[global]\ncert = /etc/xdg/pip/host-ca.crt\n' > "$WORK/pip/pip.conf"
    BUILD+=(-v "$PWD/$WORK/pip:/etc/xdg/pip:ro")
fi

took() { echo "$1: $((SECONDS - $2)) s"; }

if "${PODMAN[@]}" image exists "$BASE_IMAGE"; then
    echo "base image $BASE_IMAGE: already built"
else
    started=$SECONDS
    if ! "${PODMAN[@]}" image exists "$ROOTFS_IMAGE"; then
        rootfs=$(mktemp -d /var/tmp/gclm-rootfs.XXXXXX)
        trap 'rm -rf "$rootfs"' EXIT
        debootstrap --variant=minbase bookworm "$rootfs" "$DEBIAN_MIRROR" > "$WORK/debootstrap.log" 2>&1 \
            || { tail -20 "$WORK/debootstrap.log"; exit 1; }
        tar -C "$rootfs" -c . | "${PODMAN[@]}" import - "$ROOTFS_IMAGE" > /dev/null
        rm -rf "$rootfs"
        took "debootstrap and import of $ROOTFS_IMAGE" "$started"
    fi
    # The wheel pip would install for torch==$TORCH_VERSION on bookworm's Python 3.11.
    rm -rf "$WORK/wheels"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
        --dest "$WORK/wheels" "torch==$TORCH_VERSION"
    "${PODMAN[@]}" "${BUILD[@]}" -v "$PWD/$WORK/wheels:/wheels:ro" \
        --build-arg ROOTFS="$ROOTFS_IMAGE" -t "$BASE_IMAGE" -f docker/base/Containerfile docker/base \
        > "$WORK/base-build.log" 2>&1 || { tail -30 "$WORK/base-build.log"; exit 1; }
    rm -rf "$WORK/wheels"
    took "base image $BASE_IMAGE" "$started"
fi

started=$SECONDS
previous=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
"${PODMAN[@]}" "${BUILD[@]}" --build-arg BASE_IMAGE="$BASE_IMAGE" -t "$IMAGE" . \
    > "$WORK/image-build.log" 2>&1 || { tail -30 "$WORK/image-build.log"; exit 1; }
took "image $IMAGE" "$started"
# The image a rebuild replaced would pile up, untagged, otherwise.
current=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$IMAGE")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
    "${PODMAN[@]}" rmi "$previous" > /dev/null 2>&1 || true
fi
