"""Positions (RoPE): the chapter's check made interactive."""
from __future__ import annotations

import streamlit as st

from sprout_interp.anatomy import rope
from sprout_interp.plots.anatomy import rope_grid_figure

st.header("Positions (RoPE)")
st.markdown("A query at position *m* and a key at position *n* are rotated by *m·θᵢ* and *n·θᵢ*; their dot "
            "product depends only on the distance *m − n*. Move them together and the score stays put.")
c = st.columns(3)
m_pos = c[0].number_input("query position m", 0, 511, 105)
n_pos = c[1].number_input("key position n", 0, 511, 102)
seed = c[2].number_input("random q, k (seed)", 0, 10_000, 1)
q, k = rope.random_qk(64, int(seed))
s = rope.rope_score(q, k, int(m_pos), int(n_pos))
shift = min(int(m_pos), int(n_pos))
s0 = rope.rope_score(q, k, int(m_pos) - shift, int(n_pos) - shift)
st.metric(f"score at (m={m_pos}, n={n_pos}), distance {m_pos - n_pos}", f"{s:+.4f}",
          help="unit-length random q and k, head_dim 64, base 10000")
st.write(f"The same pair shifted to (m={m_pos - shift}, n={n_pos - shift}): **{s0:+.4f}** "
         f"(difference {abs(s - s0):.1e}).")
size = st.slider("grid size", 16, 128, 64)
st.plotly_chart(rope_grid_figure(rope.score_grid(q, k, size)), width="stretch")
turns = rope.turn_lengths()
st.caption(f"Pair 0 turns once every {turns[0]:.1f} positions; pair 31 needs {turns[-1]:,.0f}.")
