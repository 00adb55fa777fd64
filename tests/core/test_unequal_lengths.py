"""Every public function that takes a list of texts, run on two texts of different lengths, against the same
function run on each text alone: it either gives each text what it gets alone (the padding enters no mean, loss,
statistic or patch; ``pos=-1`` is each text's own last token) or refuses with UnequalLengthsError / MetricError.

Mask-honouring functions are also run with the padding's ids replaced by other ids: a result that changes has
read the padding.
"""
from __future__ import annotations

import pytest
import torch

import sprout_interp as si
from sprout_interp.behaviour.knockout import block_knockout
from sprout_interp.behaviour.steering import steering_effect, steering_vector
from sprout_interp.circuits.ablation import ablate, ablation_sweep, attribution_sweep, head_means
from sprout_interp.circuits.attention import attention_patterns, pattern_scores
from sprout_interp.circuits.metrics import LogitDiff, LogProb, Loss, MetricError, TargetLogProb
from sprout_interp.core.errors import UnequalLengthsError
from sprout_interp.core.texts import TEXTS
from sprout_interp.features import neurons as nrn
from sprout_interp.features.metrics import feature_density, sae_quality
from sprout_interp.features.pages import index_features
from sprout_interp.features.splice import run_with_sae_cache
from sprout_interp.features.train import collect_activations
from sprout_interp.lens.logit_lens import logit_lens
from sprout_interp.lens.residual import residual_rms, residual_stack, stream_rms

A = ("Zorbin Plax came home late from the harbour. His sister opened the door before he could knock. "
     "Zorbin Plax sat down by the fire and said")
B = "The valley lay quiet under the first snow. The old crow walked"
A_CORRUPT = A.replace("Zorbin Plax came", "Quillo Marsk came")
B_CORRUPT = B.replace("valley", "forest")
TOL = dict(atol=1e-5, rtol=1e-5)
pytestmark = pytest.mark.integration  # the shipped gpt-4 and Sprout


@pytest.fixture(scope="module")
def m():
    torch.manual_seed(0)
    return si.load("gpt-4")


@pytest.fixture(scope="module")
def lengths(m):
    la, lb = m.to_tokens(A).shape[1], m.to_tokens(B).shape[1]
    assert la > lb + 10  # the two texts really differ in length
    return la, lb


def _garbage_padding(m, texts):
    """The padded ids of ``texts`` with every padding position set to a different token, and the mask."""
    toks, mask = m.to_tokens_with_mask(texts)
    other = toks.clone()
    other[~mask] = 1234
    return toks, other, mask


def _ids(m):
    return m.to_single_token(" Z"), m.to_single_token(" the")


# -- the metrics: pos=-1 is each row's own last real token -----------------------------------------------------


def test_logit_diff_reads_each_rows_own_last_token(m, lengths):
    a, w = _ids(m)
    toks, mask = m.to_tokens_with_mask([A, B])
    bound = LogitDiff(a, w, pos=-1).bind(toks, mask)
    la, lb = lengths
    assert bound.pos.tolist() == [la - 1, la - 1, lb - 1, lb - 1]
    bound = LogProb(a, pos=-2).bind(toks, mask)
    assert bound.pos.tolist() == [la - 2, lb - 2]
    bound = TargetLogProb([-1, 3], [a, w]).bind(toks, mask)
    assert bound.pos.tolist() == [la - 1, 3, lb - 1, 3]
    with pytest.raises(MetricError, match=f"row 1, which has {lb} real tokens"):
        LogitDiff(a, w, pos=lb + 2).bind(toks, mask)
    with pytest.raises(MetricError, match="row 1"):
        TargetLogProb([lb + 1], [a]).bind(toks, mask)


def test_function_and_copying_metrics_refuse_padding(m):
    toks, mask = m.to_tokens_with_mask([A, B])
    with pytest.raises(MetricError, match="padding"):
        ablation_sweep(m, [A, B], lambda logits: logits[:, -1, 0].mean(), heads=[(0, 0)])
    from sprout_interp.circuits.metrics import CopyingLoss

    with pytest.raises(MetricError, match="padding"):
        CopyingLoss(seq_len=4).bind(toks, mask)


# -- patching: every row is read at the same positions, so unequal lengths are refused -------------------------


@pytest.mark.parametrize("fn", ["activation_patch", "attribution_patch", "path_patch", "attribution_path_patch"])
def test_patching_refuses_unequal_lengths(m, fn):
    a, w = _ids(m)
    kw = {"receivers": [(1, 0, "k")]} if "path" in fn else {"by": "layer"}
    with pytest.raises(UnequalLengthsError, match=r"clean holds texts of different lengths \(\d+, \d+ tokens\)"):
        getattr(si.patching, fn)(m, [A, B], [A_CORRUPT, B_CORRUPT], LogitDiff(a, w), **kw)


def test_patching_a_batch_of_equal_lengths_is_the_mean_of_each_pair(m):
    """Two pairs that tokenize to the same length: the batched table is the mean of the two single-pair tables."""
    a, w = _ids(m)
    ca, xa = m.to_tokens(A), m.to_tokens(A_CORRUPT)
    n = min(ca.shape[1], xa.shape[1])
    ca, xa = ca[:, :n], xa[:, :n]
    cb = m.to_tokens(TEXTS["description"])[:, :n]
    xb = cb.clone()
    xb[0, 2] = m.to_single_token(" forest")
    metric = LogitDiff(a, w, pos=-1)
    both = si.patching.activation_patch(m, torch.cat([ca, cb]), torch.cat([xa, xb]), metric, by="layer")
    one = si.patching.activation_patch(m, ca, xa, metric, by="layer")
    two = si.patching.activation_patch(m, cb, xb, metric, by="layer")
    torch.testing.assert_close(torch.tensor(both["value"].values), torch.tensor((one["value"].values + two["value"].values) / 2), **TOL)


# -- the residual stream -----------------------------------------------------------------------------------


def test_residual_stack_refuses_and_rms_weights_each_text(m, lengths):
    with pytest.raises(UnequalLengthsError, match="tokens holds texts of different lengths"):
        residual_stack(m, [A, B])
    with pytest.raises(UnequalLengthsError):
        stream_rms(m, [A, B])
    la, lb = lengths
    both, one, two = residual_rms(m, [A, B]), residual_rms(m, A), residual_rms(m, B)
    assert both["n_tokens"].tolist() == [la + lb] * len(both)
    expect = (one["rms"].values * la + two["rms"].values * lb) / (la + lb)
    torch.testing.assert_close(torch.tensor(both["rms"].values), torch.tensor(expect), **TOL)
    toks, other, mask = _garbage_padding(m, [A, B])
    torch.testing.assert_close(torch.tensor(residual_rms(m, other, attention_mask=mask)["rms"].values),
                               torch.tensor(both["rms"].values), atol=0, rtol=0)


# -- the lenses and attention ------------------------------------------------------------------------------


def test_logit_lens_rows_equal_each_text_alone(m, lengths):
    la, lb = lengths
    both, one, two = logit_lens(m, [A, B]), logit_lens(m, A), logit_lens(m, B)
    for i, (alone, n) in enumerate(((one, la), (two, lb))):
        torch.testing.assert_close(both.topk_probs[:, i, :n], alone.topk_probs[:, 0], **TOL)
        torch.testing.assert_close(both.kl_final[:, i, :n], alone.kl_final[:, 0], **TOL)
        torch.testing.assert_close(both.next_prob[:, i, :n], alone.next_prob[:, 0], **TOL, equal_nan=True)


def test_attention_patterns_and_scores_ignore_the_padding(m, lengths):
    la, lb = lengths
    both = attention_patterns(m, [A, B])
    torch.testing.assert_close(both[0], attention_patterns(m, A), **TOL)
    torch.testing.assert_close(both[1], attention_patterns(m, B), **TOL)
    toks, other, mask = _garbage_padding(m, [A, B])
    s1, s2 = pattern_scores(m, toks, attention_mask=mask), pattern_scores(m, other, attention_mask=mask)
    for k in s1:
        torch.testing.assert_close(s1[k], s2[k], atol=0, rtol=0, equal_nan=True)


# -- ablations -------------------------------------------------------------------------------------------


def test_ablate_gives_each_text_its_own_loss(m, lengths):
    la, lb = lengths
    heads = [(1, 0), (0, 2)]
    both, one, two = ablate(m, [A, B], heads), ablate(m, A, heads), ablate(m, B, heads)
    torch.testing.assert_close(both.loss[0, : la - 1], one.loss[0], **TOL)
    torch.testing.assert_close(both.loss[1, : lb - 1], two.loss[0], **TOL)
    assert both.mean_loss == pytest.approx((one.mean_loss * (la - 1) + two.mean_loss * (lb - 1)) / (la + lb - 2), rel=1e-5)
    with pytest.raises(UnequalLengthsError, match="resample"):
        ablate(m, [A, B], heads, kind="resample")


@pytest.mark.parametrize("method", ["fast", "naive"])
def test_ablation_sweep_with_a_logit_difference_is_the_mean_of_each_text(m, method):
    a, w = _ids(m)
    heads = [(0, 0), (1, 0), (3, 2)]
    metric = LogitDiff(a, w, pos=-1)
    both = ablation_sweep(m, [A, B], metric, heads=heads, method=method)
    one = ablation_sweep(m, A, metric, heads=heads, method=method)
    two = ablation_sweep(m, B, metric, heads=heads, method=method)
    for col in ("ablated", "clean", "change"):
        torch.testing.assert_close(torch.tensor(both[col].values), torch.tensor((one[col].values + two[col].values) / 2), **TOL)
    est = attribution_sweep(m, [A, B], metric, heads=heads)
    est1, est2 = attribution_sweep(m, A, metric, heads=heads), attribution_sweep(m, B, metric, heads=heads)
    torch.testing.assert_close(torch.tensor(est["estimate"].values),
                               torch.tensor((est1["estimate"].values + est2["estimate"].values) / 2), **TOL)


def test_head_means_and_knockout_count_real_tokens_only(m, lengths):
    la, lb = lengths
    both = head_means(m, [A, B])
    torch.testing.assert_close(both, (head_means(m, A) * la + head_means(m, B) * lb) / (la + lb), **TOL)
    toks, other, mask = _garbage_padding(m, [A, B])
    torch.testing.assert_close(head_means(m, other, attention_mask=mask), both, atol=0, rtol=0)
    k = block_knockout(m, [A, B], groups=[(1,), (2, 3)])
    k1, k2 = block_knockout(m, A, groups=[(1,), (2, 3)]), block_knockout(m, B, groups=[(1,), (2, 3)])
    expect = (k1["loss"].values * (la - 1) + k2["loss"].values * (lb - 1)) / (la + lb - 2)
    torch.testing.assert_close(torch.tensor(k["loss"].values), torch.tensor(expect), **TOL)


def test_neuron_ablation_with_a_logit_difference_is_the_mean_of_each_text(m):
    a, w = _ids(m)
    metric = LogitDiff(a, w, pos=-1)
    neurons = [(1, 5), (2, 7)]
    both = nrn.ablate_neurons(m, [A, B], neurons, metric=metric)
    one, two = nrn.ablate_neurons(m, A, neurons, metric=metric), nrn.ablate_neurons(m, B, neurons, metric=metric)
    num = [c for c in both.columns if both[c].dtype.kind == "f"]
    for col in num:
        torch.testing.assert_close(torch.tensor(both[col].values), torch.tensor((one[col].values + two[col].values) / 2), **TOL)


# -- steering ----------------------------------------------------------------------------------------------


def test_steering_reads_each_text_at_its_own_last_token(m):
    layer = 2
    vec = steering_vector(m, [A, B], ["She said", "The snow fell on the old village and"], layer)
    name = f"blocks.{layer}.hook_resid_pre"
    last = [m.run_with_cache(t, names_filter=name)[1][name][0, -1] for t in (A, B, "She said", "The snow fell on the old village and")]
    torch.testing.assert_close(vec, (last[0] + last[1]) / 2 - (last[2] + last[3]) / 2, **TOL)
    a, w = _ids(m)
    metric = LogitDiff(a, w, pos=-1)
    both = steering_effect(m, [A, B], vec, layer, coeffs=(-1.0, 0.0, 2.0), metric=metric)
    one = steering_effect(m, A, vec, layer, coeffs=(-1.0, 0.0, 2.0), metric=metric)
    two = steering_effect(m, B, vec, layer, coeffs=(-1.0, 0.0, 2.0), metric=metric)
    torch.testing.assert_close(torch.tensor(both["value"].values), torch.tensor((one["value"].values + two["value"].values) / 2), **TOL)


def test_forward_loss_per_token_matches_each_text(m, lengths):
    la, lb = lengths
    both = m([A, B], return_type="loss", loss_per_token=True)
    torch.testing.assert_close(both[0, : la - 1], m(A, return_type="loss", loss_per_token=True)[0], **TOL)
    torch.testing.assert_close(both[1, : lb - 1], m(B, return_type="loss", loss_per_token=True)[0], **TOL)


@pytest.mark.unchecked_types  # a list where one text is annotated: the library's own refusal is under test
def test_contribution_graph_refuses_a_batch(m):
    from sprout_interp.circuits.attribution import contribution_graph

    with pytest.raises(si.SproutError, match="one text"):
        contribution_graph(m, [A, B])


# -- features and neurons (the SAEs are Sprout's) ------------------------------------------------------------


@pytest.fixture(scope="module")
def sprout():
    return si.load("sprout")


@pytest.fixture(scope="module")
def sae(sprout):
    return si.sae.load_sae(sprout, 1)


def test_sae_quality_counts_real_tokens_only(sprout, sae):
    la, lb = sprout.to_tokens(A).shape[1], sprout.to_tokens(B).shape[1]
    both = sae_quality(sprout, sae, tokens=[A, B]).iloc[0]
    one, two = sae_quality(sprout, sae, tokens=A).iloc[0], sae_quality(sprout, sae, tokens=B).iloc[0]
    assert both["n_tokens"] == la + lb
    for col in ("ce_clean", "ce_sae", "ce_zero"):
        assert both[col] == pytest.approx((one[col] * (la - 1) + two[col] * (lb - 1)) / (la + lb - 2), rel=1e-5)
    assert both["l0"] == pytest.approx((one["l0"] * la + two["l0"] * lb) / (la + lb), rel=1e-6)
    dens = feature_density(sprout, sae, tokens=[A, B])
    d1, d2 = feature_density(sprout, sae, tokens=A), feature_density(sprout, sae, tokens=B)
    torch.testing.assert_close(dens, (d1 * la + d2 * lb) / (la + lb), **TOL)


def test_feature_indexes_and_caches_match_each_text(sprout, sae):
    la, lb = sprout.to_tokens(A).shape[1], sprout.to_tokens(B).shape[1]
    idx = index_features(sprout, sae, tokens=[A, B])
    one, two = index_features(sprout, sae, tokens=A), index_features(sprout, sae, tokens=B)
    torch.testing.assert_close(idx.vals[0, :la], one.vals[0], **TOL)
    torch.testing.assert_close(idx.vals[1, :lb], two.vals[0], **TOL)
    assert idx.mask is not None and idx.mask.sum().item() == la + lb
    _, cache = run_with_sae_cache(sprout, [A, B], [sae])
    _, c1 = run_with_sae_cache(sprout, A, [sae])
    _, c2 = run_with_sae_cache(sprout, B, [sae])
    for name in cache:
        torch.testing.assert_close(cache[name][0, :la], c1[name][0], **TOL)
        torch.testing.assert_close(cache[name][1, :lb], c2[name][0], **TOL)
    ni = nrn.index_neurons(sprout, 2, tokens=[A, B])
    n1, n2 = nrn.index_neurons(sprout, 2, tokens=A), nrn.index_neurons(sprout, 2, tokens=B)
    torch.testing.assert_close(ni.acts[0, :la], n1.acts[0], **TOL)
    torch.testing.assert_close(ni.acts[1, :lb], n2.acts[0], **TOL)


def test_collected_activations_are_each_texts_real_tokens(sprout):
    both = collect_activations(sprout, 1, tokens=[A, B], progress=False)
    one = collect_activations(sprout, 1, tokens=A, progress=False)
    two = collect_activations(sprout, 1, tokens=B, progress=False)
    torch.testing.assert_close(both, torch.cat([one, two]), **TOL)


def test_loss_metric_weights_each_target_once(m, lengths):
    la, lb = lengths
    both = ablation_sweep(m, [A, B], Loss(), heads=[(1, 0)])
    one, two = ablation_sweep(m, A, Loss(), heads=[(1, 0)]), ablation_sweep(m, B, Loss(), heads=[(1, 0)])
    for col in ("ablated", "clean"):
        expect = (one[col].values * (la - 1) + two[col].values * (lb - 1)) / (la + lb - 2)
        torch.testing.assert_close(torch.tensor(both[col].values), torch.tensor(expect), **TOL)


def test_transcoder_metrics_leave_padding_out_or_refuse(m, lengths):
    from sprout_interp.features.transcoder import load_transcoders
    from sprout_interp.features.transcoder_metrics import replacement_quality, run_with_transcoders, transcoder_quality

    tcs = load_transcoders(m)  # the shipped gpt-4 set
    la, lb = lengths
    both = float(run_with_transcoders(m, tcs, [A, B], return_type="loss"))
    one, two = (float(run_with_transcoders(m, tcs, t, return_type="loss")) for t in (A, B))
    assert both == pytest.approx((one * (la - 1) + two * (lb - 1)) / (la + lb - 2), rel=1e-5)
    with pytest.raises(UnequalLengthsError):
        replacement_quality(m, tcs, tokens=[A, B])
    with pytest.raises(UnequalLengthsError):
        transcoder_quality(m, tcs, tokens=[A, B])


def test_the_shipped_transcoders_recover_most_of_the_loss_gap(m):
    """The gpt-4 set with every feed-forward replaced at once recovers at least 80% of the gap between the clean
    loss and the loss with every feed-forward zeroed (the issue's aim), on 4 held-out windows."""
    from sprout_interp.features.transcoder import load_transcoders
    from sprout_interp.features.transcoder_metrics import replacement_quality

    q = replacement_quality(m, load_transcoders(m), n=4, length=128)
    assert q["ce_clean"] < q["ce_replacement"] < q["ce_mlp_zero"]
    assert q["gap_recovered"] > 0.8, q
