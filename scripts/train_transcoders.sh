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

for model in $MODELS; do
  for try in 1 2 3 4 5 6; do
    echo "== $(date -u +%FT%TZ) $model (try $try): ${ARGS[*]}"
    if "$PY" -m sprout_interp.features.transcoder_train --model "$model" --out "$ROOT/$model" --threads 1 "${ARGS[@]}"; then
      break
    fi
    sleep 60
  done
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
