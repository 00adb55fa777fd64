"""Hostile library arguments: every bad index, count, number, token id, input form or metric value is refused
with a SproutError subclass whose message names the argument, and nothing is silently converted (a bool is
not layer 1, 0.5 is not layer 0, "0" is not a layer, -1 is not the last token id).

Run as a script (``python tests/core/test_hostile_arguments.py``) it prints what each case does on the code as it
is: the error class raised, or "ran".
"""
from __future__ import annotations

import math
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conftest import tiny_config  # noqa: E402

import sprout_interp as si  # noqa: E402
from sprout_interp.circuits.attention import attention_row  # noqa: E402
from sprout_interp.circuits.composition import random_baseline  # noqa: E402
from sprout_interp.circuits.graph_interventions import ablation_prediction  # noqa: E402
from sprout_interp.circuits.graphs import graph_scores, node_influence, prune_graph, save_graph  # noqa: E402
from sprout_interp.circuits.metrics import LogitDiff, LogProb, TargetLogProb  # noqa: E402
from sprout_interp.circuits.patching import activation_patch, path_patch  # noqa: E402
from sprout_interp.core.fingerprints import fingerprint  # noqa: E402
from sprout_interp.features.metrics import feature_density, held_out_tokens, sae_quality  # noqa: E402
from sprout_interp.features.neurons import index_neurons, neurons_for_token  # noqa: E402
from sprout_interp.features.pages import features_for_token, index_features, transcoder_promoted  # noqa: E402
from sprout_interp.features.sae import SparseAutoencoder  # noqa: E402
from sprout_interp.features.train import train_sae  # noqa: E402
from sprout_interp.features.transcoder import Transcoder  # noqa: E402
from sprout_interp.features.transcoder_metrics import transcoder_quality  # noqa: E402
from sprout_model import GPT  # noqa: E402
from sprout_model.tokenizer import train_tokenizer  # noqa: E402

pytestmark = [pytest.mark.unit, pytest.mark.unchecked_types]  # the inputs are wrong on purpose: the library's own messages are checked

TEXT = "the cat sat on the mat and the dog ran"
CLEAN, CORRUPT = "the cat sat on the mat", "the dog sat on the mat"
V = 300  # the tiny model's vocabulary


def build_model() -> si.HookedSprout:
    """A 3-block, 2-head model with a 300-token tokenizer (context 32)."""
    tok = train_tokenizer(["the cat sat on the mat and the dog ran to a red ball while a bird sang in the tree"] * 20,
                          vocab_size=V)
    torch.manual_seed(0)
    return si.HookedSprout(GPT(tiny_config(vocab_size=V, n_layer=3)).eval(), tokenizer=tok, name="tiny-300")


@pytest.fixture(scope="module")
def model() -> si.HookedSprout:
    return build_model()


def _sweep(metric=None, **kw):
    """An ablation sweep; ``metric`` is a function making the metric, so a refused constructor is part of the call."""
    return lambda m: si.ablation_sweep(m, TEXT, **({} if metric is None else {"metric": metric()}), **kw)


def _metric_returning(value):
    """A function metric that returns ``value`` (or ``value(logits)``), wrapped so :func:`_sweep` can make it."""
    return lambda: (lambda logits: value(logits) if callable(value) else value)


def _patch(metric):
    return lambda m: activation_patch(m, CLEAN, CORRUPT, metric(), site="resid_pre", by="layer")


def _steer(metric):
    return lambda m: si.steering_effect(m, TEXT, torch.zeros(m.cfg.d_model), 0, coeffs=[1.0], metric=metric())


def _generate(**kw):
    return lambda m: m.generate("the cat", seed=0, **kw)


def _coeffs(coeffs):
    return lambda m: si.steering_effect(m, TEXT, torch.ones(m.cfg.d_model), 0, coeffs=coeffs)


def _tuned(**kw):
    kw = {"tokens": torch.tensor([[1, 2, 3, 4]]), "steps": 1, "progress": False, **kw}
    return lambda m: si.train_tuned_lens(m, **kw)


def _sae(m) -> SparseAutoencoder:
    return SparseAutoencoder(m.cfg.d_model, 8, 2, "blocks.0.hook_resid_post", info={"fingerprint": fingerprint(m)})


def _transcoders(m) -> dict:
    return {0: Transcoder(m.cfg.d_model, 8, 2, 0, info={"fingerprint": fingerprint(m)})}


def _train_sae(**kw):
    kw = {"acts": torch.randn(64, 16, generator=torch.Generator().manual_seed(0)), "d_sae": 32, "k": 4,
          "batch_size": 16, "epochs": 1, "progress": False, **kw}
    return lambda m: train_sae(m, 0, **kw)


def _sae_quality(**kw):
    return lambda m: sae_quality(m, _sae(m), **kw)


# (id, call, the SproutError subclass, a regex the message must hold: the argument's name)
CASES = [
    # layer / head / position indices
    ("ablate-layer-bool", lambda m: si.ablate(m, TEXT, [(True, 0)]), si.AblationError, r"layer"),
    ("ablate-layer-float", lambda m: si.ablate(m, TEXT, [(0.5, 0)]), si.AblationError, r"layer"),
    ("ablate-layer-str", lambda m: si.ablate(m, TEXT, [("0", 0)]), si.AblationError, r"layer"),
    ("ablate-head-bool", lambda m: si.ablate(m, TEXT, [(0, True)]), si.AblationError, r"head"),
    ("sweep-heads-float", _sweep(heads=[(1.0, 0)]), si.AblationError, r"layer"),
    ("attention-layers-str", lambda m: si.attention_patterns(m, TEXT, layers=["0"]), si.AblationError, r"layers"),
    ("attention-layers-bool", lambda m: si.attention_patterns(m, TEXT, layers=[True]), si.AblationError, r"layers"),
    ("attention-row-head-float", lambda m: attention_row(m, TEXT, 0, 0.5), si.AblationError, r"head"),
    ("attention-row-pos-bool", lambda m: attention_row(m, TEXT, 0, 0, pos=True), si.AblationError, r"pos"),
    ("path-senders-bool", lambda m: path_patch(m, CLEAN, CORRUPT, LogitDiff(1, 2), receivers=[(2, 0, "k")],
                                               senders=[(True, 0)]), si.PatchingError, r"sender"),
    ("path-receivers-float", lambda m: path_patch(m, CLEAN, CORRUPT, LogitDiff(1, 2), receivers=[(2, 0.0, "k")]),
     si.PatchingError, r"receiver"),
    ("knockout-groups-bool", lambda m: si.block_knockout(m, TEXT, groups=[True]), si.AblationError, r"group"),
    ("forward-stop-bool", lambda m: m(TEXT, stop_at_layer=True), si.ArgumentError, r"stop_at_layer"),
    ("dla-pos-float", lambda m: si.direct_logit_attribution(m, TEXT, answer=5, pos=1.5), si.ArgumentError, r"pos"),
    ("dla-pos-bool", lambda m: si.direct_logit_attribution(m, TEXT, answer=5, pos=True), si.ArgumentError, r"pos"),
    ("dla-answer-float", lambda m: si.direct_logit_attribution(m, TEXT, answer=5.0), si.ArgumentError, r"answer"),
    ("logitdiff-pos-bool", _sweep(metric=lambda: LogitDiff(1, 2, pos=True)), si.MetricError, r"pos"),
    ("targetlogprob-pos-float", _sweep(metric=lambda: TargetLogProb([0.5], [1])), si.MetricError, r"positions"),
    # token ids
    ("logitdiff-answer-negative", _sweep(metric=lambda: LogitDiff(-1, 2)), si.MetricError, r"answer"),
    ("logitdiff-wrong-past-vocab", _sweep(metric=lambda: LogitDiff(1, V)), si.MetricError, r"wrong"),
    ("logitdiff-answer-bool", _sweep(metric=lambda: LogitDiff(True, 2)), si.MetricError, r"answer"),
    ("logprob-target-negative", _sweep(metric=lambda: LogProb(-1)), si.MetricError, r"target"),
    ("targetlogprob-targets-negative", _sweep(metric=lambda: TargetLogProb([1], [-1])), si.MetricError, r"targets"),
    ("patch-logitdiff-negative", _patch(lambda: LogitDiff(-1, 2)), si.PatchingError, r"answer"),
    ("to-string-past-vocab", lambda m: m.to_string([V + 5]), si.VocabularyMismatchError, r"tokens"),
    ("to-string-negative", lambda m: m.to_string([-1]), si.VocabularyMismatchError, r"tokens"),
    ("to-string-float", lambda m: m.to_string([1.5]), si.ArgumentError, r"tokens"),
    ("to-str-tokens-past-vocab", lambda m: m.to_str_tokens([V]), si.VocabularyMismatchError, r"input"),
    ("residual-direction-negative", lambda m: m.tokens_to_residual_directions(-1), si.VocabularyMismatchError,
     r"tokens"),
    # what a metric returns
    ("sweep-metric-nan", _sweep(metric=_metric_returning(float("nan"))), si.MetricError, r"nan"),
    ("sweep-metric-inf", _sweep(metric=_metric_returning(float("inf"))), si.MetricError, r"inf"),
    ("sweep-metric-vector", _sweep(metric=_metric_returning(lambda lg: lg[0, -1])), si.MetricError, r"shape"),
    ("sweep-metric-str", _sweep(metric=_metric_returning("abc")), si.MetricError, r"str"),
    ("sweep-metric-none", _sweep(metric=_metric_returning(None)), si.MetricError, r"None"),
    ("sweep-naive-metric-nan", _sweep(metric=_metric_returning(float("nan")), method="naive"), si.MetricError, r"nan"),
    ("patch-metric-nan", _patch(_metric_returning(float("nan"))), si.PatchingError, r"nan"),
    ("patch-metric-vector", _patch(_metric_returning(lambda lg: lg[0, -1])), si.PatchingError, r"shape"),
    ("steer-metric-none", _steer(_metric_returning(None)), si.MetricError, r"None"),
    ("steer-metric-inf", _steer(_metric_returning(lambda lg: lg.sum() * math.inf)), si.MetricError, r"inf"),
    # counts
    ("logit-lens-k-0", lambda m: si.logit_lens(m, TEXT, k=0), si.ArgumentError, r"\bk\b"),
    ("logit-lens-k-bool", lambda m: si.logit_lens(m, TEXT, k=True), si.ArgumentError, r"\bk\b"),
    ("logit-lens-chunk-0", lambda m: si.logit_lens(m, TEXT, chunk=0), si.ArgumentError, r"chunk"),
    ("trajectories-k-0", lambda m: si.trajectories(m, TEXT, lenses=["logit"], k=0), si.ArgumentError, r"\bk\b"),
    ("head-scores-seq-len-negative", lambda m: si.head_scores(m, seq_len=-3, natural=False, copying=False),
     si.AblationError, r"seq_len"),
    ("head-scores-batch-0", lambda m: si.head_scores(m, seq_len=4, batch=0, natural=False, copying=False),
     si.AblationError, r"batch"),
    ("sweep-heads-per-batch-0", _sweep(heads_per_batch=0), si.AblationError, r"heads_per_batch"),
    ("sweep-heads-per-batch-float", _sweep(heads_per_batch=1.5), si.AblationError, r"heads_per_batch"),
    ("cache-pos-slice-999", lambda m: m.run_with_cache(TEXT, pos_slice=999), si.ArgumentError, r"pos_slice"),
    ("cache-pos-slice-bool", lambda m: m.run_with_cache(TEXT, pos_slice=True), si.ArgumentError, r"pos_slice"),
    ("cache-pos-slice-float", lambda m: m.run_with_cache(TEXT, pos_slice=1.5), si.ArgumentError, r"pos_slice"),
    # input forms
    ("cache-input-none", lambda m: m.run_with_cache(None), si.ArgumentError, r"input"),
    ("cache-input-bytes", lambda m: m.run_with_cache(b"abc"), si.ArgumentError, r"input"),
    ("cache-input-dict", lambda m: m.run_with_cache({"a": 1}), si.ArgumentError, r"input"),
    ("cache-input-mixed-list", lambda m: m.run_with_cache(["a", 1]), si.ArgumentError, r"input"),
    ("cache-input-ragged", lambda m: m.run_with_cache([[1, 2], [3]]), si.ArgumentError, r"input"),
    ("forward-input-floats", lambda m: m([1.0, 2.0]), si.ArgumentError, r"input"),
    # generation
    ("generate-temperature-negative", _generate(temperature=-1.0), si.ArgumentError, r"temperature"),
    ("generate-temperature-nan", _generate(temperature=float("nan")), si.ArgumentError, r"temperature"),
    ("generate-temperature-inf", _generate(temperature=float("inf")), si.ArgumentError, r"temperature"),
    ("generate-top-k-0", _generate(top_k=0), si.ArgumentError, r"top_k"),
    ("generate-top-k-float", _generate(top_k=1.5), si.ArgumentError, r"top_k"),
    ("generate-top-k-bool", _generate(top_k=True), si.ArgumentError, r"top_k"),
    ("generate-top-k-past-vocab", _generate(top_k=V + 1), si.ArgumentError, r"top_k"),
    ("generate-top-p-0", _generate(top_p=0.0), si.ArgumentError, r"top_p"),
    ("generate-top-p-1.5", _generate(top_p=1.5), si.ArgumentError, r"top_p"),
    ("generate-top-p-nan", _generate(top_p=float("nan")), si.ArgumentError, r"top_p"),
    ("generate-max-new-1e9", _generate(max_new_tokens=10**9, stop_at_eot=False), si.ArgumentError, r"max_new_tokens"),
    ("generate-max-new-negative", _generate(max_new_tokens=-1), si.ArgumentError, r"max_new_tokens"),
    ("generate-max-new-bool", _generate(max_new_tokens=True), si.ArgumentError, r"max_new_tokens"),
    # a sequence of numbers: a string is not one ("12" ran with coefficients [1, 2])
    ("steer-coeffs-str", _coeffs("12"), si.SteeringError, r"coeffs='12' \(a str\) is not a list of numbers"),
    ("steer-coeffs-bytes", _coeffs(b"12"), si.SteeringError, r"coeffs=b'12'"),
    ("steer-coeffs-bool", _coeffs([True]), si.SteeringError, r"coeffs\[0\]=True \(a bool\)"),
    ("steer-coeffs-str-in-list", _coeffs([1.0, "2"]), si.SteeringError, r"coeffs\[1\]='2'"),
    ("steer-coeffs-nan", _coeffs([float("nan")]), si.SteeringError, r"coeffs\[0\]=nan is not finite"),
    ("steer-coeffs-empty", _coeffs([]), si.SteeringError, r"coeffs is empty"),
    ("steer-coeffs-set", _coeffs({1.0, 2.0}), si.SteeringError, r"coeffs=.*not a list of numbers"),
    ("steer-coeffs-dict", _coeffs({1: 2}), si.SteeringError, r"coeffs=.*not a list of numbers"),
    ("steer-coeffs-2d", _coeffs(torch.ones(2, 2)), si.SteeringError, r"coeffs=.*not a list of numbers"),
    ("steer-layers-coeff-str", lambda m: si.steering_layers(m, ["the cat"], ["the dog"], TEXT, coeff="4"),
     si.SteeringError, r"coeff='4' \(a str\) is not a number"),
    ("steer-controls-coeff-list", lambda m: si.steering_controls(m, TEXT, torch.ones(m.cfg.d_model), 0, coeff=[4]),
     si.SteeringError, r"coeff=\[4\]"),
    ("steer-controls-seed-str", lambda m: si.steering_controls(m, TEXT, torch.ones(m.cfg.d_model), 0, seed="1"),
     si.SteeringError, r"seed='1'"),
    ("steered-generations-coeffs-str", lambda m: si.steered_generations(m, "the cat", torch.ones(m.cfg.d_model), 0,
                                                                        coeffs="-4"), si.SteeringError, r"coeffs='-4'"),
    # steps, samples, n: a count of nothing gives no answer (an untrained lens, NaN columns, a division by zero)
    ("tuned-lens-steps-negative", _tuned(steps=-1), si.ArgumentError, r"steps=-1 is out of range: steps is at least 1"),
    ("tuned-lens-steps-0", _tuned(steps=0), si.ArgumentError, r"steps=0"),
    ("tuned-lens-steps-float", _tuned(steps=2.5), si.ArgumentError, r"steps=2.5 \(a float\)"),
    ("tuned-lens-batch-0", _tuned(batch=0), si.ArgumentError, r"batch=0"),
    ("tuned-lens-lr-0", _tuned(lr=0.0), si.ArgumentError, r"lr=0.0 is out of range"),
    ("tuned-lens-lr-nan", _tuned(lr=float("nan")), si.ArgumentError, r"lr=nan"),
    ("tuned-lens-momentum-1", _tuned(momentum=1.0), si.ArgumentError, r"momentum=1.0"),
    ("tuned-lens-weight-decay-negative", _tuned(weight_decay=-1.0), si.ArgumentError, r"weight_decay=-1.0"),
    ("tuned-lens-optimizer", _tuned(optimizer="lbfgs"), si.ArgumentError, r"optimizer"),
    ("tuned-lens-tokens-empty", _tuned(tokens=torch.zeros(0, 4, dtype=torch.long)), si.ArgumentError,
     r"tokens holds no windows"),
    ("tuned-lens-tokens-past-vocab", _tuned(tokens=torch.full((1, 4), V)), si.VocabularyMismatchError, r"token id 300"),
    ("tuned-lens-val-unequal", _tuned(val_tokens=["the cat sat", "the"]), si.UnequalLengthsError, r"val_tokens"),
    ("composition-samples-0", lambda m: si.composition_table(m, samples=0), si.ArgumentError,
     r"samples=0 is out of range: samples is 1\.\.4096"),
    ("composition-samples-negative", lambda m: si.composition_table(m, samples=-1), si.ArgumentError, r"samples=-1"),
    ("composition-samples-float", lambda m: si.composition_table(m, samples=1.5), si.ArgumentError, r"samples=1.5"),
    ("composition-samples-huge", lambda m: si.composition_table(m, samples=10**9), si.ArgumentError, r"samples"),
    ("composition-modes-empty", lambda m: si.composition_table(m, modes=[]), si.ArgumentError, r"modes"),
    ("composition-modes-unknown", lambda m: si.composition_table(m, modes="QK"), si.ArgumentError, r"mode"),
    ("baseline-samples-0", lambda m: random_baseline(m, "K", samples=0), si.ArgumentError, r"samples=0"),
    ("baseline-seed-float", lambda m: random_baseline(m, "K", seed=0.5), si.ArgumentError, r"seed=0.5"),
    ("sae-quality-n-0", _sae_quality(n=0), si.ArgumentError, r"\bn=0 is out of range"),
    ("sae-quality-n-negative", _sae_quality(n=-3), si.ArgumentError, r"\bn=-3"),
    ("sae-quality-length-1", _sae_quality(length=1), si.ArgumentError, r"length=1 is out of range: length is at least 2"),
    ("sae-quality-batch-0", _sae_quality(batch=0), si.ArgumentError, r"batch=0"),
    ("sae-quality-dense-threshold-2", _sae_quality(dense_threshold=2.0), si.ArgumentError, r"dense_threshold=2.0"),
    ("sae-quality-one-token", _sae_quality(tokens="the"), si.ArgumentError, r"tokens holds 1 token"),
    ("feature-density-batch-0", lambda m: feature_density(m, _sae(m), TEXT, batch=0), si.ArgumentError, r"batch=0"),
    ("held-out-n-0", lambda m: held_out_tokens(m, n=0), si.ArgumentError, r"\bn=0"),
    ("held-out-seed-negative", lambda m: held_out_tokens(m, seed=-1), si.ArgumentError, r"seed=-1"),
    ("transcoder-quality-batch-0", lambda m: transcoder_quality(m, _transcoders(m), TEXT, batch=0), si.ArgumentError,
     r"batch=0"),
    ("transcoder-quality-one-token", lambda m: transcoder_quality(m, _transcoders(m), "the"), si.ArgumentError,
     r"tokens holds 1 token"),
    ("features-for-token-n-0", lambda m: features_for_token(index_features(m, _sae(m), TEXT), 5, n=0), si.ArgumentError,
     r"\bn=0"),
    ("features-for-token-n-float", lambda m: features_for_token(index_features(m, _sae(m), TEXT), 5, n=1.5),
     si.ArgumentError, r"\bn=1.5"),
    ("neurons-for-token-n-negative", lambda m: neurons_for_token(index_neurons(m, 0, TEXT), 5, n=-1), si.ArgumentError,
     r"\bn=-1"),
    ("transcoder-promoted-n-0", lambda m: transcoder_promoted(m, _transcoders(m), [(0, 1)], n=0), si.ArgumentError,
     r"\bn=0"),
    ("transcoder-quality-none", lambda m: transcoder_quality(m, None, TEXT), si.SproutError, r"transcoders=None"),
    ("train-sae-epochs-0", _train_sae(epochs=0), si.ArgumentError, r"epochs=0"),
    ("train-sae-batch-over-sample", _train_sae(batch_size=65), si.ArgumentError,
     r"64 training activations are fewer than one batch of batch_size=65"),
    ("train-sae-lr-0", _train_sae(lr=0.0), si.ArgumentError, r"lr=0.0"),
    ("train-sae-k-over-width", _train_sae(d_sae=8, k=9), si.ArgumentError, r"\bk=9 is out of range"),
    ("train-sae-seed-float", _train_sae(seed=1.5), si.ArgumentError, r"seed=1.5"),
    ("train-sae-acts-list", _train_sae(acts=[[0.0] * 16]), si.SproutError, r"acts must be"),
    # lists that hold nothing, and things that are no list
    ("trajectories-lenses-empty", lambda m: si.trajectories(m, TEXT, lenses=[]), si.ArgumentError, r"lenses"),
    ("trajectories-lenses-none", lambda m: si.trajectories(m, TEXT, lenses=None), si.ArgumentError, r"lenses"),
    ("trajectories-lenses-holds-none", lambda m: si.trajectories(m, TEXT, lenses=[None]), si.ArgumentError, r"lenses"),
    ("trajectories-lenses-unknown", lambda m: si.trajectories(m, TEXT, lenses=["tuned", "logits"]), si.ArgumentError,
     r"lenses holds 'logits'"),
    ("logit-lens-lens-unknown", lambda m: si.logit_lens(m, TEXT, lens="logits"), si.ArgumentError, r"lens"),
    ("compare-texts-empty", lambda m: si.compare_models([m], []), si.ArgumentError, r"text"),
    ("compare-texts-none", lambda m: si.compare_models([m], None), si.ArgumentError, r"text"),
    ("compare-texts-mixed", lambda m: si.compare_models([m], ["the cat", 3]), si.ArgumentError, r"text"),
    # an attribution graph that is not one
    ("prune-graph-none", lambda m: prune_graph(None), si.AttributionGraphError, r"graph=None \(a NoneType\)"),
    ("prune-graph-str", lambda m: prune_graph("graph.safetensors"), si.AttributionGraphError, r"graph='graph"),
    ("prune-graph-dict", lambda m: prune_graph({}), si.AttributionGraphError, r"graph=\{\} \(a dict\)"),
    ("graph-scores-none", lambda m: graph_scores(None), si.AttributionGraphError, r"graph=None"),
    ("graph-scores-str", lambda m: graph_scores("abc"), si.AttributionGraphError, r"graph='abc'"),
    ("graph-scores-dict", lambda m: graph_scores({"adjacency": 1}), si.AttributionGraphError, r"graph="),
    ("node-influence-none", lambda m: node_influence(None), si.AttributionGraphError, r"graph=None"),
    ("save-graph-dict", lambda m: save_graph({}, "/nonexistent/g.safetensors"), si.AttributionGraphError, r"graph="),
    ("ablation-prediction-list", lambda m: ablation_prediction([], [0]), si.AttributionGraphError, r"graph=\[\]"),
]


@pytest.mark.parametrize("call, error, names", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_argument_is_refused_by_name(model, call, error, names):
    with pytest.raises(error, match=names) as e:
        call(model)
    assert isinstance(e.value, si.SproutError)
    assert not isinstance(e.value, (IndexError, KeyError, TypeError, RuntimeError)) or isinstance(e.value, si.HookNameError)


# integer scalars of numpy and torch are whole numbers: accepted wherever an int is
ACCEPTED = [
    ("ablate-numpy-layer", lambda m: si.ablate(m, TEXT, [(np.int64(1), torch.tensor(0))]).mean_loss),
    ("attention-numpy-layers", lambda m: si.attention_patterns(m, TEXT, layers=[np.int64(1)]).shape[0]),
    ("steer-numpy-layer", lambda m: len(si.steering_effect(m, TEXT, torch.zeros(m.cfg.d_model), np.int64(1),
                                                           coeffs=[1.0]))),
    ("dla-numpy-pos", lambda m: len(si.direct_logit_attribution(m, TEXT, answer=np.int64(5), pos=np.int64(-1)))),
    ("logit-lens-numpy-k", lambda m: si.logit_lens(m, TEXT, k=np.int64(3)).topk_ids.shape[-1]),
    ("logitdiff-numpy-ids", lambda m: len(si.ablation_sweep(m, TEXT, LogitDiff(np.int64(1), torch.tensor(2))))),
    ("generate-top-k-numpy", lambda m: m.generate("the cat", max_new_tokens=2, top_k=np.int64(5), seed=0)),
]


@pytest.mark.parametrize("call", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_integer_scalars_of_numpy_and_torch_are_accepted(model, call):
    assert call(model)


def test_same_answer_for_numpy_and_python_indices(model):
    a = si.ablate(model, TEXT, [(1, 0)])
    b = si.ablate(model, TEXT, [(np.int64(1), torch.tensor(0))])
    assert torch.equal(a.logits, b.logits)
    assert a.mean_loss != si.ablate(model, TEXT, [(0, 0)]).mean_loss  # the index picked a different head


def test_metric_error_says_what_it_returned(model):
    with pytest.raises(si.MetricError, match=r"shape \(300,\)"):
        si.ablation_sweep(model, TEXT, metric=lambda logits: logits[0, -1])
    with pytest.raises(si.MetricError, match=r"'abc'"):
        si.ablation_sweep(model, TEXT, metric=lambda logits: "abc")


def test_token_id_errors_give_the_vocabulary_range(model):
    with pytest.raises(si.MetricError, match=r"answer holds token id -1.*0\.\.d_vocab-1"):
        LogitDiff(-1, 2)  # refused when made: no vocabulary has a negative id
    with pytest.raises(si.MetricError, match=r"wrong holds token id 300.*0\.\.299"):
        si.ablation_sweep(model, TEXT, metric=LogitDiff(1, 300))  # refused when bound to this model's vocabulary
    with pytest.raises(si.VocabularyMismatchError, match=r"305.*0\.\.299"):
        model.to_string([1, 305])


def test_max_new_tokens_limit_is_documented_and_tunable(model, monkeypatch):
    from sprout_interp.core import generation

    assert str(generation.MAX_NEW_TOKENS) in type(model).generate.__doc__.replace(",", "")
    with pytest.raises(si.ArgumentError, match=rf"max_new_tokens.*0\.\.{generation.MAX_NEW_TOKENS}"):
        model.generate("the cat", max_new_tokens=generation.MAX_NEW_TOKENS + 1)
    monkeypatch.setattr(generation, "MAX_NEW_TOKENS", 3)
    with pytest.raises(si.ArgumentError, match="0..3"):
        model.generate("the cat", max_new_tokens=4)
    out = model.generate(torch.tensor([[1, 2]]), max_new_tokens=3, seed=0)
    assert out.shape == (1, 5)


def test_edge_values_still_run(model):
    """The ends of each range are valid: temperature 0 (greedy), top_p 1, top_k = the vocabulary, no new tokens."""
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(model.generate(ids, max_new_tokens=0), ids)
    greedy = model.generate(ids, max_new_tokens=4, temperature=0.0, top_p=1.0, top_k=V, seed=1)
    assert torch.equal(greedy, model.generate(ids, max_new_tokens=4, temperature=0.0, top_p=None, seed=2))
    assert si.logit_lens(model, TEXT, k=V).topk_ids.shape[-1] == V
    _, cache = model.run_with_cache(TEXT, pos_slice=-1, names_filter="blocks.0.hook_resid_post")
    full = model.run_with_cache(TEXT, names_filter="blocks.0.hook_resid_post")[1]["blocks.0.hook_resid_post"]
    assert torch.equal(cache["blocks.0.hook_resid_post"][:, 0], full[:, -1])


def test_compare_models_reads_texts_of_different_lengths_each_as_alone(model):
    """A list of texts of different lengths (a ValueError of pandas before) gives each text's rows exactly as that
    text alone does: the padding is never predicted and never read."""
    texts = ["the cat", "the cat sat on the mat and the dog ran", "a red ball"]
    both = si.compare_models({"a": model}, texts)
    assert both["text"].tolist() == [i for i, t in enumerate(texts) for _ in range(len(model.to_str_tokens(t)) - 1)]
    for i, t in enumerate(texts):
        alone = si.compare_models({"a": model}, t)
        rows = both[both["text"] == i].drop(columns="text").reset_index(drop=True)
        assert rows[["pos", "context", "token"]].equals(alone[["pos", "context", "token"]])
        assert np.allclose(rows["a"].to_numpy(), alone["a"].to_numpy(), rtol=1e-5, atol=1e-7)
        assert both.attrs["tokens"][i] == alone.attrs["tokens"]
    with pytest.raises(si.SproutError, match="text 1 is a single token"):
        si.compare_models({"a": model}, ["the cat", "the"])


def test_numbers_in_every_accepted_form_still_run(model):
    """The checks refuse strings and bools, not numbers: a 1-d tensor or array of coefficients, one number alone,
    numpy floats, one lens alone as a list of one, a count at the bottom of its range."""
    v = torch.ones(model.cfg.d_model)
    want = si.steering_effect(model, TEXT, v, 0, coeffs=[1.0, 2.0])
    for coeffs in (torch.tensor([1.0, 2.0]), np.array([1.0, 2.0]), (1, 2), [np.float32(1), np.float64(2)]):
        got = si.steering_effect(model, TEXT, v, 0, coeffs=coeffs)
        assert got["coeff"].tolist() == [1.0, 2.0] and np.allclose(got["value"], want["value"])
    assert si.steering_effect(model, TEXT, v, 0, coeffs=2.0)["coeff"].tolist() == [2.0]
    one = si.trajectories(model, TEXT, lenses="logit")
    assert one.equals(si.trajectories(model, TEXT, lenses=["logit"]))
    assert len(si.composition_table(model, modes="K", samples=1)) == len(si.composition_table(model, modes=["K"], samples=1))
    lens = si.train_tuned_lens(model, torch.tensor([[1, 2, 3, 4]]), steps=1, progress=False)
    assert lens.info["steps"] == 1 and len(lens.info["loss_curve"]) == 1
    sae, stats = train_sae(model, 0, torch.randn(64, 16, generator=torch.Generator().manual_seed(0)), d_sae=32, k=4,
                           batch_size=16, epochs=1, progress=False)  # exactly one batch per step: four steps run
    assert sae.d_sae == 32 and stats.steps == 4


def _outcome(call, m, seconds: int = 3) -> str:
    """What ``call(m)`` does: the error class raised (with its module for a non-Sprout one), or "ran"."""
    def alarm(*_):
        raise TimeoutError

    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        call(m)
        return "ran"
    except TimeoutError:
        return f"ran (still running after {seconds} s)"
    except Exception as e:  # noqa: BLE001 - the probe records whatever happens
        return type(e).__name__ if isinstance(e, si.SproutError) else f"{type(e).__name__} (plain Python)"
    finally:
        signal.alarm(0)


if __name__ == "__main__":
    m = build_model()
    for case_id, call, error, _ in CASES:
        print(f"{case_id:34s} {_outcome(call, m):44s} want {error.__name__}")
    for case_id, call in ACCEPTED:
        print(f"{case_id:34s} {_outcome(call, m):44s} want ran")
