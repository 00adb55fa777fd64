"""The induction head's QK attribution at a repeated name (circuits.induction_qk): the carried parts it reads from the
component tables, and the frozen-model change it gives for removing a head's write, checked against that head's
write computed directly from the cache."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sprout_interp.circuits.induction_qk import carried, induction_qk, removal_groups
from sprout_interp.circuits.qk_attribution import qk_maps
from sprout_interp.core.errors import ArgumentError
from sprout_interp.features.clt import load_clt

pytestmark = pytest.mark.unit

NAME, TEXT = "Tobin Vell", "At the gate stood Tobin Vell. The guards let him in, and the cook gave bread to Tobin Vell"


def _table(rows):
    df = pd.DataFrame(rows, columns=["pos", "via_layer", "via_head", "value"])
    df["via_layer"] = pd.array(df["via_layer"], dtype="Int64")
    df["via_head"] = pd.array(df["via_head"], dtype="Int64")
    return df


def test_carried_sums_the_rows_of_the_named_carriers():
    t = _table([(3, 0, 0, 2.0), (3, 0, 2, 0.5), (4, 0, 0, -0.25), (5, None, None, 7.0), (3, 1, 0, 100.0)])
    assert carried(t, [(0, 0)]) == 1.75
    assert carried(t, [(0, 0), (0, 2)]) == 2.25
    assert carried(t, [(0, 0), (0, 2)], pos=3) == 2.5
    assert carried(t, [(2, 0)]) == 0.0  # no row: nothing carried


def test_removal_groups_name_each_part():
    g = removal_groups(3, [(0, 0), (0, 2)], query_pos=9, key_pos=4)
    roles = [r for r, _ in g]
    assert roles == ["previous-token heads at the key", "a previous-token head at the key",
                     "a previous-token head at the key", "another head at the key", "previous-token heads at the query",
                     "the query's embedding"]
    assert g[3][1] == [("head", 0, 1, 4)] and g[-1][1] == [("embed", 9)]


@pytest.mark.acceptance  # three attributions and seven real-model removals on gpt-4: over the integration tier's 3 s
def test_on_gpt4_the_parts_add_up_and_a_removal_matches_the_heads_own_write(gpt4):
    got = induction_qk(gpt4, [(NAME, TEXT)], (1, 0), [(0, 0), (0, 2)])
    cells = got["cells"].set_index("condition")
    assert list(cells.index) == ["induction", "swapped", "copy"]
    cell = cells.loc["induction"]
    strs = gpt4.to_str_tokens(TEXT)
    q, k, j = int(cell.query_pos), int(cell.key_pos), int(cell.copy_pos)
    assert strs[q] == strs[j] == " T" and q == 22
    assert k == j + 1 and cells.loc["copy", "key_pos"] == j
    assert cell.key_prev_from_copy == pytest.approx(cell.key_via_L0H0 + cell.key_via_L0H2, abs=1e-9)
    _, cache = gpt4.run_with_cache(TEXT)
    assert cell.score == pytest.approx(float(cache["blocks.1.attn.hook_attn_scores"][0, 0, q, k]), abs=1e-4)
    assert cell.prob == pytest.approx(float(cache["blocks.1.attn.hook_pattern"][0, 0, q, k]), abs=1e-5)
    # the frozen model's change for removing head (0, h)'s write at the key: that write, z[k, h] @ W_O, taken out of
    # the key's stream, read through the frozen key map (patterns, norms and the feed-forward output held)
    maps = qk_maps(gpt4, 1, 0, gpt4.to_tokens(TEXT)[0], q, k)
    q_vec = maps["x_q"] @ maps["MQ"]
    rem = got["removals"].set_index("removed")
    for h in range(3):
        write = cache["blocks.0.attn.hook_z"][0, k, h].float() @ gpt4.W_O[0, h].float()
        direct = -float((write @ maps["MK"] @ q_vec).detach()) / maps["scale"]
        assert rem.loc[f"block 1 head {h} (layer 0) at {k}", "table_change"] == pytest.approx(direct, abs=2e-3)
    assert got["components"]["side"].tolist().count("key") == 8
    assert set(got["removals"]["name"]) == {NAME}
    # over gpt-4's shipped cross-layer transcoder: its features (each write carried on by later heads only) give
    # every part by position and carrier the same as the feed-forward outputs taken whole (no skip connection)
    clt = induction_qk(gpt4, [(NAME, TEXT)], (1, 0), [(0, 0), (0, 2)], transcoders=load_clt(gpt4))
    parts = ["score", "key_prev", "key_prev_from_copy", "key_via_L0H0", "key_via_L0H2", "key_stays", "query_stays",
             "query_own", "query_prev"]
    for c in parts:
        assert np.abs(got["cells"][c].to_numpy() - clt["cells"][c].to_numpy()).max() < 1e-3, c
    assert np.abs(got["removals"]["table_change"].to_numpy() - clt["removals"]["table_change"].to_numpy()).max() < 1e-3
    assert "feature" in set(clt["components"]["kind"])
    with pytest.raises(ArgumentError, match="prev_heads"):
        induction_qk(gpt4, [(NAME, TEXT)], (1, 0), [])
