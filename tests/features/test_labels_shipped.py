"""The shipped labels files (model/checkpoints/{gpt-4,sprout}/transcoders/labels.json) are small, complete and fresh:
their fingerprint is the one a default request makes now, their labels equal a fresh measurement for a sample of
features (where no near-tie decides the label), and on gpt-4 the labels name what a hand-written loop finds running
each held-out window alone through the model and its transcoder."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
import torch

import sprout_interp as si
from sprout_interp.core import loading
from sprout_interp.core.texts import held_out_for
from sprout_interp.features.labels import (
    CLEAR_SHARE,
    LABELS_FILE,
    MAX_LABEL,
    feature_labels,
    labels_fingerprint,
    read_labels,
)
from sprout_interp.features.pages import repeat_flags, vocabulary_strings
from sprout_interp.features.transcoder import input_hook, load_transcoders

MODELS = ["gpt-4", "sprout"]
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not all((Path(loading.SHIPPED_DIR) / n / "transcoders" / LABELS_FILE).is_file() for n in MODELS),
                       reason="the shipped transcoders' labels are not installed"),
]


@pytest.fixture(scope="module", params=MODELS)
def shipped(request):
    m = si.load(request.param)
    return m, load_transcoders(m)


def test_the_file_is_small_complete_and_its_fingerprint_matches(shipped):
    m, ts = shipped
    path = Path(ts.info["folder"]) / LABELS_FILE
    assert path.stat().st_size < 1_000_000
    fp, table = read_labels(m, path)
    assert len(table) == sum(tc.d_transcoder for tc in ts) == len(ts) * ts[0].d_transcoder
    assert table["label"].str.len().max() <= MAX_LABEL and not table["label"].str.contains("\n").any()
    assert fp == labels_fingerprint(m, ts)  # the default request: model, each layer's weights, the settings
    got = feature_labels(m, ts, [(0, 0), (len(ts) - 1, 5)])
    assert got.attrs["source"] == "file" and list(got["label"]) == [table["label"].iloc[0],
                                                                    table["label"].iloc[-ts[0].d_transcoder + 5]]


def _clear(row, bases) -> bool:
    """No near-tie decides this row's label: shares clear of their runner-ups and of every threshold, the promoted
    token clear of the second (relative gap over 1e-3)."""
    rb, cb = bases
    gaps = [row.top_margin, row.previous_margin, abs(row.top_share - CLEAR_SHARE),
            abs(row.previous_share - CLEAR_SHARE), abs(row.repeat_share - 0.5), abs(row.continued_share - 0.5),
            abs(row.repeat_share - 1.5 * rb), abs(row.continued_share - 2 * cb), abs(row.frequency - 0.1)]
    return row.frequency == 0 or (min(gaps) > 0.02 and row.promoted_margin > 1e-3 * abs(row.promoted_logit))


@pytest.mark.acceptance  # a fresh measurement over the held-out sample: 10-40 s
def test_the_file_equals_a_fresh_measurement(shipped):
    m, ts = shipped
    g = torch.Generator().manual_seed(1)
    d = ts[0].d_transcoder
    sample = [(layer, int(f)) for layer in ts.layers for f in torch.randperm(d, generator=g)[:12]]
    held = feature_labels(m, ts, sample)
    fresh = feature_labels(m, ts, sample, use_file=False)
    assert held.attrs["source"] == "file" and fresh.attrs["source"] == "measured"
    toks = held_out_for(m, n=32, length=128)
    seen, cont = repeat_flags(toks)
    bases = (float(seen.float().mean()), float(cont.float().mean()))
    n_tok = toks.numel()
    assert (held["frequency"] * n_tok).round().tolist() == (fresh["frequency"] * n_tok).round().tolist()
    for col in ("top_share", "previous_share", "repeat_share", "continued_share", "promoted_logit", "max_activation"):
        assert held[col].to_numpy() == pytest.approx(fresh[col].to_numpy(), abs=6e-4)
    clear = [i for i, r in enumerate(fresh.itertuples()) if _clear(r, bases)]
    assert len(clear) >= len(sample) // 3
    assert list(held["label"].iloc[clear]) == list(fresh["label"].iloc[clear])


@pytest.mark.acceptance  # 32 full forwards of gpt-4, one held-out window at a time
def test_gpt4_labels_name_what_a_loop_over_each_window_finds(gpt4):
    m = gpt4
    ts = load_transcoders(m)
    layer = 2
    toks = held_out_for(m, n=32, length=128)
    strings = vocabulary_strings(m)
    acts = []
    for w in toks:  # each window alone, a full forward
        _, cache = m.run_with_cache(w[None].to(m.device), names_filter=input_hook(layer))
        acts.append(ts[layer].encode(cache[input_hook(layer)][0] * m.blocks[layer].ln2.w).detach().float().cpu())
    acts = torch.stack(acts)  # (32, 128, d)
    table = feature_labels(m, ts, [(layer, f) for f in range(ts[layer].d_transcoder)])
    assert table.attrs["source"] == "file"
    checked = 0
    for f in range(ts[layer].d_transcoder):
        firings = sorted(((float(acts[s, p, f]), s, p) for s, p in zip(*torch.nonzero(acts[..., f] > 0).T.tolist())),
                         reverse=True)
        row = table.iloc[f]
        assert round(row["frequency"] * toks.numel()) == len(firings)
        if len(firings) <= 100 or firings[99][0] - firings[100][0] < 1e-3:
            continue  # only features whose strongest-100 cut no near-tie decides
        cur, prev = defaultdict(float), defaultdict(float)
        total = sum(v for v, _, _ in firings[:100])
        for v, s, p in firings[:100]:
            cur[strings[int(toks[s, p])]] += v / total
            prev[strings[int(toks[s, p - 1])] if p else "(start)"] += v / total
        (t1, s1), (_, s2) = (sorted(cur.items(), key=lambda kv: -kv[1]) + [("", 0.0)])[:2]
        (p1, q1), (_, q2) = (sorted(prev.items(), key=lambda kv: -kv[1]) + [("", 0.0)])[:2]
        if min(s1 - s2, q1 - q2) < 0.02:
            continue
        checked += 1
        assert (row["top_token"], row["previous_token"]) == (t1, p1)
        assert row["top_share"] == pytest.approx(s1, abs=6e-4) and row["previous_share"] == pytest.approx(q1, abs=6e-4)
        if s1 >= CLEAR_SHARE + 0.02:
            assert row["label"].startswith('"') or row["label"].startswith("after")
    assert checked >= 20
