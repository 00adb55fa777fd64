"""Attention heads: every head of every block at a glance, one head's pattern on the text (with the text
itself to hover over), the head scores with the induction circuit, and the repeated-random-tokens test."""
from __future__ import annotations

import compute
import link
import qk_compute
import qk_view
import show
import state
import streamlit as st

from sprout_interp.circuits.heads import block_label
from sprout_interp.plots.heads import (
    attention_hover_html,
    head_scores_figure,
    head_scores_heatmap,
    pattern_figure,
)
from sprout_interp.plots.picking import clickable_cells

state.header(
    "Attention heads",
    "Rows of a pattern are queries (the token attending), columns are keys (the tokens it looks at); each row "
    "sums to 1 and, being causal, never looks ahead.",
)
m, key, text, toks = state.page_inputs()
L, H, T = m.cfg.n_layers, m.cfg.n_heads, int(toks.shape[1])

# the circuit comes first: its induction head is the head shown when nothing is chosen yet. It is the one circuit
# every page names (compute.induction_circuit: the claims scripts' call), not one ranked on this text.
with st.spinner("scoring every head…"), state.shown_errors("the head scores"):
    scores = compute.head_scores(m, key, text)
    circ = compute.induction_circuit(m, key)
induction = compute.induction_head(circ)  # None: the finder found no induction head
circuit_heads = set(compute.circuit_heads(circ))

c = st.columns([2, 1, 2, 3])
link.bind("layer", "attn_layer", link.int_in(0, L - 1))
link.bind("head", "attn_head", link.int_in(0, H - 1))
# the window of tokens drawn: centred on the chosen position, which starts where the text copies a name it repeats
# (compute.name_copy: the chapter's story, position 56, where " Pl" of "Zorbin Plax" comes again), wide enough to
# reach back to the name's first occurrence (the induction head's stripe is drawn), at most WINDOW_MOST tokens
WINDOW, WINDOW_MOST = 48, 128
strs = compute.str_tokens(m, key, text)
copy = compute.name_copy(strs)
text_id = f"{key}\0{text}"
if st.session_state.get("attn_text_id") not in (None, text_id):  # a new model or text: its own default window
    for k in ("attn_pos", "attn_n"):
        st.session_state.pop(k, None)
st.session_state["attn_text_id"] = text_id
link.bind("pos", "attn_pos", link.int_in(0, T - 1))
link.bind("n", "attn_n", link.int_in(1, T))
want = max(WINDOW, 2 * (copy["pos"] - copy["first"]) + 2) if copy else WINDOW
state.remember("attn_n", min(T, want, WINDOW_MOST), 1, T)
state.remember("attn_pos", copy["pos"] if copy else min(T, WINDOW) // 2, 0, T - 1)
state.remember("attn_layer", induction[0] if induction else 0, 0, L - 1)
state.remember("attn_head", induction[1] if induction else 0, 0, H - 1)
clicked = show.take_click("attn_all")  # a click on a head's small pattern below (previous run) chooses that head
if clicked is not None and 0 <= clicked[0] < L and 0 <= clicked[1] < H:
    st.session_state["attn_layer"], st.session_state["attn_head"] = clicked
layer = c[0].selectbox("block", list(range(L)), format_func=block_label, key="attn_layer")
head = c[1].selectbox("head", list(range(H)), key="attn_head",
                      help="Starts on the induction head the circuit finder names (block 1 head 0 when it finds none).")
pos = int(c[2].number_input("position", 0, T - 1, key="attn_pos",
                            help="The query in the middle of the tokens drawn, outlined in the text view. Starts where "
                                 "the text copies a name it repeats (the second occurrence), when it has one."))
n = c[3].slider("tokens shown", 1, T, key="attn_n") if T > 1 else 1
start = min(max(pos - n // 2, 0), T - n)
end = start + n
shown = f"tokens {start}–{end - 1} of {T}" if start or end < T else f"all {T} tokens"

# -- every head at a glance ------------------------------------------------------------------
st.subheader("Every head at a glance")
with st.spinner("running the model…"), state.shown_errors("the attention patterns"):
    pats = compute.all_patterns(m, key, text, start, n)
    every = compute.all_heads_chart(m, key, text, start, n, induction)
    one = compute.patterns(m, key, text, layer)[head, :end, :end]  # the text view: every token up to the window's end
show.chart(every, "every head", key="attn_all", on_select="rerun", selection_mode="points")
framed = (f"Framed in red: the induction head the circuit finder names, {block_label(induction[0])}, head {induction[1]} "
          f"(induction score {circ.induction_score:.2f} on repeated random tokens)." if induction else
          f"No head is framed: the circuit finder finds no induction head in this model (the best induction score, "
          f"{circ.induction_score:.2f} for {block_label(circ.induction_layer)} head {circ.induction_head}, is below its "
          f"bar of {circ.threshold:.2f}).")
where = (f"centred on position {pos}, where the text copies the name {state.md(repr(''.join(strs[copy['span'][0]:copy['span'][1] + 1]).strip()))} "
         f"(its second occurrence: positions {copy['span'][0]}–{copy['span'][1]}; the first starts at {copy['first']})"
         if copy and pos == copy["pos"] else f"centred on position {pos} as far as the text allows")
st.caption(f"One small pattern per head, {shown} ({where}), all on one colour scale (0–1); a query's weights on "
           f"tokens before the window are not drawn. {framed} Click a head's pattern (or choose it above) to draw it "
           "large below, where hovering shows the tokens and the weights.")

# -- the chosen head ---------------------------------------------------------------------------
st.subheader(f"{block_label(layer)}, head {head}")
# the pattern at a size it reads at (its plot square, the colour bar as tall), the text view beside it where the
# page is wide enough, else below it
# a click on a cell of the pattern drawn large (previous run) opens that cell's QK attribution (qk_view) below it
link.bind("qk", "qk_open", link.as_bool, link.fmt_bool)
link.bind("qk_query", "qk_query", link.int_in(0, T - 1))
link.bind("qk_key", "qk_key", link.int_in(0, T - 1))
qk_view.take_cell_click("attn_large", "qk_query", "qk_key", "qk_open", T)
with st.container(horizontal=True, gap="large"):
    show.chart(clickable_cells(pattern_figure(pats[layer, head], strs[start:end], first=start,
                                              title=f"{block_label(layer)}, head {head} "
                                                    f"(blocks.{layer}.attn.hook_pattern), {shown}"), offset=start),
               "the chosen head", key="attn_large", on_select="rerun", selection_mode="points")
    with st.container(width=560):
        st.html(attention_hover_html(one, strs[:end], element_id=f"attn-hover-{layer}-{head}", shown=pos,
                                     title=f"{block_label(layer)}, head {head} on the text (tokens 0–{end - 1})"),
                unsafe_allow_javascript=True)
cell = qk_view.first_cell(qk_compute.repeat_cell(m, key, text), T)  # the text's first repeat: the panel's first cell
st.session_state.setdefault("qk_query", cell[0])
st.session_state.setdefault("qk_key", cell[1])
qk_view.cell_panel(strs, layer, head, "qk_query", "qk_key", "qk_open",
                   lambda lyr, hd, q, k: qk_compute.qk_attribution(m, key, text, lyr, hd, q, k))

# -- head scores and the circuit ----------------------------------------------------------------
st.subheader("Head scores")
st.markdown("**previous-token**: attention to the token just before; **duplicate**: to earlier copies of the "
            "same token; **induction**: to the token *after* an earlier copy. Measured on repeated random "
            "tokens (16 rows of 64 tokens, each repeated twice) and on this text.")
how = ("confirmed by ablation" if circ.confirmed else
       "as the head scores rank it; the Ablations page confirms it by ablation, as the README's claims do")
(st.success if circ.found else st.info)(
    f"The induction circuit ({how}): {state.md(circ.summary())}. **How the heads are ranked:** a previous-token head by "
    "the lower of its two previous-token scores, on repeated random tokens and on held-out text (a previous-token head "
    "looks at the token before on any text), the table's **prev_token_ranked** column; the induction head by its "
    "induction score on repeated random tokens (**induction_random**). A head that scores high on one text only "
    "(on this text, or on random tokens alone) is not ranked first.")
if induction is None:
    st.warning(f"No induction head: the best induction score in this model is {circ.induction_score:.2f} "
               f"({state.md(circ.induction_label)}), below the circuit finder's bar of {circ.threshold:.2f}, so no "
               "head is named as one here.")


def _mark(row):
    hit = (int(row["layer"]), int(row["head"])) in circuit_heads
    return ["background-color: #fff3b0" if hit else ""] * len(row)


# the scores the circuit is ranked by (random tokens and held-out text, text-independent) beside this text's
ranked = compute.circuit_scores(m, key)[["layer", "head", "prev_token_random", "prev_token_text"]]
ranked = ranked.assign(prev_token_heldout=ranked["prev_token_text"],
                       prev_token_ranked=ranked[["prev_token_random", "prev_token_text"]].min(axis=1))
table = scores.merge(ranked[["layer", "head", "prev_token_heldout", "prev_token_ranked"]], on=["layer", "head"])
lead = [c for c in ("layer", "block", "head") if c in table.columns]
table = table[lead + ["prev_token_ranked", "prev_token_random", "prev_token_heldout"]
              + [c for c in table.columns if c not in lead and c not in ("prev_token_ranked", "prev_token_random",
                                                                        "prev_token_heldout")]]
table.attrs.update(scores.attrs)
# two tables of at most seven columns (all eleven side by side were cut at 1280 px): the scores the circuit is
# ranked by, then the rest with this text's; the CSV holds them all
by = lead + ["prev_token_ranked", "prev_token_random", "prev_token_heldout", "induction_random"]
rest = [c for c in ("block", "head") if c in table.columns] + [c for c in table.columns if c not in by]
show.table(table, "head scores", data=table[by].style.apply(_mark, axis=1).format(precision=3))
st.caption("Highlighted: the heads of the induction circuit above (the circuit finder's call, as in the README's "
           "claims). **prev_token_ranked** = the lower of **prev_token_random** (repeated random tokens) and "
           "**prev_token_heldout** (held-out text): the score the best previous-token head is named by. layer = index "
           "in code (blocks.{layer}); block = layer + 1, the chapter's count.")
st.dataframe(table[rest].style.format(precision=3), hide_index=True)
st.caption("The other scores: duplicate-token on repeated random tokens, and every score on this text (the *_text "
           "columns); the circuit is not ranked on this text.")
show.chart(head_scores_figure(scores), "head scores")

st.subheader("What each head writes: its full OV circuit")
st.markdown("Where a head looks is half of copying; the other half is what it writes there. The full OV circuit "
            "W_E W_V W_O W_U gives, for every token a head reads, its effect on every logit. **Copying score**: "
            "Σλ / Σ|λ| over that circuit's eigenvalues (Elhage et al. 2021; Olsson et al. 2022): near 1 the head "
            "promotes the token it reads, near −1 it writes against it. From the weights alone: for heads after "
            "block 1 the stream holds more than the token, so this says what a head is built to do, not what a "
            "text makes it do.")
with state.shown_errors("the full OV circuits"):
    ov = compute.ov_copying(m, key, False)
show.chart(head_scores_heatmap(ov, "copying_score", zmin=-1.0, zmax=1.0, colorscale="RdBu",
                                title="full OV circuit copying score (Σλ / Σ|λ|; blocks from 1, heads from 0)"),
            "OV copying scores")
link.bind("ov_ranks", "ov_ranks_open", link.as_bool, link.fmt_bool)
if st.toggle("also rank each token's own logit in what the head writes (one vocabulary-sized product per head: "
             "seconds for gpt-4, about a minute for Sprout)", key="ov_ranks_open"):
    with st.spinner("ranking every token's own logit in every head's full OV circuit…"), \
            state.shown_errors("the OV self-ranks"):
        ov = compute.ov_copying(m, key, True)
    show.table(ov, "OV copying")
    st.caption("self_top_k: the share of the vocabulary whose own token is among the 5 the head promotes most "
               "when it reads that token; self_rank_median: the median rank of a token's own logit (0 = the largest).")

# -- the repeated-random-tokens test ------------------------------------------------------------
st.subheader("The repeated-random-tokens test")
st.markdown("Random tokens, then the same tokens again. The first time nothing predicts them; the second time a "
            "model with an induction circuit copies them from the first copy. An induction head at position "
            "*n + i* of the second copy attends to position *i + 1* of the first (the token after the earlier "
            "copy of its own token): a diagonal stripe *n − 1* tokens behind the main diagonal. The head shown is "
            "the one chosen above (at first, the induction head the circuit finder names).")
# run only once opened: its own forwards on the random tokens, and the button for each head's part in copying
link.bind("repeated", "rep_open", link.as_bool, link.fmt_bool)
for k in ("rep_len", "rep_seed"):
    if k in st.session_state:  # a widget in the closed expander is not drawn: keep what it held
        st.session_state[k] = st.session_state[k]
with st.expander("run the test: the copy losses, the chosen head on the repeated tokens, each head's part in copying",
                 key="rep_open", on_change="rerun") as rep_box:
    if rep_box.open:
        c = st.columns(2)
        lengths = [8, 16, 32, 64, 128]
        link.bind("rep_len", "rep_len", link.one_of(lengths))
        link.bind("seed", "rep_seed", link.int_in(0, 10_000))
        st.session_state.setdefault("rep_len", 32)
        st.session_state.setdefault("rep_seed", 0)
        seq_len = c[0].select_slider("random tokens per copy", lengths, key="rep_len")
        seed = c[1].number_input("seed", 0, 10_000, key="rep_seed")
        seq_len = min(int(seq_len), m.cfg.n_ctx // 2)
        with st.spinner("running the test…"), state.shown_errors("the repeated-tokens test"):
            _, rstrs = compute.repeated_tokens(m, key, seq_len, int(seed))
            rpat = compute.repeated_patterns(m, key, seq_len, int(seed), layer)
            first, second, ratio = compute.copying_ratio(m, key, seq_len, int(seed))
        k = st.columns(3)
        k[0].metric("loss on copy 1 (nats/token)", f"{first:.2f}")
        k[1].metric("loss on copy 2", f"{second:.2f}")
        k[2].metric("ratio copy 2 / copy 1", f"{ratio:.2f}", help="near 1: no copying; far below 0.5: an induction circuit")
        show.chart(pattern_figure(rpat[head], rstrs, title=f"{block_label(layer)}, head {head} on {seq_len} random "
                                   f"tokens repeated twice"), "repeated tokens")

        st.markdown("**Which heads does copying need?** Ablate each head alone on the repeated tokens and see how much the "
                    "copying ratio rises (the exact fast sweep: each group of heads reruns only the blocks from its own on; "
                    "computed once per model and shared by every session).")
        flag = f"copying_sweep_{key}"
        if st.button("measure each head's part in copying", key="copy_btn"):
            st.session_state[flag] = True
        if st.session_state.get(flag):
            bar = st.empty()  # filled only while the sweep runs (the first time for this model)
            with state.shown_errors("the copying sweep"):
                cs = compute.copying_sweep(m, key, progress=lambda done, total: bar.progress(
                    done / total, text=f"ablating each head alone on the repeated tokens: {done} of {total} heads done…"))
            bar.empty()
            show.chart(head_scores_heatmap(cs, "change", zmin=None, zmax=None, colorscale="Reds",
                                            title="copying ratio change when the head is zero-ablated"), "copying sweep")
            st.caption(f"How much the copying ratio (loss on copy 2 / copy 1; clean {cs.attrs['clean']:.2f}) rises when that "
                       "head alone is zero-ablated, on 16 rows of 64 random tokens repeated twice.")
            show.table(cs, "copying sweep")
