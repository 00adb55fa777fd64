"""Positions (RoPE): the chapter's check made interactive, with random vectors or a real head's own."""
from __future__ import annotations

import compute
import link
import show
import state
import streamlit as st

from sprout_interp.anatomy import rope
from sprout_interp.circuits.heads import block_label
from sprout_interp.plots.anatomy import distance_profile_figure, rope_grid_figure

SOURCES = {"random": "random q and k (the chapter's check)", "model": "a head's own queries and keys (this text)"}

st.header("Positions (RoPE)")
st.markdown("A query at position *m* and a key at position *n* are rotated by *m·θᵢ* and *n·θᵢ*; their dot "
            "product depends only on the distance *m − n*. Move them together and the score stays put. That holds "
            "for any one pair of vectors; a real head's queries and keys change with the tokens, so its scores "
            "need not depend on the distance alone: choose a head to see how much they do.")
link.bind("qk", "pos_source", link.one_of(list(SOURCES)))
source = st.radio("q and k", list(SOURCES), format_func=SOURCES.get, horizontal=True, key="pos_source")

if source == "model":
    m, key, text, toks = state.page_inputs()
    L, H, T = m.cfg.n_layers, m.cfg.n_heads, int(toks.shape[1])
    hi = T - 1
else:
    hi = 511
c = st.columns(3)
for name, k, default in (("m", "pos_m", 105), ("n", "pos_n", 102)):
    link.bind(name, k, link.int_in(0, hi))
    state.remember(k, min(default, hi), 0, hi)
m_pos = int(c[0].number_input("query position m", 0, hi, key="pos_m"))
n_pos = int(c[1].number_input("key position n", 0, hi, key="pos_n"))
if source == "random":
    link.bind("seed", "pos_seed", link.int_in(0, 10_000))
    st.session_state.setdefault("pos_seed", 1)
    seed = c[2].number_input("random q, k (seed)", 0, 10_000, key="pos_seed")
    q, k = rope.random_qk(64, int(seed))
    what = "unit-length random q and k, head_dim 64, base 10000"
else:
    link.bind("layer", "pos_layer", link.int_in(0, L - 1))
    link.bind("head", "pos_head", link.int_in(0, H - 1))
    state.remember("pos_layer", 0, 0, L - 1)
    state.remember("pos_head", 0, 0, H - 1)
    cc = c[2].columns(2)
    layer = cc[0].selectbox("block", list(range(L)), format_func=block_label, key="pos_layer")
    head = cc[1].selectbox("head", list(range(H)), key="pos_head")
    with st.spinner("reading the head's queries and keys…"), state.shown_errors("the head's queries and keys"):
        (qs, ks), by_distance, full_grid = compute.head_qk(m, key, text, layer, head)
    q, k = qs[m_pos], ks[n_pos]
    what = (f"the query of {block_label(layer)} head {head} at token {m_pos} and its key at token {n_pos} of the "
            f"text, after QK-norm and before RoPE (unscaled q·k), base {m.cfg.rotary_base:g}")
base = m.cfg.rotary_base if source == "model" else 10000.0
s = rope.rope_score(q, k, m_pos, n_pos, base)
shift = min(m_pos, n_pos)
s0 = rope.rope_score(q, k, m_pos - shift, n_pos - shift, base)
st.metric(f"score at (m={m_pos}, n={n_pos}), distance {m_pos - n_pos}", f"{s:+.4f}", help=what)
st.write(f"The same pair shifted to (m={m_pos - shift}, n={n_pos - shift}): **{s0:+.4f}** "
         f"(difference {abs(s - s0):.1e}).")
link.bind("size", "pos_size", link.int_in(16, 128))
st.session_state.setdefault("pos_size", 64)
size = st.slider("grid size", 16, 128, key="pos_size")
show.chart(rope_grid_figure(rope.score_grid(q, k, size, base),
                             title="one pair of vectors at every (m, n): constant along each diagonal"),
            "RoPE score grid", width="stretch")
turns = rope.turn_lengths(q.shape[-1], base)
st.caption(f"Pair 0 turns once every {turns[0]:.1f} positions; pair {len(turns) - 1} needs {turns[-1]:,.0f}.")

if source == "model":
    st.subheader(f"{block_label(layer)}, head {head}: its real scores on the text")
    grid = full_grid[:size, :size]
    show.chart(rope_grid_figure(grid, title=f"{block_label(layer)} head {head}: q·k / √d_head before the softmax "
                                             f"(first {min(size, T)} tokens)", colorbar="score"),
                "the head's scores", width="stretch")
    r2 = by_distance.attrs["r2"]
    st.metric("share of the score's variance the distance explains", f"{r2:.0%}",
              help="1 − (variance within each distance) / (total variance), over every query–key pair of the text")
    show.chart(distance_profile_figure(by_distance), "score by distance", width="stretch")
    st.caption("Each query's own vector and each key's own vector differ from token to token, so a real head's "
               "score is RoPE's function of the distance applied to different vectors: a narrow band (a high share) "
               "means the head attends by position, a wide one that the tokens decide.")
    show.table(by_distance, "score by distance")
