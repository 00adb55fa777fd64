#!/usr/bin/env bash
# Train the cross-layer transcoders of Sprout, then gpt-4, on one core in the background:
#
#     mkdir -p runs/clt && nohup nice -n 19 bash scripts/train_clt.sh >> runs/clt/train.log 2>&1 &
#
# Each model's run goes to runs/clt/<model>/ (ignored by git): clt.state.pt while it trains (saved every
# --save-every steps, atomically), then circuit-tracer's CLT files (W_enc_{i}, W_dec_{i}.safetensors, float32) and
# config.yaml with the quality on held-out text. Running the script again, in this session or a later one, resumes
# each unfinished run bit for bit and skips finished ones. The settings (CLT_ARGS) must stay the same for a resume;
# change them only with a fresh folder (CLT_ROOT). A model whose load fails (its weights moved aside for a moment)
# is retried; a second copy of this script finds the run folder locked and stops. Progress: `python -m sprout_interp.features.clt_train --model M --out runs/clt/M --status`;
# a finished run ships in float16 with `... --model M --ship runs/clt/M`.
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
PY=${PY:-.venv/bin/python}
ROOT=${CLT_ROOT:-runs/clt}
MODELS=${CLT_MODELS:-"sprout gpt-4"}
# 4 x d_model features per layer, BatchTopK k = 32 per layer; 24 chunks of 32,768 fresh training tokens, 2 passes
# each, batches of 512: 3,072 steps, 1.57M tokens seen, 786k distinct
read -r -a ARGS <<< "${CLT_ARGS:---expansion 4 --k 32 --chunks 24 --chunk-tokens 32768 --passes 2 --batch-size 512 --lr 1e-3 --save-every 25 --log-every 25}"

for model in $MODELS; do
  for try in 1 2 3 4 5 6; do
    echo "== $(date -u +%FT%TZ) $model (try $try): ${ARGS[*]}"
    "$PY" -m sprout_interp.features.clt_train --model "$model" --out "$ROOT/$model" --threads 1 "${ARGS[@]}"
    rc=$?
    [ "$rc" -eq 0 ] && break
    # 3: another process is training in that run folder (it holds its clt.lock): leave it alone, start nothing
    [ "$rc" -eq 3 ] && { echo "== $model: another trainer holds $ROOT/$model; this script stops"; exit 3; }
    sleep 60
  done
done
echo "== $(date -u +%FT%TZ) done"
