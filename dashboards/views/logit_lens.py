"""Logit lens: what the model would say if it stopped after each block."""
from __future__ import annotations

import pandas as pd
import streamlit as st

import compute
import state
from sprout_interp.lens.logit_lens import CHAPTER_SPROUT_CONFIDENCE, penultimate_vs_final
from sprout_interp.plots import layer_metrics_chart, logit_lens_grid
from sprout_interp.plots.trajectories import TRAJECTORY_METRICS, trajectory_heatmaps

state.header(
    "Logit lens",
    "Each cell reads the residual stream after a block through the final RMSNorm and the tied head: "
    "*what would the model say if it stopped here?* Colour = the top-1 probability, text = the top-1 token, "
    "red frame = the top-1 is the actual next token. Rows: **embedding**, then **block 1 … block L** "
    "(block N is `blocks.{N-1}.hook_resid_post` in code); the top row is the model's real output.",
)
m, key, text, toks = state.page_inputs()
T = int(toks.shape[1])

which = st.radio("lens", ["logit", "tuned"], horizontal=True, key="lens_which",
                 help="tuned: each block's stream first goes through a learned affine translator (the tuned lens, "
                      "Belrose et al. 2023) trained for this checkpoint")
with st.spinner("reading every block through the head…"), state.shown_errors("the logit lens"):
    lens, summary, cells, echo = compute.lens(m, key, text, which)
if lens.notice:
    st.warning(lens.notice)
R = lens.n_rows

# -- which tokens to draw, which cell to inspect ------------------------------------------------
c = st.columns([1, 3, 1, 1])
width = c[0].selectbox("tokens shown", [10, 20, 30, 40, 60, 80], index=1, key="lens_width")
state.clamp_state("lens_start", 0, max(T - width, 0))
start = c[1].slider("first token shown", 0, max(T - width, 0), key="lens_start") if T > width else 0
end = min(start + width, T)

# a click on the grid (previous run) picks the cell: apply it once, before the pickers are drawn
try:
    pts = st.session_state["lens_grid"]["selection"]["points"]
except (KeyError, TypeError):
    pts = []
picked = next((tuple(int(v) for v in p["customdata"][:2]) for p in pts if p.get("customdata")), None)
if picked is not None and picked != st.session_state.get("lens_applied"):
    st.session_state["lens_applied"] = picked
    st.session_state["lens_pos"], st.session_state["lens_row"] = picked
state.remember("lens_pos", start, 0, T - 1)
state.remember("lens_row", R - 1, 0, R - 1)
pos = c[2].number_input("position", 0, T - 1, key="lens_pos")
row = c[3].selectbox("row", list(range(R)), format_func=lambda r: lens.rows[r], key="lens_row")

# -- the grid ----------------------------------------------------------------------------------
fig = logit_lens_grid(lens, m.to_str_tokens, positions=range(start, end), clickable=True, selected=(pos, row),
                      title=f"{state.plain(m.name or key)}, {lens.lens} lens: top-1 guess after each block, tokens {start}–{end - 1} of {T}")
st.plotly_chart(fig, on_select="rerun", selection_mode="points", key="lens_grid", width="content")
st.caption("Click a cell (or set position and row above) to see its five candidates. Hover shows them too.")

# -- the chosen cell -------------------------------------------------------------------------
cell = cells[(cells["pos"] == pos) & (cells["block"] == row)]
left, right = st.columns([2, 3])
with left:
    st.subheader(f"{lens.rows[row]}, position {pos}")
    if not cell.empty:
        r0 = cell.iloc[0]
        nxt = r0["next_token"]
        st.markdown(f"input token **{state.md(repr(r0['token']))}**; actual next token "
                    + (f"**{state.md(repr(nxt))}**: p = {r0['next_prob']:.1%}, rank {int(r0['next_rank']) + 1}"
                       if nxt is not None else "— (the last token has none)"))
        cand = pd.DataFrame({
            "rank": range(1, len(r0["topk"]) + 1), "token": [repr(t) for t in r0["topk"]],
            "probability": r0["topk_probs"], "is the next token": [t == nxt for t in r0["topk"]],
        })
        st.dataframe(cand, hide_index=True, column_config={
            "probability": st.column_config.ProgressColumn(format="%.3f", min_value=0.0, max_value=1.0)})
with right:
    pv = penultimate_vs_final(summary)
    st.subheader("Does the last block step back?")
    k = st.columns(2)
    k[0].metric(f"confidence after block {pv['penultimate_block']} (penultimate)", f"{pv['penultimate']:.0%}")
    k[1].metric(f"after block {pv['final_block']} (final)", f"{pv['final']:.0%}", f"{-100 * pv['drop']:+.0f} points")
    with state.shown_errors("the three-text figure"):
        pv3 = penultimate_vs_final(compute.lens_three_texts(m, key, which))
    st.markdown(
        f"On the three ready-made texts together: **{pv3['penultimate']:.0%}** after block "
        f"{pv3['penultimate_block']}, **{pv3['final']:.0%}** after block {pv3['final_block']}. "
        f"The chapter (Sprout, 8 blocks, its three texts): **{CHAPTER_SPROUT_CONFIDENCE[7]:.0%}** after block 7, "
        f"**{CHAPTER_SPROUT_CONFIDENCE[8]:.0%}** after block 8."
    )
    st.caption(f"Confidence = mean top-1 probability over all tokens. The embedding row repeats the input token "
               f"at {echo:.0%} of positions (tied weights).")

# -- per-layer metrics -----------------------------------------------------------------------
st.subheader("Confidence, accuracy and KL to the final output, by block")
chapter = CHAPTER_SPROUT_CONFIDENCE if m.cfg.n_layers == 8 else None
st.plotly_chart(layer_metrics_chart(summary.assign(model=state.plain(m.name or key)), color="model", dash=None,
                                    chapter=chapter, title=f"{state.plain(m.name or key)}: the logit lens by block (this text)"),
                width="content")
if chapter is None:
    st.caption(f"The chapter's 77% / 59% are for Sprout's blocks 7 and 8; this model has {m.cfg.n_layers} blocks.")
st.dataframe(summary, hide_index=True)

# -- per-token trajectories, both lenses -----------------------------------------------------
st.subheader("Per-token trajectories: logit lens vs tuned lens")
metric = st.selectbox("colour", list(TRAJECTORY_METRICS), format_func=lambda k: TRAJECTORY_METRICS[k][0],
                      key="lens_traj_metric")
with state.shown_errors("the trajectories"):
    traj = compute.lens_trajectories(m, key, text)
    st.plotly_chart(trajectory_heatmaps(traj, metric, positions=range(start, end),
                                        title=f"{state.plain(m.name or key)}: {TRAJECTORY_METRICS[metric][0]}, "
                                              f"tokens {start}–{end - 1} (text = top-1 token)"),
                    width="content", key="lens_traj")
