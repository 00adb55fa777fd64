#!/usr/bin/env bash
# After the `run` call of a session lent a GPU (model/TRAINING.md, "A GPU session: the prepared script"):
#
#     bash scripts/device_unpack.sh PARTS_DIR [DEST]    # put the shipped weights back, then join the parts
#     bash scripts/device_unpack.sh --restore           # only put the shipped weights back
#
# PARTS_DIR is the folder the run's files came back to (its files_at); the parts, manifest.json and
# train.json become DEST/checkpoint (default DEST: runs/device; never overwritten), an ordinary checkpoint
# folder (config.json, model.safetensors, tokenizer.json, train.json) that sprout_model.info,
# sprout_model.ship --run DEST and sprout_interp.load read; device.json and log.txt go beside it.
# The weights come back from --aside (default $SPROUT_DEVICE_ASIDE or /tmp/sprout-device-aside); a file
# already back in the tree is left as it is. If the aside folder is gone: git checkout -- model/checkpoints
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
ASIDE=${SPROUT_DEVICE_ASIDE:-/tmp/sprout-device-aside}
RESTORE_ONLY=0
TOKENIZER=()
POS=()
while [ $# -gt 0 ]; do
    case $1 in
        --restore) RESTORE_ONLY=1; shift ;;
        --aside) ASIDE=$2; shift 2 ;;
        --tokenizer) TOKENIZER=(--tokenizer "$2"); shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        -*) echo "device_unpack: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) POS+=("$1"); shift ;;
    esac
done
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi

restored=0
differ=0
if [ -d "$ASIDE" ]; then
    while IFS= read -r -d '' f; do
        rel=${f#"$ASIDE"/}
        if [ -e "$rel" ]; then
            if cmp -s "$f" "$rel"; then rm "$f"; else echo "device_unpack: kept $f: $rel is back already and differs" >&2; differ=1; fi
        else
            mkdir -p "$(dirname "$rel")"
            mv "$f" "$rel"
            restored=$((restored + 1))
        fi
    done < <(find "$ASIDE" -type f -print0)
    find "$ASIDE" -depth -type d -empty -delete
fi
echo "device_unpack: put $restored files back from $ASIDE"
missing=$(git ls-files --deleted -- model/checkpoints)
if [ -n "$missing" ]; then
    echo "device_unpack: still missing from the tree: $missing; git checkout -- model/checkpoints restores them from git" >&2
    exit 1
fi
[ "$differ" = 0 ] || exit 1
[ "$RESTORE_ONLY" = 1 ] && exit 0
if [ ${#POS[@]} -lt 1 ]; then
    echo "device_unpack: weights restored; pass PARTS_DIR (the run's files_at) to join the checkpoint" >&2
    exit 0
fi
PARTS=${POS[0]}
DEST=${POS[1]:-runs/device}
"$PY" -m sprout_model.device join "$PARTS" "$DEST/checkpoint" "${TOKENIZER[@]}"
for f in device.json log.txt; do
    if [ -f "$PARTS/$f" ]; then cp "$PARTS/$f" "$DEST/$f"; fi
done
echo "device_unpack: $DEST/checkpoint; next: python -m sprout_model.info $DEST/checkpoint"
