"""Feature labels (sprout_interp.features.labels, circuits.graph_labels) on a tiny random model with random per-layer
transcoders and a random cross-layer transcoder, against a hand-written loop: each text run alone through the
model, the transcoder applied to its feed-forward input, the firings sorted and the tokens counted in plain Python.
Features are checked where no near-tie decides the label (the winning token's share clear of the runner-up's and of
the naming threshold, the promoted token clear of the second); texts of unequal length are measured together and
compared with each alone; the label rules on hand-made parts; bad arguments refused by name."""
from __future__ import annotations

import json
from collections import defaultdict

import pandas as pd
import pytest
import torch

import sprout_interp as si
from sprout_interp.circuits.graph_labels import graph_labels
from sprout_interp.circuits.local_replacement import random_transcoders
from sprout_interp.core.errors import ArgumentError, AttributionGraphError, SproutError, TranscoderMismatchError
from sprout_interp.core.texts import TEXTS
from sprout_interp.features.clt import CrossLayerTranscoder, load_clt, save_clt
from sprout_interp.features.labels import (
    CLEAR_SHARE,
    LABEL_COLUMNS,
    MAX_LABEL,
    NEVER,
    feature_labels,
    label_text,
    labels_fingerprint,
    quote_token,
    read_labels,
    where_word,
    write_labels,
)
from sprout_interp.features.pages import vocabulary_strings
from sprout_interp.features.transcoder import input_hook

pytestmark = pytest.mark.unit

# three texts of unequal length (in tokens), measured together and each alone
TEXTS3 = [TEXTS["story"][:300], TEXTS["dialogue"][:120], TEXTS["description"]]
TOP = 40  # strongest firings counted: below the firings of most features, so the cut is exercised


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return si.load(tiny_checkpoint)


@pytest.fixture(scope="module")
def per_layer(model):
    return random_transcoders(model, k=4, d_transcoder=32, seed=0)


@pytest.fixture(scope="module")
def clt(model):
    """A random JumpReLU CLT: for_model's unit decoders, thresholds at each layer's 80% quantile of pre-activations
    on the texts (about a fifth of the features fire per token), small random encoder biases."""
    c = CrossLayerTranscoder.for_model(model, 24, seed=1)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        c.b_enc.copy_(0.05 * torch.randn(c.b_enc.shape, generator=g))
        for i in range(c.n_layers):
            xs = torch.cat([_mlp_inputs(model, t)[i] for t in TEXTS3])
            c.threshold[i].copy_(c.pre_acts(i, xs).quantile(0.8, dim=0))
    return c


def _mlp_inputs(m, text: str) -> list[torch.Tensor]:
    """Each layer's feed-forward input on ``text`` alone, (pos, d_model): a full forward, ln2's output times its gain."""
    toks, _ = m.prepare_input(text)
    _, cache = m.run_with_cache(toks, names_filter=[input_hook(i) for i in range(m.cfg.n_layers)])
    return [cache[input_hook(i)][0] * m.blocks[i].ln2.w for i in range(m.cfg.n_layers)]


def _each_alone(m) -> list[tuple[list[int], list[torch.Tensor]]]:
    """Each text's ids and feed-forward inputs, each text run alone."""
    return [(m.prepare_input(t)[0][0].tolist(), _mlp_inputs(m, t)) for t in TEXTS3]


def _by_hand(m, alone, acts_of, layer: int, feature: int, top: int) -> dict:
    """A feature's measured parts from each text alone (``alone``: :func:`_each_alone`), by plain Python: its
    activation at every token (``acts_of(layer, x)`` -> (pos, d_transcoder)), the ``top`` strongest firings, their
    tokens' and previous tokens' shares of the activation, the winner's margins."""
    strings = vocabulary_strings(m)
    firings, n = [], 0
    for ids, xs in alone:
        a = acts_of(layer, xs[layer])[:, feature].tolist()
        n += len(ids)
        for p, v in enumerate(a):
            if v > 0:
                firings.append((v, strings[ids[p]], strings[ids[p - 1]] if p else "(start)"))
    firings.sort(key=lambda f: -f[0])
    cut = firings[:top]
    out = dict(frequency=len(firings) / n, n_fires=len(firings),
               cut_gap=(cut[-1][0] - firings[top][0]) if len(firings) > top else float("inf"))
    total = sum(f[0] for f in cut)
    for name, k in (("top", 1), ("previous", 2)):
        acc = defaultdict(float)
        for f in cut:
            acc[f[k]] += f[0] / total
        ranked = sorted(acc.items(), key=lambda kv: -kv[1]) + [("", 0.0)]
        out.update({f"{name}_token": ranked[0][0], f"{name}_share": ranked[0][1],
                    f"{name}_margin": ranked[0][1] - ranked[1][1]})
    return out


def _clear(h: dict) -> bool:
    """No near-tie decides this feature's label: winners clear of the runner-up and of the naming threshold, the
    strongest-firings cut clear of the next firing."""
    return (h["n_fires"] > 0 and h["cut_gap"] > 1e-4 and min(h["top_margin"], h["previous_margin"]) > 0.02
            and min(abs(h["top_share"] - CLEAR_SHARE), abs(h["previous_share"] - CLEAR_SHARE)) > 0.02)


def _check_against_hand(m, ts, acts_of, direction_of, layers):
    pairs = [(layer, f) for layer in layers for f in range(24)]
    got = feature_labels(m, ts, pairs, texts=TEXTS3, top=TOP)
    assert list(got.columns) == list(LABEL_COLUMNS) and got.attrs["source"] == "measured"
    assert [(int(a), int(b)) for a, b in zip(got["layer"], got["feature"])] == pairs
    strings = vocabulary_strings(m)
    alone = _each_alone(m)
    checked = 0
    for row in got.itertuples():
        h = _by_hand(m, alone, acts_of, row.layer, row.feature, TOP)
        assert row.frequency == pytest.approx(h["frequency"], abs=1e-9)
        assert row.block == row.layer + 1 and len(row.label) <= MAX_LABEL
        eff = (direction_of(row.layer, row.feature).detach().double() @ m.W_U.detach().double()).topk(2)
        promoted_clear = bool(eff.values[0] - eff.values[1] > 1e-3 * eff.values[0].abs())  # float64, relative gap
        if promoted_clear:
            assert row.promoted == strings[int(eff.indices[0])]
            assert row.promoted_logit == pytest.approx(float(eff.values[0]), rel=1e-4)
        if not _clear(h) or not promoted_clear:
            continue
        checked += 1
        assert (row.top_token, row.previous_token) == (h["top_token"], h["previous_token"])
        assert row.top_share == pytest.approx(h["top_share"], abs=1e-4)
        assert row.previous_share == pytest.approx(h["previous_share"], abs=1e-4)
        assert row.top_margin == pytest.approx(h["top_margin"], abs=1e-4)
        if h["top_share"] >= CLEAR_SHARE:  # the label names what the loop found
            assert quote_token(h["top_token"])[:4] in row.label
        if h["previous_share"] >= CLEAR_SHARE and h["previous_token"] != "(start)":
            assert "after " + quote_token(h["previous_token"])[:4] in row.label
    assert checked >= 6, f"only {checked} features had a clear label"
    return got


def test_per_layer_labels_match_a_loop_over_each_text_alone(model, per_layer):
    _check_against_hand(model, per_layer, lambda layer, x: per_layer[layer].encode(x).float(),
                        lambda layer, f: per_layer[layer].W_dec[f], [0, 1])


def test_clt_labels_match_a_loop_and_promote_the_summed_decoder(model, clt):
    L = clt.n_layers

    def direction(layer, f):  # every layer it writes to, one at a time
        return sum(clt.W_dec[layer][f, j - layer] for j in range(layer, L))

    got = _check_against_hand(model, clt, lambda layer, x: clt.encode_layer(layer, x).float(), direction, [0, 1])
    assert got.attrs["kind"] == "clt"


def test_a_batch_of_unequal_texts_measures_what_each_alone_would(model, per_layer):
    """Padding counts nowhere: the three texts together give what their concatenated loop gives, and one text
    alone gives its own numbers (not the batch's)."""
    pairs = [(1, f) for f in range(32)]
    together = feature_labels(model, per_layer, pairs, texts=TEXTS3, top=10_000)  # no cut: every firing counted
    n = [model.prepare_input(t)[0].shape[1] for t in TEXTS3]
    assert len(set(n)) == 3
    alone = [feature_labels(model, per_layer, pairs, texts=t, top=10_000) for t in TEXTS3]
    fires = sum(a["frequency"].to_numpy() * k for a, k in zip(alone, n))
    assert together["frequency"].to_numpy() * sum(n) == pytest.approx(fires, abs=1e-6)
    assert together["max_activation"].to_numpy() == pytest.approx(
        pd.concat([a["max_activation"] for a in alone], axis=1).max(axis=1).to_numpy(), abs=1e-5)


def test_the_label_rules():
    assert label_text(" Pl", 0.8, " Zorbin", 0.6, "ax", 0.01) == '" Pl" after " Zorbin" -> "ax"'
    assert label_text(" Pl", 0.8, " the", 0.1, "ax", 0.01) == '" Pl" -> "ax"'
    assert label_text(" Pl", 0.1, " Zorbin", 0.5, "ax", 0.01) == 'after " Zorbin" -> "ax"'
    assert label_text(" Pl", 0.1, "(start)", 0.5, "ax", 0.01) == 'at start -> "ax"'
    assert label_text(" Pl", 0.12, ",", 0.1, "ax", 0.01) == 'mixed " Pl" 12% -> "ax"'
    assert label_text(" Pl", 0.12, ",", 0.1, "ax", 0.25) == 'dense 25% -> "ax"'
    assert label_text(" B", 0.14, ",", 0.1, " book", 0.01, "repeat") == 'mixed " B" 14% (repeat) -> " book"'
    assert label_text(None, 0.0, None, 0.0, "ax", 0.0) == NEVER
    long = label_text(" Jonathanson", 0.9, " Mackintoshes", 0.9, " Wellingtons", 0.01)
    assert len(long) <= MAX_LABEL and long.startswith('" Jon') and "after" in long and "->" in long
    assert where_word(0.6, 0.3, 0.55, 0.05) == "repeat pair"
    assert where_word(0.6, 0.3, 0.2, 0.05) == "repeat"
    assert where_word(0.4, 0.3, 0.2, 0.05) == "" and where_word(0.6, 0.5, 0.2, 0.05) == ""


def test_tokens_are_quoted_safely():
    assert quote_token(" Pl") == '" Pl"'
    assert quote_token("\n\t\r") == '"↵⇥␍"'
    assert quote_token('say "hi"\\') == r'"say \"hi\"\\"'
    assert quote_token('say "hi"\\', 6) == r'"say \"…"'  # cut between characters, never inside an escape
    assert quote_token("a\u202eb\x00\u200b") == r'"a\u202eb\x00\u200b"'
    assert quote_token(" Jonathanson", 6) == '" Jona…"'
    with pytest.raises(ArgumentError, match="most"):
        quote_token("x", 1)


def test_a_feature_that_never_fires_says_so(model, per_layer):
    tc = per_layer[0]
    dead = {0: type(tc)(tc.d_model, tc.d_transcoder, tc.k, 0, info=tc.info)}
    with torch.no_grad():
        dead[0].load_state_dict(tc.state_dict(), strict=False)
        dead[0].b_enc[5] = -1e4  # never among the top k with a positive value
        dead[0].W_skip = None
    got = feature_labels(model, dead, [(0, 5), (0, 6)], texts=TEXTS3)
    assert got["label"].iloc[0] == NEVER and got["frequency"].iloc[0] == 0 and got["top_token"].iloc[0] == ""
    assert got["label"].iloc[1] != NEVER


@pytest.mark.unchecked_types
@pytest.mark.parametrize("kw, error, match", [
    (dict(features=[(0, 32)]), ArgumentError, r"features\[0\] feature=32 is out of range: .* 0\.\.31"),
    (dict(features=[(5, 0)]), ArgumentError, r"features\[0\] layer=5 .*layers are \[0, 1\]"),
    (dict(features=[(True, 0)]), ArgumentError, r"features\[0\] layer=True \(a bool\)"),
    (dict(features=[(0, 1.0)]), ArgumentError, r"features\[0\] feature=1.0 \(a float\) is not a whole number"),
    (dict(features=[0, 1]), ArgumentError, r"features\[0\]=0 \(a int\) is not a \(layer, feature\) pair"),
    (dict(features=[]), ArgumentError, "features is empty"),
    (dict(features="0,1"), ArgumentError, "not a list of"),
    (dict(n_texts=0), ArgumentError, r"n_texts=0 is out of range: n_texts is 1\.\.65536"),
    (dict(length=5000), ArgumentError, r"length=5000 is out of range: length is 1\.\.1024"),
    (dict(top=True), ArgumentError, r"top=True \(a bool\)"),
    (dict(seed=-1), ArgumentError, r"seed=-1 is out of range"),
    (dict(batch=0), ArgumentError, "batch=0"),
    (dict(texts=5), ArgumentError, "texts=5"),
    (dict(texts=[]), ArgumentError, "texts=.*non-empty list"),
    (dict(texts=TEXTS3, use_file="yes"), ArgumentError, "use_file='yes'"),
    (dict(transcoders=3), ArgumentError, "transcoders=3 .*TranscoderSet"),
    (dict(transcoders={0: "x"}), ArgumentError, r"transcoders\[0\] must be the Transcoder of layer 0"),
    (dict(kind="mlp"), AttributionGraphError, "kind must be one of"),
])
def test_bad_arguments_are_refused(model, per_layer, kw, error, match):
    kw = {"transcoders": per_layer, "features": [(0, 0)], "texts": TEXTS3, **kw}
    with pytest.raises(error, match=match):
        feature_labels(model, **kw)


def test_transcoders_of_another_width_are_refused(model, gpt4_tiny_mismatch=None):
    other = CrossLayerTranscoder(model.cfg.n_layers + 1, model.cfg.d_model, 8)
    with pytest.raises(TranscoderMismatchError, match="spans 3 layers"):
        feature_labels(model, other, [(0, 0)], texts=TEXTS3)
    assert issubclass(TranscoderMismatchError, SproutError)


def test_graph_labels_name_every_node(model, per_layer):
    g = si.attribution_graph(model, TEXTS["story"][:80], per_layer)
    feats = g.nodes[g.nodes.kind == "feature"]
    pairs = sorted({(int(a), int(b)) for a, b in zip(feats.layer, feats.feature)})
    table = feature_labels(model, per_layer, pairs, texts=TEXTS3)
    lab = graph_labels(g, model, per_layer, labels=table)
    assert len(lab) == len(g.nodes) and (lab.index == g.nodes.index).all()
    by = dict(zip(zip(table.layer, table.feature), table.label))
    for r, text in zip(g.nodes.itertuples(), lab):
        if r.kind == "feature":
            assert text == by[(r.layer, r.feature)]
        elif r.kind == "error":
            assert text == f"err L{r.layer} @{r.pos}"
        elif r.kind == "embedding":
            assert text == f"emb {quote_token(r.token)}"
        else:
            assert text == f"{quote_token(r.token)} p={r.logit_prob:.2f}"
    assert "\n" not in "".join(lab)
    with pytest.raises(AttributionGraphError, match="has no row for"):
        graph_labels(g, model, per_layer, labels=table.iloc[1:])


@pytest.mark.unchecked_types
def test_graph_labels_refuse_what_is_not_a_graph(model, per_layer):
    with pytest.raises(AttributionGraphError, match="graph=.* is not an AttributionGraph"):
        graph_labels("graph.json", model, per_layer)


@pytest.mark.acceptance  # the command end to end, the held-out sample (the corpus) read: about 10 s
def test_the_command_writes_labels_for_a_clt_folder_and_they_are_read_back(model, clt, tiny_checkpoint, tmp_path,
                                                                          capsys):
    from sprout_interp.features.labels import main

    clt.info.update(model_name="tiny", fingerprint=si.core.fingerprints.fingerprint(model))
    folder = save_clt(clt, tmp_path / "clt")
    args = ["--model", str(tiny_checkpoint), "--folder", str(folder), "--n-texts", "4", "--length", "32"]
    assert main(args) == 1  # no file yet: missing
    assert "missing or stale" in capsys.readouterr().out
    assert main(args + ["--write"]) == 0
    assert "wrote" in capsys.readouterr().out
    doc = json.loads((folder / "labels.json").read_text(encoding="utf-8"))
    assert doc["fingerprint"]["kind"] == "clt" and doc["n_tokens"] == 4 * 32
    assert main(args) == 0 and "fresh" in capsys.readouterr().out
    loaded = load_clt(model, folder)
    settings = dict(n_texts=4, length=32)
    fresh = feature_labels(model, loaded, None, use_file=False, **settings)
    held = feature_labels(model, loaded, None, **settings)
    assert held.attrs["source"] == "file" and fresh.attrs["source"] == "measured"
    assert list(held["label"]) == list(fresh["label"])
    assert held["frequency"].to_numpy() == pytest.approx(fresh["frequency"].to_numpy(), abs=1e-12)
    for col in ("top_share", "previous_share", "promoted_logit", "max_activation"):
        assert held[col].to_numpy() == pytest.approx(fresh[col].to_numpy(), abs=6e-4)
    assert held["top_margin"].isna().all()
    # another request (settings, or weights changed) is measured, not read
    assert feature_labels(model, loaded, [(0, 0)], n_texts=5, length=32).attrs["source"] == "measured"
    with torch.no_grad():
        loaded.W_dec[0].mul_(2)  # layer 0's features now promote through other weights
    assert feature_labels(model, loaded, [(0, 0)], **settings).attrs["source"] == "measured"
    assert feature_labels(model, loaded, [(1, 0)], **settings).attrs["source"] == "file"  # layer 1's are unchanged
    fp, table = read_labels(model, folder / "labels.json")
    assert len(table) == clt.n_layers * clt.d_transcoder and fp["settings"]["n_texts"] == 4
    (folder / "labels.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(TranscoderMismatchError, match="labels"):
        read_labels(model, folder / "labels.json")
    assert write_labels(model, loaded, tmp_path / "elsewhere", n_texts=2, length=16).is_file()
    # a second write keeps the layers whose weights did not change, word for word, and measures the changed one
    path = write_labels(model, loaded, tmp_path / "elsewhere", n_texts=2, length=16)
    before = json.loads(path.read_text(encoding="utf-8"))
    before["layers"]["1"]["label"][0] = "kept from the file"
    path.write_text(json.dumps(before), encoding="utf-8")
    with torch.no_grad():
        loaded.W_dec[0].mul_(0.5)
    after = json.loads(write_labels(model, loaded, tmp_path / "elsewhere", n_texts=2, length=16).read_text("utf-8"))
    assert after["layers"]["1"]["label"][0] == "kept from the file"
    assert after["fingerprint"] == labels_fingerprint(model, loaded, n_texts=2, length=16)
    fresh = feature_labels(model, loaded, [(0, f) for f in range(clt.d_transcoder)], n_texts=2, length=16,
                           use_file=False)
    assert after["layers"]["0"]["label"] == list(fresh["label"])
    assert write_labels(model, loaded, tmp_path / "elsewhere", n_texts=2, length=16, reuse=False) and \
        json.loads(path.read_text("utf-8"))["layers"]["1"]["label"][0] != "kept from the file"
