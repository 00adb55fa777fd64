"""Steering: add a contrast's direction to the residual stream and watch what the model does."""
from __future__ import annotations

import compute
import link
import show
import state
import streamlit as st

from sprout_interp.behaviour.steering import EXAMPLE
from sprout_interp.circuits.heads import block_label
from sprout_interp.plots.steering import steering_effect_figure, steering_layers_figure, zero_vector_blocks

COEFFS = tuple(float(c) for c in range(-8, 9))

state.header(
    "Steering",
    "A **steering vector** is the mean residual stream over texts with a property minus the mean over the same "
    "texts without it, read at each text's last token entering one block (`blocks.{layer}.hook_resid_pre`). Adding "
    "*coefficient × vector* there on every forward pushes the model towards the property; a negative coefficient "
    "pushes it away. The default contrast differs only in \"She\" / \"He\", and the metric is the logit difference "
    "`logit[answer] - logit[wrong]` after the prompt (nats of log-odds). The loss on the sidebar's text, under "
    "the same coefficients, says when a dose stops steering and starts breaking the model.",
)
m, key, text, toks = state.page_inputs()
L = m.cfg.n_layers


def _lines(raw: str) -> tuple[str, ...]:
    return tuple(line.strip() for line in state.clean_text(raw).splitlines() if line.strip())


for param, k in (("prompt", "steer_prompt"), ("answer", "steer_answer"), ("wrong", "steer_wrong")):
    link.bind(param, k, lambda raw: raw[: state.MAX_URL_TEXT])
st.session_state.setdefault("steer_pos", "\n".join(EXAMPLE["positive"]))
st.session_state.setdefault("steer_neg", "\n".join(EXAMPLE["negative"]))
for k, field in (("steer_prompt", "prompt"), ("steer_answer", "answer"), ("steer_wrong", "wrong")):
    st.session_state.setdefault(k, EXAMPLE[field])
c = st.columns(2)
positive = _lines(c[0].text_area("texts with the property (one a line)", key="steer_pos", height=120))
negative = _lines(c[1].text_area("the same texts without it (one a line)", key="steer_neg", height=120))
c = st.columns([3, 1, 1])
prompt = state.clean_text(c[0].text_input("prompt (the metric reads the token after it)", key="steer_prompt"))
answer = c[1].text_input("answer (pushed up)", key="steer_answer")
wrong = c[2].text_input("wrong (pushed down)", key="steer_wrong")
if not positive or not negative or not prompt.strip():
    st.warning("Give at least one text on each side and a prompt.")
    state.stop()

link.bind("coeff", "steer_coeff", lambda raw: float(raw) if float(raw) in COEFFS else None, lambda v: f"{v:g}",
           valid="one of " + ", ".join(f"{c:g}" for c in COEFFS))
st.session_state.setdefault("steer_coeff", 2.0)
coeff = st.select_slider("coefficient (× the vector)", options=COEFFS, key="steer_coeff", format_func=lambda v: f"{v:g}")

st.subheader("Which block does the contrast steer from?")
with st.spinner("making each block's vector and steering with it…"), state.shown_errors("the steering by block"):
    layers = compute.steering_layers(m, key, positive, negative, prompt, answer, wrong, coeff)
show.chart(steering_layers_figure(layers), "steering by block")
st.caption(f"Each bar: the vector made from the contrast entering that block, added {coeff:g} times there; the "
           f"change in the logit difference on the prompt (clean {float(layers['clean'].iloc[0]):.3f}). The vector is "
           "read from the stream at that block, so it grows with the stream and one coefficient is a comparable dose "
           "everywhere (hover: its norm beside the stream's). Blocks counted from 1; layer = block - 1.")
zero = zero_vector_blocks(layers)
if zero:
    st.caption(f"No bar at block{'s' if len(zero) > 1 else ''} {', '.join(map(str, zero))}: the vector there is 0, so "
               "adding it changes nothing. Both sets of texts give the same stream at their last token"
               + (" (entering block 1 the stream is the last token's embedding alone, and both sets end on the "
                  "same tokens)" if 1 in zero else "") + ".")

best = int(layers.loc[layers["change"].abs().idxmax(), "layer"])
link.bind("block", "steer_layer", link.block_in(L), link.fmt_block)
state.remember("steer_layer", best, 0, L - 1)
layer = st.selectbox("steer at block", list(range(L)), key="steer_layer", format_func=block_label)

with st.spinner("steering with every coefficient…"), state.shown_errors("the steering"):
    effect, loss = compute.steering_effect(m, key, positive, negative, prompt, answer, wrong, layer, COEFFS, text)
show.chart(steering_effect_figure(effect, loss), "steering by coefficient")
row = effect.set_index("coeff").loc[coeff]
lrow = loss.set_index("coeff").loc[coeff]
k = st.columns(3)
k[0].metric(f"logit difference at coefficient {coeff:g}", f"{row['value']:.3f}", f"{row['change']:+.3f}")
k[1].metric("loss on the sidebar's text (nats/token)", f"{lrow['value']:.3f}", f"{lrow['change']:+.3f}",
            delta_color="inverse")
k[2].metric("added norm / stream norm", f"{row['added_norm']:.1f} / {row['stream_norm']:.1f}")
show.table(effect.merge(loss[["coeff", "value", "change"]].rename(columns={"value": "loss", "change": "loss_change"}),
                         on="coeff"), "steering by coefficient")

st.subheader("Steered continuations")
st.markdown(f"The prompt continued with coefficients -{abs(coeff):g}, 0 and +{abs(coeff):g} at {block_label(layer)}, "
            "sampled with one seed, so the coefficient is the only difference (0 is the model's own sample).")
gkey = "steer_generations"
want = (key, positive, negative, prompt, layer, abs(coeff))
if st.button("sample the continuations", key="steer_generate_btn"):
    st.session_state.setdefault(gkey, set()).add(want)
if want in st.session_state.get(gkey, set()):
    with st.spinner("sampling…"), state.shown_errors("the continuations"):
        gens = compute.steered_generations(m, key, positive, negative, prompt, layer, (-abs(coeff), 0.0, abs(coeff)))
    show.table(gens, "steered continuations")
else:
    st.caption("Sampling runs only when you ask: with a hook on the model, each new token is a full forward.")
