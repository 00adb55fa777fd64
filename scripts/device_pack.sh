#!/usr/bin/env bash
# Before the `run` call of a session lent a GPU (model/TRAINING.md, "A GPU session: the prepared script"):
#
#     bash scripts/device_pack.sh [--data data/large-names] [--name-view K] [--aside DIR] [--dry-run]
#
#  1. fills device/ (ignored by git; the call's one carried path) with what training needs: train.bin,
#     val.bin, meta.json and tokenizer.json of --data (with --name-view K also train_names{K}.bin, as
#     train_names0.bin);
#  2. moves the shipped weights (every tracked *.safetensors under model/checkpoints, 57.6 MB) out of the
#     tree to --aside (default $SPROUT_DEVICE_ASIDE or /tmp/sprout-device-aside): the device trains from
#     scratch and needs none of them, and with them the tree alone is 62.8 MB of the 64 MiB a call may send;
#  3. checks that the tree and device/ together stay under 64 MiB, and prints both; over it, the weights are
#     put back and the script fails.
#
# While the weights are aside the shipped checkpoints do not load in this working tree (others' tests fail):
# make the run call at once, then `bash scripts/device_unpack.sh` (or `--restore`) puts them back.
# --dry-run fills device/ and prints the sizes as if the weights were moved, moving nothing.
set -euo pipefail
SCRIPTS=$(cd "$(dirname "$0")" && pwd)
cd "$(git rev-parse --show-toplevel)"
DATA=data/large-names
VIEW=""
ASIDE=${SPROUT_DEVICE_ASIDE:-/tmp/sprout-device-aside}
CARRY=device
WEIGHTS='model/checkpoints/*.safetensors'
DRY=0
while [ $# -gt 0 ]; do
    case $1 in
        --data) DATA=$2; shift 2 ;;
        --name-view) VIEW=$2; shift 2 ;;
        --aside) ASIDE=$2; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "device_pack: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
if ! git check-ignore -q "$CARRY/"; then
    echo "device_pack: $CARRY/ is not ignored by git, so it would travel as part of the tree; add /$CARRY/ to .gitignore" >&2
    exit 1
fi
for f in train.bin val.bin meta.json tokenizer.json ${VIEW:+train_names$VIEW.bin}; do
    [ -f "$DATA/$f" ] || { echo "device_pack: no $DATA/$f (python -m sprout_model.prepare writes it)" >&2; exit 1; }
done
if [ -n "$(find "$ASIDE" -type f 2>/dev/null | head -1)" ]; then
    echo "device_pack: $ASIDE still holds files of an earlier pack; run bash scripts/device_unpack.sh --restore first" >&2
    exit 1
fi
rm -rf "$CARRY"
mkdir -p "$CARRY/data"
cp "$DATA/train.bin" "$DATA/val.bin" "$DATA/meta.json" "$DATA/tokenizer.json" "$CARRY/data/"
if [ -n "$VIEW" ]; then cp "$DATA/train_names$VIEW.bin" "$CARRY/data/train_names0.bin"; fi
echo "device_pack: $CARRY/data from $DATA: $(ls "$CARRY/data" | tr '\n' ' ')"
if [ "$DRY" = 1 ]; then
    echo "device_pack: --dry-run: the sizes with $WEIGHTS out of the tree (nothing moved)"
    exec "$PY" -m sprout_model.device size --carry "$CARRY" --without "$WEIGHTS"
fi
mkdir -p "$ASIDE"
moved=0
while IFS= read -r -d '' f; do
    [ -f "$f" ] || continue
    mkdir -p "$ASIDE/$(dirname "$f")"
    mv "$f" "$ASIDE/$f"
    moved=$((moved + 1))
done < <(git ls-files -z -- "$WEIGHTS")
echo "device_pack: moved $moved shipped weight files to $ASIDE (bash scripts/device_unpack.sh --restore puts them back)"
if ! "$PY" -m sprout_model.device size --carry "$CARRY"; then
    echo "device_pack: too much to send; putting the weights back" >&2
    bash "$SCRIPTS/device_unpack.sh" --restore --aside "$ASIDE" >&2
    exit 1
fi
echo "device_pack: ready. run(command=\"bash scripts/train_on_device.sh --minutes 8\", carry=[\"$CARRY\"], timeout_s=570)"
