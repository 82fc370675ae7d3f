#!/usr/bin/env bash
# benchmarks/device_prep.sh: fetch, here, what device_check.sh needs on the GPU machine.
#
# The GPU machine has Python 3.12 (x86-64) with most of gpuguard's dependencies and no network.
# This puts the cp312 manylinux x86-64 wheels of the locked versions (requirements.lock) of the
# ones its image lacks, and the locked nvidia-ml-py (the binding the adapter is written for), in
# .device-wheels/ (git-ignored), to be carried with the working tree.  Idempotent.
set -eu
repo="$(cd "$(dirname "$0")/.." && pwd)"
dest="$repo/.device-wheels"
mkdir -p "$dest"
py="$repo/.venv/bin/python"
[ -x "$py" ] || py=python3
for name in yara-python google-re2 nvidia-ml-py; do
    version="$(sed -n "s/^${name}==\([^ \\]*\).*/\1/p" "$repo/requirements.lock")"
    if [ -z "$version" ]; then
        echo "device_prep: $name is not in requirements.lock (fix: bash packaging/setup-host.sh lock)" >&2
        exit 2
    fi
    stem="$(echo "$name" | tr - _)"
    rm -f $(ls "$dest"/"$stem"-*.whl 2>/dev/null | grep -v -- "-$version-" || true)
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$dest" "$name==$version"
done
echo "device_prep: $(ls "$dest" | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest"
