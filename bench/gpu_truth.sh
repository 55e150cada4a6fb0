#!/usr/bin/env bash
# The GPU truth on a bare GPU host, from a checkout:
#
#     bench/gpu_truth.sh [--wheels DIR] [bench/gpu_truth.py flags, e.g. --out DIR --sizes-gib 8,32]
#
# The host's python3 (or $PYTHON) must have torch with CUDA, transformers, peft, safetensors,
# httpx and nvidia-ml-py: the lent H200 image does. What it lacks of the supervisor's base install
# (starlette, uvicorn, httptools, websockets, sniffio, jsonschema, cryptography and their deps)
# comes as wheels from `make gpu-wheels` (var/gpu-wheels, about 6 MiB), installed offline
# into a private folder that only this run puts on PYTHONPATH. Nothing is installed system-wide.
set -euo pipefail
cd "$(dirname "$0")/.."

wheels=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) wheels="${2:?--wheels needs a folder of .whl files}"; shift 2 ;;
    --wheels=*) wheels="${1#--wheels=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done

PY="${PYTHON:-python3}"
site=""
if [ -n "$wheels" ]; then
  if ! compgen -G "$wheels/*.whl" >/dev/null; then
    echo "gpu_truth.sh: no .whl files in $wheels (make gpu-wheels builds them)" >&2
    exit 2
  fi
  site="$(mktemp -d /tmp/haru-gpu-site.XXXXXX)"
  # --no-deps: the wheels are exactly what the image lacks; everything else is the image's own.
  "$PY" -m pip install -q --no-index --find-links "$wheels" --no-deps --no-compile \
    --no-cache-dir --target "$site" "$wheels"/*.whl
fi
export PYTHONPATH="$PWD${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

# Say what is missing before anything starts, not halfway through the GPU's time.
"$PY" - <<'PY'
import importlib.util, sys
need = ["torch", "transformers", "peft", "safetensors", "starlette", "uvicorn", "httpx", "jsonschema", "pynvml",
        "websockets", "cryptography"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_truth.sh: missing {', '.join(missing)}: carry them with --wheels DIR")
import torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"CUDA {'yes: ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no'}")
PY

exec "$PY" bench/gpu_truth.py "${args[@]+"${args[@]}"}"
