#!/usr/bin/env bash
# Set up a Debian host for gpuguard (idempotent), then run a job.
#
#   bash packaging/setup-host.sh run  [gpuguard agent options]   # set up, selftest, then the agent in the foreground
#   bash packaging/setup-host.sh test [pytest options]           # set up, then the whole test suite
#   bash packaging/setup-host.sh test --latest [pytest options]  # the same on the newest allowed versions
#   bash packaging/setup-host.sh setup                           # set up only
#   bash packaging/setup-host.sh lock [--upgrade]                # refresh requirements.lock from pyproject.toml
#
# Installs what is missing: Debian's bcc (python3-bpfcc), kernel headers (or
# the closest Debian headers linked in as a fallback), nftables, a compiler for
# the test workloads, and a virtual environment (.venv) that sees bcc and has
# gpuguard with exactly the PyPI packages pinned (with hashes) in
# requirements.lock.  Safe to run again: it only does what is not done yet.
#
# --latest (or GPUGUARD_LATEST=1) builds the venv from the newest versions
# pyproject.toml allows instead of the lock, so a new release that breaks
# something shows up before it lands in the lock; the next plain run goes back
# to the locked set.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
LOCK="$ROOT/requirements.lock"
job=${1:-run}
[ $# -gt 0 ] && shift
latest=${GPUGUARD_LATEST:-0}
if [ "$job" = test ] && [ "${1:-}" = --latest ]; then latest=1; shift; fi
[ "$latest" = 1 ] || latest=0

# The test job's pytest-xdist workers: 6 on the 2-core CI machine (most root tests wait on the
# kernel or an agent rather than compute, and the busy workloads of the host tests take what
# CPU the rest leaves: the same tree took 318 s on 4 workers, 269 s on 6, each worker busy to
# the end).  GPUGUARD_TEST_WORKERS overrides it for one run.
TEST_WORKERS=${GPUGUARD_TEST_WORKERS:-6}

say() { printf 'gpuguard-setup: %s\n' "$*" >&2; }
die() { printf 'gpuguard-setup: %s\n' "$*" >&2; exit 2; }
# shellcheck source=packaging/debian-packages.sh
. "$ROOT/packaging/debian-packages.sh"

[ "$(id -u)" -eq 0 ] || die "must run as root (fix: sudo bash packaging/setup-host.sh $job)"
command -v apt-get >/dev/null || die "apt-get not found: this script sets up Debian/Ubuntu hosts (fix: install bcc, kernel headers and python3-venv by hand, then pip install -e .)"

DEBS=(python3-bpfcc python3-venv python3-pip python3-nftables nftables iproute2 gcc libc6-dev util-linux procps
      systemd logrotate)
# Real parts the tests talk to (a Prometheus server scraping the agent, rsyslog
# receiving CEF, openssl making a TLS pool's certificate): not needed to run the agent, so `run` does not install them.
[ "$job" = run ] || DEBS+=(prometheus rsyslog openssl)
# The busy workers' servers and client libraries (tests/test_busy_workers.py: a cache, a job queue,
# a key-value store and a database from Debian, clients in Python and C), test-only as well.
[ "$job" = run ] || DEBS+=(memcached beanstalkd redis-server postgresql libmemcached-dev libhiredis-dev
                           zlib1g-dev libssl-dev python3-redis python3-psycopg2 python3-pymemcache)
# kubectl renders the Kustomize overlays in the tests: Debian's kubernetes-client, unless a
# kubectl is already there (another package, e.g. the Cloud SDK's, may own /usr/bin/kubectl).
[ "$job" = run ] || command -v kubectl >/dev/null || DEBS+=(kubernetes-client)
headers=()  # kernel headers, when this kernel has none yet

KREL=$(uname -r)
KBUILD=/lib/modules/$KREL/build
if [ ! -e "$KBUILD/include" ]; then
    # Prefer the exact headers; fall back to Debian's generic ones.
    if apt-cache show "linux-headers-$KREL" >/dev/null 2>&1; then
        headers+=("linux-headers-$KREL")
    elif ! ls -d /usr/src/linux-headers-*-amd64 >/dev/null 2>&1 && ! ls -d /usr/src/linux-headers-*-arm64 >/dev/null 2>&1; then
        case $(uname -m) in
            x86_64) headers+=(linux-headers-amd64) ;;
            aarch64) headers+=(linux-headers-arm64) ;;
        esac
    fi
fi

need_debs "${DEBS[@]}" ${headers[@]+"${headers[@]}"}

if [ ! -e "$KBUILD/include" ]; then
    # No headers for this exact kernel: link the newest Debian headers.  Probes
    # only use tracepoint arguments and UAPI structs, so this is safe for them.
    arch_suffix=amd64; [ "$(uname -m)" = aarch64 ] && arch_suffix=arm64
    fallback=$(ls -d /usr/src/linux-headers-*-"$arch_suffix" 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$fallback" ] || die "no kernel headers for $KREL (fix: apt-get install linux-headers-$arch_suffix)"
    common=${fallback%-"$arch_suffix"}-common
    say "no headers for $KREL: linking $fallback as a fallback"
    mkdir -p "/lib/modules/$KREL"
    ln -sfn "$fallback" "$KBUILD"
    [ -d "$common" ] && ln -sfn "$common" "/lib/modules/$KREL/source"
fi

# Syscall tracepoints live in tracefs.
if [ ! -d /sys/kernel/tracing/events ] && [ ! -d /sys/kernel/debug/tracing/events ]; then
    mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null \
        || mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || true
fi

# A venv on Debian's python3 (bcc is a Debian package for that interpreter),
# holding exactly the locked set: made afresh whenever the lock, pyproject.toml
# or the mode changes, and --ignore-installed so that a Debian package the venv
# sees (python3-yaml, python3-psutil ...) never stands in for a locked version.
# The platform's pip configuration (extra indexes, find-links, constraints) is
# left out: the lock and PyPI decide.
pip_() { PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_CONSTRAINT= "$VENV/bin/python" -m pip \
             --disable-pip-version-check -q "$@"; }
stamp="$VENV/.gpuguard-installed"
mode=locked; [ "$latest" = 1 ] && mode=latest
want="$mode $(cat "$ROOT/pyproject.toml" "$LOCK" | sha256sum | cut -c1-16)"
# (lock uses the venv's uv as it is, then makes the venv afresh from the new lock.)
if [ "$job" = lock ] && [ -x "$VENV/bin/uv" ]; then
    :
elif [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "creating the virtual environment in $VENV ($mode versions)"
    rm -rf "$VENV"
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
    if [ "$mode" = latest ]; then
        pip_ install --ignore-installed -e "$ROOT[test,dev]" \
            || die "pip install of the newest versions failed (fix: check access to PyPI, then run this again)"
    else
        pip_ install --require-hashes --ignore-installed --no-deps -r "$LOCK" \
            || die "pip install -r requirements.lock failed (fix: check access to PyPI, then run this again)"
        pip_ install --no-deps --no-build-isolation -e "$ROOT" \
            || die "pip install -e . failed (fix: run it by hand to see why)"
    fi
    echo "$want" > "$stamp"
fi
"$VENV/bin/python" -c "import bcc" 2>/dev/null || die "the venv cannot import bcc (fix: apt-get install --reinstall python3-bpfcc)"

case $job in
    setup) say "ready: $VENV/bin/gpuguard" ;;
    lock)  cd "$ROOT" && "$VENV/bin/uv" pip compile pyproject.toml --all-extras --universal \
               --python-version 3.11 --generate-hashes --custom-compile-command "bash packaging/setup-host.sh lock" \
               -o requirements.lock -q "$@" \
               || die "uv pip compile failed (fix: check access to PyPI, then run this again)"
           exec bash "$ROOT/packaging/setup-host.sh" setup ;;
    run)   "$VENV/bin/gpuguard" selftest --own-agent \
               || say "the selftest failed (see the line above); starting the agent anyway"
           exec "$VENV/bin/gpuguard" agent "$@" ;;
    # TEST_WORKERS workers: each file's root tests as one unit on one worker, in the order
    # tests/conftest.py gives them (files with a host mutator turn about with the other root
    # files, the tests that are not root last); its host lock keeps observers from mutators.
    test)  cd "$ROOT" && GPUGUARD_LATEST=$latest exec "$VENV/bin/python" -m pytest --require-root-tests \
               -n "$TEST_WORKERS" --dist loadgroup "$@" ;;
    *)     die "unknown job '$job' (fix: use run, test, setup or lock)" ;;
esac
