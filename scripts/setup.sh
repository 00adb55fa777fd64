#!/usr/bin/env bash
# Create (or reuse) .venv and install sprout-interp into it, with the corpus, test and docs extras.
# Safe to run again: it skips the install when nothing changed since the last one.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "sprout-interp needs Python >= 3.11 (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2; exit 1; }

[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python

# torch first, pinned, and only when missing: on this machine kind `pip install torch==2.13.0` takes a
# CPU build from local disk in seconds, while an unpinned torch (or one pulled in as a dependency)
# downloads a multi-GB CUDA build. pyproject.toml keeps a range so users elsewhere choose their own.
if ! "$VPY" -c 'import torch' 2>/dev/null; then
  "$VPY" -m pip install -q --upgrade pip
  "$VPY" -m pip install -q torch==2.13.0
fi

stamp=.venv/.sprout-installed
want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$VPY" -m pip install -q -e ".[train,test,docs]"
  echo "$want" > "$stamp"
fi

# The "large" corpus also reads public-domain books that Debian packages ship as data (model/corpus.py,
# DEBIAN_PACKAGES, pinned there). They are unpacked, not installed: apt-get download + dpkg-deb -x into
# .venv/debian-corpus, without their dependencies (R, SWORD). Where that fails only `--corpus large` needs them,
# so it is a note, not an error; that corpus's CorpusError says what to run.
debdir=.venv/debian-corpus
debs=$("$VPY" -c 'from sprout_model.corpus import DEBIAN_PACKAGES as P; print(" ".join(f"{k}={v}" for k, v in P.items()))')
if [ "$(cat "$debdir/.sprout-debs" 2>/dev/null)" != "$debs" ]; then
  tmp=$(mktemp -d)
  # shellcheck disable=SC2086
  if command -v apt-get >/dev/null 2>&1 && { (cd "$tmp" && apt-get download -qq $debs) >/dev/null 2>&1 ||
       { [ "$(id -u)" -eq 0 ] && apt-get update -qq >/dev/null 2>&1 && (cd "$tmp" && apt-get download -qq $debs) >/dev/null 2>&1; }; }; then
    rm -rf "$debdir" && mkdir -p "$debdir"
    for f in "$tmp"/*.deb; do dpkg-deb -x "$f" "$debdir"; done
    echo "$debs" > "$debdir/.sprout-debs"
  else
    echo "note: could not download the Debian packages $debs; only the 'large' corpus needs them" >&2
  fi
  rm -rf "$tmp"
fi
