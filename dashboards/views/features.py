"""Features: the sparse autoencoders' latents, one page each, and which of them fire on your text."""
from __future__ import annotations

import compute
import link
import precomputed
import state
import streamlit as st

from sprout_interp.plots.features import activation_histogram, context_html, contexts_html, logit_effect_chart

state.header(
    "Features (sparse autoencoders)",
    "A sparse autoencoder (SAE) rewrites one layer's residual stream as a sum of a few of its thousands of "
    "*features* (TopK, Gao et al. 2024: 32 active per token). Each feature has a page, as on Neuronpedia: where it "
    "fires most on held-out text, how strongly, and which tokens its direction promotes through the unembedding.",
)
m, key, text, toks = state.page_inputs()

layers = compute.sae_layers(m, key)
if not layers:
    st.info("This checkpoint has no sparse autoencoder beside it. Train one with "
            "`python -m sprout_interp.features.train --model <name or path> --layer 3` (about a quarter of an hour "
            "on a CPU), then reload.")
    state.stop()
link.bind("layer", f"feat_layer_{key}", link.one_of(layers))
layer = st.selectbox("layer", layers, format_func=lambda l: f"block {l + 1} (layer {l}, blocks.{l}.hook_resid_post)",
                     key=f"feat_layer_{key}")
with st.spinner("loading the SAE…"), state.shown_errors("the SAE"):
    sae = compute.sae(m, key, layer)
qual = sae.info.get("quality") or {}
if qual:
    c = st.columns(4)
    c[0].metric("features", f"{sae.d_sae:,}", help="latents of the SAE")
    c[1].metric("L0", f"{qual.get('l0', float('nan')):.0f}", help="mean active features per token (held-out)")
    c[2].metric("variance explained", f"{qual.get('fve', float('nan')):.0%}")
    c[3].metric("loss recovered", f"{qual.get('loss_recovered', float('nan')):.1%}",
                help="(CE zero-ablated − CE with the reconstruction) / (CE zero-ablated − CE clean), held-out text")

# each tab runs only while it is open (the text tab builds a dozen feature pages for its descriptions)
TABS = ["Feature page", "On your text"]
# a typed text opens on its features (each new text once; a tab chosen afterwards stays); a link's tab, applied
# next, still wins
if st.session_state.get("text_choice") == state.OWN_TEXT and st.session_state.get("feat_text_opened") != text:
    st.session_state["feat_text_opened"] = text
    st.session_state["feat_tab"] = TABS[1]
link.bind("tab", "feat_tab", link.one_of(TABS))
page_tab, text_tab = st.tabs(TABS, key="feat_tab", on_change="rerun")
link.bind("how", "feat_how", link.one_of(["by number", "by token"]))
link.bind("token", "feat_token", lambda raw: raw[: state.MAX_URL_TEXT])
link.bind("feature", f"feat_n_{key}_{layer}", link.int_in(0, sae.d_sae - 1))
for k in ("feat_how", "feat_token", f"feat_n_{key}_{layer}", f"feat_pick_{key}_{layer}", f"feat_text_pick_{key}_{layer}"):
    if k in st.session_state:  # a widget in the closed tab is not drawn: keep what it held for when it opens again
        st.session_state[k] = st.session_state[k]
st.session_state.setdefault("feat_token", " the")

with page_tab:
    if page_tab.open:
        how = st.radio("find a feature", ["by number", "by token"], horizontal=True, key="feat_how")
        state.remember(f"feat_n_{key}_{layer}", precomputed.DEFAULT_FEATURE, 0, sae.d_sae - 1)
        if how == "by token":
            tok = state.clean_text(st.text_input("a token (one token, with its leading space: ' Plax')", key="feat_token"))
            with st.spinner("searching…"), state.shown_errors("the token search"):
                found = compute.features_for_token(m, key, layer, tok)
            if found.empty:
                st.info(f"{state.md(repr(tok))} does not occur in the held-out sample, or no feature fires on it.")
            else:
                st.dataframe(found, hide_index=True)
                pick = st.selectbox("show feature", list(found["feature"]), key=f"feat_pick_{key}_{layer}")
                st.session_state[f"feat_n_{key}_{layer}"] = int(pick)
        feature = st.number_input(f"feature (0 … {sae.d_sae - 1})", min_value=0, max_value=sae.d_sae - 1, step=1,
                                  key=f"feat_n_{key}_{layer}")
        with st.spinner("building the feature's page…"), state.shown_errors("the feature page"):
            page = compute.feature_page(m, key, layer, int(feature))
        st.markdown(f"**feature {int(feature)}**, block {layer + 1} (layer {layer}): {state.md(page.description)}")
        c = st.columns(3)
        c[0].metric("fires on", f"{page.frequency:.2%}", help=f"of {page.n_tokens:,} held-out tokens")
        c[1].metric("max activation", f"{page.max_activation:.2f}")
        c[2].metric("mean when on", f"{page.mean_activation:.2f}")
        st.markdown("**Top-activating contexts** (held-out text; the firing token outlined, background = activation)")
        st.html(contexts_html(page.contexts))
        left, right = st.columns(2)
        with left:
            if not page.histogram.empty:
                st.plotly_chart(activation_histogram(page, title=f"activations when on ({page.frequency:.2%} of tokens)"),
                                width="content")
            st.markdown("**Tokens it fires on** (share of its top activations)")
            st.dataframe(page.top_tokens, hide_index=True)
        with right:
            st.plotly_chart(logit_effect_chart(page, title="tokens it promotes and suppresses (W_dec · W_U)"), width="content")
            st.markdown("**The token before** (share of its top activations)")
            st.dataframe(page.top_previous, hide_index=True)

with text_tab:
    if text_tab.open:
        with st.spinner("encoding your text…"), state.shown_errors("the features of this text"):
            cells, by = compute.text_features(m, key, text, layer)
        if cells.attrs.get("notice"):
            st.warning(state.md(cells.attrs["notice"]))
        if by.empty:
            st.info("No feature fires on this text.")
        else:
            top = by.head(12).copy()
            desc = compute.feature_descriptions(m, key, layer, tuple(int(f) for f in top["feature"]))
            top["description"] = [desc[int(f)] for f in top["feature"]]
            st.markdown("**The strongest features on this text** (pos 0-based)")
            # a table whose cells wrap: a description is a sentence or two, which a data grid's column cuts off
            st.table(top.round(3), hide_index=True)
            show = st.selectbox("colour the text by feature", list(top["feature"]), key=f"feat_text_pick_{key}_{layer}")
            strs = compute.str_tokens(m, key, text)
            acts = [0.0] * len(strs)
            for r in cells[cells["feature"] == show].itertuples():
                acts[r.pos] = r.activation
            st.html(f'<div style="font-family: monospace; line-height: 1.8">{context_html(strs, acts)}</div>')
            with st.expander("every (position, feature) that fires"):
                st.dataframe(cells, hide_index=True)
