"""Patching / circuits: where the information that decides a prediction lives, and what built it."""
from __future__ import annotations

import compute
import link
import precomputed
import scrolling
import show
import state
import streamlit as st

from sprout_interp.plots.patching import (
    NODE_KINDS,
    contribution_graph_figure,
    head_patching_heatmap,
    patching_agreement_figure,
    patching_heatmap,
)

state.header(
    "Patching / circuits",
    "Two texts of the same length differ in one detail. **Activation patching** copies one activation from the "
    "clean run into the corrupted run and asks how much of the clean prediction comes back: score 0 = the corrupted "
    "run's logit difference, 1 = the clean run's. The default pair renames the *first* \"Zorbin\", so only the "
    "clean text says what follows the second. **The contribution graph** shows, for one prediction on the clean "
    "text, how much each head and feed-forward pushes the predicted token (direct logit attribution) and which "
    "earlier positions each head reads.",
)
m = state.current_model()
if m is None:
    state.stop()
key = state.model_key()
c = st.columns(2)
for param, k in (("clean", "patch_clean"), ("corrupted", "patch_corrupted"), ("answer", "patch_answer"),
                 ("wrong", "patch_wrong")):
    link.bind(param, k, lambda raw: raw[: state.MAX_URL_TEXT])
DEFAULT = precomputed.PATCH_DEFAULT  # the pair precomputed for the shipped checkpoints
st.session_state.setdefault("patch_clean", DEFAULT["clean"])
st.session_state.setdefault("patch_corrupted", DEFAULT["corrupted"])
clean = state.clean_text(c[0].text_area("clean text", key="patch_clean", height=110))
corrupted = state.clean_text(c[1].text_area("corrupted text (same number of tokens)", key="patch_corrupted", height=110))
c = st.columns([1, 1, 2])
st.session_state.setdefault("patch_answer", DEFAULT["answer"])
st.session_state.setdefault("patch_wrong", DEFAULT["wrong"])
answer = state.clean_text(c[0].text_input("answer token (clean)", key="patch_answer"))
wrong = state.clean_text(c[1].text_input("wrong token", key="patch_wrong"))
c[2].caption("Metric: logit[answer] − logit[wrong] at the last position (each must be exactly one token; a leading "
             "space is part of the token).")

if not clean.strip() or not corrupted.strip():
    st.warning("Type both texts: patching compares a clean and a corrupted run of the same length.")
    state.stop()
with st.spinner("patching the residual stream at every block and position (first time only)…"), \
        state.shown_errors("the residual-stream patching"):
    resid = compute.patching(m, key, clean, corrupted, answer, wrong, "resid_pre", "layer_pos")
    heads = compute.patching(m, key, clean, corrupted, answer, wrong, "z", "head")
    toks = compute.str_tokens(m, key, clean)
k = st.columns(3)
k[0].metric("logit difference, clean run", f"{resid.attrs['clean']:.3f}")
k[1].metric("logit difference, corrupted run", f"{resid.attrs['corrupted']:.3f}")
k[2].metric("tokens", f"{len(toks)}")
show.chart(patching_heatmap(resid, toks), "block x position patching", width="stretch")
st.caption("Each cell: the stream entering that block (`blocks.{block-1}.hook_resid_pre`) at that position copied "
           "from the clean run into the corrupted run. Early blocks: the information sits where the texts differ; "
           "after the induction head's block it sits at the last position.")
show.chart(head_patching_heatmap(heads), "head patching", width="stretch")
st.caption("Each cell: one head's output (`hook_z`, every position) copied from the clean run. Blocks counted from 1, "
           "heads from 0.")

link.bind("attribution", "patch_attribution", link.as_bool, link.fmt_bool)
if st.toggle("compare with attribution patching (every patch estimated from one backward pass)",
             key="patch_attribution"):
    with st.spinner("attribution patching…"), state.shown_errors("attribution patching"):
        agree_resid = compute.patching_agreement(m, key, clean, corrupted, answer, wrong, "resid_pre", "layer_pos")
        agree_heads = compute.patching_agreement(m, key, clean, corrupted, answer, wrong, "z", "head")
    st.markdown(
        "**Attribution patching** (Nanda; Syed et al. 2023) estimates every patch above at once: the corrupted "
        "run's logit difference plus (clean activation − corrupted activation) · its gradient, one forward and one "
        "backward pass in all. It is a first-order estimate: a large change (a whole token's embedding, a head "
        "that saturates) can land far from the exact score, so read it as a map of where to look and check the "
        "cells that matter exactly.")
    k = st.columns(4)
    k[0].metric("r, stream by block × position", f"{agree_resid.attrs['r']:.2f}")
    k[1].metric("largest error, stream (score)", f"{agree_resid.attrs['max_abs_error']:.2f}")
    k[2].metric("r, heads", f"{agree_heads.attrs['r']:.2f}")
    k[3].metric("largest error, heads (score)", f"{agree_heads.attrs['max_abs_error']:.2f}")
    c = st.columns(2)
    with c[0]:
        show.chart(patching_agreement_figure(agree_resid), "attribution vs exact, stream", width="stretch")
    with c[1]:
        show.chart(patching_agreement_figure(agree_heads), "attribution vs exact, heads", width="stretch")
    st.caption("Each marker: one patch, its exact score (one run of the model per patch) across, the attribution "
               "estimate up; on the dotted diagonal the estimate is exact. Colour: the block (counted from 1).")
    with st.expander("attribution patching tables"):
        show.table(agree_resid, "attribution vs exact, stream")
        show.table(agree_heads, "attribution vs exact, heads")

st.subheader("Contribution graph (clean text)")
n = len(toks)
link.bind("pos", "patch_pos", link.int_in(0, n - 1))
link.bind("threshold", "patch_threshold_pct", link.int_in(1, 50))
state.remember("patch_pos", n - 1, 0, n - 1)
c = st.columns([3, 1])
pos = c[0].slider("prediction at position (0-based; the token after it is predicted)", 0, n - 1, key="patch_pos")
state.remember("patch_threshold_pct", 5, 1, 50)
thr = c[1].slider("keep parts ≥ % of the largest", 1, 50, key="patch_threshold_pct")
with st.spinner("attributing the prediction…"), state.shown_errors("the contribution graph"):
    nodes, edges = compute.graph(m, key, clean, pos, thr / 100)
# a click on a node (previous run) opens that part's own page, on this text
node = show.take_click("patch_graph", 3)
if node is not None:
    kind, layer, head = node
    on_text = {"text": clean} if len(clean) <= state.MAX_URL_TEXT else {}
    if kind == NODE_KINDS["head"]:
        st.switch_page("views/attention.py", query_params={**on_text, "layer": str(layer), "head": str(head)})
    elif kind == NODE_KINDS["mlp"]:
        st.switch_page("views/neurons.py", query_params={**on_text, "pos": str(pos), "answer": nodes.attrs["token"],
                                                         "how": "from the prediction above", "layer": str(layer)})
    elif kind == NODE_KINDS["embed"]:
        st.switch_page("views/residual.py", query_params=on_text)
scrolling.chart(contribution_graph_figure(nodes, edges, toks, m.cfg.n_layers, m.cfg.n_heads), "contribution graph",
                "patch_graph_box", pos, on_select="rerun", selection_mode="points", key="patch_graph")
st.caption(f"Predicted token at position {pos}: {state.md(nodes.attrs['token'])} (logit {nodes.attrs['logit']:.2f}). "
           "Every block has a row per head and one for its feed-forward, the embedding at the bottom. Node size: how "
           "much that part pushes the token (blue for, red against), in logits through the final norm; lines: the "
           "part of a head's push that comes from each earlier position it reads (grey dots: the stream entering "
           "that head's block there). Hover a node for its name and value; **click it to open its page** (a head: "
           "Attention heads; a feed-forward: its neurons).")
if len(clean) <= state.MAX_URL_TEXT:  # a feed-forward node is a sum over its neurons: the Neurons page splits it
    st.page_link("views/neurons.py", label=f"split the feed-forward nodes into neurons (this text, position {pos}, "
                                           f"{nodes.attrs['token']!r}) on the Neurons page", icon="🔬",
                 query_params={"text": clean, "pos": str(pos), "answer": nodes.attrs["token"], "how": "from the prediction above"})
head_rows = nodes[nodes["kind"] == "head"]
choices = [(int(r.layer), int(r.head)) for r in head_rows.itertuples()] or [(0, 0)]
link.bind("head", "patch_head", lambda raw: next((c for c in choices if f"{c[0]}.{c[1]}" == raw), None),
           lambda lh: f"{lh[0]}.{lh[1]}", valid="layer.head of a head in this graph: "
           + ", ".join(f"{l}.{h}" for l, h in choices))
if st.session_state.get("patch_head") not in choices:
    st.session_state.pop("patch_head", None)
pick = st.selectbox("look at a head", choices, format_func=lambda lh: f"block {lh[0] + 1} head {lh[1]} (layer {lh[0]})",
                    key="patch_head")
if len(clean) <= state.MAX_URL_TEXT:
    st.page_link("views/attention.py", label=f"open block {pick[0] + 1} head {pick[1]} on the Attention heads page "
                                           "(this text)", icon="🔍",
                 query_params={"text": clean, "layer": str(pick[0]), "head": str(pick[1])})
with state.shown_errors("the head's tokens"):
    eff, row = compute.head_effects(m, key, clean, pick[0], pick[1], pos)
c = st.columns(2)
c[0].markdown(f"**Tokens block {pick[0] + 1} head {pick[1]} promotes and suppresses at position {pos}** "
              "(direct effect on each logit)")
with c[0]:
    show.table(eff[["effect", "rank", "token", "logit"]], "the head's tokens")
c[1].markdown(f"**Where it looks from position {pos}** (attention weights, largest first)")
with c[1]:
    show.table(row.sort_values("weight", ascending=False).head(10), "where the head looks")
with st.expander("tables"):
    show.table(resid, "block x position patching")
    show.table(heads, "head patching")
    show.table(edges, "contribution graph edges")
