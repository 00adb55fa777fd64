"""The dashboard's slowest answers, computed once per checkpoint and shipped beside it in ``dashboard.json``.

These take the dashboard seconds to minutes on a CPU and depend on the checkpoint (and the files trained for it)
alone, not on the text a person types: every head's scores that rank the induction circuit
(:func:`circuit_scores`), the circuit confirmed by mean ablation (:func:`confirmed_circuit`), each head's part in
copying (:func:`copying_sweep`), what each head's full OV circuit writes (:func:`ov_copying`, with the
self-ranks: about a minute for Sprout), the logit and tuned lens over the three ready-made texts
(:func:`lens_three_texts`), the patching page's default pair patched both ways (:func:`patching` with
:data:`PATCH_DEFAULT`) and every SAE latent's description (:func:`feature_descriptions`, on the held-out sample's
index). These functions are the one home of those computations: the dashboard's ``compute`` module calls them,
and ``scripts/precompute_dashboard.py`` calls them to write :data:`FILE` into a checkpoint's folder
(:func:`write`).

The file records the checkpoint's fingerprint (``sprout_interp.core.fingerprints.fingerprint``: its config and
the sha256 of its weights and vocabulary), the sha256 of each file trained for it that an answer reads (the tuned
lens, the SAEs: :func:`sources`) and the settings it was computed with (:func:`settings`). :func:`read` returns
its contents only when all three equal the loaded model's; a changed checkpoint, a retrained lens or SAE, other
settings or a damaged file give None and the reason, and the dashboard computes the answer itself. Only these
fingerprints of the inputs decide whether the file is used, never its numbers: a file computed on another machine
serves this one.

What the file promises: its numbers are float32 computations, whose last bits depend on the CPU's kernels and the
thread count, so a fresh computation on another machine equals them to :data:`FRESH_TOLERANCE` (relative 1e-4,
absolute 1e-4: logits, logit differences, losses in nats, probabilities, head scores, shares), and a ratio of two
such numbers to that tolerance on the difference it divides (patching's ``score`` as ``value - corrupted`` in
logits, an ablation's share of the copying gain as the probability it removes). Its choices (the circuit's heads,
its verdicts, which head ranks first) are the same wherever no near-tie decides them: every choice in the shipped
files is won by at least :data:`CHOICE_MARGIN`, ten times the tolerance, and
tests/dashboards/test_dashboard_precomputed.py asserts both. No streamlit here: the script imports this module
without a server.
"""
from __future__ import annotations

import hashlib
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
from sprout_interp.features.sae import available_saes, load_sae
from sprout_interp.lens.tuned_lens import lens_path

FILE = "dashboard.json"
FORMAT = "sprout-dashboard/1"
#: what a fresh computation of the file's numbers on another machine (other CPU kernels, another thread count)
#: equals them to (``numpy.testing.assert_allclose``'s arguments): float32 rounding of a few forward passes
FRESH_TOLERANCE = dict(rtol=1e-4, atol=1e-4)
#: the least margin by which a choice in a shipped file is won (a head's score over the next, a share over a
#: verdict's bar), far above FRESH_TOLERANCE: no rounding can make another machine choose otherwise
CHOICE_MARGIN = 1e-3

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
# the logit lens page's "three ready-made texts together" figure (the chapter's 77% / 59% measurement)
LENS = dict(k=1, lenses=("logit", "tuned"))
# the patching page's default pair: the first "Zorbin" renamed, so only the clean text says what follows the second;
# the metric is logit[answer] - logit[wrong] at the last position; patched at both of the page's sites
_CLEAN = ("When the boat came in, old Zorbin Plax was waiting on the pier. The sailors tied the ropes, and the last "
          "man off the boat shook hands with Zorbin")
PATCH_DEFAULT = dict(clean=_CLEAN, corrupted=_CLEAN.replace("Zorbin", "Velmat", 1), answer=" Pl", wrong=" the")
PATCH_SPLITS = (("resid_pre", "layer_pos"), ("z", "head"))
# every SAE latent's description, and the page of the latent the Features page opens on (DEFAULT_FEATURE of each
# SAE): features.pages.feature_summaries' defaults on index_features' held-out sample (settings() records those
# defaults, so a change to either makes the shipped answers stale, never wrong)
DEFAULT_FEATURE = 0


def settings() -> dict:
    """Everything the shipped answers depend on besides the checkpoint: a file computed otherwise is not used."""
    return {"lens": dict(LENS, texts=_sha(json.dumps(TEXTS, sort_keys=True).encode())),
            "patching": dict(PATCH_DEFAULT, splits=PATCH_SPLITS, method="exact"),
            "features": dict(_feature_defaults(), default_feature=DEFAULT_FEATURE),
            "scores": dict(SCORES, copying=False),
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


def _feature_defaults() -> dict:
    """The default arguments of ``index_features`` and ``feature_summaries``: what every description depends on."""
    import inspect

    from sprout_interp.features.pages import feature_summaries, index_features

    return {fn.__name__: {k: p.default for k, p in inspect.signature(fn).parameters.items()
                          if p.default is not inspect.Parameter.empty and k != "index"}
            for fn in (index_features, feature_summaries)}


def lens_three_texts(m, which: str = "logit") -> pd.DataFrame:
    """The logit lens (``which="logit"``) or the tuned lens (``"tuned"``) over the three ready-made texts together,
    right-padded and masked: ``LogitLens.summary()``, one row per block (how the chapter measured Sprout)."""
    import warnings

    from sprout_interp.lens.logit_lens import logit_lens

    toks, mask = m.to_tokens_with_mask(list(TEXTS.values()), truncate=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a checkpoint without a tuned lens: the page says so itself
        return logit_lens(m, toks, k=LENS["k"], attention_mask=mask, lens=which).summary()


def patching(m, clean: str, corrupted: str, answer: str, wrong: str, site: str, by: str,
             method: str = "exact") -> pd.DataFrame:
    """``activation_patch`` (``method="exact"``) or ``attribution_patch`` (``"attribution"``) of ``clean`` into
    ``corrupted``, the metric logit[answer] − logit[wrong] at the last position."""
    from sprout_interp import patching as P
    from sprout_interp.core.tokens import token_id

    metric = P.LogitDiff(token_id(m, answer), token_id(m, wrong))
    run = P.attribution_patch if method == "attribution" else P.activation_patch
    return run(m, clean, corrupted, metric, site=site, by=by)


def feature_pages(m, sae, features=None, index=None, keep=()) -> tuple[dict[int, str], dict]:
    """(``{latent: its automatic description}`` for ``features`` (default: every latent of ``sae``), ``{latent:
    its whole page}`` for those in ``keep``), each exactly as ``features.pages.feature_summaries`` builds it on
    ``index`` (default: ``index_features`` on the held-out sample)."""
    from sprout_interp.features.pages import feature_summaries, index_features

    feats = list(range(sae.d_sae)) if features is None else list(features)
    index = index_features(m, sae) if index is None else index
    descriptions, kept = {}, {}
    for s in range(0, len(feats), 256):  # a few hundred pages at a time: each holds its tables
        pages = feature_summaries(m, sae, feats[s:s + 256], index)
        descriptions.update({f: p.description for f, p in pages.items()})
        kept.update({f: p for f, p in pages.items() if f in keep})
    return descriptions, kept


def feature_descriptions(m, sae, features=None, index=None) -> dict[int, str]:
    """``{latent: its automatic description}`` for ``features`` (default: every latent): :func:`feature_pages`'."""
    return feature_pages(m, sae, features, index)[0]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sources(m) -> dict[str, str]:
    """``{path in the checkpoint folder: sha256}`` of every file trained for the checkpoint that an answer here reads:
    the tuned lens and each SAE (weights and settings). Empty for a model without a folder."""
    file = path_of(m)
    if file is None:
        return {}
    root = file.parent
    files = sorted([*root.glob("tuned_lens.*"), *root.glob("saes/*/*")])
    return {f.relative_to(root).as_posix(): _sha(f.read_bytes()) for f in files if f.is_file()}


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


def feature_page_to_json(page) -> dict:
    """A ``FeatureSummary`` as plain values (its tables by :func:`frame_to_json`)."""
    return {f.name: frame_to_json(v) if isinstance(v, pd.DataFrame) else _plain(v)
            for f in fields(page) for v in [getattr(page, f.name)]}


def feature_page_from_json(d: dict):
    """The ``FeatureSummary`` :func:`feature_page_to_json` wrote."""
    from sprout_interp.features.pages import FeatureSummary

    kw = {}
    for f in fields(FeatureSummary):
        v = d[f.name]
        kw[f.name] = frame_from_json(v) if isinstance(v, dict) and "columns" in v and "index" in v else _number(v)
    return FeatureSummary(**kw)


# -- the file ---------------------------------------------------------------------------------------------


def build(m, progress: Optional[Callable[[str], None]] = None) -> dict:
    """Everything :data:`FILE` holds for model ``m``, computed now: the format, the fingerprint, the sources, the
    settings, the head scores, the confirmed circuit, the copying sweep, the OV copying table, the lens over the
    three texts, the default pair patched, and each SAE's descriptions and default page (``progress(step)`` before
    each)."""
    say = progress or (lambda step: None)
    say("head scores")
    scores = circuit_scores(m)
    say("the circuit confirmed by ablation")
    confirmed = confirmed_circuit(m, scores)
    say("the copying sweep")
    sweep = copying_sweep(m, **SWEEP)
    say("the full OV circuits")
    ov = ov_copying(m, ranks=True)
    say("the lens over the three ready-made texts")
    lens = {which: frame_to_json(lens_three_texts(m, which)) for which in LENS["lenses"]}
    say("the patching page's default pair")
    try:
        patched = {f"{site}/{by}": frame_to_json(patching(m, **PATCH_DEFAULT, site=site, by=by))
                   for site, by in PATCH_SPLITS}
    except SproutError:  # a vocabulary without the default answer token: the page says so itself
        patched = {}
    descriptions, default_pages = {}, {}
    for layer in available_saes(m):
        say(f"every latent's description, the SAE of layer {layer}")
        described, kept = feature_pages(m, load_sae(m, layer), keep=(DEFAULT_FEATURE,))
        descriptions[str(layer)] = list(described.values())
        default_pages[str(layer)] = feature_page_to_json(kept[DEFAULT_FEATURE])
    return {"format": FORMAT, "model": m.name or "", "fingerprint": fingerprint(m), "sources": sources(m),
            "settings": settings(), "circuit_scores": frame_to_json(scores),
            "confirmed_circuit": circuit_to_json(confirmed), "copying_sweep": frame_to_json(sweep),
            "ov_copying": frame_to_json(ov), "lens_three_texts": lens, "patching": patched,
            "feature_descriptions": descriptions, "feature_pages": default_pages}


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
    the self-ranks; :meth:`ov_copying` gives it as the dashboard asks for it), ``lens`` (:func:`lens_three_texts`
    by lens), ``patched`` (:func:`patching` of :data:`PATCH_DEFAULT` by ``"site/by"``; :meth:`patching` answers a
    page's call), ``descriptions`` (every latent's, by SAE layer; :meth:`descriptions_of`), ``pages`` (the page of
    :data:`DEFAULT_FEATURE`, by SAE layer; :meth:`feature_page`)."""

    def __init__(self, data: dict):
        self.scores = frame_from_json(data["circuit_scores"])
        self.confirmed = circuit_from_json(data["confirmed_circuit"])
        self.sweep = frame_from_json(data["copying_sweep"])
        self.ov = frame_from_json(data["ov_copying"])
        self.lens = {k: frame_from_json(v) for k, v in data["lens_three_texts"].items()}
        self.patched = {k: frame_from_json(v) for k, v in data["patching"].items()}
        self.descriptions = {int(k): [str(d) for d in v] for k, v in data["feature_descriptions"].items()}
        self.pages = {int(k): feature_page_from_json(v) for k, v in data["feature_pages"].items()}
        self.path: Optional[Path] = None

    def ov_copying(self, ranks: bool) -> pd.DataFrame:
        """:func:`ov_copying`'s table: with the self-ranks, or without them as ``ranks=False`` computes it."""
        return self.ov.copy() if ranks else self.ov.drop(columns=OV_RANKS)

    def patching(self, clean: str, corrupted: str, answer: str, wrong: str, site: str, by: str,
                 method: str = "exact") -> Optional[pd.DataFrame]:
        """:func:`patching`'s table when it was precomputed for these very arguments (the page's default pair,
        exact), else None."""
        asked = dict(clean=clean, corrupted=corrupted, answer=answer, wrong=wrong)
        got = self.patched.get(f"{site}/{by}") if asked == PATCH_DEFAULT and method == "exact" else None
        return None if got is None else got.copy()

    def feature_page(self, layer: int, feature: int):
        """The ``FeatureSummary`` of ``feature`` in the SAE of ``layer`` when it was precomputed, else None."""
        got = self.pages.get(int(layer))
        return got if got is not None and got.feature == int(feature) else None

    def descriptions_of(self, layer: int, features) -> Optional[dict[int, str]]:
        """:func:`feature_descriptions` of ``features`` for the SAE of ``layer``, or None when not precomputed."""
        got = self.descriptions.get(int(layer))
        if got is None or any(not 0 <= int(f) < len(got) for f in features):
            return None
        return {int(f): got[int(f)] for f in features}


def read(m, path: Optional[Path] = None) -> tuple[Optional[Precomputed], str]:
    """(the answers in ``path`` (default: beside ``m``'s checkpoint), "") when the file was computed for this very
    checkpoint (same fingerprint), its tuned lens and SAEs (same :func:`sources`) and today's :func:`settings`; else
    (None, why not: no file, a damaged file, another checkpoint, another lens or SAE, other settings)."""
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
        if data.get("sources") != sources(m):
            return None, f"{path.name} was computed with another tuned lens or other SAEs than those beside the checkpoint"
        got = Precomputed(data)
    except (SproutError, OSError, ValueError, KeyError, TypeError) as err:  # a damaged file is not used; the page computes
        return None, f"{path.name} cannot be read ({type(err).__name__}: {str(err)[:120]})"
    got.path = path
    return got, ""
