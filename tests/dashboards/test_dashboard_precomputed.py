"""The dashboard's precomputed answers (dashboards/precomputed.py, written by scripts/precompute_dashboard.py).

A ``dashboard.json`` is read only for the checkpoint whose fingerprint it carries and with today's settings (a
changed checkpoint, other settings or a damaged file are not used: the dashboard computes); its tables and circuit
come back exactly as written. The shipped files equal a fresh computation by the library on this machine, whatever
its CPU: the numbers to precomputed.FRESH_TOLERANCE (they were computed on another machine, whose kernels round
otherwise), the choices (the circuit's heads, its verdicts) exactly, each won by at least precomputed.CHOICE_MARGIN
(asserted, so a near-tie can never decide them).
"""
from __future__ import annotations

import json
import shutil
import sys
from dataclasses import fields
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import pytest
import torch

from sprout_interp.circuits.induction import InductionCircuit
from sprout_interp.core import loading
from sprout_interp.core.fingerprints import fingerprint

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "dashboards"))
import precomputed  # noqa: E402
from doc_blocks import same_output  # noqa: E402

pytestmark = pytest.mark.unit
SHIPPED = ["gpt-1", "gpt-4", "sprout"]


def _installed(name: str) -> bool:
    return (Path(loading.SHIPPED_DIR) / name / "model.safetensors").is_file()


def _scores() -> pd.DataFrame:
    df = pd.DataFrame({"layer": [0, 0, 1, 1], "block": [1, 1, 2, 2], "head": [0, 1, 0, 1],
                       "prev_token_random": [0.9, 0.1, 0.05, 0.02], "duplicate_random": [0.0, 0.1, 0.2, 0.0],
                       "induction_random": [0.01, 0.02, 0.81, 0.1], "prev_token_text": [0.7, 0.2, 0.1, 0.0],
                       "duplicate_text": [0.0, 0.1, 0.2, 0.3], "induction_text": [0.0, 0.1, 0.4, 0.05]})
    df.attrs.update(model="tiny", seq_len=64, batch=16, seed=0)
    return df


def _circuit() -> InductionCircuit:
    """A confirmed circuit, block 1 head 0 (layer 0) -> block 2 head 0 (layer 1), with hand-made ablation evidence."""
    nan = float("nan")
    labels = ["none", "block 2 head 0 (layer 1)", "block 1 head 0 (layer 0)"]
    ev = pd.DataFrame({"role": ["clean", "induction candidate", "previous-token candidate"],
                       "condition": ["clean", *labels[1:]], "heads": labels,
                       "head_pairs": [[], [(1, 0)], [(0, 0)]], "n_heads": [0, 1, 1],
                       "layer": pd.array([None, 1, 0], dtype="Int64"), "copying_second": [0.6, 0.1, 0.3],
                       "copying_removed": [0.0, 0.99, 0.6], "loss_change": [0.0, 0.1, 0.05],
                       "specificity": [nan, 50.0, float("inf")], "induction_score": [0.88, nan, 0.05],
                       "induction_drop": [0.0, nan, 0.9], "chosen": [False, True, True]})
    ev["role"] = ev["role"].astype("str")
    ev.attrs.update(clean_copying_first=0.003, clean_copying_second=0.6, kind="mean", worst=float("-inf"))
    return InductionCircuit(model="tiny", prev_layer=0, prev_head=0, prev_score=0.7, induction_layer=1, induction_head=0,
                            induction_score=0.81, prev_earlier=True, prev_before_layer=0, prev_before_head=0,
                            prev_before_score=0.7, threshold=0.3, found=True, scores_on="both",
                            clean_copying_ratio=0.02, prev_tokens=[(0, 0)], confirmed=True, kind="mean",
                            copying="names", evidence=ev)


def _sweep() -> pd.DataFrame:
    df = pd.DataFrame({"layer": [0, 1], "block": [1, 2], "head": [0, 0], "metric": ["copying_ratio"] * 2,
                       "ablated": [0.6, 0.3], "clean": [0.02, 0.02], "change": [0.58, 0.28]})
    df.attrs.update(metric="copying_ratio", kind="zero", method="fast", clean=0.02)
    return df


def _ov() -> pd.DataFrame:
    df = pd.DataFrame({"layer": [0, 1], "block": [1, 2], "head": [0, 0], "copying_score": [0.9, -0.2],
                       "self_top_k": [0.5, 0.0], "self_rank_median": [1.0, 4000.0]})
    df.attrs.update(k=5, normalize=True)
    return df


def _lens() -> pd.DataFrame:
    return pd.DataFrame({"row": ["embedding", "block 1"], "block": [0, 1], "layer": [-1, 0], "confidence": [0.4, 0.7],
                         "kl_final": [2.5, 0.0], "n_tokens": [90, 90]})


def _patched() -> pd.DataFrame:
    df = pd.DataFrame({"layer": [0, 0, 1], "block": [1, 1, 2], "pos": [0, 1, 0], "score": [0.0, 1.0, 0.25]})
    df.attrs.update(clean=3.5, corrupted=-1.25, site="resid_pre", by="layer_pos")
    return df


TEXT_A = "The boat came in and old Zorbin Plax waited. Zorbin Plax shook hands with the sailors on the pier."
TEXT_B = "She said the ropes were tied."
DESCRIPTIONS = ["fires on ' the'", "fires on 'ax' after ' Pl'; promotes ' was'", "never fires on held-out text"]


def _data(m) -> dict:
    return {"format": precomputed.FORMAT, "model": "tiny", "fingerprint": fingerprint(m),
            "sources": precomputed.sources(m), "settings": precomputed.settings(),
            "circuit_scores": precomputed.frame_to_json(_scores()),
            "confirmed_circuit": precomputed.circuit_to_json(_circuit()),
            "copying_sweep": precomputed.frame_to_json(_sweep()), "ov_copying": precomputed.frame_to_json(_ov()),
            "lens_three_texts": {"logit": precomputed.frame_to_json(_lens())},
            "patching": {"resid_pre/layer_pos": precomputed.frame_to_json(_patched())},
            "feature_descriptions": {"1": DESCRIPTIONS}, "feature_pages": {}}


def test_tables_and_circuits_come_back_as_written(hooked, tmp_path):
    """Values, dtypes (nullable Int64, str, bool, object head pairs as tuples), NaN, the index and attrs survive
    the JSON file; the circuit's summary and verdicts are the same."""
    path = precomputed.write(hooked, _data(hooked), tmp_path / precomputed.FILE)
    got, why = precomputed.read(hooked, path)
    assert why == "" and got is not None and got.path == path
    pd.testing.assert_frame_equal(got.scores, _scores(), check_exact=True)
    pd.testing.assert_frame_equal(got.sweep, _sweep(), check_exact=True)
    pd.testing.assert_frame_equal(got.ov_copying(True), _ov(), check_exact=True)
    assert list(got.ov_copying(False).columns) == ["layer", "block", "head", "copying_score"]
    assert got.scores.attrs == _scores().attrs and got.sweep.attrs == _sweep().attrs
    c, want = got.confirmed, _circuit()
    pd.testing.assert_frame_equal(c.evidence, want.evidence, check_exact=True)
    assert c.evidence["head_pairs"].tolist() == [[], [(1, 0)], [(0, 0)]] and c.evidence.attrs == want.evidence.attrs
    assert c == want and c.prev_tokens == [(0, 0)] and c.summary() == want.summary() and c.verdicts() == want.verdicts()
    assert "REPRODUCED" in c.summary()
    json.loads(path.read_text(encoding="utf-8"), parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    pd.testing.assert_frame_equal(got.lens["logit"], _lens(), check_exact=True)
    assert "tuned" not in got.lens  # not precomputed: the page computes it


def test_precomputed_patching_and_descriptions_answer_only_what_was_computed(hooked, tmp_path):
    """The patching table answers the default pair, exact, at the site and split it was computed for, and nothing
    else (another text, answer, site or method is computed by the page); descriptions answer the SAE layers and
    latents stored, and None for any other."""
    path = precomputed.write(hooked, _data(hooked), tmp_path / precomputed.FILE)
    got, why = precomputed.read(hooked, path)
    assert got is not None, why
    d = precomputed.PATCH_DEFAULT
    args = (d["clean"], d["corrupted"], d["answer"], d["wrong"])
    table = got.patching(*args, "resid_pre", "layer_pos")
    pd.testing.assert_frame_equal(table, _patched(), check_exact=True)
    assert table.attrs == _patched().attrs
    table.loc[0, "score"] = 99.0  # a caller's change does not reach the stored table
    assert got.patching(*args, "resid_pre", "layer_pos").loc[0, "score"] == 0.0
    assert got.patching(*args, "z", "head") is None
    assert got.patching(*args, "resid_pre", "layer_pos", method="attribution") is None
    assert got.patching(d["clean"] + " ", *args[1:], "resid_pre", "layer_pos") is None
    assert got.patching(*args[:2], " the", " Pl", "resid_pre", "layer_pos") is None
    assert got.descriptions_of(1, (2, 0)) == {2: DESCRIPTIONS[2], 0: DESCRIPTIONS[0]}
    assert got.descriptions_of(1, (3,)) is None and got.descriptions_of(0, (0,)) is None


def test_a_feature_page_comes_back_as_built(tiny_checkpoint):
    """A latent's whole page (scalars, the where-it-fires shares, every table with its list columns) survives the
    JSON file unchanged, and the file answers only the latent it holds."""
    import sprout_interp as si
    from sprout_interp.features.pages import feature_summaries, index_features
    from sprout_interp.features.sae import SparseAutoencoder

    m = si.load(str(tiny_checkpoint))
    sae = SparseAutoencoder.for_model(m, 1, d_sae=24, k=4)
    index = index_features(m, sae, tokens=[TEXT_A, TEXT_B])
    page = feature_summaries(m, sae, [3], index)[3]
    assert not page.contexts.empty and isinstance(page.contexts["tokens"].iloc[0], list)
    back = precomputed.feature_page_from_json(json.loads(json.dumps(precomputed.feature_page_to_json(page))))
    for f in fields(page):
        want, got = getattr(page, f.name), getattr(back, f.name)
        if isinstance(want, pd.DataFrame):
            pd.testing.assert_frame_equal(got, want, check_exact=True)
        else:
            assert got == want, f.name
    data = dict(_data(m), feature_pages={"1": precomputed.feature_page_to_json(page)})
    held = precomputed.Precomputed(data)
    assert held.feature_page(1, 3).description == page.description
    assert held.feature_page(1, 0) is None and held.feature_page(0, 3) is None


def test_a_retrained_lens_or_sae_beside_the_checkpoint_makes_the_file_unused(tiny_checkpoint, tmp_path):
    """The file records the sha256 of the tuned lens and SAE files beside the checkpoint: one changed, added or
    removed after it was written and the file is not used (the lens figure and the descriptions would be stale)."""
    import sprout_interp as si

    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, folder)
    shutil.copy(tiny_checkpoint.parent / "tokenizer.json", tmp_path)
    m = si.load(str(folder))
    (folder / "tuned_lens.json").write_text("{}", encoding="utf-8")
    sae = folder / "saes" / "blocks.1.hook_resid_post"
    sae.mkdir(parents=True)
    (sae / "cfg.json").write_text("{}", encoding="utf-8")
    assert set(precomputed.sources(m)) == {"tuned_lens.json", "saes/blocks.1.hook_resid_post/cfg.json"}
    precomputed.write(m, _data(m))
    assert precomputed.read(m)[0] is not None
    (sae / "cfg.json").write_text('{"retrained": true}', encoding="utf-8")
    got, why = precomputed.read(m)
    assert got is None and "tuned lens or other SAEs" in why
    precomputed.write(m, _data(m))
    assert precomputed.read(m)[0] is not None
    (folder / "tuned_lens.safetensors").write_bytes(b"new")
    assert precomputed.read(m)[0] is None


def test_another_checkpoint_or_other_settings_are_not_used(hooked, tmp_path):
    """A file stamped with another checkpoint's fingerprint (other weights, config or vocabulary), computed with
    other settings, of another format, or damaged, is not used, and the reason says which."""
    path = tmp_path / precomputed.FILE
    precomputed.write(hooked, _data(hooked), path)
    with torch.no_grad():  # the same checkpoint, one weight changed: retrained
        p = next(hooked.model.parameters())
        was = p.view(-1)[0].item()
        p.view(-1)[0] = was + 1.0
    got, why = precomputed.read(hooked, path)
    assert got is None and "another checkpoint" in why and "weights" in why
    with torch.no_grad():
        p.view(-1)[0] = was
    assert precomputed.read(hooked, path)[0] is not None  # the same weights again: used

    def doctored(change) -> tuple:
        data = _data(hooked)
        change(data)
        path.write_text(json.dumps(data), encoding="utf-8")
        return precomputed.read(hooked, path)

    cases = {
        "config": lambda d: d["fingerprint"]["config"].__setitem__("n_layers", 99),
        "vocabulary": lambda d: d["fingerprint"].__setitem__("vocab_sha256", "0" * 64),
        "fingerprint": lambda d: d.__setitem__("fingerprint", ["not", "an", "object"]),
        "other settings": lambda d: d["settings"]["sweep"].__setitem__("seq_len", 32),
        "with other settings": lambda d: d["settings"]["patching"].__setitem__("answer", " the"),
        "tuned lens or other SAEs": lambda d: d.__setitem__("sources", {"tuned_lens.safetensors": "0" * 64}),
        "not a": lambda d: d.__setitem__("format", "something else/9"),
        "KeyError": lambda d: d.pop("copying_sweep"),
    }
    for word, change in cases.items():
        got, why = doctored(change)
        assert got is None and word in why, (word, why)
    for raw in ("{not json", "[1, 2]", ""):
        path.write_text(raw, encoding="utf-8")
        got, why = precomputed.read(hooked, path)
        assert got is None and why, raw
    assert precomputed.read(hooked, tmp_path / "absent.json") == (None, f"no {precomputed.FILE} beside the checkpoint")


@pytest.mark.acceptance  # over 3 s: the attention page twice on gpt-1
@pytest.mark.skipif(not _installed("gpt-1"), reason="the shipped gpt-1 checkpoint is not installed")
def test_the_dashboard_reads_a_matching_file_and_computes_past_a_mismatched_one(tmp_path):
    """A page frames the induction head of the file's scores when the fingerprint matches; with one weight's
    hash changed in the file it frames the head the library computes, and never the file's."""
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    import sprout_interp as si

    shutil.copy(Path(loading.SHIPPED_DIR) / "tokenizer.json", tmp_path)  # the shipped tokenizer, as beside the shipped
    shipped = Path(loading.SHIPPED_DIR) / "gpt-1"
    m = si.load(str(shipped))
    data = json.loads((shipped / precomputed.FILE).read_text(encoding="utf-8"))
    scores = precomputed.frame_from_json(data["circuit_scores"])
    true = precomputed.ranked_circuit(scores)
    planted = (0, 0) if (true.induction_layer, true.induction_head) != (0, 0) else (0, 1)
    i = scores.index[(scores["layer"] == planted[0]) & (scores["head"] == planted[1])][0]
    scores.loc[i, "induction_random"] = 0.95  # a head the library does not name, scored far above the bar
    data["circuit_scores"] = precomputed.frame_to_json(scores)

    def framed(name: str, fp: dict) -> str:
        """The attention page's caption on a copy of gpt-1 (its own folder: its own caches) with the planted file."""
        folder = tmp_path / name
        shutil.copytree(shipped, folder)
        (folder / precomputed.FILE).write_text(json.dumps(dict(data, fingerprint=fp)), encoding="utf-8")
        at = AppTest.from_file(str(ROOT / "dashboards" / "app.py"), default_timeout=600)
        at.query_params.update({"model": str(folder)})
        at = at.switch_page("views/attention.py").run()
        assert not at.exception, [e.value for e in at.exception]
        return next(c.value for c in at.caption if c.value.startswith("One small pattern per head"))

    planted_label = f"block {planted[0] + 1} (layer {planted[0]}), head {planted[1]} (induction score 0.95"
    assert planted_label in framed("same", fingerprint(m))  # read: the planted head is framed
    shown = framed("other", dict(fingerprint(m), weights_sha256="0" * 64))  # another checkpoint's file: computed here
    assert "induction score 0.95" not in shown and f"{true.induction_score:.2f}" in shown, shown


FRESH = precomputed.FRESH_TOLERANCE


def _fresh_frame(got: pd.DataFrame, want: pd.DataFrame, ratios: Optional[dict[str, pd.Series]] = None) -> None:
    """``got`` (read from a shipped file) is ``want`` (computed here) to FRESH_TOLERANCE: text and whole-number
    columns exactly, numbers to the tolerance; a column of ``ratios`` (``{name: its denominator in want}``) as the
    difference it divides (ratio × denominator), since a small denominator magnifies the rounding of its numerator."""
    ratios = ratios or {}
    plain = [c for c in want.columns if c not in ratios]
    pd.testing.assert_frame_equal(got[plain], want[plain], check_exact=False, **FRESH)
    for col, denominator in ratios.items():
        finite = np.isfinite(want[col].to_numpy(float)) & np.isfinite(denominator.to_numpy(float))
        np.testing.assert_array_equal(np.isfinite(got[col].to_numpy(float)), np.isfinite(want[col].to_numpy(float)))
        np.testing.assert_allclose((got[col] * denominator).to_numpy(float)[finite],
                                   (want[col] * denominator).to_numpy(float)[finite], err_msg=col, **FRESH)


def _fresh_patching(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """A patching table: ``value`` (the metric, a logit difference) and the clean and corrupted runs' to the
    tolerance; ``score = (value - corrupted) / (clean - corrupted)`` as ``value - corrupted`` (gpt-1's clean and
    corrupted differ by 0.02, so a score carries 50 times the logits' rounding)."""
    for k in ("clean", "corrupted"):
        np.testing.assert_allclose(got.attrs[k], want.attrs[k], err_msg=k, **FRESH)
    gap = pd.Series(want.attrs["clean"] - want.attrs["corrupted"], index=want.index)
    _fresh_frame(got, want, ratios={"score": gap})


def _fresh_evidence(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """The circuit's evidence: each measurement to the tolerance; ``copying_removed`` as the probability it removes
    (× the clean copying gain), ``induction_drop`` as the score it takes (× the clean induction score);
    ``specificity``, their quotient by ``loss_share``, through those two and whether it is specific (the choices)."""
    a = want.attrs
    index = want.index
    gain = pd.Series(a["clean_copying_second"] - a["clean_copying_first"], index=index)
    score = pd.Series(a["clean_induction_score"], index=index)
    _fresh_frame(got.drop(columns="specificity"), want.drop(columns="specificity"),
                 ratios={"copying_removed": gain, "induction_drop": score})
    for k in ("clean_copying_first", "clean_copying_second", "clean_loss", "clean_induction_score"):
        np.testing.assert_allclose(got.attrs[k], a[k], err_msg=k, **FRESH)


def _choice_margins(scores: pd.DataFrame, c) -> dict[str, float]:
    """By how much each choice of ``find_induction_circuit`` (as the dashboard runs it) is won on ``scores`` and the
    confirmed circuit ``c``: a head ranked first over the next, a score against the candidates' threshold, a share
    against a bar of the verdicts, the sign of a loss change (a specificity's inf). NaN where a choice is not made."""
    from sprout_interp.circuits.evidence import NO_COPYING
    from sprout_interp.circuits.induction import PARTLY_SHARE, REPRODUCED_SHARE

    def lead(values) -> float:
        v = np.sort(np.asarray(values, dtype=float))[::-1]
        return float(v[0] - v[1]) if len(v) > 1 else float("nan")

    def nearest(values, bar: float) -> float:
        v = np.asarray(values, dtype=float)
        v = v[np.isfinite(v)]
        return float(np.min(np.abs(v - bar))) if len(v) else float("nan")

    assert c.scores_on == "both"
    prank = scores[["prev_token_random", "prev_token_text"]].min(axis=1)
    irank = scores["induction_random"]
    earlier = scores["layer"] < c.induction_layer
    prev_any = scores[["prev_token_random", "prev_token_text"]].max(axis=1)
    top = irank.sort_values(ascending=False).index[:7]  # the candidates (at most 6) and the first left out
    t = c.threshold
    out = {"induction head by score": lead(irank), "previous-token head by score": lead(prank),
           "earlier previous-token head by score": lead(prank[earlier]),
           "induction candidates' scores against the threshold": nearest(irank[top], t),
           "earlier heads' previous-token scores against the threshold": min(nearest(prank[earlier], t),
                                                                              nearest(prev_any[earlier], t)),
           "the circuit's induction score against the threshold": abs(c.induction_score - t)}
    ev = c.evidence
    a = ev.attrs
    out["the clean copying gain against NO_COPYING"] = abs(a["clean_copying_second"] - a["clean_copying_first"]
                                                           - NO_COPYING)
    ablated = ev[ev["role"] != "clean"]
    for bar, name in ((c.min_share, "min_share"), (REPRODUCED_SHARE, "REPRODUCED"), (PARTLY_SHARE, "PARTLY")):
        out[f"shares of the copying gain removed against {name}"] = nearest(ablated["copying_removed"], bar)
    out["induction score drops against min_share"] = nearest(ablated["induction_drop"], c.min_share)
    finite = ablated["specificity"][np.isfinite(ablated["specificity"])]
    out["specificities against min_specificity (relative)"] = nearest(finite / c.min_specificity, 1.0)
    out["loss changes against 0 (a specificity's inf)"] = nearest(ablated["loss_change"], 0.0)
    out["the induction head by its share removed"] = lead(ablated.loc[ablated["role"] == "induction candidate",
                                                                      "copying_removed"])
    return out


@pytest.mark.acceptance  # tens of seconds a model: every forward the claims scripts run
@pytest.mark.parametrize("name", SHIPPED)
def test_the_shipped_file_equals_a_fresh_computation(name):
    """Each shipped checkpoint's dashboard.json is what precomputed.build computes now (the library's functions),
    on any CPU: the numbers to FRESH_TOLERANCE, the circuit's heads and verdicts exactly, each choice won by at
    least CHOICE_MARGIN; its summary and verdicts' words exactly, their numbers to their last printed digit."""
    if not _installed(name):
        pytest.skip(f"the shipped {name} checkpoint is not installed")
    import sprout_interp as si

    m = si.load(name)
    got, why = precomputed.read(m)
    assert got is not None, why
    fresh = precomputed.build(m)
    scores = precomputed.frame_from_json(fresh["circuit_scores"])
    _fresh_frame(got.scores, scores)
    _fresh_frame(got.sweep, precomputed.frame_from_json(fresh["copying_sweep"]))
    _fresh_frame(got.ov, precomputed.frame_from_json(fresh["ov_copying"]))
    c = precomputed.circuit_from_json(fresh["confirmed_circuit"])
    for which, (circuit, table) in {"shipped": (got.confirmed, got.scores), "fresh": (c, scores)}.items():
        won = _choice_margins(table, circuit)
        close = {k: v for k, v in won.items() if v < precomputed.CHOICE_MARGIN}  # NaN: no such choice
        assert not close, f"{name} ({which}): a near-tie decides {close}"
    assert got.confirmed.heads() == c.heads() and got.confirmed.found == c.found
    assert (got.confirmed.prev_before_layer, got.confirmed.prev_before_head) == (c.prev_before_layer, c.prev_before_head)
    assert same_output(got.confirmed.summary(), c.summary()), (got.confirmed.summary(), c.summary())
    for part, (word, why) in c.verdicts().items():
        assert got.confirmed.verdicts()[part][0] == word and same_output(got.confirmed.verdicts()[part][1], why), part
    _fresh_evidence(got.confirmed.evidence, c.evidence)
    np.testing.assert_allclose(got.confirmed.induction_score, c.induction_score, **FRESH)
    assert set(got.lens) == {"logit", "tuned"} and set(got.patched) == {"resid_pre/layer_pos", "z/head"}
    for which, table in got.lens.items():
        _fresh_frame(table, precomputed.frame_from_json(fresh["lens_three_texts"][which]))
    for split, table in got.patched.items():
        _fresh_patching(table, precomputed.frame_from_json(fresh["patching"][split]))
    assert got.descriptions == {int(k): v for k, v in fresh["feature_descriptions"].items()}
    assert set(got.pages) == set(got.descriptions)
    assert (name == "sprout") == bool(got.descriptions)  # Sprout ships its SAEs: every latent described


@pytest.mark.acceptance  # over 3 s: head scores on a text
@pytest.mark.skipif(not _installed("gpt-4"), reason="the shipped gpt-4 checkpoint is not installed")
def test_what_the_dashboard_reads_is_what_the_library_computes_for_a_page():
    """The attention page's head scores (random-token columns from the shipped file, the text's computed) equal
    head_scores on that text; its OV copying table (shipped) equals ov_copying_scores without the ranks."""
    pytest.importorskip("streamlit")
    import compute

    import sprout_interp as si
    from sprout_interp.circuits.attention import head_scores
    from sprout_interp.circuits.metrics import LogitDiff
    from sprout_interp.circuits.ov_circuit import ov_copying_scores
    from sprout_interp.circuits.patching import activation_patch
    from sprout_interp.core.texts import TEXTS
    from sprout_interp.lens.logit_lens import logit_lens

    m = si.load("gpt-4")
    assert compute.shipped(m, "gpt-4")[0] is not None  # read from dashboard.json, not computed
    text = TEXTS["story"]
    want = head_scores(m, natural=m.to_tokens(text), copying=False)
    got = compute.head_scores(m, "gpt-4", text)
    _fresh_frame(got, want)  # the random-token columns were computed on the machine that wrote the file
    assert got.attrs == want.attrs
    _fresh_frame(compute.ov_copying(m, "gpt-4", False), ov_copying_scores(m, ranks=False))
    # the logit lens page's three-text figure: the lens over the three texts, padded and masked, as the library runs it
    toks, mask = m.to_tokens_with_mask(list(TEXTS.values()), truncate=True)
    for which in ("logit", "tuned"):
        want = logit_lens(m, toks, k=1, attention_mask=mask, lens=which).summary()
        _fresh_frame(compute.lens_three_texts(m, "gpt-4", which), want)
    # the patching page's default pair, patched both ways exactly as activation_patch does it
    d = precomputed.PATCH_DEFAULT
    metric = LogitDiff(m.to_single_token(d["answer"]), m.to_single_token(d["wrong"]))
    for site, by in precomputed.PATCH_SPLITS:
        want = activation_patch(m, d["clean"], d["corrupted"], metric, site=site, by=by)
        got = compute.patching(m, "gpt-4", *d.values(), site, by)
        _fresh_patching(got, want)


@pytest.mark.acceptance  # over 3 s: the held-out sample indexed through Sprout's SAE
def test_the_shipped_descriptions_are_the_feature_pages_own():
    """The Features page's descriptions, read from Sprout's dashboard.json, are the descriptions feature_summaries
    builds for those latents on the held-out index (a spread of latents of each SAE)."""
    if not _installed("sprout"):
        pytest.skip("the shipped sprout checkpoint is not installed")
    pytest.importorskip("streamlit")
    import compute

    import sprout_interp as si
    from sprout_interp.features.pages import feature_summaries
    from sprout_interp.features.sae import available_saes, load_sae

    m = si.load("sprout")
    got = compute.shipped(m, "sprout")[0]
    assert got is not None and sorted(got.descriptions) == available_saes(m) != []
    for layer in available_saes(m):
        sae = load_sae(m, layer)
        assert len(got.descriptions[layer]) == sae.d_sae
        feats = tuple(range(0, sae.d_sae, sae.d_sae // 7))[:8]
        want = {f: p.description for f, p in feature_summaries(m, sae, list(feats)).items()}
        assert compute.feature_descriptions(m, "sprout", layer, feats) == want
        # the page the Features page opens on, read from the file, is the one feature_summary builds
        first = precomputed.DEFAULT_FEATURE
        page = feature_summaries(m, sae, [first])[first]
        shown = compute.feature_page(m, "sprout", layer, first)
        assert got.feature_page(layer, first) is not None
        for f in fields(page):
            a, b = getattr(shown, f.name), getattr(page, f.name)
            if isinstance(b, pd.DataFrame):  # the shipped page was computed on another machine: FRESH_TOLERANCE
                _fresh_frame(a, b)
            elif isinstance(b, dict):
                assert a == pytest.approx(b, rel=FRESH["rtol"], abs=FRESH["atol"]), f.name
            else:
                assert a == (pytest.approx(b, rel=FRESH["rtol"], abs=FRESH["atol"]) if isinstance(b, float) else b), f.name
