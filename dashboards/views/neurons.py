"""Neurons: the feed-forward's own units, which of them push a prediction, one neuron's page and its ablation."""
from __future__ import annotations

import compute
import link
import show
import state
import streamlit as st

from sprout_interp.circuits.heads import block_label
from sprout_interp.plots.neurons import (
    neuron_attribution_chart,
    neuron_histogram,
    neuron_logit_effect_chart,
    signed_context_html,
    signed_contexts_html,
)

state.header(
    "Neurons (the feed-forward's units)",
    "A *neuron* is one hidden unit of a block's SwiGLU feed-forward: its activation is `silu(gate) × up` "
    "(`blocks.{layer}.mlp.hook_post`), and it writes *activation × W_out[neuron]* into the residual stream. Its "
    "activation has both signs and both write (orange: positive, blue: negative). First, which neurons push the "
    "prediction at one position of your text (their direct effect through the final norm, as the LLM Transparency "
    "Tool lists them); then one neuron's page, as Neuroscope shows it: where it fires on held-out text, what its "
    "output direction promotes, and what ablating it does to your text.",
)
m, key, text, toks = state.page_inputs()
L = m.cfg.n_layers
d_mlp = m.cfg.d_mlp
strs = compute.str_tokens(m, key, text)
T = len(strs)

st.subheader("Which neurons push this prediction?")
link.bind("pos", "nrn_pos", link.int_in(0, T - 1))
state.remember("nrn_pos", T - 1, 0, T - 1)
for param, k in (("answer", "nrn_answer"), ("wrong", "nrn_wrong")):
    link.bind(param, k, lambda raw: raw[: state.MAX_URL_TEXT])
c = st.columns([3, 1, 1])
pos = c[0].select_slider("the prediction at position (0-based; the token after it is predicted)", options=list(range(T)),
                         key="nrn_pos", format_func=lambda p: f"{p}: {strs[p]!r}")
top_guess = compute.top_prediction(m, key, text, pos)
answer = c[1].text_input("answer (blank: the model's top guess)", key="nrn_answer") or top_guess
wrong = c[2].text_input("against (blank: the answer's logit alone)", key="nrn_wrong")
with st.spinner("attributing the prediction to every neuron…"), state.shown_errors("the neuron attribution"):
    top = compute.neuron_attribution(m, key, text, pos, answer, wrong)
what = f"logit[{answer!r}]" + (f" - logit[{wrong!r}]" if wrong else "")
st.caption(f"{state.md(what)} after {state.md(repr(strs[pos]))} (pos {pos}) is {top.attrs['logit_diff']:+.2f}; every "
           f"neuron together writes {top.attrs['neurons_total']:+.2f} of it directly (the rest: the embedding, the "
           "heads, and what neurons do through later blocks, which only an ablation shows). The model's top guess "
           f"here: {state.md(repr(top_guess))}.")
show.chart(neuron_attribution_chart(top), "neurons pushing the prediction")
show.table(top, "neurons pushing the prediction")

st.subheader("One neuron's page")
link.bind("layer", "nrn_layer", link.int_in(0, L - 1))  # 0-indexed as on every page (block = layer + 1)
link.bind("neuron", "nrn_n", link.int_in(0, d_mlp - 1))
link.bind("how", "nrn_how", link.one_of(["from the prediction above", "by number", "by token"]))
st.session_state.setdefault("nrn_token", " the")
how = st.radio("find a neuron", ["from the prediction above", "by number", "by token"], horizontal=True, key="nrn_how")
if how == "from the prediction above":
    labels = {f"block {r.block} neuron {r.neuron} ({r.attribution:+.3f})": (int(r.layer), int(r.neuron))
              for r in top.itertuples()}
    want = st.session_state.get("nrn_layer")  # a link's layer (a feed-forward node's click): its strongest neuron first
    if "nrn_pick" not in st.session_state and want is not None:
        st.session_state["nrn_pick"] = next((lab for lab, (l, _) in labels.items() if l == want), next(iter(labels)))
    pick = st.selectbox("neuron", list(labels), key="nrn_pick")
    layer, neuron = labels[pick]
    st.session_state["nrn_layer"], st.session_state["nrn_n"] = layer, neuron
else:
    state.remember("nrn_layer", 0, 0, L - 1)
    c = st.columns(2)
    layer = c[0].selectbox("block", list(range(L)), key="nrn_layer", format_func=block_label)
    if how == "by token":
        tok = state.clean_text(c[1].text_input("a token (one token, with its leading space: ' she')", key="nrn_token"))
        with st.spinner("searching the held-out sample…"), state.shown_errors("the token search"):
            found = compute.neurons_for_token(m, key, layer, tok)
        if found.empty:
            st.info(f"{state.md(repr(tok))} does not occur in the held-out sample.")
            state.stop()
        st.caption("The neurons most active on the token, in standard deviations of each neuron's activation (z).")
        st.dataframe(found, hide_index=True)
        st.session_state["nrn_n"] = int(st.selectbox("show neuron", list(found["neuron"]), key=f"nrn_found_{layer}"))
    state.remember("nrn_n", 0, 0, d_mlp - 1)
    neuron = int(st.number_input(f"neuron (0 … {d_mlp - 1})", min_value=0, max_value=d_mlp - 1, step=1, key="nrn_n",
                                 disabled=how == "by token"))

# the held-out page reads the whole layer on held-out text (the slowest part of the page): it opens when asked, or
# when the neuron was chosen by number or token (a link that names one)
link.bind("held_out", "nrn_page_open", link.as_bool, link.fmt_bool)
if how != "from the prediction above" and st.session_state.get("nrn_how_opened") != how:
    st.session_state["nrn_page_open"] = True  # each time the way of finding one changes to a number or a token
st.session_state["nrn_how_opened"] = how
with st.expander(f"block {layer + 1} neuron {neuron} on held-out text: its strongest contexts, histogram and the "
                 "tokens it promotes", key="nrn_page_open", on_change="rerun") as held_box:
    if held_box.open:
        with st.spinner("reading the layer's neurons on held-out text…"), state.shown_errors("the neuron page"):
            page = compute.neuron_page(m, key, layer, neuron)
        st.markdown(f"**block {layer + 1} neuron {neuron}** (layer {layer}): {state.md(page.description)}")
        k = st.columns(4)
        k[0].metric("fires on", f"{page.frequency:.2%}", help=f"tokens above a quarter of its largest activation, of "
                                                              f"{page.n_tokens:,} held-out tokens")
        k[1].metric("largest / most negative", f"{page.max_activation:+.2f} / {page.min_activation:+.2f}")
        k[2].metric("mean ± sd", f"{page.mean_activation:+.2f} ± {page.std_activation:.2f}")
        k[3].metric("positive on", f"{page.positive_share:.0%}", help="share of tokens with a positive activation")
        left, right = st.columns(2)
        with left:
            st.markdown("**Strongest positive contexts** (held-out text; the token outlined)")
            st.html(signed_contexts_html(page.contexts))
        with right:
            st.markdown("**Most negative contexts**")
            st.html(signed_contexts_html(page.negative_contexts))
        left, right = st.columns(2)
        with left:
            if not page.histogram.empty:
                show.chart(neuron_histogram(page), "neuron activation histogram")
            st.markdown("**Tokens it fires on** (share of its strongest positive activations)")
            st.dataframe(page.top_tokens, hide_index=True)
        with right:
            show.chart(neuron_logit_effect_chart(page), "neuron logit effects")
            st.markdown("**The token before** (share of its strongest positive activations)")
            st.dataframe(page.top_previous, hide_index=True)

st.subheader("This neuron on your text")
with st.spinner("running the text…"), state.shown_errors("the neuron on your text"):
    on_text = compute.neuron_on_text(m, key, text, layer, neuron)
st.html(f'<div style="font-family: monospace; line-height: 1.8">'
        f'{signed_context_html(list(on_text["token"]), list(on_text["activation"]), center=pos)}</div>')
st.caption(f"Each token on a background as strong as the neuron's activation there (hover: the value); the prediction "
           f"position {pos} outlined.")
link.bind("ablate", "nrn_kind", link.one_of(["zero", "mean"]))
kind = st.radio("ablate it by setting it to", ["zero", "mean"], horizontal=True, key="nrn_kind",
                format_func=lambda k: "zero" if k == "zero" else "its mean on held-out text")
with st.spinner("rerunning the text with the neuron ablated…"), state.shown_errors("the neuron's ablation"):
    loss, pred = compute.neuron_ablation(m, key, text, layer, neuron, kind, pos, answer, wrong)
k = st.columns(2)
k[0].metric("loss on the text (nats/token)", f"{loss.loc[0, 'ablated']:.4f}", f"{loss.loc[0, 'change']:+.4f}",
            delta_color="inverse")
k[1].metric(f"{pred.loc[0, 'metric']} at pos {pos} ({state.plain(what if wrong else 'log P(' + repr(answer) + ')')})",
            f"{pred.loc[0, 'ablated']:.3f}", f"{pred.loc[0, 'change']:+.3f}")
