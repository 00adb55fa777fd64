#!/usr/bin/env bash
# Train the per-layer transcoders of Sprout's 8 blocks, then gpt-4's 4, one layer after another on one core:
#
#     nohup nice -n 19 bash scripts/train_transcoders.sh > runs/transcoders/train.log 2>&1 &
#
# Each model's layers go to runs/transcoders/<model>/ (ignored by git): layer_{i}.safetensors (float32) and
# config.yaml, in circuit-tracer's per-layer format. A finished layer is skipped and an unfinished one resumes
# from its saved state (layer_{i}.state.pt), so running the script again, in this session or a later one,
# continues where it stopped. The settings (TC_ARGS) must stay the same for a resume; change them only with a
# fresh folder (TC_ROOT). A model whose load fails (its weights moved aside for a moment) is retried.
# When a model's layers are all there, its replacement-model quality goes to <model>/replacement.json, and
# `python -m sprout_interp.features.transcoder_train --model M --ship runs/transcoders/M` copies them in
# float16 beside the checkpoint.
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
PY=${PY:-.venv/bin/python}
ROOT=${TC_ROOT:-runs/transcoders}
MODELS=${TC_MODELS:-"sprout gpt-4"}
# 80k training pairs per layer, 4 x d_model features, k = 32, skip connection, 5 epochs of batches of 512
read -r -a ARGS <<< "${TC_ARGS:---tokens 80000 --expansion 4 --k 32 --skip --epochs 5 --batch-size 512 --lr 1e-3 --save-every 50}"
# Sprout's blocks 6-8 (layers 5-7), whose feed-forwards the recipe above explained least (FVE 0.36-0.49 on
# held-out text): LATE_ARGS, measured in docs/features.md ("Transcoder quality"); the same width, so one set
LATE_LAYERS=${TC_LATE_LAYERS:-"5 6 7"}
read -r -a LATE_ARGS <<< "${TC_LATE_ARGS:---tokens 200000 --expansion 4 --k 64 --skip --epochs 1 --batch-size 512 --lr 3e-3 --save-every 50}"

train() {  # model, then the arguments of one call; retried while the model's load fails
  local model=$1; shift
  for try in 1 2 3 4 5 6; do
    echo "== $(date -u +%FT%TZ) $model (try $try): $*"
    if "$PY" -m sprout_interp.features.transcoder_train --model "$model" --out "$ROOT/$model" --threads 1 "$@"; then
      return 0
    fi
    sleep 60
  done
}

for model in $MODELS; do
  if [ "$model" = sprout ]; then
    read -r -a late <<< "$LATE_LAYERS"
    early=(); for l in 0 1 2 3 4 5 6 7; do [[ " $LATE_LAYERS " == *" $l "* ]] || early+=("$l"); done
    train "$model" --layers "${early[@]}" "${ARGS[@]}"
    train "$model" --layers "${late[@]}" "${LATE_ARGS[@]}"
  else
    train "$model" "${ARGS[@]}"
  fi
  "$PY" - "$model" "$ROOT/$model" <<'EOF' || echo "replacement quality of $model: not measured"
import json, sys
import torch
torch.set_num_threads(1)
from sprout_interp.core.hooked import load_hooked
from sprout_interp.features.transcoder import load_transcoders
from sprout_interp.features.transcoder_metrics import replacement_quality
m = load_hooked(sys.argv[1])
ts = load_transcoders(m, sys.argv[2])
if len(ts) == m.cfg.n_layers:
    q = replacement_quality(m, ts, n=16)
    print(sys.argv[1], "replacement model:", q, flush=True)
    with open(f"{sys.argv[2]}/replacement.json", "w") as f:
        json.dump(q, f, indent=1)
EOF
done
echo "== $(date -u +%FT%TZ) done"
