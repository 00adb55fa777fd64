"""Residual stream: how big the stream gets after the embedding and after each block."""
from __future__ import annotations

import compute
import link
import show
import state
import streamlit as st

from sprout_interp.lens.residual import CHAPTER_GPT4_RMS, growth_claims
from sprout_interp.plots import block_knockout_chart, rms_growth_chart, rms_position_chart

state.header(
    "Residual stream",
    "The root mean square of the stream, `sqrt(mean x²)` over d_model, after the embedding (block 0) and after "
    "each block, averaged over the text's tokens. Every block *adds* to the stream, so it grows; RMSNorm in front "
    "of each block and of the head keeps what they read at a fixed size.",
)
m, key, text, toks = state.page_inputs()
name = state.plain(m.name or key)  # in plotly titles and legends: literal text

with st.spinner("measuring the stream…"), state.shown_errors("the residual stream"):
    rms = compute.rms(m, key, text)
link.bind("log", "rms_log", link.as_bool, link.fmt_bool)
st.session_state.setdefault("rms_log", True)
log_y = st.toggle("log scale", key="rms_log")
show.chart(rms_growth_chart(rms.assign(model=name), color="model", dash=None, log_y=log_y,
                             chapter=CHAPTER_GPT4_RMS, chapter_label="chapter (gpt-4, held-out text)",
                             title=f"{name}: RMS of the stream after each block (this text)"),
            "RMS after each block")
# one table under the other: side by side, half a 1280-pixel window's column cut the first one's last column
st.markdown("**Ours beside the chapter's gpt-4 figures**")
show.table(growth_claims(rms), "ours beside the chapter")
st.markdown("**Every row** (block: from 1, 0 = after the embedding; layer: index in code, −1 = embedding)")
show.table(rms, "RMS after each block")

st.subheader("What each block is worth")
st.caption("The loss on this text (nats per token) when one block stops writing to the stream: its attention "
           "and feed-forward outputs zeroed, so the stream passes through it unchanged. The bar is the rise over "
           "the clean loss; blocks counted from 1. `sprout_interp.behaviour.knockout.block_knockout`.")
if toks.shape[-1] < 2:
    st.info("A loss needs at least two tokens: type a longer text to see what each block is worth.")
else:
    with st.spinner("knocking out each block…"), state.shown_errors("the block knockouts"):
        knock = compute.knockout(m, key, text)
    show.chart(block_knockout_chart(knock, title=f"{name}: loss rise when a block stops writing (this text)"),
                "block knockouts")
    show.table(knock.drop(columns=["layers"]), "block knockouts")

st.subheader("Per position")
link.bind("per_position", "rms_per_position", link.as_bool, link.fmt_bool)
if st.toggle("show the RMS at every position", key="rms_per_position"):
    with st.spinner("measuring every position…"), state.shown_errors("the per-position RMS"):
        pp = compute.rms(m, key, text, per_position=True)
    blocks = st.multiselect("rows", list(range(m.cfg.n_layers + 1)), default=list(range(m.cfg.n_layers + 1)),
                            format_func=lambda b: "embedding" if b == 0 else f"block {b}", key=f"rms_rows_{key}")
    show.chart(rms_position_chart(pp, blocks=blocks, log_y=log_y, tokens=compute.str_tokens(m, key, text)),
                "RMS at each position")
else:
    st.caption("Turn it on to see the stream's size token by token.")
