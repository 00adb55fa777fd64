"""Compare models: the same text under gpt-1, gpt-4 and sprout (whichever are installed)."""
from __future__ import annotations

import compute
import link
import show
import state
import streamlit as st

from sprout_interp.plots.heads import compare_models_figure, name_copying_figure
from sprout_model.evaluation import NAME_TEXTS

state.header(
    "Compare models",
    "The probability each model gives the actual next token, token by token, on the sidebar's text; then "
    "invented names: does the model copy the rest of a name it has seen once? (No layer numbers on this page: "
    "every figure is the models' real output.)",
)
have = state.installed_shipped()
missing = [n for n in state.SHIPPED if n not in have]
options = list(reversed(have))  # smallest first: gpt-1, gpt-4, sprout
own = state.model_key()
if own and own not in options and st.session_state.get("model_choice") in (state.OWN_PATH, state.UPLOAD):
    options.append(own)
if missing:
    st.caption(f"Not installed here: {', '.join(missing)}.")
if not options:
    st.error("No shipped checkpoint is installed and no model path is chosen: nothing to compare.")
    state.stop()
mkey = "cmp_models_" + "|".join(options)
link.bind("models", mkey, lambda raw: [o for o in options if o in raw] if set(raw) <= set(options) else None,
           lambda v: [k for k in v if not state.is_upload(k)], many=True,
           valid="models from " + ", ".join(state.shown_key(o) for o in options))
st.session_state.setdefault(mkey, list(options))
keys = st.multiselect("models", options, key=mkey, format_func=state.shown_key)
if not keys:
    st.info("Choose at least one model.")
    state.stop()
loaded = []
for k in keys:  # a model that does not load is left out, and the page says why
    try:
        state.load_model(k)
        loaded.append(k)
    except Exception as err:
        st.warning(f"Could not load **{state.md(state.shown_key(k))}**, so it is left out: {state.md(err)}")
keys = loaded
if not keys:
    st.error("None of the chosen models could be loaded.")
    state.stop()

text = state.current_text()
if not text.strip():
    st.warning("The text is empty: pick a ready-made text or type something in the sidebar.")
    state.stop()
with st.spinner("running every model on the text…"), state.shown_errors("the comparison"):
    df = compute.compare_models(tuple(keys), text)
ref = state.load_model(keys[0])
if df.attrs.get("text") != text:
    st.warning(f"The text is longer than the models' context: only its first {ref.cfg.n_ctx:,} tokens are compared.")

n = len(df)
width = 40
link.bind("start", "cmp_start", link.int_in(1, max(n - width + 1, 1)))
state.clamp_state("cmp_start", 1, max(n - width + 1, 1))
start = st.slider("first predicted token shown (pos, 0-based)", 1, max(n - width + 1, 1), key="cmp_start") if n > width else 1
label = {k: state.plain(state.shown_key(k)) for k in keys}  # a typed path is a legend entry: literal text, never plotly markup
show.chart(compare_models_figure(df.rename(columns=label), models=[label[k] for k in keys],
                                  positions=range(start, start + width),
                                  title=f"P(actual next token), tokens {start}–{min(start + width, n + 1) - 1} of {n}"),
            "P(actual next token)")
st.markdown("**Mean probability of the actual next token over the text**")
show.table(df[keys].mean().rename("mean P(next token)").to_frame().T, "mean P(next token)")
with st.expander("every token"):
    show.table(df, "every token")

st.subheader("Invented names")
st.markdown(f"{len(NAME_TEXTS)} short stories each name an invented person twice (\"Zorbin Plax\" …). The first time the name's "
            "later tokens are a surprise; the second time a model that copies from context should expect them.")
with st.spinner("reading the name stories…"), state.shown_errors("the name-copying view"):
    nc = compute.name_copying(tuple(keys))
show.chart(name_copying_figure(nc.assign(model=nc["model"].map(lambda k: label.get(k, state.plain(k))))),
            "invented names")
table = nc.pivot_table(index=["model", "name"], columns="occurrence", values="prob", aggfunc="mean")
table.columns = [f"occurrence {c}: mean P(later tokens)" for c in table.columns]
show.table(table.reset_index(), "invented names")
