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

The Attribution graph page's first view of the default text (:func:`graph_first_view`: the graph's node table,
each node's influence, the replacement and completeness scores, the graph pruned at :data:`GRAPH`'s thresholds,
the drawn features' labels and promoted tokens; not its adjacency, tens of MB) lives in its own file,
:data:`GRAPH_FILE`, stamped with the checkpoint's fingerprint and the sha256 of the transcoders it was computed over
(:func:`graph_sources`), so that transcoders shipped anew make only it stale (:func:`read_graph_view`). Its numbers
keep :data:`GRAPH_DIGITS` significant digits and equal a fresh computation to :data:`FRESH_TOLERANCE`; its pruned
graph is a cut over thousands of nearly equal edge scores, so what it promises instead of :data:`CHOICE_MARGIN` is
that it lies between the fresh graph pruned at both thresholds 1e-4 lower and 1e-4 higher
(tests/dashboards/test_dashboard_graph_view.py).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, fields
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
# the Attribution graph page's first view, in its own file beside the checkpoint (GRAPH_FILE, so that transcoders
# shipped anew make only it stale): the dashboard's default text graphed as the page opens it -- the prompt up to
# where the name comes back, at most 2,048 feature nodes, circuit-tracer's pruning thresholds, the best shipped kind
GRAPH_FILE = "graph_view.json"
GRAPH_FORMAT = "sprout-graph-view/1"
GRAPH = dict(max_features=2048, node_threshold=0.8, edge_threshold=0.98)
GRAPH_TEXT = next(iter(TEXTS))  # the text the dashboard opens on
GRAPH_DIGITS = 7  # significant digits of the first view's floats (float32 numbers, kept to 5e-7 relative)


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


# -- the Attribution graph page's first view --------------------------------------------------------------


def name_copy(strs: list[str]) -> dict | None:
    """Where a text copies a name it repeats (names found by ``features.search.repeated_names`` from the tokens
    alone), for the pages that open on it (attention, logit lens, attribution graph); None when no name repeats.

    ``pos``: the position whose next token is the copied one -- before the second word of a repeated two-word name
    (the chapter's story: the second " Pl" of "Zorbin Plax", predicted at position 56, "in"), else before the second
    piece of the first name that comes back. ``span``: (first, last) position of that name's second occurrence,
    with a repeated name right before or after it (the whole "Zorbin Plax"); ``first``: where its first occurrence
    starts."""
    from sprout_interp.features.search import repeated_names

    again = repeated_names(strs)
    second = again[again["occurrence"] == 2]
    if second.empty:
        return None
    at = set(second["pos"])
    pos = None
    for p in sorted(second.loc[second["piece"] == 0, "pos"]):
        if p - 1 in at:  # a name right after another repeated name: a full name's second word
            pos = int(p) - 1
            break
    if pos is None:
        name = second[second["name"] == second["name"].iloc[0]]
        pos = int(name["pos"].iloc[0])  # before its second piece
    lo = hi = pos
    while lo - 1 in at:
        lo -= 1
    while hi + 1 in at:
        hi += 1
    names = set(second.loc[second["pos"].between(lo, hi), "name"])
    first = int(again[(again["occurrence"] == 1) & again["name"].isin(names)]["pos"].min())
    return {"pos": pos, "span": (lo, hi), "first": first}


def text_labels(m, text: str) -> list[str]:
    """One label per token of ``text`` as the pages show them (``core.tokens.token_labels``), cut to the context."""
    from sprout_interp.core.tokens import token_labels

    ids = m.to_tokens(text, truncate=True)[0]
    return token_labels(m.tokenizer, ids) if m.tokenizer is not None else list(m.to_str_tokens(ids))


def graph_end(strs: list[str]) -> int | None:
    """Where a text's graph ends by default: just after the position where the model predicts a repeated name's
    copied token (:func:`name_copy`), so the logits explain that prediction; None when no name repeats. A token
    count (the prompt is ``strs[:end]``)."""
    got = name_copy(strs)
    return None if got is None else got["pos"] + 1


def default_end(m, text: str) -> int:
    """The Attribution graph page's prompt length for ``text`` before a person changes it: :func:`graph_end`, else
    the whole text, at most the context less one (``<|endoftext|>`` goes first)."""
    strs = text_labels(m, text)
    hi = min(len(strs), m.cfg.n_ctx - 1)
    return min(graph_end(strs) or hi, hi)


def graph_sources(m, kind: str) -> dict[str, str]:
    """``{path in the checkpoint folder: sha256}`` of every file of the shipped transcoders of ``kind`` (their
    weights, settings and ``labels.json``): what the graph's first view was computed from."""
    from sprout_interp.features.clt import clt_folder
    from sprout_interp.features.transcoder import transcoder_folder

    file = path_of(m)
    if file is None:
        return {}
    folder = clt_folder(m) if kind == "clt" else transcoder_folder(m)
    return {f.relative_to(file.parent).as_posix(): _sha(f.read_bytes()) for f in sorted(folder.glob("*"))
            if f.is_file()}


@dataclass(frozen=True)
class GraphView:
    """What the Attribution graph page's first view of one prompt shows, without the graph's adjacency: the page
    draws it as it draws a graph it computed, and computes the graph itself once a person asks for more (another
    threshold, a pin, a node's card, a QK attribution, a download).

    Attributes:
        settings: ``text`` (sha256), ``end``, ``max_features``, ``kind``, ``node_threshold``, ``edge_threshold``.
        nodes: the graph's node table (``AttributionGraph.nodes``' columns the page reads); tokens: the prompt's
            ids; n_layers, info: the graph's.
        influence: each node's influence on the logits, in node order (``node_influence``); replacement,
            completeness: ``graph_scores``.
        view_nodes, view_edges: ``plots.graph.graph_tables`` at the two thresholds (no pinned nodes).
        labels: ``{(layer, feature): label}`` (``si.feature_labels``) and promoted: ``{(layer, feature): the three
            tokens it promotes}`` (``transcoder_promoted``), for the view's features.
    """

    settings: dict
    nodes: pd.DataFrame
    tokens: list
    n_layers: int
    info: dict
    influence: list
    replacement: float
    completeness: float
    view_nodes: pd.DataFrame
    view_edges: pd.DataFrame
    labels: dict
    promoted: dict

    @property
    def n_pos(self) -> int:
        return len(self.tokens)

    @property
    def n_features(self) -> int:
        return int((self.nodes["kind"] == "feature").sum())

    @property
    def n_errors(self) -> int:
        return self.n_layers * self.n_pos

    @property
    def n_logits(self) -> int:
        return int((self.nodes["kind"] == "logit").sum())

    @property
    def transcoder_kind(self) -> str:
        return self.info.get("transcoder_kind", "per_layer")

    def answers(self, text: str, end: int, max_features: int, kind: str) -> bool:
        """Whether this is the first view of the graph of ``text``'s first ``end`` tokens with these settings."""
        return self.settings == graph_settings(text, end, max_features, kind)


#: the columns of a graph's node table the page reads from a first view
GRAPH_COLUMNS = ["node", "kind", "layer", "block", "pos", "feature", "token_id", "token", "activation", "logit_prob"]


def graph_settings(text: str, end: int, max_features: int, kind: str) -> dict:
    """What a first view answers: the text (by sha256), the prompt length, the feature cap, the transcoders' kind
    and :data:`GRAPH`'s thresholds."""
    return {"text": _sha(text.encode()), "end": int(end), "max_features": int(max_features), "kind": kind,
            "node_threshold": GRAPH["node_threshold"], "edge_threshold": GRAPH["edge_threshold"]}


def default_graph(m, text: Optional[str] = None):
    """(the attribution graph the Attribution graph page opens on for ``text`` (default: the dashboard's default
    text), its text, its kind): the prompt up to :func:`default_end`, :data:`GRAPH`'s feature cap, over the best
    shipped kind of transcoders (``best_kind``); None when the checkpoint ships none."""
    from sprout_interp.circuits.attribution_graph import attribution_graph
    from sprout_interp.circuits.local_replacement import best_kind, resolve_transcoders, shipped_kinds

    if not shipped_kinds(m):
        return None
    text = TEXTS[GRAPH_TEXT] if text is None else text
    kind = best_kind(m)
    ts = resolve_transcoders(m, None, kind=kind)
    g = attribution_graph(m, m.to_tokens(text, truncate=True)[0, :default_end(m, text)], ts,
                          max_feature_nodes=GRAPH["max_features"])
    return g, text, kind


def graph_first_view(m, text: Optional[str] = None, graph=None) -> Optional[GraphView]:
    """The Attribution graph page's first view of :func:`default_graph` (``graph``: that graph, when computed
    already), computed now; None when the checkpoint ships no transcoders."""
    from sprout_interp.circuits.graphs import graph_scores, node_influence
    from sprout_interp.circuits.local_replacement import resolve_transcoders
    from sprout_interp.features.labels import feature_labels
    from sprout_interp.features.pages import transcoder_promoted
    from sprout_interp.plots.graph import graph_tables

    if graph is None:
        made = default_graph(m, text)
        if made is None:
            return None
        g, text, kind = made
    else:
        g, text, kind = graph, TEXTS[GRAPH_TEXT] if text is None else text, graph.transcoder_kind
    end = default_end(m, text)  # tokens of the text (the graph's positions hold <|endoftext|> first as well)
    ts = resolve_transcoders(m, None, kind=kind)
    infl = node_influence(g).tolist()
    replacement, completeness = graph_scores(g)
    nodes, edges = graph_tables(g, GRAPH["node_threshold"], GRAPH["edge_threshold"], infl, ())
    feats = sorted({(int(r.layer), int(r.feature)) for r in nodes[nodes["kind"] == "feature"].itertuples()})
    labels = feature_labels(m, None if kind == "clt" else ts, feats, kind=kind)
    promoted = transcoder_promoted(m, ts, feats)
    return GraphView(settings=graph_settings(text, end, GRAPH["max_features"], kind),
                     nodes=g.nodes[GRAPH_COLUMNS].copy(), tokens=[int(t) for t in g.tokens.tolist()],
                     n_layers=g.n_layers, info=dict(g.info), influence=infl, replacement=float(replacement),
                     completeness=float(completeness), view_nodes=nodes, view_edges=edges,
                     labels={(int(r.layer), int(r.feature)): str(r.label) for r in labels.itertuples()},
                     promoted={(int(r.layer), int(r.feature)): list(r.promoted) for r in promoted.itertuples()})


def _digits(values, n: int = GRAPH_DIGITS) -> list:
    """Float values to ``n`` significant digits (each within 5e-7 of itself, relative, far inside
    :data:`FRESH_TOLERANCE`; NaN kept): a graph's float32 numbers without the float64 digits they never had."""
    return [v if v is None or not math.isfinite(v) else float(f"{v:.{n}g}") for v in map(float, values)]


def _short(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every float column to :data:`GRAPH_DIGITS` significant digits (:func:`_digits`)."""
    out = df.copy()
    for c in out.columns:
        if pd.api.types.is_float_dtype(out[c].dtype):
            out[c] = pd.Series(_digits(out[c]), index=out.index, dtype=out[c].dtype)
    return out


def graph_view_to_json(v: GraphView) -> dict:
    """A :class:`GraphView` as plain values, its floats to :data:`GRAPH_DIGITS` significant digits."""
    return {"settings": v.settings, "nodes": frame_to_json(_short(v.nodes)), "tokens": v.tokens,
            "n_layers": v.n_layers, "info": _plain(v.info), "influence": _digits(v.influence),
            "replacement": v.replacement, "completeness": v.completeness,
            "view_nodes": frame_to_json(_short(v.view_nodes)), "view_edges": frame_to_json(_short(v.view_edges)),
            "labels": [[lf[0], lf[1], t] for lf, t in sorted(v.labels.items())],
            "promoted": [[lf[0], lf[1], list(t)] for lf, t in sorted(v.promoted.items())]}


def graph_view_from_json(d: dict) -> GraphView:
    """The :class:`GraphView` :func:`graph_view_to_json` wrote."""
    return GraphView(settings=d["settings"], nodes=frame_from_json(d["nodes"]), tokens=[int(t) for t in d["tokens"]],
                     n_layers=int(d["n_layers"]), info=_number(d["info"]), influence=[float(x) for x in d["influence"]],
                     replacement=float(d["replacement"]), completeness=float(d["completeness"]),
                     view_nodes=frame_from_json(d["view_nodes"]), view_edges=frame_from_json(d["view_edges"]),
                     labels={(int(a), int(b)): str(t) for a, b, t in d["labels"]},
                     promoted={(int(a), int(b)): [str(x) for x in t] for a, b, t in d["promoted"]})


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


def graph_path_of(m) -> Optional[Path]:
    """Where :data:`GRAPH_FILE` lives for ``m``: its checkpoint's folder (None for a model without one)."""
    file = path_of(m)
    return None if file is None else file.with_name(GRAPH_FILE)


def write_graph_view(m, view: Optional[GraphView] = None, path: Optional[Path] = None) -> Optional[Path]:
    """Write ``view`` (default: :func:`graph_first_view` now) to ``path`` (default: beside the checkpoint), with the
    checkpoint's fingerprint and the sha256 of the transcoders it was computed over (:func:`graph_sources`); a
    checkpoint that ships no transcoders gets no file (None; an old one is removed)."""
    path = Path(path) if path is not None else graph_path_of(m)
    if path is None:
        raise FileNotFoundError(f"the model has no checkpoint folder to write {GRAPH_FILE} into: pass path=")
    view = graph_first_view(m) if view is None else view
    if view is None:
        path.unlink(missing_ok=True)
        return None
    data = {"format": GRAPH_FORMAT, "model": m.name or "", "fingerprint": fingerprint(m),
            "sources": graph_sources(m, view.settings["kind"]), "view": graph_view_to_json(view)}
    path.write_text(json.dumps(data, indent=None, separators=(",", ":"), allow_nan=False) + "\n", encoding="utf-8")
    return path


def read_graph_view(m, path: Optional[Path] = None) -> tuple[Optional[GraphView], str]:
    """(the first view in ``path`` (default: beside ``m``'s checkpoint), "") when it was computed for this very
    checkpoint (same fingerprint) over the transcoders shipped beside it now (same :func:`graph_sources`); else
    (None, why not). Whether it answers the page's question (text, prompt length, cap, kind) is
    :meth:`GraphView.answers`'."""
    path = Path(path) if path is not None else graph_path_of(m)
    if path is None or not path.is_file():
        return None, f"no {GRAPH_FILE} beside the checkpoint"
    try:
        data = read_json(path, GRAPH_FILE)
        if data.get("format") != GRAPH_FORMAT:
            return None, f"{path.name} is not a {GRAPH_FORMAT} file"
        bad = fingerprint_mismatch(fingerprint(m), data.get("fingerprint"))
        if bad:
            return None, f"{path.name} was computed for another checkpoint ({', '.join(bad)} differ)"
        view = graph_view_from_json(data["view"])
        if data.get("sources") != graph_sources(m, view.settings.get("kind")):
            return None, f"{path.name} was computed over other transcoders than those beside the checkpoint"
    except (SproutError, OSError, ValueError, KeyError, TypeError, IndexError) as err:
        return None, f"{path.name} cannot be read ({type(err).__name__}: {str(err)[:120]})"
    return view, ""


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
