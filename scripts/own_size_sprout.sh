#!/usr/bin/env bash
# Sprout at its own size on this CPU, from nothing, resumably: model/TRAINING.md's own-size recipe as one command
# that is run again to go on from where the last run stopped.
#
#     nohup bash scripts/own_size_sprout.sh >> runs/own-size.log 2>&1 &     # start or resume, in the background
#     bash scripts/own_size_sprout.sh --dry-run                              # print the stages and commands
#     pkill -TERM -f "out $RUNS/sprout-O-"                                   # stop: the run saves its state
#
# Stages, each skipped when it is done (a run folder is only ever resumed, never overwritten):
#   1. data/names-splice (`default` with spliced invented names, the shipped tokenizer's corpus);
#   2. the copy stage, runs/sprout-O-copy: fresh weights, every row a copy-task row, until the copying ratio is at
#      or below $COPY_STOP (the induction phase change);
#   3. data/large-names ("large" encoded with the shipped tokenizer, so its models compare on `default`'s
#      validation windows);
#   4. the stable run, runs/sprout-O-wsd: text of "large" with 15% copy rows and renamed views, the rate held at
#      2e-3 (warmup–stable–decay over 60M tokens, decaying only over the last 12M), until stopped.
# A finished candidate is a cooldown branched off the stable run (`train --branch-from runs/sprout-O-wsd ...`, as
# in TRAINING.md), measured with analyses/model_acceptance.py before any ship.
#
# Environment: PYTHON (default .venv/bin/python), RUNS (default runs), THREADS (2), NICENESS (19),
# COPY_STOP (0.2). The runs are compiled (`--compile`); TRAINING.md logs how long each stage took.
# A run state is `state.pt` in its folder; it survives between sessions on one machine, not on a new one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
RUNS=${RUNS:-runs}
THREADS=${THREADS:-2}
NICENESS=${NICENESS:-19}
COPY_STOP=${COPY_STOP:-0.2}
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=$THREADS PYTHONUNBUFFERED=1

say() { echo "own_size_sprout: $(date -u +%H:%M:%S) $*"; }
run() {
    say "run: $*"
    [ "$DRY" = 1 ] && return 0
    nice -n "$NICENESS" "$@"
}

# The last evaluation's copying ratio in a run's state.pt ("none" before its first evaluation or its first save).
last_copy_ratio() {
    [ -f "$1/state.pt" ] || { echo none; return; }
    "$PY" - "$1" <<'EOF'
import sys
from pathlib import Path
from sprout_model.run_state import read_state
h = read_state(Path(sys.argv[1]) / "state.pt").get("history") or []
print(h[-1]["copy_ratio"] if h else "none")
EOF
}

# Whether the copy stage reached $COPY_STOP; leaves its last copying ratio in COPY_RATIO.
copy_done() {
    COPY_RATIO=$(last_copy_ratio "$RUNS/sprout-O-copy")
    [ "$COPY_RATIO" != none ] && awk -v r="$COPY_RATIO" -v s="$COPY_STOP" 'BEGIN { exit !(r <= s) }'
}

mkdir -p "$RUNS"
if [ -f data/names-splice/meta.json ]; then say "data/names-splice: there"
else run "$PY" -m sprout_model.prepare --out data/names-splice --name-views 4 --splice-share 0.5; fi

if copy_done; then say "copy stage: done (copying ratio $COPY_RATIO <= $COPY_STOP)"
else
    run "$PY" -m sprout_model.train --preset sprout --data data/names-splice --copy-rows 1.0 --batch-size 32 \
        --seq-len 128 --lr 2e-3 --warmup 50 --tokens 20e6 --eval-every 50 --eval-batches 1 --save-every 25 \
        --threads "$THREADS" --compile --stop-copy-ratio "$COPY_STOP" --out "$RUNS/sprout-O-copy"
    if [ "$DRY" = 0 ] && ! copy_done; then say "copy stage stopped before the phase change: run this again"; exit 0; fi
fi

if [ -f data/large-names/meta.json ]; then say "data/large-names: there"
else
    run "$PY" -m sprout_model.prepare --corpus large --tokenizer model/checkpoints/tokenizer.json --name-views 4 \
        --splice-share 0.5 --out data/large-names
fi

run "$PY" -m sprout_model.train --preset sprout --init-from "$RUNS/sprout-O-copy" --data data/large-names \
    --name-views --copy-rows 0.15 --batch-size 16 --seq-len 256 --lr 2e-3 --warmup 50 --schedule wsd --tokens 60e6 \
    --cooldown-tokens 12e6 --eval-every 100 --eval-batches 4 --save-every 25 --threads "$THREADS" --compile \
    --out "$RUNS/sprout-O-wsd"
