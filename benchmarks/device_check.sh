#!/usr/bin/env bash
# benchmarks/device_check.sh [--dry-run] [OUTDIR]: proves gpuguard's GPU paths on a GPU machine.
#
# Writes summary.json, check.log, traces.tar.gz and logs.tar.gz into OUTDIR (default $OUT) in at
# most 8 minutes.  On the GPU machine it uses that machine's python3 and the wheels that
# benchmarks/device_prep.sh put in .device-wheels/ (carried there with the working tree);
# --dry-run runs the same check on a machine without a GPU, over the fakes.  Run it again at
# will: it cleans up after itself and after a run that was killed.  README-device.md.
set -u

usage() { sed -n '2,8s/^# \{0,1\}//p' "$0"; }
dry=0
out=""
for arg in "$@"; do
    case "$arg" in
        --dry-run) dry=1 ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "device_check: unknown option $arg (fix: benchmarks/device_check.sh [--dry-run] [OUTDIR])" >&2; exit 2 ;;
        *) out="$arg" ;;
    esac
done
out="${out:-${OUT:-}}"
if [ -z "$out" ]; then
    echo "device_check: no OUTDIR and \$OUT is not set (fix: benchmarks/device_check.sh [--dry-run] OUTDIR)" >&2
    exit 2
fi
if [ "$(id -u)" != 0 ]; then
    echo "device_check: needs root (tracefs, cgroups, the agent) (fix: run it as root)" >&2
    exit 2
fi
repo="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out" || exit 2
budget=480

if [ "$dry" = 1 ]; then
    py="$repo/.venv/bin/python"
    [ -x "$py" ] || py=python3
    export PYTHONPATH="$repo"
else
    py=python3
    site=""
    if ls "$repo"/.device-wheels/*.whl >/dev/null 2>&1; then
        site="$(mktemp -d /tmp/gpuguard-site.XXXXXX)"
        # the locked versions the machine's image lacks (benchmarks/device_prep.sh)
        if ! "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
                --target "$site" "$repo"/.device-wheels/*.whl >"$site.log" 2>&1; then
            cp "$site.log" "$out/wheels.log"
            echo "device_check: the carried wheels did not install (see wheels.log); going on without them" >&2
            site=""
        fi
    fi
    export PYTHONPATH="${site:+$site:}$repo"
fi
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
args=(--out "$out")
[ "$dry" = 1 ] && args+=(--dry-run)
# the driver keeps its own budget; this only stops one that hangs past it
timeout -k 10 $((budget + 40)) "$py" "$repo/benchmarks/device/check.py" "${args[@]}" --budget-s "$budget"
