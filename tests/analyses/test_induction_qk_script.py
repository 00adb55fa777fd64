"""analyses/induction_qk.py's judge: each part's verdict from its own numbers (hand-made tables, two texts)."""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
from conftest import analysis_script

pytestmark = pytest.mark.unit

CIRC = SimpleNamespace(prev_tokens=[(0, 0), (0, 2)], prev_layer=0, prev_head=0, induction_label="block 2 head 0 (layer 1)",
                       prev_label="block 1 head 0 (layer 0) + block 1 head 2 (layer 0)", summary=lambda: "")


def _cells(share_story=0.8, swapped_carried=1.0, query_own=8.0):
    rows = []
    for name, score, key_pos in (("Zorbin Plax", 10.0, 2), ("Dorrit Kalbeck", 8.0, 9)):
        carried = share_story * score
        rows += [dict(model="m", name=name, condition="induction", score=score, prob=0.6, key_pos=key_pos,
                      key_prev_from_copy=carried, key_prev_share=carried / score, key_via_L0H0=carried,
                      key_via_L0H2=0.0, query_own=query_own, query_prev=0.5),
                 dict(model="m", name=name, condition="swapped", score=2.0, prob=0.01, key_pos=key_pos,
                      key_prev_from_copy=swapped_carried, key_prev_share=0.5, key_via_L0H0=swapped_carried,
                      key_via_L0H2=0.0, query_own=1.0, query_prev=0.0),
                 dict(model="m", name=name, condition="copy", score=3.0, prob=0.0, key_pos=key_pos - 1,
                      key_prev_from_copy=0.2, key_prev_share=0.1, key_via_L0H0=0.2, key_via_L0H2=0.0,
                      query_own=1.0, query_prev=0.0)]
    return pd.DataFrame(rows)


def _removals(carrier_drop=-0.55, other_drop=-0.05, embed_drop=-0.58):
    rows = []
    for name, key_pos, q in (("Zorbin Plax", 2, 54), ("Dorrit Kalbeck", 9, 59)):
        base = 0.6
        for role, removed, change in (("nothing", "nothing", 0.0),
                                      ("a previous-token head at the key", f"block 1 head 0 (layer 0) at {key_pos}",
                                       carrier_drop),
                                      ("a previous-token head at the key", f"block 1 head 2 (layer 0) at {key_pos}", 0.1),
                                      ("another head at the key", f"block 1 head 1 (layer 0) at {key_pos}", other_drop),
                                      ("previous-token heads at the query", "…", 0.02),
                                      ("the query's embedding", f"embedding at {q}", embed_drop)):
            rows.append(dict(model="m", name=name, role=role, removed=removed, prob=base + change, prob_change=change,
                             score_change=10 * change, table_change=12 * change))
    return pd.DataFrame(rows)


def judged(**kw):
    mod = analysis_script("induction_qk")
    cells_kw = {k: kw.pop(k) for k in ("share_story", "swapped_carried", "query_own") if k in kw}
    measured = {"circuits": {"m": CIRC}, "cells": _cells(**cells_kw), "removals": _removals(**kw)}
    return {c.part.split(" ")[0]: c for c in mod.judge(measured)}


def test_every_part_holds():
    got = judged()
    assert [got[p].verdict for p in "12345"] == ["REPRODUCED"] * 5
    assert "80% (story)" in got["1"].brief and "-92% (story)" in got["3"].brief  # -0.55 of 0.6
    assert all(c.model == "m" and c.command.endswith("analyses/induction_qk.py") for c in got.values())


def test_each_part_falls_on_its_own_numbers():
    assert judged(share_story=0.3)["1"].verdict == "NOT reproduced"
    assert judged(share_story=0.3)["3"].verdict == "REPRODUCED"  # the removal is its own evidence
    assert judged(swapped_carried=6.0)["2"].verdict == "PARTLY"  # lower, but not below half
    assert judged(carrier_drop=-0.2)["3"].verdict == "PARTLY"  # specific (4x the other head), not half the weight
    assert judged(other_drop=-0.3)["3"].verdict == "PARTLY"  # big, but another head removed there does half as much
    assert judged(query_own=2.0)["4"].verdict == "NOT reproduced"
    assert judged(embed_drop=-0.1)["5"].verdict == "NOT reproduced"
    assert judged(embed_drop=-0.1)["4"].verdict == "REPRODUCED"
