"""Attribution graph: which transcoder features, error nodes and tokens write the prediction, as a graph."""
from __future__ import annotations

import hashlib
import re

import compute
import graph_cards
import graph_compute
import graph_export
import graph_hover
import link
import precomputed
import qk_compute
import qk_view
import scrolling
import show
import state
import streamlit as st

from sprout_interp.core.errors import TranscoderNotFoundError
from sprout_interp.core.texts import TEXTS
from sprout_interp.plots.common import show_token
from sprout_interp.plots.features import contexts_html, logit_effect_chart
from sprout_interp.plots.graph import KIND_CODES, attribution_graph_figure, group_nodes, node_key, shown_labels

state.header(
    "Attribution graph",
    "Circuit tracing (Ameisen et al. 2025, circuit-tracer): every block's feed-forward is replaced by its "
    "transcoder, plus an *error node* per block and position for what the transcoder misses, and the attention "
    "patterns and norm scales are frozen on this prompt; the model is then linear, and every edge is the exact "
    "direct effect of one node on another. Nodes: active transcoder **features** (circles), **error nodes** "
    "(grey squares), the **token embeddings** (triangles, bottom) and the **logits** of the most probable next "
    "tokens (stars, top). Pruning keeps the nodes that carry most of the influence on the logits.",
)
m, key, text, toks = state.page_inputs()
strs = compute.str_tokens(m, key, text)
T = len(strs)
MAX_FEATURES = [512, 1024, 2048, 4096, 8192]  # the first, GRAPH's, precomputed for the default text (below)
MAX_EDGES = 600  # the strongest edges drawn (thousands of faint lines hide the graph)
N_LABELS = 16  # the most influential nodes labelled on the graph (more crowd it; every node's label is in its hover)
# a prompt of at most this many tokens is graphed on the page's first load (the chapter's 57 tokens: the page in
# 2.6 s beside a training run); a longer one (its cost grows with its positions: 8 s for 197 tokens of Sprout) once
# asked (benchmarks/dashboard_interaction.py --pages graph)
AUTO_TOKENS = 96

with st.expander("open a saved graph file (.safetensors, or circuit-tracer's .json)"):
    up = st.file_uploader("a graph written by graph.save(path), si.save_graph_json or this page's downloads",
                          type=["safetensors", "json"], key="ag_upload", max_upload_size=512)
if up is not None and up.name.lower().endswith(".json"):  # circuit-tracer's frontend JSON: a read-only view
    graph_export.show_upload(up.getvalue(), up.name)
    state.stop()
graph, gkey, seconds, own, pre = None, "", None, True, None
if up is not None:
    data = up.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    with st.spinner("reading the graph file…"), state.shown_errors("the uploaded graph"):
        graph = graph_compute.uploaded_graph(digest, data)
    gkey, own = f"upload:{digest}", graph.info.get("model_name") == (m.name or "")
    st.info(f"Showing the uploaded graph ({state.md(up.name)}: {state.md(graph)}). Remove the file above to compute "
            "one for the text in the sidebar." + ("" if own else " It was made with another model than the one in "
                                                  "the sidebar, so its features have no pages here."))
else:
    try:
        kinds = graph_compute.graph_kinds(m, key)  # the kinds of transcoders shipped, the best (the default) first
        if not kinds:
            raise TranscoderNotFoundError("neither <checkpoint>/transcoders/ nor <checkpoint>/clt/ is beside it")
    except TranscoderNotFoundError as err:
        st.info(f"**{state.md(m.name or key)} has no transcoders**, so no attribution graph can be made for it: a graph "
                "replaces every block's feed-forward with its transcoder. The shipped **sprout** and **gpt-4** come "
                "with theirs: choose one of them in the sidebar (or open a saved graph file above). To train "
                "transcoders for this checkpoint: `python -m sprout_interp.features.transcoder_train --model "
                f"<name or path>` (details: {state.md(err)})")
        state.stop()
    except Exception as err:  # a damaged transcoder folder
        st.error(f"Could not read this model's transcoders: {state.md(err)}")
        state.stop()
    hi = min(T, m.cfg.n_ctx - 1)  # <|endoftext|> goes first
    if hi < 1:
        st.warning("The text is too short for a graph: type a longer text.")
        state.stop()
    first = graph_compute.graph_end(strs)
    link.bind("end", "ag_end", link.int_in(1, hi))
    link.bind("max_features", "ag_max", link.one_of(MAX_FEATURES))
    state.remember("ag_end", min(first or hi, hi), 1, hi)
    st.session_state.setdefault("ag_max", precomputed.GRAPH["max_features"])
    c = st.columns([2, 1])
    end = int(c[0].number_input(f"the prompt: the text's first N tokens (1 … {hi}); the graph explains what the "
                                "model predicts next", min_value=1, max_value=hi, step=1, key="ag_end"))
    max_features = c[1].selectbox("feature nodes (at most)", MAX_FEATURES, key="ag_max",
                                  help="circuit-tracer's max_feature_nodes: the features of most influence on the "
                                       "logits are kept (their rows computed first); the rest's effect is kept as "
                                       "each node's 'dropped' value, so the graph stays exact.")
    if len(kinds) > 1:
        link.bind("kind", "ag_kind", link.one_of(kinds))
        c[1].selectbox("transcoders", kinds, key="ag_kind", format_func=graph_compute.KIND_LABELS.get,
                       help="what replaces the feed-forwards: the first is the model's best (the higher held-out "
                            "FVE), si.attribution_graph's default; a cross-layer transcoder's features write to "
                            "their own and every later block (docs: Attribution graphs, Cross-layer transcoders)")
    else:
        st.session_state["ag_kind"] = kinds[0] if kinds else None
    nxt = f", the text goes on with {state.md(repr(strs[end]))}" if end < T else ""
    st.caption(f"Prompt: tokens 0 … {end - 1}, ending {state.md(repr(''.join(strs[max(0, end - 6):end])))}{nxt}. "
               + ("The first view stops where a name comes back: its second word, which the model should copy."
                  if first == end else ""))
    # asked: the button, or a link with graph=1 or with a view of a graph (pins, supernodes, a card)
    link.bind("graph", "ag_go", link.as_bool, link.fmt_bool)
    if any(p in st.query_params for p in ("pin", "super", "card")):
        st.session_state["ag_go"] = True
    if end > AUTO_TOKENS and not st.session_state.get("ag_go"):
        st.info(f"**A prompt of {end} tokens is graphed when you ask.** The graph's cost grows with the prompt's "
                f"length (every position has error nodes and features, each a row of the graph): for Sprout on two CPU "
                f"cores beside a training run, about 2.6 s for the chapter's 57 tokens, 8 s for 197 tokens. Prompts of up to {AUTO_TOKENS} "
                "tokens are graphed at once; this one after the button (or from a link with `graph=1`), and then "
                "again by itself whenever the prompt changes.")
        st.button("compute the attribution graph", key="ag_go_btn", type="primary",
                  on_click=lambda: st.session_state.__setitem__("ag_go", True))
        state.stop()
    # the default text's first view was computed beside the checkpoint (precomputed.GraphView: everything the page
    # draws until a person asks for more); the graph itself is computed once something needs it (full_graph)
    pre = graph_compute.shipped_graph(m, key, text, end, int(max_features), graph_compute.graph_kind())
    if pre is None:
        with st.spinner(f"computing the attribution graph of {end} tokens (a few seconds on two CPU cores for the "
                        "chapter's 57 tokens, longer for a long prompt; then kept for every threshold)…"), \
                state.shown_errors("the graph"):
            graph, seconds = graph_compute.attribution_graph(m, key, text, end, int(max_features),
                                                             graph_compute.graph_kind())
    else:
        graph = pre
    gkey = f"{key}|{end}|{max_features}|{graph_compute.graph_kind()}|{hashlib.sha256(text.encode()).hexdigest()}"


def full_graph(spinner: bool = True):
    """The attribution graph itself: the one drawn, or, when the first view was read from the checkpoint's folder,
    computed now (once; then cached like any graph the page computes)."""
    if pre is None:
        return graph

    def made():
        return graph_compute.attribution_graph(m, key, text, end, int(max_features), graph_compute.graph_kind())[0]

    if not spinner:  # a download's data, made after the page was drawn
        return made()
    with st.spinner(f"computing the attribution graph of {end} tokens (the first view was read from the checkpoint's "
                    "folder; the graph itself is needed now)…"), state.shown_errors("the graph"):
        return made()


if pre is not None:
    influence, replacement, completeness = pre.influence, pre.replacement, pre.completeness
else:
    with st.spinner("measuring each node's influence…"), state.shown_errors("the graph's scores"):
        influence, replacement, completeness, _ = graph_compute.graph_influence(graph, gkey)
nodes_all = graph.nodes
keys = [node_key(r.kind, r.layer, r.pos, r.feature, r.token_id) for r in nodes_all.itertuples()]
index_of = dict(zip(keys, range(len(keys))))
tokens = list(nodes_all["token"].values[graph.n_features + graph.n_errors:graph.n_features + graph.n_errors + graph.n_pos])
L, P = graph.n_layers, graph.n_pos
logits = nodes_all[nodes_all["kind"] == "logit"]

k = st.columns(5)
k[0].metric("nodes", f"{len(nodes_all):,}", help=f"{graph.n_features:,} features, {graph.n_errors:,} error nodes, "
                                               f"{P} embeddings, {graph.n_logits} logits")
k[1].metric("top logit", repr(str(logits["token"].iloc[0])),
            f"p = {float(logits['logit_prob'].iloc[0]):.2f}", delta_color="off")
k[2].metric("replacement score", f"{replacement:.3f}", help="circuit-tracer's: the share of the tokens' and error "
                                                           "nodes' influence on the logits that starts at tokens")
k[3].metric("completeness score", f"{completeness:.3f}", help="circuit-tracer's: the share of each node's input "
                                                             "that comes from non-error nodes, weighted by influence")
k[4].metric("computed in", f"{seconds:.1f} s" if seconds is not None else "(from file)",
            help="(from file): the graph file uploaded, or the default text's first view, computed beside the "
                 "checkpoint by scripts/precompute_dashboard.py (graph_view.json); the graph itself is computed when "
                 "a threshold, a pin, a node's card, a QK attribution or a download needs it" if seconds is None
            else None)
if own and up is None:
    named = next((n for n, t in TEXTS.items() if t == text), None)
    src = f"TEXTS[{named!r}]" if named else repr(text if len(text) <= 300 else text[:300] + "…")
    imp = "from sprout_interp.core.texts import TEXTS; " if named else ""
    cmd = (f"python -c \"import sprout_interp as si; {imp}m = si.load({m.name or key!r}); "
           f"g = si.attribution_graph(m, m.to_tokens({src})[0, :{end}], max_feature_nodes={max_features}); "
           "print(g, si.graph_scores(g))\"")
    st.caption("The scores and the node counts, reproduced by" + (
        " (the time is this server's, measured around the same call):" if seconds is not None else
        " (this first view was computed beside the checkpoint by scripts/precompute_dashboard.py, into "
        "graph_view.json, with the same call; the graph itself is computed here when a threshold, a pin, a card, the "
        "QK panel or a download needs it):"))
    st.code(cmd, language="bash", wrap_lines=True)
else:
    st.caption("Scores of the uploaded graph: `python -c \"import sprout_interp as si; g = si.load_graph('graph."
               "safetensors'); print(g, si.graph_scores(g))\"`")


# -- thresholds, pins and supernodes (all in the link) -------------------------------------------------------------


KEY_FORMS = (f"node keys of this graph: f<layer>.<pos>.<feature> (a feature; layer 0 to {L - 1}, pos 0 to {P - 1}), "
             f"e<layer>.<pos> (an error node), t<pos> (an embedding) or l<token id> (a logit)")


def _pins(raw: list[str]) -> list[str] | None:
    out = [r for r in dict.fromkeys(raw) if r]
    return out if out and all(r in index_of for r in out) else None


_NAME = re.compile(r"^[^:,]{1,40}$")


def _supers(raw: list[str]) -> list[str] | None:
    out = []
    for r in raw:
        name, sep, members = r.partition(":")
        ms = [x for x in members.split(",") if x]
        if not sep or not _NAME.match(name.strip()) or not ms or not all(x in index_of for x in ms):
            return None
        out.append(f"{name.strip()}:{','.join(dict.fromkeys(ms))}")
    return out or None


def _named(raw: list[str]) -> list[str] | None:
    out: dict[str, str] = {}
    for r in raw:
        k_, sep, text_ = r.partition(":")
        text_ = text_.strip()
        if not sep or k_ not in index_of or not 1 <= len(text_) <= 40:
            return None
        out[k_] = text_
    return [f"{k_}:{t_}" for k_, t_ in out.items()] or None


link.bind("node_threshold", "ag_node_thr", link.number_in(0.1, 1.0))
link.bind("edge_threshold", "ag_edge_thr", link.number_in(0.5, 1.0))
link.bind("pin", "ag_pins", _pins, list, many=True, valid=KEY_FORMS)
link.bind("super", "ag_super", _supers, list, many=True,
           valid="name:key,key,… (a name of 1 to 40 characters without ':' or ','; " + KEY_FORMS + ")")
link.bind("label", "ag_labels", _named, list, many=True,
          valid="key:text (a node key of this graph, then the label, 1 to 40 characters; " + KEY_FORMS + ")")
link.bind("card", "ag_card", lambda raw: raw if raw in index_of and raw.startswith("f") else None,
           valid="a feature node of this graph: f<layer>.<pos>.<feature> (layer 0 to "
                 f"{L - 1}, pos 0 to {P - 1})")
st.session_state.setdefault("ag_node_thr", 0.8)
st.session_state.setdefault("ag_edge_thr", 0.98)
for k_ in ("ag_pins", "ag_super", "ag_labels"):  # a graph of another prompt: pins it does not hold are let go
    st.session_state[k_] = [x for x in st.session_state.get(k_) or []
                            if all(y in index_of for y in (x.partition(":")[2].split(",") if k_ == "ag_super"
                                                          else [x.partition(":")[0]] if k_ == "ag_labels" else [x]))]
if st.session_state.get("ag_card") not in index_of:
    st.session_state.pop("ag_card", None)

# a click on a node (previous run): a feature opens its card below; any node can then be pinned
clicked = show.take_click("ag_graph", 2)
if clicked is not None and 0 <= clicked[1] < len(keys):
    ck = keys[clicked[1]]
    st.session_state["ag_clicked"] = ck
    graph_cards.select(ck)  # any node's card: its strongest inputs and outputs
    if clicked[0] == KIND_CODES["feature"]:
        st.session_state["ag_card"] = ck

c = st.columns(2)
node_thr = c[0].slider("node threshold: keep the nodes that carry this share of the influence on the logits",
                       0.1, 1.0, step=0.01, key="ag_node_thr")
edge_thr = c[1].slider("edge threshold: keep the edges that carry this share of the edge influence", 0.5, 1.0,
                       step=0.001, key="ag_edge_thr", format="%.3f")
pins = list(st.session_state.get("ag_pins") or [])
supers = {s.partition(":")[0]: s.partition(":")[2].split(",") for s in st.session_state.get("ag_super") or []}
keep = tuple(sorted({index_of[x] for x in pins} | {index_of[x] for ms in supers.values() for x in ms}))
if pre is not None and not keep and (float(node_thr), float(edge_thr)) == (
        pre.settings["node_threshold"], pre.settings["edge_threshold"]):
    nodes, edges = pre.view_nodes.copy(), pre.view_edges.copy()  # the first view, as shipped
else:
    graph = full_graph()
    with st.spinner("pruning…"), state.shown_errors("the pruned graph"):
        nodes, edges = graph_compute.graph_view(graph, gkey, float(node_thr), float(edge_thr), keep)
# what needs the graph itself beyond the first view: a node's card, the pinned nodes' subgraph, the QK panel open
if graph is pre and (st.session_state.get("ag_node") or "node" in st.query_params or clicked is not None
                     or st.session_state.get("ag_qk_open") or st.session_state.get("ag_clicked")
                     or st.query_params.get("qk") in ("1", "true")):
    graph = full_graph()
notes = {}
if own:
    feats = tuple(sorted({(int(r.layer), int(r.feature)) for r in nodes[nodes["kind"] == "feature"].itertuples()}))
    if pre is not None and all(f in pre.labels and f in pre.promoted for f in feats):
        top, lab = pre.promoted, pre.labels  # the first view's, as shipped
    else:
        with state.shown_errors("the features' tokens"):
            top = graph_compute.graph_promoted(m, key, feats)
        with state.shown_errors("the features' labels"):
            lab = graph_compute.feature_labels(m, key, graph_compute.graph_kind(), feats)
    measured = {r.key: lab[(int(r.layer), int(r.feature))] for r in nodes[nodes["kind"] == "feature"].itertuples()
                if (int(r.layer), int(r.feature)) in lab}
else:
    top, measured = {}, {}
    notes = {r.key: "promotes " + ", ".join(show_token(t) for t in top.get((int(r.layer), int(r.feature)), []))
             for r in nodes[nodes["kind"] == "feature"].itertuples()}
typed = dict(x.partition(":")[::2] for x in st.session_state.get("ag_labels") or [])
labels = shown_labels(nodes, top if own else {}, typed, measured)
drawn, drawn_edges = group_nodes(nodes, edges, supers)
labels.update({f"S:{name}": name for name in supers})
fig = attribution_graph_figure(drawn, drawn_edges, tokens, L, pinned=pins, notes=notes, max_edges=MAX_EDGES,
                               labels=labels, n_labels=N_LABELS)
st.markdown(f"**The graph of the prompt** ({P} positions, `<|endoftext|>` first): features (circles), error nodes "
            "(grey squares) and token embeddings (green triangles) writing into the logits (orange stars); "
            "x = position (each as wide as its nodes need), y = block (from 1); the strongest nodes labelled beside "
            "them." + ("" if fig.layout.width is None else " Too long to fit the page: it scrolls sideways and opens "
                       "on the last position, where the prediction is made."))
if fig.layout.width is None:  # the whole graph fits the page: drawn as wide as the page's column
    with st.container(key="ag_graph_box"):
        show.chart(fig, "attribution graph", width="stretch", on_select="rerun", selection_mode="points",
                   key="ag_graph")
else:  # a prompt too long to fit: its own width in a box that scrolls, opened on the last position
    scrolling.chart(fig, "attribution graph", "ag_graph_box", fig.layout.xaxis.range[1], on_select="rerun",
                    selection_mode="points", key="ag_graph")
graph_hover.hover_edges("ag_graph_box")
shown_e = min(len(drawn_edges), MAX_EDGES)
st.caption(f"Drawn: {int((nodes['kind'] == 'feature').sum())} features, {int((nodes['kind'] == 'error').sum())} error "
           f"nodes, {P} embeddings and {graph.n_logits} logit(s) of {len(nodes_all):,} nodes (prune_graph at "
           f"node_threshold={node_thr:g}, edge_threshold={edge_thr:g}, pinned nodes added); {shown_e:,} of its "
           f"{len(drawn_edges):,} edges, the strongest (blue: raises the target, red: lowers it). Node size: "
           "influence on the logits. **Hover a node to follow its edges** (its inputs and outputs drawn on top, "
           "the rest dimmed) and read its label, kind, block, position, activation, influence and (a feature) the "
           "tokens it promotes; **click a feature to open its card below**, and pin nodes to keep them "
           "and group them into supernodes.")

# -- pins and supernodes ------------------------------------------------------------------------------------------


def _what(k_: str) -> str:
    r = nodes_all.iloc[index_of[k_]]
    tok = repr(str(r["token"]))
    if r["kind"] == "feature":
        return f"feature {int(r['feature'])} · block {int(r['layer']) + 1} · pos {int(r['pos'])} {tok}"
    if r["kind"] == "error":
        return f"error · block {int(r['layer']) + 1} · pos {int(r['pos'])} {tok}"
    if r["kind"] == "embedding":
        return f"embedding · pos {int(r['pos'])} {tok}"
    return f"logit {tok}"


def _label(k_: str) -> str:
    return _what(k_) + (f" · {labels[k_]!r}" if labels.get(k_) else "")


st.subheader("Pinned nodes and supernodes")
clicked_key = st.session_state.get("ag_clicked")
if clicked_key in index_of and clicked_key not in pins:
    if st.button(f"pin the node clicked last: {_label(clicked_key)}", key="ag_pin_clicked"):
        st.session_state["ag_pins"] = pins + [clicked_key]
        st.rerun()
options = list(dict.fromkeys(pins + [x for x in nodes["key"] if x in index_of]))
c = st.columns([3, 2])
c[0].multiselect("pinned nodes (kept in the graph whatever the thresholds)", options, key="ag_pins",
                 format_func=_label)
with c[1].form("ag_group", clear_on_submit=True, border=False):
    name = st.text_input("supernode name", key="ag_super_name", placeholder="e.g. 'Plax' readers")
    members = st.multiselect("pinned nodes it groups", pins, format_func=_label, key="ag_super_members")
    go_ = st.form_submit_button("group into a supernode")
if go_:
    clean = state.clean_text(name or "").strip().replace(":", " ").replace(",", " ")[:40]
    if not clean or not members:
        st.warning("A supernode needs a name and at least one pinned node.")
    elif clean in supers:
        st.warning(f"There is a supernode {state.md(clean)} already: choose another name.")
    else:
        st.session_state["ag_super"] = (st.session_state.get("ag_super") or []) + [f"{clean}:{','.join(members)}"]
        st.rerun()
if st.session_state.get("ag_super"):
    st.multiselect("supernodes (drawn as one diamond each, edges summed; remove one here)",
                   list(st.session_state["ag_super"]), key="ag_super",
                   format_func=lambda s: f"{s.partition(':')[0]} ({len(s.partition(':')[2].split(','))} nodes)")
if clicked_key in index_of:
    with st.form("ag_name", clear_on_submit=True, border=False):
        c = st.columns([3, 1], vertical_alignment="bottom")
        said_ = c[0].text_input(f"your label for the node clicked last ({_label(clicked_key)}; now "
                                f"{labels.get(clicked_key, 'none')!r}): drawn on the graph and kept in the link",
                                key="ag_label_text", max_chars=40)
        named_ = c[1].form_submit_button("set the label")
    if named_ and state.clean_text(said_ or "").strip():
        rest = [x for x in st.session_state.get("ag_labels") or [] if x.partition(":")[0] != clicked_key]
        st.session_state["ag_labels"] = rest + [f"{clicked_key}:{state.clean_text(said_).strip()[:40]}"]
        st.rerun()
if st.session_state.get("ag_labels"):
    st.multiselect("your labels (remove one here to go back to the measured label)",
                   list(st.session_state["ag_labels"]), key="ag_labels",
                   format_func=lambda s: f"{s.partition(':')[0]}: {s.partition(':')[2]}")

# -- the pinned nodes on their own, and the clicked node's card (any kind): graph_cards -------------------------------

graph_cards.subgraph_pane(graph, gkey, keys, index_of, pins, supers, tokens, _label)
graph_cards.node_card(graph, gkey, keys, index_of, _label, edges)

# -- the clicked feature's card -------------------------------------------------------------------------------------

card = st.session_state.get("ag_card")
if card in index_of:
    r = nodes_all.iloc[index_of[card]]
    layer, feature = int(r["layer"]), int(r["feature"])
    st.subheader(f"Feature {feature}, block {layer + 1} (layer {layer}) transcoder")
    st.caption(f"At pos {int(r['pos'])} ({state.md(repr(str(r['token'])))}) of this prompt its activation is "
               f"{float(r['activation']):.3f} and its influence on the logits {influence[index_of[card]]:.3f}.")
    if not own:
        st.info("This graph was made with another model: choose it in the sidebar to see its features' pages.")
    else:
        with st.spinner(f"reading block {layer + 1}'s transcoder features on held-out text (once per block)…"), \
                state.shown_errors("the feature's card"):
            page = graph_compute.transcoder_page(m, key, layer, feature)
        st.markdown(f"**{state.md(page.description)}** (from its top activations and promoted tokens)")
        c = st.columns(3)
        c[0].metric("fires on", f"{page.frequency:.2%}", help=f"of {page.n_tokens:,} held-out tokens")
        c[1].metric("max activation", f"{page.max_activation:.2f}")
        c[2].metric("mean when on", f"{page.mean_activation:.2f}")
        st.markdown("**Top-activating contexts** (held-out text: 96 windows of 128 tokens; the firing token "
                    "outlined, background = activation)")
        st.html(contexts_html(page.contexts))
        left, right = st.columns(2)
        with left:
            show.chart(logit_effect_chart(page, title=f"tokens feature {feature} promotes and suppresses "
                                                       "(W_dec · W_U)"), "feature card: promoted tokens")
        with right:
            st.markdown("**Tokens it fires on** (share of its top activations)")
            st.dataframe(page.top_tokens, hide_index=True)
        load, tc = (("clt import load_clt", f"load_clt(m).layer_features({layer})") if graph_compute.graph_kind() == "clt"
                    else ("transcoder import load_transcoders", f"load_transcoders(m)[{layer}]"))
        st.caption(f"Reproduce: `python -c \"import sprout_interp as si; from sprout_interp.features.{load}; "
                   "from sprout_interp.features.pages import transcoder_feature_summary; "
                   f"m = si.load({m.name or key!r}); s = transcoder_feature_summary(m, {tc}, "
                   f"{feature}); print(s.description, s.frequency, s.contexts)\"`")
else:
    st.caption("Click a feature node (a circle) to see its card here: where it fires on held-out text and which "
               "tokens it promotes.")

# -- why a head looks there: a cell's QK attribution (qk_view), from a head-carried edge or chosen ----------------

st.subheader("Why a head looks there")
if not own:
    st.caption("QK attributions need the model the graph was made with: choose it in the sidebar.")
else:
    link.bind("qk_layer", "ag_qk_layer", link.int_in(0, L - 1))
    link.bind("qk_head", "ag_qk_head", link.int_in(0, m.cfg.n_heads - 1))
    link.bind("qk", "ag_qk_open", link.as_bool, link.fmt_bool)
    link.bind("qk_query", "ag_qk_query", link.int_in(0, P - 1))
    link.bind("qk_key", "ag_qk_key", link.int_in(0, P - 1))
    first = qk_compute.repeat_cell(m, key, text) if up is None else None
    qk_view.graph_section(m, key, graph, gkey, nodes_all, edges, keys, _label, compute.induction_head(
        compute.induction_circuit(m, key)), None if first is None or first[0] + 1 >= P else (first[0] + 1, first[1] + 1))

# -- tables and the file ----------------------------------------------------------------------------------------------

with st.expander("the drawn nodes and edges (tables)"):
    cols = ["key", "label", "kind", "layer", "block", "pos", "feature", "token", "activation", "logit_prob",
            "influence"]
    show.table(nodes.assign(label=nodes["key"].map(labels).fillna(""))[cols].sort_values("influence",
                                                                                          ascending=False),
               "graph nodes")
    show.table(edges.assign(source=[keys[i] for i in edges["source"]], target=[keys[i] for i in edges["target"]]),
                "graph edges")
st.download_button(f"⬇ the whole graph ({len(nodes_all):,} nodes) as a .safetensors file (reopen it above, or with "
                   "si.load_graph)", data=lambda: graph_compute.graph_file(full_graph(spinner=False)), file_name="attribution_graph.safetensors",
                   mime="application/octet-stream", on_click="ignore", key="ag_download")
graph_export.download(graph if graph is not pre else lambda: full_graph(spinner=False), node_thr, edge_thr,
                      slug=f"{graph.info.get('model_name') or 'graph'}-{graph.n_pos}-tokens", labels=labels, pinned=pins, supernodes=supers)
