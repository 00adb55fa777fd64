#!/usr/bin/env bash
# Create (or reuse) .venv-ct: circuit-tracer in a virtual environment of its own, for
# scripts/compare_circuit_tracer.py. Not part of the main install: circuit-tracer 0.5.0 pins
# transformers <= 4.57.3 and pulls TransformerLens 3, the project's venv has transformers 5 and TransformerLens 4.
# Safe to run again: it skips the install when the pinned versions are already there.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${CT_VENV:-.venv-ct}
TORCH=2.13.0
# nnsight 0.8 (pip's default) breaks circuit-tracer 0.5.0's import (no nnsight.intervention.tracing); 0.6.3 works.
PINS="circuit-tracer==0.5.0 transformers==4.57.3 nnsight==0.6.3"

"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
  echo "circuit-tracer needs Python >= 3.10 (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2; exit 1; }

stamp="$VENV/.circuit-tracer-installed"
want="torch==$TORCH $PINS"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] &&
   "$VENV/bin/python" -c 'import circuit_tracer' 2>/dev/null; then
  echo "$VENV: circuit-tracer already installed ($want)"
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# torch first and pinned: on this machine it is a CPU build on local disk, while one pulled in as a dependency
# would be a multi-GB CUDA download.
"$VENV/bin/python" -m pip install -q torch==$TORCH
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install -q $PINS
"$VENV/bin/python" -c 'import circuit_tracer, transformers, nnsight; print("circuit-tracer ok: transformers",
transformers.__version__, "nnsight", nnsight.__version__)'
echo "$want" > "$stamp"
