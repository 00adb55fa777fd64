"""Why the induction head looks at the token after a name's first occurrence: its QK attribution at the name's second
occurrence (:func:`~sprout_interp.circuits.qk_attribution.qk_attribution`), the part of its key carried there by the
previous-token head(s), the same numbers on control cells, and each part checked by removing writes in the real
model (:func:`~sprout_interp.circuits.head_writes.remove_writes`).

The chapter's story: a previous-token head writes into every token which token stood before it; at a name's second
occurrence the induction head's query (the current token) matches the key of the token that followed the name's
first occurrence, because the previous-token head carried the earlier copy of the current token there. So on the
key side, the part carried by the previous-token head from the earlier copy's position should make most of the
score; on the query side, the current token itself (written at the query position and never moved).

Cells (:func:`~sprout_interp.circuits.head_writes.name_cells`): the query is the earliest token of the name's second
occurrence with a copy in its first; the key the token after that copy. Controls, the same query: ``swapped``, the
same cell with the earlier copy replaced by another token (the key's own token unchanged, nothing before it matching
the query); ``copy``, the earlier copy itself as the key (the same token as the query, but not after it).

Scores are pre-softmax attention scores (``hook_attn_scores``), probabilities attention weights (``hook_pattern``);
layers 0-indexed, block = layer + 1, positions 0-based.
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from sprout_interp.circuits.head_writes import name_cells, remove_writes, swap_token
from sprout_interp.circuits.heads import Head, head_label, heads_label
from sprout_interp.circuits.qk_attribution import QKAttribution, component_label, qk_attribution
from sprout_interp.core.arguments import check_index, describe
from sprout_interp.core.errors import ArgumentError
from sprout_interp.core.hooked import as_hooked

__all__ = ["CONDITIONS", "carried", "induction_qk", "cell_row", "removal_groups"]

#: the cells measured per text: the induction cell and its two controls
CONDITIONS = ("induction", "swapped", "copy")


def carried(components: pd.DataFrame, heads: Sequence[Head], pos: int | None = None) -> float:
    """The summed ``value`` of a component table's rows last carried by any of ``heads`` (and written at ``pos``
    when given): the part of that side's score those heads brought to its position."""
    via = set(map(tuple, heads))
    keep = [not pd.isna(vl) and (int(vl), int(vh)) in via for vl, vh in zip(components["via_layer"], components["via_head"])]
    rows = components[keep]
    if pos is not None:
        rows = rows[rows["pos"] == pos]
    return float(rows["value"].sum())


def _stays(components: pd.DataFrame, pos: int) -> float:
    """What was written at ``pos`` and never left it."""
    return float(components.loc[components["via_layer"].isna() & (components["pos"] == pos), "value"].sum())


def cell_row(a: QKAttribution, prev_heads: Sequence[Head], copy_pos: int) -> dict:
    """One cell's numbers: ``score``; on the key side ``key_prev`` (carried by the previous-token head(s), from any
    position), ``key_prev_from_copy`` (from ``copy_pos``), one ``key_via_L{l}H{h}`` per previous-token head (from
    ``copy_pos``), ``key_stays`` (written at the key and never moved), ``key_top`` (its largest component); on the
    query side ``query_stays`` (written at the query and never moved), ``query_own`` (written at the query: the
    current token, by any route, e.g. a head attending to its own position), ``query_prev`` (carried by the
    previous-token heads) and ``query_top``; and
    ``key_prev_share`` = key_prev_from_copy / score."""
    kc, qc = a.key_components, a.query_components
    row = dict(score=a.score, key_prev=carried(kc, prev_heads), key_prev_from_copy=carried(kc, prev_heads, copy_pos))
    for lh in prev_heads:
        row[f"key_via_L{lh[0]}H{lh[1]}"] = carried(kc, [lh], copy_pos)
    row.update(key_stays=_stays(kc, a.key_pos), query_stays=_stays(qc, a.query_pos),
               query_own=float(qc.loc[qc["pos"] == a.query_pos, "value"].sum()),
               query_prev=carried(qc, prev_heads),
               key_top=_top(kc), query_top=_top(qc))
    row["key_prev_share"] = row["key_prev_from_copy"] / a.score if a.score else float("nan")
    return row


def _top(components: pd.DataFrame) -> str:
    if components.empty:
        return ""
    r = components.iloc[0]
    name = component_label(r["kind"], int(r["layer"]), int(r["pos"]), r["token"], int(r["feature"]), r["via_layer"],
                           r["via_head"])
    return f"{name} = {r['value']:.2f}"


def removal_groups(n_heads: int, prev_heads: Sequence[Head], query_pos: int, key_pos: int) -> list[tuple[str, list]]:
    """The writes removed in the real model, each group with its role: the previous-token heads at the key together
    and each alone (the key side), every other head of their blocks at the key, one by one (specificity), the
    previous-token heads at the query (the query side gets no part of theirs from the earlier copy), and the
    query's own embedding (the query side's own token)."""
    prev = [tuple(h) for h in prev_heads]
    groups: list[tuple[str, list]] = []
    if len(prev) > 1:
        groups.append(("previous-token heads at the key", [("head", l, h, key_pos) for l, h in prev]))
    for l, h in prev:
        groups.append(("a previous-token head at the key", [("head", l, h, key_pos)]))
    for l in sorted({l for l, _ in prev}):
        for h in range(n_heads):
            if (l, h) not in prev:
                groups.append(("another head at the key", [("head", l, h, key_pos)]))
    groups.append(("previous-token heads at the query", [("head", l, h, query_pos) for l, h in prev]))
    groups.append(("the query's embedding", [("embed", query_pos)]))
    return groups


def _predicted(a: QKAttribution, group: list) -> float:
    """The frozen model's score change for removing ``group`` (every component it holds; exact with norms frozen)."""
    out = 0.0
    for w in group:
        if w[0] == "head":
            side = a.key_components if w[3] == a.key_pos else a.query_components if w[3] == a.query_pos else None
            if side is not None:
                out -= carried(side, [(w[1], w[2])])
        elif w[0] == "embed":
            for side, p in ((a.key_components, a.key_pos), (a.query_components, a.query_pos)):
                if w[1] == p:
                    out -= float(side.loc[(side["kind"] == "embedding") & (side["pos"] == p), "value"].sum())
    return out


def induction_qk(model, texts: Sequence[tuple[str, str]], induction: Head, prev_heads: Sequence[Head],
                 transcoders=None, n_components: int = 8) -> dict[str, pd.DataFrame]:
    """The induction head's QK attribution at each text's induction cell and its controls, and the removals.

    Args:
        texts: (name, text) pairs, each text with ``name`` twice (its first cell is measured).
        induction: the induction head (layer, head); prev_heads: the previous-token head(s), in earlier blocks.
        transcoders: as :func:`qk_attribution` takes (None: each feed-forward's output is one component).
        n_components: rows of each side kept per induction cell in ``components``.

    Returns {"cells": one row per text and condition (``CONDITIONS``): name, condition, query_pos, key_pos,
    copy_pos, query_token, key_token, prob (attention weight at the cell) and :func:`cell_row`'s columns;
    "components": the largest ``n_components`` rows of each side at each induction cell (``side`` "key" or
    "query", :func:`qk_attribution`'s columns, a ``carrier`` label); "removals": one row per text and removed group
    (:func:`removal_groups`): role, removed, score, prob, score_change, prob_change (real model) and
    ``table_change`` (the attribution's change for the same removal, norms frozen)}. ``attrs``: induction, prev
    (labels)."""
    m = as_hooked(model)
    L = check_index(induction[0], "induction layer", m.cfg.n_layers, what="this model's blocks, 0-indexed")
    H = check_index(induction[1], "induction head", m.cfg.n_heads, what=f"this model's {m.cfg.n_heads} heads")
    prev = [(check_index(l, "prev_heads layer", L, what=f"a block before the induction head's, 0..{L - 1}"),
             check_index(h, "prev_heads head", m.cfg.n_heads)) for l, h in prev_heads]
    if not prev:
        raise ArgumentError(f"prev_heads={describe(prev_heads)} is empty: pass the previous-token head(s)")
    cells, comps, removals = [], [], []
    for name, text in texts:
        c = name_cells(m, text, name).iloc[0]
        q, k, j = int(c.query_pos), int(c.key_pos), int(c.copy_pos)
        swapped = swap_token(m, text, j)
        strs = m.to_str_tokens(text)
        base = dict(name=name, query_pos=q, copy_pos=j, query_token=strs[q])
        for cond, inp, key in (("induction", text, k), ("swapped", swapped, k), ("copy", text, j)):
            a = qk_attribution(m, inp, L, H, q, key, transcoders, n_components=n_components)
            groups = removal_groups(m.cfg.n_heads, prev, q, key) if cond == "induction" else []
            rw = remove_writes(m, inp, L, H, q, key, [g for _, g in groups])
            key_token = m.to_str_tokens(a.tokens[key:key + 1])[0]
            cells.append({**base, "condition": cond, "key_pos": key, "key_token": key_token, "prob": float(rw["prob"].iloc[0]),
                          **cell_row(a, prev, j)})
            if cond != "induction":
                continue
            for side, t in (("key", a.key_components), ("query", a.query_components)):
                top = t.head(n_components).copy()
                top.insert(0, "side", side)
                top["carrier"] = [("" if pd.isna(vl) else head_label(int(vl), int(vh))) for vl, vh in
                                  zip(top["via_layer"], top["via_head"])]
                comps.append(top.assign(name=name))
            roles = ["nothing"] + [r for r, _ in groups]
            preds = [0.0] + [_predicted(a, g) for _, g in groups]
            removals.append(rw.assign(name=name, role=roles, table_change=preds))
    out = {"cells": pd.DataFrame(cells), "components": pd.concat(comps, ignore_index=True),
           "removals": pd.concat(removals, ignore_index=True)}
    for df in out.values():
        df.attrs.update(induction=head_label(L, H), prev=heads_label(prev))
    return out
