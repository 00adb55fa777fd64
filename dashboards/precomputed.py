"""The dashboard's slowest answers, computed once per checkpoint and shipped beside it in ``dashboard.json``.

Four things take the dashboard seconds to minutes on a CPU and depend on the checkpoint alone (not on the text):
every head's scores that rank the induction circuit (:func:`circuit_scores`), the circuit confirmed by mean
ablation (:func:`confirmed_circuit`), each head's part in copying (:func:`copying_sweep`) and what each head's
full OV circuit writes (:func:`ov_copying`, with the self-ranks: about a minute for Sprout). These functions are
the one home of those computations: the dashboard's ``compute`` module calls them, and
``scripts/precompute_dashboard.py`` calls them to write :data:`FILE` into a checkpoint's folder (:func:`write`).

The file records the checkpoint's fingerprint (``sprout_interp.core.fingerprints.fingerprint``: its config and
the sha256 of its weights and vocabulary) and the settings it was computed with (:func:`settings`). :func:`read`
returns its contents only when both equal the loaded model's; a changed checkpoint, other settings or a damaged
file give None and the reason, and the dashboard computes the answer itself. No streamlit here: the script
imports this module without a server.
"""
from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

from sprout_interp.circuits import ablation, attention, induction
from sprout_interp.circuits.induction import InductionCircuit
from sprout_interp.core.errors import SproutError
from sprout_interp.core.files import read_json
from sprout_interp.core.fingerprints import fingerprint, fingerprint_mismatch
from sprout_interp.core.texts import TEXTS
from sprout_interp.lens.tuned_lens import lens_path

FILE = "dashboard.json"
FORMAT = "sprout-dashboard/1"

# The same call, with the same settings, as the claims scripts (analyses/induction_heads.py's defaults, which the
# README's claims table uses): head scores on 16 rows of 64 repeated random tokens and on 8 held-out windows of 256
# tokens (seed 0), previous-token heads ranked on both (find_induction_circuit's default on="both"), threshold 0.3;
# confirmed by mean ablation against the head means of 16 held-out windows (seed 1), the held-out loss on 4 windows.
CIRCUIT_REF_N, CIRCUIT_LOSS_N, CIRCUIT_LENGTH, CIRCUIT_SEED = 16, 4, 256, 0
SCORES = dict(seq_len=64, batch=16, seed=CIRCUIT_SEED)
# the copying sweep the attention page draws: each head zero-ablated alone on 16 rows of 64 random tokens, repeated
SWEEP = dict(kind="zero", seq_len=64, batch=16, seed=0)
# the full OV circuits' copying scores and self-ranks (ov_copying_scores' defaults)
OV = dict(normalize=True, k=5)
OV_RANKS = ["self_top_k", "self_rank_median"]  # the columns only ranks=True computes


def settings() -> dict:
    """Everything the shipped answers depend on besides the checkpoint: a file computed otherwise is not used."""
    return {"scores": dict(SCORES, copying=False),
            "confirm": dict(kind="mean", reference_windows=CIRCUIT_REF_N, reference_seed=CIRCUIT_SEED + 1,
                            loss_windows=CIRCUIT_LOSS_N, length=CIRCUIT_LENGTH, loss_seed=CIRCUIT_SEED),
            "sweep": dict(SWEEP, metric="copying_ratio", method="fast"), "ov": dict(OV)}


# -- the computations -------------------------------------------------------------------------------------


def circuit_scores(m) -> pd.DataFrame:
    """Every head's previous-token / duplicate / induction scores as the claims scripts compute them: on repeated
    random tokens and on held-out text (the three ready-made texts where no corpus is installed)."""
    return attention.head_scores(m, copying=False, **SCORES)


def ranked_circuit(scores: pd.DataFrame) -> InductionCircuit:
    """The induction circuit as the head scores rank it (``find_induction_circuit``'s defaults; nothing ablated)."""
    return induction.find_induction_circuit(scores=scores)


def confirmed_circuit(m, scores: pd.DataFrame) -> InductionCircuit:
    """The induction circuit confirmed by mean ablation exactly as the claims scripts do it (each candidate head
    alone, then together): dozens of forwards."""
    from types import SimpleNamespace

    from sprout_interp.report.cli import held_out, mean_reference

    means = mean_reference(m, CIRCUIT_REF_N, CIRCUIT_LENGTH, CIRCUIT_SEED + 1)
    loss_text = held_out(m, SimpleNamespace(n=CIRCUIT_LOSS_N, length=CIRCUIT_LENGTH, seed=CIRCUIT_SEED))
    return induction.find_induction_circuit(m, scores=scores, kind="mean", reference=means,
                                            held_out=loss_text if loss_text is not None else list(TEXTS.values()))


def copying_sweep(m, kind: str = "zero", seq_len: int = 64, batch: int = 16, seed: int = 0,
                  progress: Optional[Callable[[int, int], None]] = None) -> pd.DataFrame:
    """Each head's part in in-context copying: the copying ratio (loss on copy 2 / copy 1) with that head ablated
    alone, on ``batch`` rows of ``seq_len`` random tokens repeated twice (``ablation_sweep``'s exact fast method)."""
    from sprout_model.evaluation import repeated_tokens_batch

    rep = repeated_tokens_batch(m.cfg.d_vocab, seq_len, batch, seed)
    return ablation.ablation_sweep(m, rep, metric="copying_ratio", kind=kind, method="fast", progress=progress)


def ov_copying(m, ranks: bool) -> pd.DataFrame:
    """Each head's full OV circuit: the eigenvalue copying score, and with ``ranks`` how often it promotes the token
    it reads (``ov_copying_scores``; the weights only)."""
    from sprout_interp.circuits.ov_circuit import ov_copying_scores

    return ov_copying_scores(m, ranks=ranks, **OV)


# -- plain values for JSON and back -----------------------------------------------------------------------


_INF = {"Infinity": float("inf"), "-Infinity": float("-inf")}


def _plain(v):
    """``v`` as strict JSON values: NaN and pandas' NA as None, an infinity as the string "Infinity" or
    "-Infinity" (:func:`_number` reads it back), tuples as lists, numpy scalars as Python numbers."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if v is None or v is pd.NA:
        return None
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, float) and math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def _number(v):
    """A value :func:`_plain` wrote, with an infinity's string back as the float."""
    if isinstance(v, dict):
        return {k: _number(x) for k, x in v.items()}
    return _INF.get(v, v) if isinstance(v, str) else v


def _tuples(v):
    """An object column's value as it was: a list of head pairs, each a tuple (JSON wrote each as a list)."""
    return [tuple(x) if isinstance(x, list) else x for x in v] if isinstance(v, list) else v


def frame_to_json(df: pd.DataFrame) -> dict:
    """A table as plain values: each column's name, dtype and values, the index and ``attrs``
    (:func:`frame_from_json` gives the same table back, dtypes included)."""
    return {"index": _plain(list(df.index)), "attrs": _plain(df.attrs),
            "columns": [{"name": str(c), "dtype": str(df[c].dtype), "values": _plain(df[c].tolist())} for c in df]}


def frame_from_json(d: dict) -> pd.DataFrame:
    """The table :func:`frame_to_json` wrote."""
    cols = {}
    for c in d["columns"]:
        values = [_tuples(v) for v in c["values"]] if c["dtype"] == "object" else c["values"]
        if c["dtype"].startswith(("float", "Float")):
            values = [_number(v) for v in values]
        cols[c["name"]] = pd.Series(values, dtype=c["dtype"], index=d["index"])
    df = pd.DataFrame(cols, index=d["index"])
    df.attrs.update(_number(d["attrs"]))
    return df


def circuit_to_json(c: InductionCircuit) -> dict:
    """An :class:`InductionCircuit` as plain values, its evidence table included."""
    out = {f.name: _plain(getattr(c, f.name)) for f in fields(c) if f.name != "evidence"}
    out["evidence"] = None if c.evidence is None else frame_to_json(c.evidence)
    return out


def circuit_from_json(d: dict) -> InductionCircuit:
    """The circuit :func:`circuit_to_json` wrote."""
    kw = {f.name: _number(d[f.name]) for f in fields(InductionCircuit) if f.name != "evidence"}
    kw["prev_tokens"] = [tuple(h) for h in kw["prev_tokens"]]
    return InductionCircuit(**kw, evidence=None if d["evidence"] is None else frame_from_json(d["evidence"]))


# -- the file ---------------------------------------------------------------------------------------------


def build(m, progress: Optional[Callable[[str], None]] = None) -> dict:
    """Everything :data:`FILE` holds for model ``m``, computed now: the format, the fingerprint, the settings,
    the head scores, the confirmed circuit and the copying sweep (``progress(step)`` before each)."""
    say = progress or (lambda step: None)
    say("head scores")
    scores = circuit_scores(m)
    say("the circuit confirmed by ablation")
    confirmed = confirmed_circuit(m, scores)
    say("the copying sweep")
    sweep = copying_sweep(m, **SWEEP)
    say("the full OV circuits")
    ov = ov_copying(m, ranks=True)
    return {"format": FORMAT, "model": m.name or "", "fingerprint": fingerprint(m), "settings": settings(),
            "circuit_scores": frame_to_json(scores), "confirmed_circuit": circuit_to_json(confirmed),
            "copying_sweep": frame_to_json(sweep), "ov_copying": frame_to_json(ov)}


def path_of(m) -> Optional[Path]:
    """Where :data:`FILE` lives for ``m``: its checkpoint's folder (None for a model without one)."""
    folder = lens_path(m)
    return None if folder is None else folder / FILE


def write(m, data: Optional[dict] = None, path: Optional[Path] = None) -> Path:
    """Write ``data`` (default: :func:`build` now) as JSON to ``path`` (default: beside the checkpoint)."""
    path = Path(path) if path is not None else path_of(m)
    if path is None:
        raise FileNotFoundError("the model has no checkpoint folder to write dashboard.json into: pass path=")
    data = build(m) if data is None else data
    path.write_text(json.dumps(data, indent=None, separators=(",", ":"), allow_nan=False) + "\n", encoding="utf-8")
    return path


class Precomputed:
    """The answers read from a checkpoint's :data:`FILE`: ``scores``, ``confirmed`` (an InductionCircuit),
    ``sweep`` (the copying sweep table, for the settings in :data:`SWEEP` only), ``ov`` (the OV copying table with
    the self-ranks; :meth:`ov_copying` gives it as the dashboard asks for it)."""

    def __init__(self, data: dict):
        self.scores = frame_from_json(data["circuit_scores"])
        self.confirmed = circuit_from_json(data["confirmed_circuit"])
        self.sweep = frame_from_json(data["copying_sweep"])
        self.ov = frame_from_json(data["ov_copying"])
        self.path: Optional[Path] = None

    def ov_copying(self, ranks: bool) -> pd.DataFrame:
        """:func:`ov_copying`'s table: with the self-ranks, or without them as ``ranks=False`` computes it."""
        return self.ov.copy() if ranks else self.ov.drop(columns=OV_RANKS)


def read(m, path: Optional[Path] = None) -> tuple[Optional[Precomputed], str]:
    """(the answers in ``path`` (default: beside ``m``'s checkpoint), "") when the file was computed for this very
    checkpoint (same fingerprint) with today's :func:`settings`; else (None, why not: no file, a damaged file,
    another checkpoint, other settings)."""
    path = Path(path) if path is not None else path_of(m)
    if path is None or not path.is_file():
        return None, f"no {FILE} beside the checkpoint"
    try:
        data = read_json(path, FILE)  # bounded, and a JSON object (else a SproutError, below)
        if data.get("format") != FORMAT:
            return None, f"{path.name} is not a {FORMAT} file"
        bad = fingerprint_mismatch(fingerprint(m), data.get("fingerprint"))
        if bad:
            return None, f"{path.name} was computed for another checkpoint ({', '.join(bad)} differ)"
        if data.get("settings") != _plain(settings()):
            return None, f"{path.name} was computed with other settings"
        got = Precomputed(data)
    except (SproutError, OSError, ValueError, KeyError, TypeError) as err:  # a damaged file is not used; the page computes
        return None, f"{path.name} cannot be read ({type(err).__name__}: {str(err)[:120]})"
    got.path = path
    return got, ""
