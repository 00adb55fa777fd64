"""The Attribution graph page's node card and subgraph pane.

:func:`node_card`: the node clicked last (any kind: feature, error node, embedding, logit) with its strongest inputs
and outputs as two ranked lists (:func:`sprout_interp.circuits.subgraph.node_edges`, over every edge of the graph);
a click on a row opens that node's card instead (and a feature's own card below). :func:`subgraph_pane`: the
pinned nodes and supernodes drawn on their own (:func:`sprout_interp.circuits.subgraph.subgraph`,
:func:`sprout_interp.plots.subgraph.subgraph_figure`), each edge's value the one chosen (the sum over every path
through unpinned nodes, the direct edges summed, or circuit-tracer's share), with the table of every edge.
The card's node is ``?node=<key>`` in the link, the value shown ``?sg_value=``. No tensor maths here.
"""
from __future__ import annotations

from collections.abc import Callable

import link
import scrolling
import show
import state
import streamlit as st

from sprout_interp.core.errors import SproutError

N_EDGES = 10  # rows in each of a node card's lists
VALUE_NAMES = {"total": "through the rest (sum over every path via unpinned nodes)",
               "weight": "direct edges (summed)", "share": "circuit-tracer's share of the target's input"}


@st.cache_data(max_entries=64, show_spinner=False)
def _edges(_graph, gkey: str, node: int, n: int):
    from sprout_interp.circuits.subgraph import node_edges

    return node_edges(_graph, node, n=n)


@st.cache_data(max_entries=32, show_spinner=False)
def _subgraph(_graph, gkey: str, pins: tuple, supers: tuple):
    from sprout_interp.circuits.subgraph import subgraph

    return subgraph(_graph, list(pins), {name: list(ms) for name, ms in supers})


def select(key: str) -> None:
    """Open node ``key``'s card (a click on the graph)."""
    st.session_state["ag_node"] = key


def _move(table_key: str, keys_shown: list[str], index_of: dict) -> None:
    """A row clicked in one of the card's lists: its node's card opens (a feature's own card too), and the page's
    'pin the node clicked last' offers it."""
    rows = ((st.session_state.get(table_key) or {}).get("selection") or {}).get("rows") or []
    if rows and 0 <= rows[0] < len(keys_shown) and keys_shown[rows[0]] in index_of:
        k = keys_shown[rows[0]]
        st.session_state["ag_node"] = k
        st.session_state["ag_clicked"] = k
        if k.startswith("f"):
            st.session_state["ag_card"] = k


def _list(df, keys: list[str], label: Callable[[str], str], drawn: set, this: str, side: str, index_of: dict):
    """One ranked list: the other end's name and key, block, position, the weight and its shares; clickable rows."""
    other = [keys[i] for i in df["node"]]
    # an edge is (target, source): into this node from a source, or out of it into a target
    pair = (lambda k: (index_of[this], index_of[k])) if side == "inputs" else (lambda k: (index_of[k], index_of[this]))
    view = df.assign(name=[label(k) for k in other], key=other,
                     drawn=[pair(k) in drawn for k in other])
    cols = ["rank", "name", "key", "weight", "share"] + \
        (["target_share"] if side == "outputs" else []) + ["drawn"]
    table_key = f"ag_nc_{side}_{this.replace('.', '_')}"  # a key a CSS class can name (a browser test finds it)
    st.dataframe(view[cols], hide_index=True, key=table_key, on_select=lambda: _move(table_key, other, index_of),
                 selection_mode="single-row", width="stretch",
                 column_config={
                     "rank": st.column_config.NumberColumn("#", width="small"),
                     "name": st.column_config.TextColumn("node", width="medium"),
                     "key": st.column_config.TextColumn("key", width="small"),
                     "weight": st.column_config.NumberColumn("weight", format="%+.4f",
                                                             help="adjacency[target, source]: the direct effect, in "
                                                                  "the target's units"),
                     "share": st.column_config.NumberColumn(
                         "share", format="percent",
                         help=f"of this node's summed |{'input' if side == 'inputs' else 'output'}| (signed)"),
                     "target_share": st.column_config.NumberColumn(
                         "of target", format="percent", help="of the target's summed |input| (circuit-tracer's "
                                                             "pctInput)"),
                     "drawn": st.column_config.CheckboxColumn("drawn", help="the graph above draws this edge"),
                 })


def node_card(graph, gkey: str, keys: list[str], index_of: dict, label: Callable[[str], str], drawn_edges=None,
              model_hint: str = "") -> None:
    """The card of the node clicked last (``?node=`` in the link): two ranked lists, its strongest inputs and
    outputs over every edge of the graph (``drawn_edges``: the page's drawn edges, ``source``/``target`` node
    indices, marked in a column)."""
    link.bind("node", "ag_node", lambda raw: raw if raw in index_of else None,
              valid="a node key of this graph (f<layer>.<pos>.<feature>, e<layer>.<pos>, t<pos> or l<token id>)")
    this = st.session_state.get("ag_node")
    if this not in index_of:
        st.session_state.pop("ag_node", None)
        st.caption("Click any node of the graph (a feature, an error node, an embedding or a logit) to see its "
                   "strongest inputs and outputs here.")
        return
    node = index_of[this]
    st.subheader(f"Node {this}: {label(this)}")
    try:
        with st.spinner("ranking the node's edges…"):
            ins, outs = _edges(graph, gkey, node, N_EDGES)
    except SproutError as err:
        st.error(f"Could not rank this node's edges: {state.md(err)}")
        return
    drawn = set()
    if drawn_edges is not None and len(drawn_edges):
        drawn = set(zip(drawn_edges["target"].astype(int), drawn_edges["source"].astype(int)))
    st.caption(f"Ranked by |weight| over **every edge of the graph** ({ins.attrs['count']:,} inputs, summed |input| "
               f"{ins.attrs['abs_sum']:.3f}; {outs.attrs['count']:,} outputs, summed |output| "
               f"{outs.attrs['abs_sum']:.3f}), not only the edges drawn above ('drawn' marks those). Weight: the "
               "direct effect in the target's units (a feature's pre-activation, a logit minus the mean logit). "
               "**Click a row to open that node's card.**")
    # the two lists one above the other, each the page's width (side by side, a 1280-px window's half column cut
    # their weights off)
    with st.container():
        st.markdown(f"**Strongest inputs** (top {len(ins)} of {ins.attrs['count']:,})")
        if len(ins):
            _list(ins, keys, label, drawn, this, "inputs", index_of)
        else:
            st.caption("None: an error node or an embedding reads nothing in the graph (it is a source).")
    with st.container():
        st.markdown(f"**Strongest outputs** (top {len(outs)} of {outs.attrs['count']:,})")
        if len(outs):
            _list(outs, keys, label, drawn, this, "outputs", index_of)
        else:
            st.caption("None: a logit node writes into nothing (it is a target)." if this.startswith("l") else
                       "None: no node of the graph reads what it writes (the logits read only the last position).")
    st.caption(f"Reproduce: `ins, outs = si.node_edges(g, {this!r}, n={N_EDGES})` (g: this graph{model_hint}; "
               f"{this} is node {node}).")


def subgraph_pane(graph, gkey: str, keys: list[str], index_of: dict, pins: list[str], supers: dict,
                  tokens: list[str], label: Callable[[str], str]) -> None:
    """The pinned nodes and supernodes (``supers``: ``{name: [keys]}``) on their own, with the edges between them
    (``?sg_value=`` picks the number an edge shows)."""
    from sprout_interp.plots.subgraph import subgraph_figure, subgraph_label

    st.subheader("Subgraph of the pinned nodes")
    groups = tuple((name, tuple(index_of[k] for k in ms if k in index_of)) for name, ms in supers.items())
    alone = tuple(index_of[k] for k in pins if k in index_of)
    if len(alone) + len(groups) < 2 and not any(len(ms) > 1 for _, ms in groups):
        st.caption("Pin two or more nodes (or group them into supernodes) to see them here on their own, with the "
                   "edges between them summed through the rest of the graph.")
        return
    link.bind("sg_value", "ag_sg_value", link.one_of(list(VALUE_NAMES)))
    st.session_state.setdefault("ag_sg_value", "total")
    value = st.radio("each edge shows", list(VALUE_NAMES), format_func=VALUE_NAMES.get, key="ag_sg_value",
                     horizontal=True)
    try:
        with st.spinner("summing the paths between the pinned nodes…"):
            nodes, edges = _subgraph(graph, gkey, alone, groups)
    except SproutError as err:
        st.error(f"Could not compute the subgraph: {state.md(err)}")
        return
    names = {int(r["id"]): (r["name"] if r["kind"] == "supernode" else subgraph_label(r)) for _, r in nodes.iterrows()}
    fig = subgraph_figure(nodes, edges, tokens, graph.n_layers, value=value,
                          title=f"subgraph: {len(nodes)} nodes; edges: {value}")
    if fig.layout.width is None:  # laid out to fit the page: drawn as wide as its column, as the graph above
        show.chart(fig, "subgraph", key="ag_subgraph", width="stretch")
    else:  # too many places to fit: its own width in a box that scrolls, opened on the last position
        scrolling.chart(fig, "subgraph", "ag_subgraph_box", fig.layout.xaxis.range[1], key="ag_subgraph")
    st.caption("**total**: the change of the target's input if the source's write were removed, summed over every "
               "path whose inner nodes are unpinned features (pinned nodes, error nodes and embeddings held; target "
               "units; a path through another pinned node is drawn as that path instead). **direct**: the graph's "
               "edges between them. **share**: circuit-tracer's subgraph view (direct edges as a share of the "
               "target's summed |input|; a supernode target averages its members'). A supernode sums its members' "
               "edges (its own inside edges dropped).")
    key_of = {int(r["id"]): (f"S:{r['name']}" if r["kind"] == "supernode" else keys[int(r["node"])])
              for _, r in nodes.iterrows()}
    table = edges.assign(source=edges["source"].map(names), source_key=edges["source"].map(key_of),
                         target=edges["target"].map(names), target_key=edges["target"].map(key_of))
    show.table(table[["source", "source_key", "target", "target_key", "total", "weight", "share"]],
               "subgraph edges", width="stretch", key="ag_sg_table",
               column_config={"source_key": "source key", "target_key": "target key",
                              "share": st.column_config.NumberColumn("share", format="percent")})
    sup = {name: [keys[i] for i in ms] for name, ms in groups}
    st.caption(f"Reproduce: `si.subgraph(g, {[keys[i] for i in alone]}, {sup})` (g: this graph; nodes by key).")
