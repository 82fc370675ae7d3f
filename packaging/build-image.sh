#!/usr/bin/env bash
# Build the gpuguard container image from Debian's archive and PyPI's locked wheels: no image registry.
#
#   sudo bash packaging/build-image.sh [--tag TAG] [--base IMAGE] [--mirror MIRROR]... [--rebuild-base]
#                                      [--isolation chroot|oci] [--rootfs DIR | --no-rootfs]
#
# Steps (one progress line each; safe to run again: what is up to date is kept):
#  1. the tools: podman and mmdebstrap from Debian's archive (installed when missing)
#  2. the base: mmdebstrap of bookworm with python3, Debian's bcc, nftables, iproute2,
#     imported as localhost/gpuguard-base:bookworm (kept while its package list is the same)
#  3. the wheelhouse: exactly the runtime pins of requirements.lock, hash-checked
#     (packaging/lockfile.py cuts the test and dev extras out), for the image's Python 3.11
#  4. the image: packaging/Containerfile, offline, one layer over the base (--squash)
#  5. the rootfs: the image exported to DIR/rootfs with its config in DIR/image.json, for
#     packaging/run-image-rootfs.py (default /var/cache/gpuguard-image; kept as a cache)
#
# --base IMAGE     use a Debian bookworm image you already have instead of step 2
# --mirror MIRROR  mmdebstrap's MIRROR (repeatable): a URL or a "deb ..." line, e.g. your own
#                  Debian mirror; default deb.debian.org with bookworm-updates and bookworm-security
# --isolation      how the build runs its RUN steps; default: oci where the cgroup hierarchy is
#                  v2 only, else chroot (crun refuses hybrid hierarchies)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TAG=localhost/gpuguard:latest
BASE=localhost/gpuguard-base:bookworm
make_base=1
rebuild_base=0
MIRRORS=()
ISOLATION=
OUT=/var/cache/gpuguard-image
step=0
STEPS=5
say() { printf 'gpuguard-image: %s\n' "$*" >&2; }
die() { printf 'gpuguard-image: %s\n' "$*" >&2; exit 2; }
progress() { step=$((step + 1)); say "[$step/$STEPS] $*"; }
# shellcheck source=packaging/debian-packages.sh
. "$ROOT/packaging/debian-packages.sh"
while [ $# -gt 0 ]; do
    case $1 in
        --tag) TAG=${2:?}; shift ;;
        --base) BASE=${2:?}; make_base=0; shift ;;
        --mirror) MIRRORS+=("${2:?}"); shift ;;
        --rebuild-base) rebuild_base=1 ;;
        --isolation) ISOLATION=${2:?}; shift ;;
        --rootfs) OUT=${2:?}; shift ;;
        --no-rootfs) OUT= ;;
        # the options of the earlier script: its base is the default now
        --debian-base) ;;
        *) die "unknown option $1 (fix: see the usage at the top of packaging/build-image.sh)" ;;
    esac
    shift
done
[ "$(id -u)" -eq 0 ] || die "must run as root: mmdebstrap, podman's storage and the rootfs (fix: sudo bash packaging/build-image.sh)"
command -v apt-get >/dev/null || die "apt-get not found: the image is built from Debian's archive (fix: run this on a Debian or Ubuntu host)"
command -v python3 >/dev/null || die "python3 not found: it cuts the lock and fetches the wheels (fix: apt-get install python3 python3-pip)"
case $(uname -m) in
    x86_64) ARCH=x86_64 ;;
    aarch64) ARCH=aarch64 ;;
    *) die "no wheels of the locked packages for $(uname -m) (fix: build on x86_64 or aarch64)" ;;
esac
if [ -z "$ISOLATION" ]; then
    ISOLATION=oci
    [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] || ISOLATION=chroot
fi
case $ISOLATION in chroot | oci) ;; *) die "--isolation is chroot or oci, not $ISOLATION (fix: leave it out to choose by the cgroup hierarchy)" ;; esac

progress "tools: podman, mmdebstrap"
tools=(podman)
[ "$make_base" -eq 0 ] || tools+=(mmdebstrap)
need_debs "${tools[@]}"

ctx=$(mktemp -d /var/tmp/gpuguard-image.XXXXXX)
container=
cleanup() {
    [ -z "$container" ] || podman rm -f "$container" >/dev/null 2>&1 || true
    rm -rf "$ctx"
}
trap cleanup EXIT

# Debian's packages the agent runs on: bcc's Python binding (the interpreter the wheels are for),
# nftables and its Python binding (block-egress), iproute2; python3-wheel lets the venv's
# setuptools build gpuguard's wheel offline.  util-linux (setpriv) is essential, so always there.
BASE_DEBS=python3,python3-venv,python3-wheel,python3-bpfcc,python3-nftables,nftables,iproute2,ca-certificates,usr-is-merged
# mmdebstrap merges /usr with usrmerge, which pulls in perl (46 MB); once merged, usr-is-merged
# stands in for it (dpkg refuses the purge, failing the build, should anything still need them).
PURGE="usrmerge libfile-find-rule-perl libnumber-compare-perl libtext-glob-perl perl libperl5.36 perl-modules-5.36"
# Man pages, docs (but their copyright files) and translations are left out of the base.
DPKG_EXCLUDES=(--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
               --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*'
               --dpkgopt='path-exclude=/usr/share/info/*')
if [ "$make_base" -eq 1 ]; then
    want=$(printf '%s\n' "$BASE_DEBS" "$PURGE" "${DPKG_EXCLUDES[@]}" ${MIRRORS[@]+"${MIRRORS[@]}"} | sha256sum | cut -c1-16)
    have=$(podman image inspect -f '{{index .Labels "gpuguard.base"}}' "$BASE" 2>/dev/null || true)
    if [ "$have" = "$want" ] && [ "$rebuild_base" -eq 0 ]; then
        progress "base: $BASE is up to date (--rebuild-base makes it again from the archive)"
    else
        progress "base: mmdebstrap bookworm ($BASE_DEBS) as $BASE"
        # Reproducible for the same mirror content: file times from the commit being built.
        epoch=$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || date +%s)
        SOURCE_DATE_EPOCH=$epoch mmdebstrap --quiet --variant=apt --include="$BASE_DEBS" \
            "${DPKG_EXCLUDES[@]}" --customize-hook="chroot \"\$1\" dpkg --purge $PURGE >/dev/null" \
            bookworm "$ctx/base.tar" ${MIRRORS[@]+"${MIRRORS[@]}"} </dev/null \
            || die "mmdebstrap failed (fix: check access to the Debian archive, or pass --mirror)"
        old=$(podman image inspect -f '{{.Id}}' "$BASE" 2>/dev/null || true)
        podman import --quiet --change "LABEL gpuguard.base=$want" --change 'CMD ["/bin/bash"]' \
            "$ctx/base.tar" "$BASE" >/dev/null || die "podman import of the base failed (fix: run it by hand to see why)"
        rm -f "$ctx/base.tar"
        # the base it replaces, unless an image still stands on it
        [ -z "$old" ] || podman rmi "$old" >/dev/null 2>&1 || true
    fi
else
    progress "base: $BASE (given)"
    podman image exists "$BASE" || podman pull -q "$BASE" >/dev/null \
        || die "no image $BASE here and it cannot be pulled (fix: drop --base to make one from Debian's archive)"
fi

progress "wheelhouse: the runtime pins of requirements.lock (hash-checked)"
mkdir -p "$ctx/wheels" "$ctx/src"
(cd "$ROOT" && python3 packaging/lockfile.py runtime) > "$ctx/wheels/runtime.txt" \
    || die "could not cut the runtime pins from requirements.lock (see the line above)"
# The image's interpreter is bookworm's CPython 3.11 on glibc 2.36, whatever this host runs
# (every manylinux tag up to glibc 2.36 named: pip before 24 does not widen one to older ones).
platforms=(--platform "manylinux2014_$ARCH")
for minor in $(seq 17 36); do platforms+=(--platform "manylinux_2_${minor}_$ARCH"); done
# The host's pip settings (extra indexes, find-links, constraints) are left out: the lock decides.
PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS='' PIP_CONSTRAINT='' python3 -m pip download -q \
    --disable-pip-version-check --require-hashes --no-deps --only-binary :all: \
    "${platforms[@]}" --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none \
    -d "$ctx/wheels" -r "$ctx/wheels/runtime.txt" \
    || die "could not fetch the locked wheels (fix: check access to PyPI; python3 -m pip must work)"
# gpuguard's own sources (tracked and new files, not tests or benchmarks): the image builds its
# wheel with the setuptools Debian's venv carries, so no unpinned build dependency is fetched.
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$ROOT" ls-files -z -co --exclude-standard -- . ':!tests' ':!benchmarks' ':!packaging' ':!docs' \
        | (cd "$ROOT" && tar --null -T - -cf -) | tar -xf - -C "$ctx/src"
else
    tar -C "$ROOT" --exclude=tests --exclude=benchmarks --exclude=packaging --exclude=docs \
        --exclude=.venv --exclude=__pycache__ -cf - . | tar -xf - -C "$ctx/src"
fi
cp "$ROOT/packaging/agent.yaml" "$ctx/agent.yaml"

base_id=$(podman image inspect -f '{{.Id}}' "$BASE")
inputs=$( (cd "$ctx" && find . -type f -print0 | sort -z | xargs -0 sha256sum; echo "$base_id") \
          | cat - "$ROOT/packaging/Containerfile" | sha256sum | cut -c1-16)
have=$(podman image inspect -f '{{index .Labels "gpuguard.inputs"}}' "$TAG" 2>/dev/null || true)
if [ "$have" = "$inputs" ]; then
    progress "image: $TAG is up to date (same sources, lock and base)"
else
    progress "image: podman build --isolation $ISOLATION -t $TAG"
    old=$(podman image inspect -f '{{.Id}}' "$TAG" 2>/dev/null || true)
    podman build --quiet --isolation "$ISOLATION" --squash --build-arg "BASE=$BASE" \
        --label "gpuguard.inputs=$inputs" -f "$ROOT/packaging/Containerfile" -t "$TAG" "$ctx" >/dev/null \
        || die "podman build failed (see above; fix: --isolation chroot where containers cannot start)"
    [ -z "$old" ] || podman rmi "$old" >/dev/null 2>&1 || true
fi

if [ -z "$OUT" ]; then
    progress "rootfs: not exported (--no-rootfs)"
else
    image_id=$(podman image inspect -f '{{.Id}}' "$TAG")
    if [ "$(cat "$OUT/image.id" 2>/dev/null)" = "$image_id" ] && [ -d "$OUT/rootfs/opt/gpuguard" ]; then
        progress "rootfs: $OUT/rootfs is this image already"
    else
        progress "rootfs: exporting $TAG to $OUT/rootfs"
        mkdir -p "$OUT"
        rm -rf "$OUT/rootfs" "$OUT/rootfs.new" "$OUT/image.id"
        mkdir "$OUT/rootfs.new"
        # create (never started: no OCI runtime needed) then export the file system
        container=$(podman create "$TAG")
        podman export "$container" | tar -xf - -C "$OUT/rootfs.new" --numeric-owner \
            || die "podman export of $TAG failed (fix: run it by hand to see why)"
        podman rm -f "$container" >/dev/null && container=
        podman image inspect "$TAG" > "$OUT/image.json"
        mv "$OUT/rootfs.new" "$OUT/rootfs"
        echo "$image_id" > "$OUT/image.id"
    fi
fi
size=$(podman image inspect -f '{{.Size}}' "$TAG")
say "image $TAG ($((size / 1000000)) MB uncompressed)${OUT:+; rootfs in $OUT/rootfs (.venv/bin/python packaging/run-image-rootfs.py runs it)}"
