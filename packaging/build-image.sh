#!/usr/bin/env bash
# Build the gpuguard container image with podman (or buildah) from this checkout, offline.
#
#   bash packaging/build-image.sh [--tag TAG] [--base IMAGE | --debian-base] [--isolation chroot]
#
# --base IMAGE     a Debian bookworm image you already have (default docker.io/library/debian:bookworm-slim)
# --isolation chroot  run the RUN steps in a chroot instead of an OCI runtime (hosts where
#                  crun/runc cannot start containers, e.g. hybrid cgroups or no CAP_SYS_RESOURCE)
# --debian-base    make that base from Debian's archive with mmdebstrap (python3, bcc, nftables
#                  included) and import it as localhost/gpuguard-base:bookworm: no image registry needed
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TAG=localhost/gpuguard:latest
BASE=docker.io/library/debian:bookworm-slim
make_base=0
ISOLATION=()
die() { printf 'gpuguard-image: %s\n' "$*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
        --tag) TAG=$2; shift ;;
        --base) BASE=$2; shift ;;
        --debian-base) make_base=1; BASE=localhost/gpuguard-base:bookworm ;;
        --isolation) ISOLATION=(--isolation "$2"); shift ;;
        *) die "unknown option $1" ;;
    esac
    shift
done
if command -v podman >/dev/null; then builder=(podman build)
elif command -v buildah >/dev/null; then builder=(buildah bud)
else die "neither podman nor buildah is installed (fix: apt-get install podman)"; fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
if [ "$make_base" -eq 1 ]; then
    command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (fix: apt-get install mmdebstrap)"
    command -v podman >/dev/null || die "--debian-base imports with podman (fix: apt-get install podman)"
    mmdebstrap --variant=apt --include=python3,python3-venv,python3-bpfcc,nftables,iproute2,ca-certificates \
        bookworm "$ctx/base.tar" || die "mmdebstrap failed (fix: check access to the Debian archive)"
    podman import "$ctx/base.tar" "$BASE" >/dev/null
    rm -f "$ctx/base.tar"
fi
# The wheelhouse: gpuguard and every dependency, built/fetched with this host's pip settings.
python3 -m pip wheel -q --disable-pip-version-check -w "$ctx/wheels" "$ROOT" \
    || die "could not build the wheelhouse (fix: check access to PyPI)"
cp "$ROOT/packaging/agent.yaml" "$ctx/agent.yaml"
"${builder[@]}" "${ISOLATION[@]}" --build-arg "BASE=$BASE" -f "$ROOT/packaging/Containerfile" -t "$TAG" "$ctx"
printf 'gpuguard-image: built %s\n' "$TAG" >&2
