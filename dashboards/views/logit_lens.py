"""Logit lens: what the model would say if it stopped after each block."""
from __future__ import annotations

import hashlib

import compute
import link
import pandas as pd
import scrolling
import show
import state
import streamlit as st

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

link.bind("lens", "lens_which", link.one_of(["logit", "tuned"]))
which = st.radio("lens", ["logit", "tuned"], horizontal=True, key="lens_which",
                 help="tuned: each block's stream first goes through a learned affine translator (the tuned lens, "
                      "Belrose et al. 2023) trained for this checkpoint")
with st.spinner("reading every block through the head…"), state.shown_errors("the logit lens"):
    lens, summary, cells, echo = compute.lens(m, key, text, which)
if lens.notice:
    st.warning(lens.notice)
R = lens.n_rows



# -- which tokens to draw, which cell to inspect ------------------------------------------------
# a new model or text starts the cell pickers afresh (a position and row chosen on the old text, or a click
# on the old grid, would otherwise leave the pickers and the detail panel naming different cells)
text_id = hashlib.sha1(f"{key}\0{text}".encode("utf-8", "replace")).hexdigest()[:12]
if st.session_state.get("lens_text_id") not in (None, text_id):
    for k in ("lens_pos", "lens_row", "lens_start", "lens_applied", "lens_centred"):
        st.session_state.pop(k, None)
st.session_state["lens_text_id"] = text_id
grid_key = f"lens_grid_{text_id}"  # the grid's click selection belongs to this text only

widths = [10, 20, 30, 40, 60, 80, 120]
c = st.columns([1, 3, 1, 1])
link.bind("tokens", "lens_width", link.one_of(widths))
link.bind("start", "lens_start", link.int_in(0, max(T - 1, 0)))
link.bind("pos", "lens_pos", link.int_in(0, T - 1))
link.bind("row", "lens_row", link.int_in(0, R - 1))
st.session_state.setdefault("lens_width", 30)
width = c[0].selectbox("tokens shown", widths, key="lens_width",
                       help="More than fit the page: scroll the grid sideways.")

# a click on the grid (previous run) picks the cell: apply it once, before the pickers are drawn
try:
    pts = st.session_state[grid_key]["selection"]["points"]
except (KeyError, TypeError):
    pts = []
picked = next((tuple(int(v) for v in p["customdata"][:2]) for p in pts if p.get("customdata")), None)
if picked is not None and picked != st.session_state.get("lens_applied"):
    st.session_state["lens_applied"] = picked
    st.session_state["lens_pos"], st.session_state["lens_row"] = picked
# the position starts where the text copies a name it repeats (compute.name_copy: the token before the copied one,
# so the cell shows whether each block already predicts the copy), else at the first token shown; a first token
# chosen (in the link) keeps its window: the position then starts there
state.clamp_state("lens_start", 0, max(T - width, 0))
copy = None if "lens_start" in st.session_state else compute.name_copy(compute.str_tokens(m, key, text))
state.remember("lens_pos", copy["pos"] if copy else st.session_state.get("lens_start", 0), 0, T - 1)
state.remember("lens_row", R - 1, 0, R - 1)
# the grid moves to a newly chosen position (typed, clicked, from a link) when it lies outside the tokens shown
if st.session_state.get("lens_centred") != (st.session_state["lens_pos"], width):
    st.session_state["lens_centred"] = (st.session_state["lens_pos"], width)
    first = st.session_state.get("lens_start", 0)
    if not first <= st.session_state["lens_pos"] < first + width:
        st.session_state["lens_start"] = min(max(st.session_state["lens_pos"] - width // 2, 0), max(T - width, 0))
start = c[1].slider("first token shown", 0, max(T - width, 0), key="lens_start") if T > width else 0
end = min(start + width, T)
pos = c[2].number_input("position", 0, T - 1, key="lens_pos")
row = c[3].selectbox("row", list(range(R)), format_func=lambda r: lens.rows[r], key="lens_row")

# -- the grid ----------------------------------------------------------------------------------
fig = logit_lens_grid(lens, m.to_str_tokens, positions=range(start, end), clickable=True, selected=(pos, row),
                      title=f"{state.plain(m.name or key)}, {lens.lens} lens: top-1 guess after each block, "
                            f"tokens {start}–{end - 1} of {T}")
scrolling.chart(fig, "logit lens grid", "lens_grid_box", pos - start, on_select="rerun", selection_mode="points",
                key=grid_key)
st.caption("Click a cell (or set position and row above) to see its five candidates. Hover shows them too; a cell "
           "shows at most 8 characters of its token.")

# -- the chosen cell -------------------------------------------------------------------------
cell = cells[(cells["pos"] == pos) & (cells["block"] == row)]
left, right = st.columns([1, 1])  # the five candidates need half the page (2:3 cut its last column at 1280 px)
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
    delta, color = state.points_delta(pv["final"] - pv["penultimate"])
    k[1].metric(f"after block {pv['final_block']} (final)", f"{pv['final']:.0%}", delta, delta_color=color,
                delta_arrow="auto" if color == "normal" else "off")
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
show.chart(layer_metrics_chart(summary.assign(model=state.plain(m.name or key)), color="model", dash=None,
                                chapter=chapter, title=f"{state.plain(m.name or key)}: the logit lens by block (this text)"),
            "logit lens by block")
if chapter is None:
    st.caption(f"The chapter's 77% / 59% are for Sprout's blocks 7 and 8; this model has {m.cfg.n_layers} blocks.")
show.table(summary, "logit lens by block")

# -- per-token trajectories, both lenses -----------------------------------------------------
# computed only once opened (both lenses over every row and token: more work than the rest of the page)
st.subheader("Per-token trajectories: logit lens vs tuned lens")
link.bind("trajectories", "lens_traj_open", link.as_bool, link.fmt_bool)
with st.expander("each token through both lenses, block by block (entropy, cross-entropy, KL to the final output)",
                 key="lens_traj_open", on_change="rerun") as traj_box:
    if traj_box.open:
        link.bind("colour", "lens_traj_metric", link.one_of(list(TRAJECTORY_METRICS)))
        metric = st.selectbox("colour", list(TRAJECTORY_METRICS), format_func=lambda k: TRAJECTORY_METRICS[k][0],
                              key="lens_traj_metric")
        with st.spinner("reading every block through both lenses…"), state.shown_errors("the trajectories"):
            traj = compute.lens_trajectories(m, key, text)
            tfig = trajectory_heatmaps(traj, metric, positions=range(start, end),
                                       title=f"{state.plain(m.name or key)}: {TRAJECTORY_METRICS[metric][0]}, "
                                             f"tokens {start}–{end - 1} (text = top-1 token)")
            scrolling.chart(tfig, "trajectories", "lens_traj_box", pos - start, key="lens_traj")
