#!/usr/bin/env bash
# The one command a session lent a GPU gives its `run` call (model/TRAINING.md, "A GPU session: the prepared
# script"), after `bash scripts/device_pack.sh` and with carry ["device"]:
#
#     bash scripts/train_on_device.sh --minutes 8
#
# trains Sprout from scratch on device/data (a copy-task stage, then text with copy rows; bf16, compiled),
# evaluates it, and writes the best checkpoint in float16 parts of at most 15 MiB, manifest.json, train.json,
# device.json and log.txt to $OUT (out/device-run where $OUT is unset): 7 files, under the 8 that come back.
# The same recipe, small, on the CPU here (about a minute):
#
#     bash scripts/train_on_device.sh --cpu --preset tiny
#
# Every other option is `python -m sprout_model.device run`'s (--help lists them). sprout_model is not
# installed on the device: a temporary folder holding only a link sprout_model -> model/ goes first on
# PYTHONPATH (here too, so this checkout's model/ is what runs). `timeout` is a backstop that ends the
# command 45 s after --minutes even if something hangs; the recipe itself stops inside --minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
DEST=${OUT:-out/device-run}
mkdir -p "$DEST"
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
SHIM=$(mktemp -d "${TMPDIR:-/tmp}/sprout-shim.XXXXXX")
ln -s "$REPO/model" "$SHIM/sprout_model"
export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
MINUTES=8
prev=""
for arg in "$@"; do
    [ "$prev" = "--minutes" ] && MINUTES=$arg
    case $arg in --minutes=*) MINUTES=${arg#--minutes=} ;; esac
    prev=$arg
done
LIMIT=$(awk -v m="$MINUTES" 'BEGIN { printf "%d", m * 60 + 45 }')
{
    echo "train_on_device: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) CPUs, limit ${LIMIT}s"
    "$PY" -c "import sprout_model.device, sprout_model.train, torch, sys; print('python', sys.version.split()[0], \
'| sprout_model from', sprout_model.__path__[0], '| torch', torch.__version__, '| cuda', torch.cuda.is_available())" || exit 3
    nvidia-smi --query-gpu=name,memory.total,memory.used,utilization.gpu --format=csv,noheader 2>/dev/null || true
    timeout --signal=TERM --kill-after=20 "$LIMIT" "$PY" -m sprout_model.device run --out "$DEST" "$@"
} 2>&1 | tee "$DEST/log.txt"
rc=${PIPESTATUS[0]}
rm -rf "$SHIM"
exit "$rc"
