"""Cached calls into sprout_interp: one place, keyed by the model's key (its name or path) and the text.

Every function takes the model as ``_m`` (Streamlit does not hash a leading-underscore argument) and
its key as ``key``, so results are cached per (model, text, options) and shared by every session:
they are pure functions of those, so one session never sees another's choices, only the same answer
to the same question. Nothing here does tensor maths; it calls the library.
"""
from __future__ import annotations

import threading

import precomputed
import state
import streamlit as st

from sprout_interp.behaviour import compare, per_token
from sprout_interp.behaviour.knockout import block_knockout
from sprout_interp.circuits import ablation, attention
from sprout_interp.core.errors import AblationError
from sprout_interp.core.texts import TEXTS
from sprout_interp.lens import residual
from sprout_interp.lens.logit_lens import embedding_echo_rate, logit_lens, trajectories

_CACHE = dict(max_entries=32, show_spinner=False)


def tokens(_m, text: str):
    """The text's token ids (1, pos), cut to the context (the page has said so already)."""
    return _m.to_tokens(text, truncate=True)


@st.cache_data(**_CACHE)
def str_tokens(_m, key: str, text: str) -> list[str]:
    """One label per token of the text: a character split over several tokens is shown whole on its first piece
    (the others '◌'), a lone piece as its bytes ``⟨0xE2⟩`` (``core.tokens.token_labels``): ``precomputed.text_labels``,
    which the graph page's shipped first view used too."""
    return precomputed.text_labels(_m, text)


#: where a text copies a name it repeats (the pages that open on it: attention, logit lens, attribution graph); its
#: home is ``precomputed``, whose graph first view opens on the same place
name_copy = precomputed.name_copy


# -- logit lens -------------------------------------------------------------------------------


@st.cache_data(**_CACHE)
def lens(_m, key: str, text: str, which: str = "logit"):
    """(LogitLens, summary table, cells table with token strings, embedding echo rate); ``which``: "logit" or
    "tuned" (a checkpoint without a tuned lens gives the logit lens, with ``LogitLens.notice`` set)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the page shows the notice itself
        ll = logit_lens(_m, tokens(_m, text), k=5, lens=which)
    return ll, ll.summary(), ll.cells(_m.to_str_tokens), embedding_echo_rate(ll)


@st.cache_data(**_CACHE)
def lens_three_texts(_m, key: str, which: str = "logit"):
    """Summary of the lens over the three ready-made texts together (how the chapter measured Sprout);
    text-independent: precomputed for a shipped checkpoint."""
    got = _shipped(_m, key)
    return got.lens[which].copy() if got is not None and which in got.lens else precomputed.lens_three_texts(_m, which)


@st.cache_data(**_CACHE)
def lens_trajectories(_m, key: str, text: str):
    """Per-token trajectories of the text through the logit and the tuned lens (one table, nats)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trajectories(_m, tokens(_m, text))


# -- residual stream --------------------------------------------------------------------------


@st.cache_data(**_CACHE)
def rms(_m, key: str, text: str, per_position: bool = False):
    return residual.residual_rms(_m, tokens(_m, text), per_position=per_position)


@st.cache_data(**_CACHE)
def knockout(_m, key: str, text: str):
    """What each block is worth on the text: the loss with it knocked out, one row per block."""
    return block_knockout(_m, tokens(_m, text))


# -- attention --------------------------------------------------------------------------------


@st.cache_data(max_entries=64, show_spinner=False)
def patterns(_m, key: str, text: str, layer: int):
    """Attention patterns (head, query, key) of one block (0-indexed) on the text."""
    return attention.attention_patterns(_m, tokens(_m, text), layers=[layer])[0]


@st.cache_data(max_entries=16, show_spinner=False)
def all_patterns(_m, key: str, text: str, start: int, n: int):
    """Attention patterns (layer, head, query, key) of every block on the text's tokens ``start`` … ``start + n - 1``
    (queries and keys; the model reads the text from its first token, so a query's weights on keys before the
    window are not drawn)."""
    return attention.attention_patterns(_m, tokens(_m, text)[:, :start + n])[:, :, start:, start:]


@st.cache_resource(max_entries=8, show_spinner=False)
def all_heads_chart(_m, key: str, text: str, start: int, n: int, framed: tuple | None):
    """The small multiples of every head on the text's tokens ``start`` … ``start + n - 1``, ``framed`` (layer, head)
    outlined (None: no frame); a click on a panel selects its invisible marker, whose customdata is ``[layer, head]``.
    Built once and shared (plotly takes a while to lay out dozens of panels): callers must not change it."""
    from sprout_interp.plots.heads import all_heads_figure
    from sprout_interp.plots.picking import clickable_panels

    fig = all_heads_figure(all_patterns(_m, key, text, start, n), str_tokens(_m, key, text)[start:start + n],
                           selected=framed, first=start)
    names = {f"block {l + 1} head {h}": (l, h) for l in range(_m.cfg.n_layers) for h in range(_m.cfg.n_heads)}
    panels = {i: names[tr.name] for i, tr in enumerate(fig.data) if tr.name in names}
    return clickable_panels(fig, panels, {i: f"block {l + 1} head {h} (layer {l}): click to draw it large below"
                                          for i, (l, h) in panels.items()}, name="choose this head")


@st.cache_data(**_CACHE)
def head_scores(_m, key: str, text: str):
    """Previous-token / duplicate / induction scores on repeated random tokens and on this text: ``head_scores``
    with its defaults, whose repeated random tokens (16 rows of 64, seed 0) are :func:`circuit_scores`' own, so
    their columns are taken from there (precomputed for a shipped checkpoint) and only the text is scored here."""
    random = circuit_scores(_m, key)
    df = attention.head_scores(_m, seq_len=2, batch=1, natural=tokens(_m, text), copying=False)  # the text's columns
    for col in [c for c in df.columns if c.endswith("_random")]:
        df[col] = random[col].to_numpy()
    df.attrs.update(seq_len=random.attrs["seq_len"], batch=random.attrs["batch"], seed=random.attrs["seed"])
    return df


@st.cache_data(**_CACHE)
def ov_copying(_m, key: str, ranks: bool):
    """Each head's full OV circuit: the eigenvalue copying score, and with ``ranks`` how often it promotes the
    token it reads (text-independent: the weights only; precomputed for a shipped checkpoint)."""
    got = _shipped(_m, key)
    return got.ov_copying(ranks) if got is not None else precomputed.ov_copying(_m, ranks)


# -- the induction circuit: every head a page names comes from here ------------------------------------
# The same call, with the same settings, as the claims scripts (precomputed.py holds the calls and the settings);
# for a checkpoint with a dashboard.json of its own fingerprint (the shipped ones: scripts/precompute_dashboard.py)
# the scores, the confirmed circuit and the copying sweep are read from it instead of computed.


@st.cache_resource(max_entries=8, show_spinner=False)
def shipped(_m, key: str):
    """(the answers precomputed beside the checkpoint, or None; why none): precomputed.read, once per model."""
    return precomputed.read(_m)


def _shipped(_m, key: str):
    return shipped(_m, key)[0]


@st.cache_data(**_CACHE)
def circuit_scores(_m, key: str):
    """Every head's previous-token / duplicate / induction scores as the claims scripts compute them: on repeated
    random tokens and on held-out text (the three ready-made texts where no corpus is installed); text-independent."""
    got = _shipped(_m, key)
    return got.scores.copy() if got is not None else precomputed.circuit_scores(_m)


@st.cache_data(**_CACHE)
def ranked_circuit(_m, key: str):
    """The induction circuit as :func:`circuit_scores` rank it (``find_induction_circuit``'s defaults; nothing
    ablated: quick enough for a page's first load)."""
    return precomputed.ranked_circuit(circuit_scores(_m, key))


@st.cache_resource(show_spinner=False)
def _confirmed_circuits() -> dict:
    """The circuits confirmed by ablation so far, by model key, shared by every session; with their locks."""
    return {"done": {}, "locks": {}, "lock": threading.Lock()}


def _once(store: dict, want, make):
    """``make()`` once per ``want`` for every session (two sessions asking at once wait for one), kept in ``store``
    (``done``, ``locks``, ``lock``); the oldest is forgotten past ``_CACHE``'s ``max_entries``."""
    with store["lock"]:
        lock = store["locks"].setdefault(want, threading.Lock())
    with lock:
        got = store["done"].get(want)
        if got is None:
            got = make()
            with store["lock"]:
                while len(store["done"]) >= _CACHE["max_entries"]:
                    store["done"].pop(next(iter(store["done"])))
                store["done"][want] = got
    return got


def confirm_circuit(_m, key: str):
    """The induction circuit found and confirmed by mean ablation exactly as the claims scripts do it (each
    candidate head alone, then together; dozens of forwards, so only when asked), computed once per model for
    every session; from then on :func:`induction_circuit` returns it on every page."""

    def make():
        got = _shipped(_m, key)
        return got.confirmed if got is not None else precomputed.confirmed_circuit(_m, circuit_scores(_m, key))

    return _once(_confirmed_circuits(), key, make)


def induction_circuit(_m, key: str):
    """The one induction circuit every page names: confirmed by ablation once any session has asked
    (:func:`confirm_circuit`), else as the head scores rank it (:func:`ranked_circuit`). Not to be changed."""
    done = _confirmed_circuits()["done"].get(key)
    return done if done is not None else ranked_circuit(_m, key)


def induction_head(circ) -> tuple[int, int] | None:
    """The circuit's induction head (layer, head), or None when the finder found none: its best induction score
    is below the finder's own threshold (one block cannot make one: gpt-1)."""
    return (circ.induction_layer, circ.induction_head) if circ.induction_score >= circ.threshold else None


def circuit_heads(circ) -> list[tuple[int, int]]:
    """The heads a page names as the circuit, 0-indexed: the circuit's heads when the finder found it, else its
    induction head alone when one passes the threshold, else none."""
    if circ.found:
        return list(circ.heads())
    ind = induction_head(circ)
    return [ind] if ind is not None else []


@st.cache_resource(show_spinner=False)
def _copying_sweeps() -> dict:
    """The copying sweeps computed so far, by (model key, options), shared by every session; with their locks.
    (Not st.cache_data: a sweep must be able to draw its progress bar, which a cached function cannot.)"""
    return {"done": {}, "locks": {}, "lock": threading.Lock()}


def copying_sweep(_m, key: str, kind: str = "zero", seq_len: int = 64, batch: int = 16, seed: int = 0,
                  progress=None):
    """Each head's part in in-context copying: the copying ratio (loss on copy 2 / copy 1) with that head
    ablated alone, on ``batch`` rows of ``seq_len`` random tokens repeated twice; the exact fast sweep
    (one forward per group of heads from their block on, not one full forward per head). Computed once per
    model and options for every session (two sessions asking at once wait for one sweep); ``progress(done,
    total)`` is called as the heads are measured, only when it is computed (not when read from the shipped
    answers, :func:`shipped`, which hold the default options')."""
    want = dict(kind=kind, seq_len=seq_len, batch=batch, seed=seed)

    def make():
        got = _shipped(_m, key)
        if got is not None and want == precomputed.SWEEP:
            return got.sweep
        return precomputed.copying_sweep(_m, progress=progress, **want)

    return _once(_copying_sweeps(), (key, kind, seq_len, batch, seed), make).copy()


@st.cache_data(**_CACHE)
def repeated_tokens(_m, key: str, seq_len: int, seed: int):
    """One row of random tokens repeated twice, and its token strings."""
    from sprout_model.evaluation import repeated_tokens_batch

    toks = repeated_tokens_batch(_m.cfg.d_vocab, seq_len, 1, seed)
    strs = _m.to_str_tokens(toks[0]) if _m.tokenizer is not None else [f"#{i}" for i in toks[0].tolist()]
    return toks, list(strs)


@st.cache_data(max_entries=64, show_spinner=False)
def repeated_patterns(_m, key: str, seq_len: int, seed: int, layer: int):
    toks, _ = repeated_tokens(_m, key, seq_len, seed)
    return attention.attention_patterns(_m, toks, layers=[layer])[0]


@st.cache_data(**_CACHE)
def copying_ratio(_m, key: str, seq_len: int, seed: int):
    """(first-copy loss, second-copy loss, ratio) on 16 rows of repeated random tokens."""
    from sprout_model.evaluation import repeated_tokens_loss_ratio

    return tuple(repeated_tokens_loss_ratio(_m.model, seq_len=seq_len, batch=16, seed=seed))


@st.cache_data(**_CACHE)
def head_qk(_m, key: str, text: str, layer: int, head: int):
    """((the head's own queries, keys) before RoPE, its scores by distance, its score grid) on the text."""
    from sprout_interp.anatomy import rope

    toks = tokens(_m, text)
    grid = rope.head_score_grid(_m, toks, layer, head)
    return rope.head_qk(_m, toks, layer, head), rope.scores_by_distance(_m, toks, layer, head, grid=grid), grid


# -- ablations --------------------------------------------------------------------------------


@st.cache_data(**_CACHE)
def mean_reference(_m, key: str):
    """Per-head mean outputs for mean ablation, and where they came from."""
    try:
        return ablation.head_means(_m), "held-out text (16 windows of 256 tokens)"
    except AblationError:  # no corpus installed: the three ready-made texts instead
        return ablation.head_means(_m, list(TEXTS.values())), "the three ready-made texts (the corpus is not installed)"


@st.cache_data(**_CACHE)
def resample_reference(_m, key: str, length: int):
    """One held-out window at least as long as the text, to resample each head's output from."""
    return ablation.default_reference(_m, n=1, length=length), "one window of held-out text"


def reference(_m, key: str, kind: str, length: int):
    """(reference, where it came from) for an ablation kind."""
    if kind == "mean":
        return mean_reference(_m, key)
    if kind == "resample":
        return resample_reference(_m, key, length)
    return None, ""


@st.cache_data(**_CACHE)
def ablation_effect(_m, key: str, text: str, heads: tuple, kind: str):
    toks = tokens(_m, text)
    ref, _ = reference(_m, key, kind, toks.shape[1])
    return per_token.ablation_effect(_m, toks, list(heads), kind=kind, reference=ref)


@st.cache_data(**_CACHE)
def sweep(_m, key: str, text: str, kind: str):
    toks = tokens(_m, text)
    ref, _ = reference(_m, key, kind, toks.shape[1])
    return ablation.ablation_sweep(_m, toks, metric="loss", kind=kind, reference=ref)


# -- comparing models -------------------------------------------------------------------------


def _models(keys: tuple) -> dict:
    return {k: state.load_model(k) for k in keys}


@st.cache_data(**_CACHE)
def compare_models(keys: tuple, text: str):
    models = _models(keys)
    ref = next(iter(models.values()))
    if not _fits(ref, text):  # longer than the context: compare on the part the models read
        text = ref.to_string(ref.to_tokens(text, truncate=True)[0])
    return compare.compare_models(models, text)


def _fits(m, text: str) -> bool:
    try:
        m.to_tokens(text)
        return True
    except Exception:
        return False


@st.cache_data(**_CACHE)
def name_copying(keys: tuple):
    return compare.name_copying_table(_models(keys))


# -- patching / circuits ---------------------------------------------------------------------


@st.cache_data(**_CACHE)
def patching(_m, key: str, clean: str, corrupted: str, answer: str, wrong: str, site: str, by: str,
             method: str = "exact"):
    """``activation_patch`` (``method="exact"``) or ``attribution_patch`` (``"attribution"``) of clean into corrupted
    with the logit difference answer - wrong at the last position (the page's default pair, exact: precomputed for a
    shipped checkpoint)."""
    got = _shipped(_m, key)
    args = (clean, corrupted, answer, wrong, site, by, method)
    done = got.patching(*args) if got is not None else None
    return done if done is not None else precomputed.patching(_m, *args)


@st.cache_data(**_CACHE)
def patching_agreement(_m, key: str, clean: str, corrupted: str, answer: str, wrong: str, site: str, by: str):
    """Exact patching beside attribution patching of the same pair, site and split."""
    from sprout_interp import patching as P

    args = (_m, key, clean, corrupted, answer, wrong, site, by)
    return P.patching_agreement(patching(*args), patching(*args, method="attribution"))


@st.cache_data(**_CACHE)
def graph(_m, key: str, text: str, pos: int, threshold: float):
    """(nodes, edges) of the contribution graph of the model's own prediction at ``pos``."""
    from sprout_interp.circuits.attribution import contribution_graph

    return contribution_graph(_m, text, pos=pos, threshold=threshold)


@st.cache_data(**_CACHE)
def head_effects(_m, key: str, text: str, layer: int, head: int, pos: int):
    """(promoted/suppressed tokens of one head at ``pos``, that head's attention row at ``pos``)."""
    from sprout_interp.circuits.attribution import head_token_effects

    eff = head_token_effects(_m, text, layer, head, pos=pos, k=8)
    return eff, attention.attention_row(_m, tokens(_m, text), layer, head, pos)


# -- steering ---------------------------------------------------------------------------------


def _logit_diff(_m, answer: str, wrong: str):
    from sprout_interp.circuits.metrics import LogitDiff
    from sprout_interp.core.tokens import token_id

    return LogitDiff(token_id(_m, answer), token_id(_m, wrong))


@st.cache_data(**_CACHE)
def steering_layers(_m, key: str, positive: tuple, negative: tuple, prompt: str, answer: str, wrong: str,
                    coeff: float):
    """``steering_layers`` of the contrast on the prompt, the metric logit[answer] - logit[wrong] at its end."""
    from sprout_interp.behaviour import steering

    return steering.steering_layers(_m, list(positive), list(negative), prompt, coeff=coeff,
                                    metric=_logit_diff(_m, answer, wrong))


@st.cache_data(**_CACHE)
def steering_vector(_m, key: str, positive: tuple, negative: tuple, layer: int):
    """The contrast's vector entering block ``layer``: shared by the coefficient sweep and the continuations."""
    from sprout_interp.behaviour import steering

    return steering.steering_vector(_m, list(positive), list(negative), layer)


@st.cache_data(**_CACHE)
def steering_effect(_m, key: str, positive: tuple, negative: tuple, prompt: str, answer: str, wrong: str,
                    layer: int, coeffs: tuple, text: str):
    """(the logit difference on the prompt, the loss on ``text``), each by coefficient, steered at ``layer``."""
    from sprout_interp.behaviour import steering

    v = steering_vector(_m, key, positive, negative, layer)
    effect = steering.steering_effect(_m, prompt, v, layer, coeffs, _logit_diff(_m, answer, wrong))
    loss = steering.steering_effect(_m, tokens(_m, text), v, layer, coeffs, "loss")
    return effect, loss


@st.cache_data(**_CACHE)
def steered_generations(_m, key: str, positive: tuple, negative: tuple, prompt: str, layer: int, coeffs: tuple):
    """The prompt's continuation under each coefficient, one seed for all."""
    from sprout_interp.behaviour import steering

    v = steering_vector(_m, key, positive, negative, layer)
    return steering.steered_generations(_m, prompt, v, layer, coeffs, max_new_tokens=20, seed=0)


# -- features (sparse autoencoders) ---------------------------------------------------------


@st.cache_data(**_CACHE)
def sae_layers(_m, key: str) -> list[int]:
    """The layers (0-indexed) with an SAE saved beside the checkpoint."""
    from sprout_interp.features.sae import available_saes

    return available_saes(_m)


@st.cache_resource(max_entries=8, show_spinner=False)
def sae(_m, key: str, layer: int):
    """The SAE of ``layer`` (SAEMismatchError when the saved one belongs to another checkpoint)."""
    from sprout_interp.features.sae import load_sae

    return load_sae(_m, layer)


@st.cache_resource(max_entries=8, show_spinner=False)
def feature_index(_m, key: str, layer: int):
    """Every held-out token's active latents (96 windows of 128 tokens), shared by every feature page of the layer."""
    from sprout_interp.features.pages import index_features

    return index_features(_m, sae(_m, key, layer))


@st.cache_data(max_entries=256, show_spinner=False)
def feature_page(_m, key: str, layer: int, feature: int):
    """One latent's page (FeatureSummary) on the held-out sample (the one the page opens on: precomputed for a
    shipped checkpoint's SAEs)."""
    from sprout_interp.features.pages import feature_summary

    got = _shipped(_m, key)
    done = got.feature_page(layer, feature) if got is not None else None
    if done is not None:
        return done
    return feature_summary(_m, sae(_m, key, layer), feature, feature_index(_m, key, layer))


@st.cache_data(**_CACHE)
def features_for_token(_m, key: str, layer: int, token: str):
    """The latents firing most on a token (a string that is one token) in the held-out sample."""
    from sprout_interp.features.pages import features_for_token as search

    return search(feature_index(_m, key, layer), token, n=15, model=_m)


@st.cache_data(**_CACHE)
def text_features(_m, key: str, text: str, layer: int):
    """(cells, by_feature): which latents fire where on the text (cut to the context, with a notice)."""
    import warnings

    from sprout_interp.features.pages import features_on_text

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the page shows the notice itself
        return features_on_text(_m, sae(_m, key, layer), text)


@st.cache_data(max_entries=256, show_spinner=False)
def feature_descriptions(_m, key: str, layer: int, features: tuple) -> dict:
    """{feature: its automatic description} for a few latents (their pages built together: one check of the SAE;
    every latent's is precomputed for a shipped checkpoint's SAEs)."""
    got = _shipped(_m, key)
    done = got.descriptions_of(layer, features) if got is not None else None
    if done is not None:
        return done
    return precomputed.feature_descriptions(_m, sae(_m, key, layer), features, feature_index(_m, key, layer))


# -- neurons ----------------------------------------------------------------------------------


@st.cache_resource(max_entries=4, show_spinner=False)
def neuron_index(_m, key: str, layer: int):
    """One layer's neuron activations at every held-out token (96 windows of 128 tokens), shared by its pages."""
    from sprout_interp.features.neurons import index_neurons

    return index_neurons(_m, layer)


@st.cache_data(max_entries=256, show_spinner=False)
def neuron_page(_m, key: str, layer: int, neuron: int):
    """One neuron's page (NeuronSummary) on the held-out sample."""
    from sprout_interp.features.neurons import neuron_summary

    return neuron_summary(_m, layer, neuron, neuron_index(_m, key, layer))


@st.cache_data(**_CACHE)
def neuron_table(_m, key: str, layer: int):
    """Every neuron of the layer: its statistics on the held-out sample."""
    from sprout_interp.features.neurons import neuron_table as table

    return table(neuron_index(_m, key, layer))


@st.cache_data(**_CACHE)
def neurons_for_token(_m, key: str, layer: int, token: str):
    """The neurons most selective for a token (a string that is one token) in the held-out sample."""
    from sprout_interp.features.neurons import neurons_for_token as search

    return search(neuron_index(_m, key, layer), token, n=15, model=_m)


@st.cache_data(**_CACHE)
def top_prediction(_m, key: str, text: str, pos: int) -> str:
    """The model's most likely next token at ``pos`` of the text."""
    return _m.to_string([int(_m(tokens(_m, text))[0, pos].argmax())])


@st.cache_data(**_CACHE)
def neuron_attribution(_m, key: str, text: str, pos: int, answer: str, wrong: str, top: int = 20):
    """The ``top`` neurons by direct effect on ``logit[answer] - logit[wrong]`` (``wrong`` "" = the logit alone)."""
    from sprout_interp.features.neurons import neuron_attribution as attribution

    return attribution(_m, tokens(_m, text), answer, wrong or None, pos=pos, top=top)


@st.cache_data(**_CACHE)
def neuron_on_text(_m, key: str, text: str, layer: int, neuron: int):
    """One neuron's activation at every token of the text."""
    from sprout_interp.features.neurons import neuron_on_text as on_text

    return on_text(_m, tokens(_m, text), layer, neuron)


@st.cache_data(**_CACHE)
def neuron_ablation(_m, key: str, text: str, layer: int, neuron: int, kind: str, pos: int, answer: str, wrong: str):
    """(the loss on the text, the logit difference at ``pos``), each with the neuron ablated beside clean (one
    table each; both read from the same clean and ablated forwards)."""
    from sprout_interp.circuits.metrics import LogitDiff, LogProb
    from sprout_interp.core.tokens import token_id
    from sprout_interp.features.neurons import ablate_neurons

    a = token_id(_m, answer)
    metric = LogitDiff(a, token_id(_m, wrong), pos=pos) if wrong else LogProb(a, pos=pos)
    both = ablate_neurons(_m, tokens(_m, text), [(layer, neuron)], kind=kind, metric=["loss", metric])
    return both.iloc[[0]].reset_index(drop=True), both.iloc[[1]].reset_index(drop=True)
