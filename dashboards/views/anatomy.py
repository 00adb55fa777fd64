"""Anatomy: the one-page diagram, each part's real code with line numbers, and a parameter calculator."""
from __future__ import annotations

import link
import show
import state
import streamlit as st

from sprout_interp.anatomy import params as anatomy
from sprout_interp.plots.anatomy import model_diagram

st.header("Anatomy")
m = state.current_model()
cfg = m.model.cfg if m is not None else None
n_layer = cfg.n_layer if cfg else 8

left, right = st.columns([5, 6])
with right:
    link.bind("part", "anatomy_part", link.one_of([p.key for p in anatomy.PARTS]))
    key = st.radio("part", [p.key for p in anatomy.PARTS], format_func=lambda k: anatomy.PARTS_BY_KEY[k].title,
                   horizontal=True, key="anatomy_part")
    part = anatomy.PARTS_BY_KEY[key]
    path, first, last, code = anatomy.source(part)
    st.markdown(f"**{part.title}** — {part.what}")
    if cfg is not None:
        n = anatomy.part_params(cfg)[key]
        where = " per block" if key in ("attention", "ffn", "block") else (" per norm" if key == "rmsnorm" else "")
        st.markdown(f"Parameters in **{state.md(m.name) if m.name else 'this model'}**: **{n:,}**{where}")
    st.caption(f"`{anatomy.project_path(path)}`, lines {first}–{last} (read from the file now; the numbers are "
               "the file's own)")
    st.code(anatomy.numbered(code, first), language="python", wrap_lines=True)
with left:
    show.chart(model_diagram(n_layer, selected=key), "model diagram", width="stretch")

st.subheader("Count your own model")
link.bind("preset", "calc_preset", link.one_of(list(anatomy.CALCULATOR_PRESETS)))
st.session_state.setdefault("calc_preset", list(anatomy.CALCULATOR_PRESETS)[2])
preset = st.selectbox("preset", list(anatomy.CALCULATOR_PRESETS), key="calc_preset")
p = anatomy.CALCULATOR_PRESETS[preset]
c = st.columns(5)
d_model = c[0].slider("d_model", 64, 1024, p["d_model"], step=64, key=f"calc_d_{preset}")
n_head = c[1].select_slider("heads", [h for h in range(1, 17) if d_model % h == 0 and (d_model // h) % 2 == 0],
                            value=p["n_head"] if d_model % p["n_head"] == 0 else 1, key=f"calc_h_{preset}_{d_model}")
n_layer_c = c[2].slider("n_layer", 1, 24, p["n_layer"], key=f"calc_l_{preset}")
d_ff = c[3].slider("d_ff", 128, 4096, p["d_ff"], step=64, key=f"calc_ff_{preset}")
vocab = c[4].number_input("vocabulary", 256, 200_000, p["vocab_size"], step=256, key=f"calc_v_{preset}")
b = anatomy.param_breakdown(d_model, n_layer_c, d_ff, int(vocab), n_head)
k = st.columns(4)
k[0].metric("total parameters", f"{b['total']:,}")
k[1].metric("spent on the vocabulary", f"{b['vocab_share']:.0%}")
k[2].metric("per block", f"{b['per_block']:,}")
untied = anatomy.param_breakdown(d_model, n_layer_c, d_ff, int(vocab), n_head, tied=False)
k[3].metric("without weight tying", f"{untied['total']:,}")
st.caption("Embedding V·d + n_layer × (attention 4d² + 2·head_dim QK-norm gains + SwiGLU 3·d·d_ff + norms 2d) "
           "+ final norm d — the chapter's count, computed by `sprout_interp.anatomy.params.param_breakdown`.")
