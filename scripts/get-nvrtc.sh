#!/usr/bin/env bash
# Fetch NVRTC 13.0 (libnvrtc.so.13 + libnvrtc-builtins.so.13.0) from PyPI into DIR.
#
#   scripts/get-nvrtc.sh DIR        # e.g. scripts/get-nvrtc.sh .nvrtc  (what `make nvrtc` runs)
#
# Idempotent: does nothing when DIR/nvidia/cu13/lib/libnvrtc.so.13 already exists.
# Prints the absolute path of libnvrtc.so.13 on stdout at the end, so
#   export ATTNFORGE_NVRTC="$(scripts/get-nvrtc.sh .nvrtc)"
# works. Environment: PYTHON (default python3), NVRTC_REQUIREMENT
# (default "nvidia-cuda-nvrtc==13.0.*").
set -euo pipefail

if [ "$#" -ne 1 ] || [ -z "$1" ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
dir=$1
python=${PYTHON:-python3}
requirement=${NVRTC_REQUIREMENT:-nvidia-cuda-nvrtc==13.0.*}
rel=nvidia/cu13/lib/libnvrtc.so.13

if [ ! -f "$dir/$rel" ]; then
    if ! command -v "$python" >/dev/null 2>&1; then
        echo "error: $python not found; NVRTC is installed from PyPI with pip." >&2
        echo "Install Python 3 with pip, or install the wheel yourself and set ATTNFORGE_NVRTC:" >&2
        echo "  pip install --target $dir '$requirement'" >&2
        exit 1
    fi
    if ! "$python" -m pip --version >/dev/null 2>&1; then
        echo "error: pip is not available for $python." >&2
        echo "Install it (e.g. 'apt-get install python3-pip' or '$python -m ensurepip --user'), then rerun," >&2
        echo "or install the wheel yourself: pip install --target $dir '$requirement'" >&2
        exit 1
    fi
    mkdir -p "$dir"
    echo "installing $requirement into $dir ..." >&2
    PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet --disable-pip-version-check --no-deps \
        --upgrade --target "$dir" "$requirement" >&2
    if [ ! -f "$dir/$rel" ]; then
        echo "error: pip finished but $dir/$rel does not exist (wheel layout changed?)" >&2
        exit 1
    fi
fi

libdir=$(cd "$(dirname "$dir/$rel")" && pwd -P)
if ! ls "$libdir"/libnvrtc-builtins.so.13.* >/dev/null 2>&1; then
    echo "warning: no libnvrtc-builtins.so.13.* next to libnvrtc.so.13 in $libdir" >&2
fi
echo "$libdir/libnvrtc.so.13"
