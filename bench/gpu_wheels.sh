#!/usr/bin/env bash
# Download the wheels `bench/gpu_truth.sh --wheels DIR` carries to a GPU host whose image lacks
# them: the supervisor's HTTP stack (its edge needs httptools, a compiled wheel, and the uvicorn
# WebSocket protocol it bounds, websockets), its config checker (jsonschema and what it needs) and
# its TLS identities (cryptography, cffi, pycparser), at the versions constraints.txt pins, for
# CPython 3.12.
#
#     bench/gpu_wheels.sh DIR        (or `make gpu-wheels`: DIR = var/gpu-wheels)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:?usage: bench/gpu_wheels.sh DIR}"
pins=$(grep -iE '^(starlette|uvicorn|httptools|sniffio|jsonschema|jsonschema-specifications|referencing|rpds-py|attrs|websockets|cryptography|cffi|pycparser)==' constraints.txt)
[ "$(echo "$pins" | wc -l)" -eq 13 ] || { echo "constraints.txt lacks a pin: $pins" >&2; exit 2; }
mkdir -p "$dir"
# shellcheck disable=SC2086 # one pin per word
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  -d "$dir" $pins
du -sh "$dir"
ls "$dir"
