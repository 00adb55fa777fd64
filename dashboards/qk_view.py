"""Why a head looks where it looks: one cell's QK attribution as a panel the Attention and the Attribution graph pages
open (beside ``show.py``, not in ``views/``: it is no page of its own).

The page binds the cell to its link and hands the panel a function that makes the attribution (a cached call of
``compute`` or ``graph_compute``: the library's ``qk_attribution``). The panel shows the pre-softmax score, the
query side and the key side as two ranked lists with the head that carried each component to its position, each
side summed by carrier head, and the largest (query component, key component) pairs. No tensor maths here.
"""
from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import qk_compute
import show
import state
import streamlit as st

from sprout_interp.circuits.heads import block_label, head_label

#: rows of each ranked list
TOP = 12

#: what a component is on the graph page, per kind of the graph's transcoders
_PER_LAYER_PARTS = ("With the graph's transcoders, as the graph's nodes: each feed-forward is its features, an error node "
                    "and the transcoder's decoder bias (constant) at each position.")
_CLT_PARTS = ("With the graph's cross-layer transcoder, as the graph's nodes: a feature of block b writes into the "
              "feed-forward output of block b and of every later block; its value on a row sums those writes, each "
              "carried on only by heads of blocks after the one it joins. Each feed-forward also has an error node and "
              "the CLT's decoder bias (constant) at each position.")


def take_cell_click(chart_key: str, query_key: str, key_key: str, open_key: str, T: int) -> None:
    """A click on a pattern's cell (``plots.picking.clickable_cells``, previous run) chooses that cell and opens the
    panel. Call before the panel's widgets are drawn."""
    clicked = show.take_click(chart_key)
    if clicked is not None and 0 <= clicked[1] <= clicked[0] < T:
        st.session_state[query_key], st.session_state[key_key] = int(clicked[0]), int(clicked[1])
        st.session_state[open_key] = True


def first_cell(cell: tuple[int, int] | None, T: int) -> tuple[int, int]:
    """The cell the panel opens on: ``cell`` (a text's first induction cell), else the last token on itself."""
    return (int(cell[0]), int(cell[1])) if cell is not None and 0 <= cell[1] <= cell[0] < T else (T - 1, T - 1)


def _where(strs: list[str], p: int) -> str:
    return f"{p} {state.plain(repr(strs[p]))}" if 0 <= p < len(strs) else str(p)


def _side(df, strs: list[str]) -> pd.DataFrame:
    """A side's ranked list as a person reads it: #, the component (what, and where it was written), the head that
    carried it to the position (``head_label`` without the layer: blocks count from 1), its value."""
    rows = df.head(TOP)
    what = []
    for k, lyr, f, p in zip(rows["kind"], rows["layer"], rows["feature"], rows["pos"]):
        part = ("embedding" if k == "embedding" else f"block {int(lyr) + 1} " + (
            "MLP" if k == "mlp" else f"feat. {int(f)}" if k == "feature" else k))
        what.append(f"{part} at {_where(strs, int(p))}")
    carried = ["— (never moved)" if pd.isna(v) else head_label(int(v), int(h), with_layer=False)
               for v, h in zip(rows["via_layer"], rows["via_head"])]
    return pd.DataFrame({"#": range(1, len(rows) + 1), "component": what, "carried by": carried,
                         "value": rows["value"].round(3).to_list()})


def _rows(n: int) -> int:
    """A table's height in pixels showing ``n`` rows and its header without a scroll bar."""
    return 35 * (n + 1) + 3


#: the ranked lists' column widths: the component and its carrier read in full beside the other side's list
_COLUMNS = {"#": st.column_config.NumberColumn(width=26), "value": st.column_config.NumberColumn(width=58, format="%.3f")}


def _carriers(df):
    return pd.DataFrame({"carried by": [c or "— (never moved)" for c in df["carrier"]],
                         "value": df["value"].round(3).to_list()})


def cell_panel(strs: list[str], layer: int, head: int, query_key: str, key_key: str, open_key: str,
               attribute: Callable[[int, int, int, int], dict], where: str = "the text",
               how: str = "click a cell of the pattern, or choose it here",
               parts: str = "Each feed-forward's whole output at a position is one component.") -> None:
    """The QK-attribution panel for head ``head`` of block ``layer`` (0-indexed): an expander (open while
    ``st.session_state[open_key]``) with the query and key positions (widgets ``query_key``, ``key_key``, bound to the
    link by the page) and, when open, ``attribute(layer, head, query, key)`` (a dict as
    ``compute.qk_attribution`` returns) drawn as the score, the two ranked lists, the sides by carrier head and the
    top pairs. ``strs``: the tokens of the prompt the positions index; ``where`` names it, ``how`` says how a cell is
    chosen, ``parts`` what a component is."""
    T = len(strs)
    who = head_label(layer, head)
    st.session_state.setdefault(open_key, False)
    with st.expander(f"why {who} looks where it looks: the QK attribution of one cell ({how})", key=open_key,
                     on_change="rerun") as box:
        if not box.open:
            return
        state.remember(query_key, T - 1, 0, T - 1)
        state.remember(key_key, 0, 0, T - 1)
        c = st.columns(2)
        q = int(c[0].number_input(f"query position (0–{T - 1})", 0, T - 1, key=query_key,
                                  help="the token attending: a row of the pattern"))
        if st.session_state[key_key] > q:
            st.session_state[key_key] = q
        k = int(c[1].number_input(f"key position (0–{q})", 0, q, key=key_key,
                                  help="the token attended to: a column of the pattern, at or before the query"))
        with st.spinner("attributing the score…"), state.shown_errors("the QK attribution"):
            a = attribute(layer, head, q, k)
        st.markdown(f"**{state.md(who)}**, query {state.md(_where(strs, q))} → key {state.md(_where(strs, k))} "
                    f"of {where}: pre-softmax score **{a['score']:.3f}** (`blocks.{layer}.attn.hook_attn_scores`).")
        left, right = st.columns(2)
        with left:
            st.markdown(f"**Query side** (the stream at {state.md(_where(strs, q))} entering {block_label(layer)})")
            show.table(_side(a["query_components"], strs), "QK query side", column_config=_COLUMNS, height=_rows(TOP))
            st.caption("by carrier head")
            show.table(_carriers(a["query_by_head"]), "QK query side by carrier")
        with right:
            st.markdown(f"**Key side** (the stream at {state.md(_where(strs, k))} entering {block_label(layer)})")
            show.table(_side(a["key_components"], strs), "QK key side", column_config=_COLUMNS, height=_rows(TOP))
            st.caption("by carrier head")
            show.table(_carriers(a["key_by_head"]), "QK key side by carrier")
        st.markdown("**Top pairs** (query component × key component: their product term; the last row is every other "
                    "pair)")
        show.table(a["terms"][["query", "key", "term"]].round(3), "QK top pairs", height=_rows(len(a["terms"])))
        st.caption(f"Exact with the attention patterns and every norm's scale frozen on this prompt (the score is then "
                   f"a bilinear form of the two streams): each side's values add up to the score (the frozen score "
                   f"{a['info'].get('score_frozen', float('nan')):.3f}). A component's value is the score with it alone "
                   f"on its side and the whole other side. 'carried by': the attention head that last moved it to the "
                   f"position, blocks counted from 1 as the chapter does (block = layer + 1; labels such as L0H2 give the "
                   f"0-indexed layer of code); '— (never moved)': written at the position itself. MLP: a block's "
                   f"feed-forward; feat.: a transcoder feature. {parts}")


def graph_section(m, key: str, graph, gkey: str, nodes_all: pd.DataFrame, edges: pd.DataFrame, keys: list[str],
                  label: Callable[[str], str], induction: tuple[int, int] | None, cell: tuple[int, int] | None) -> None:
    """The Attribution graph page's part: the head-carried edges into the node clicked last (each edge split by the
    head that carried it, ``head_loadings``), one of which opens the QK attribution of its carrier head at the cell
    (the target's position, the source's position); or a head and a cell chosen. Positions are the graph's (its
    prompt with ``<|endoftext|>`` first). The page binds the widgets ``ag_qk_*`` to its link first. ``cell``: the
    cell the panel opens on (the text's first repeat, in the graph's positions), ``induction``: the head it opens
    on."""
    L, H = m.cfg.n_layers, m.cfg.n_heads
    strs = [str(t) for t in nodes_all["token"].values[graph.n_features + graph.n_errors:
                                                       graph.n_features + graph.n_errors + graph.n_pos]]
    P = len(strs)
    state.remember("ag_qk_layer", induction[0] if induction else min(1, L - 1), 0, L - 1)
    state.remember("ag_qk_head", induction[1] if induction else 0, 0, H - 1)
    start = first_cell(cell, P)
    st.session_state.setdefault("ag_qk_query", start[0])
    st.session_state.setdefault("ag_qk_key", start[1])

    target = st.session_state.get("ag_clicked")
    idx = {k: i for i, k in enumerate(keys)}
    if target in idx and nodes_all.iloc[idx[target]]["kind"] != "embedding":
        t = idx[target]
        t_pos = int(nodes_all.iloc[t]["pos"])
        pos = nodes_all["pos"].to_numpy()
        into = edges[(edges["target"] == t) & (pos[edges["source"].to_numpy()] != t_pos)]
        into = into.reindex(into["weight"].abs().sort_values(ascending=False).index).head(8)
        if into.empty:
            st.caption(f"No drawn edge into {state.md(label(target))} comes from another position, so no head "
                       "carried one: click another node, or choose a head and a cell below.")
        else:
            with st.spinner("splitting the edges by the head that carried them…"), \
                    state.shown_errors("the head loadings"):
                load = qk_compute.edge_loadings(m, key, graph, gkey,
                                                tuple((int(t), int(s)) for s in into["source"]))
            load = load[load["via_layer"].notna()]
            rows = load.reindex(load["value"].abs().sort_values(ascending=False).index)
            table = pd.DataFrame({"from": [label(keys[int(s)]) for s in rows["source"]],
                                  "carried by": list(rows["carrier"]), "part of the edge": rows["value"].round(4).to_list(),
                                  "edge": rows["edge"].round(4).to_list()})
            st.markdown(f"**Edges into {state.md(label(target))}** (the node clicked last) from other positions, split "
                        "by the attention head that carried each last (head loadings; each edge's parts add up to it):")
            show.table(table, "head-carried edges")
            choices = list(range(len(rows)))
            pick = st.selectbox("open the QK attribution of a carrier head at the cell (this node's position, the "
                                "source's position)", choices, index=None, key="ag_qk_edge",
                                format_func=lambda i: f"{table['carried by'].iloc[i]}: {table['from'].iloc[i]} → "
                                                      f"{label(target)}")
            if pick is not None and st.session_state.get("_ag_qk_edge_taken") != (target, pick):
                st.session_state["_ag_qk_edge_taken"] = (target, pick)
                r = rows.iloc[pick]
                st.session_state["ag_qk_layer"], st.session_state["ag_qk_head"] = int(r["via_layer"]), int(r["via_head"])
                st.session_state["ag_qk_query"] = t_pos
                st.session_state["ag_qk_key"] = min(int(nodes_all.iloc[int(r["source"])]["pos"]), t_pos)
                st.session_state["ag_qk_open"] = True
    else:
        st.caption("Click a feature, error or logit node in the graph to list the edges into it that an attention head "
                   "carried from another position; or choose a head and a cell here.")
    c = st.columns(2)
    layer = c[0].selectbox("block", list(range(L)), format_func=block_label, key="ag_qk_layer")
    head = c[1].selectbox("head", list(range(H)), key="ag_qk_head")
    cell_panel(strs, int(layer), int(head), "ag_qk_query", "ag_qk_key", "ag_qk_open",
               lambda lyr, hd, q, k: qk_compute.graph_qk(m, key, graph, gkey, lyr, hd, q, k),
               where="the graph's prompt (<|endoftext|> first), with the graph's transcoders",
               how="choose the head above and the cell here, or a head-carried edge",
               parts=_CLT_PARTS if graph.info.get("transcoder_kind") == "clt" else _PER_LAYER_PARTS)

