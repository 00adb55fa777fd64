"""Ablations: knock out heads and see which tokens the model loses."""
from __future__ import annotations

import compute
import link
import show
import state
import streamlit as st

from sprout_interp.circuits.ablation import KINDS
from sprout_interp.circuits.heads import block_label
from sprout_interp.plots import token_change_chart
from sprout_interp.plots.heads import sweep_heatmap

state.header(
    "Ablations",
    "Replace chosen heads' outputs (`blocks.{layer}.attn.hook_z`, before W_O) and rerun the model on the text. "
    "**zero**: zeros; **mean**: the head's mean output over held-out text; **resample**: its output, at the same "
    "position, on another (held-out) text. The model itself is never changed: each run adds its hooks and removes "
    "them, so other sessions never see your ablation.",
)
m, key, text, toks = state.page_inputs()
L, H, T = m.cfg.n_layers, m.cfg.n_heads, int(toks.shape[1])
if T < 2:
    st.warning("The text is a single token: there is no next token to predict. Type a longer text.")
    state.stop()

heads_all = [(l, h) for l in range(L) for h in range(H)]
hkey = f"abl_heads_{key}"


def _heads(raw: list[str]) -> list[tuple[int, int]] | None:
    """``?heads=1.0&heads=2.1`` (layer.head, 0-indexed) as the heads it names; None (refused, with bind's warning)
    when any of them is not a head of this model."""
    out = []
    for r in raw:
        lh = tuple(int(x) for x in r.split("."))
        if len(lh) != 2 or lh not in heads_all:
            return None
        if lh not in out:
            out.append(lh)
    return out or None


link.bind("heads", hkey, _heads, lambda v: [f"{l}.{h}" for l, h in v], many=True,
           valid=f"layer.head pairs, layer 0 to {L - 1} and head 0 to {H - 1} (e.g. 1.0)")
link.bind("kind", "abl_kind", link.one_of(KINDS))


# The first choice is the induction circuit every page names (compute.induction_circuit, the claims scripts' call):
# as the head scores rank it until someone confirms it by ablation (the button below: dozens of forwards, so only when
# asked), then the confirmed circuit. The choice follows the circuit until it is changed here (or set by a link).
ckey, fkey = f"abl_confirm_{key}", f"abl_first_{key}"  # confirming asked; the heads last chosen for the user
if st.session_state.pop(ckey, None) == "asked":
    with st.spinner("confirming the induction circuit by ablation (each candidate head alone, then together)…"), \
            state.shown_errors("the circuit search"):
        compute.confirm_circuit(m, key)
    st.session_state.pop(hkey, None)  # asked for: the confirmed heads replace the choice
circ = None
with st.spinner("ranking the heads for a first choice…"):
    try:
        circ = compute.induction_circuit(m, key)
    except Exception as err:  # no first choice to offer; the page works without one
        st.info(f"No heads are chosen at first: the circuit finder could not run on this model ({state.md(err)}).")
first = compute.circuit_heads(circ) if circ is not None else []
if hkey not in st.session_state or st.session_state.get(fkey) == st.session_state[hkey] != first:
    st.session_state[hkey] = st.session_state[fkey] = first
c = st.columns([3, 1])
heads = c[0].multiselect("heads to ablate (together)", heads_all, key=hkey,
                         format_func=lambda lh: f"{block_label(lh[0])} · head {lh[1]}")
kind = c[1].radio("kind", KINDS, horizontal=True, key="abl_kind")
named = ", ".join(f"{block_label(lh[0])} · head {lh[1]}" for lh in first) or "none"
if circ is not None and not circ.confirmed:
    c = [st.container(), st.container()]  # the caption, then the button under it (in a narrow column its label was cut)
    c[0].caption(f"First choice ({named}): the induction circuit as the head scores rank it (the circuit finder with "
                 "the README's settings: the best induction head and the best previous-token head on repeated random "
                 "tokens and held-out text), not yet confirmed by ablation.")
    c[1].button("confirm the circuit by ablation", key="abl_confirm_btn",
                on_click=lambda: st.session_state.__setitem__(ckey, "asked"),
                help="Mean-ablates each candidate head alone, then together, measuring the name copying and the "
                     "held-out loss, as the README's claims do; the confirmed heads replace the choice on every page. "
                     "Dozens of forwards: tens of seconds on a CPU, once per model.")
elif circ is not None:
    st.caption(f"First choice ({named}), confirmed by ablation: {state.md(circ.summary())}")
if circ is not None and not first:
    st.info(f"The circuit finder names no induction head in this model: its best induction score is "
            f"{circ.induction_score:.2f} ({state.md(circ.induction_label)}), below its bar of {circ.threshold:.2f}. "
            "No heads are chosen at first.")
if not heads:
    st.info("Choose one or more heads to ablate. (The first choice offered is the induction circuit the circuit "
            "finder names, when it names one.)")
else:
    with st.spinner(f"{kind}-ablating {len(heads)} head(s)…"), state.shown_errors("the ablation"):
        eff = compute.ablation_effect(m, key, text, tuple(sorted(heads)), kind)
        _, source = compute.reference(m, key, kind, T)
    k = st.columns(4)
    k[0].metric("loss, clean (nats/token)", f"{eff.attrs['clean_loss']:.3f}")
    k[1].metric("loss, ablated", f"{eff.attrs['ablated_loss']:.3f}", f"{eff.attrs['loss_change']:+.3f}",
                delta_color="inverse")
    k[2].metric("mean P(next), clean", f"{eff['clean_prob'].mean():.1%}")
    k[3].metric("mean P(next), ablated", f"{eff['ablated_prob'].mean():.1%}")
    if source:
        st.caption(f"{kind} ablation reference: {source}.")
    n = len(eff)
    width = 60
    state.clamp_state("abl_start", 1, max(n - width + 1, 1))
    start = st.slider("first predicted token shown (pos, 0-based)", 1, max(n - width + 1, 1), key="abl_start") if n > width else 1
    show.chart(token_change_chart(eff, positions=range(start, start + width),
                                   title=f"change in P(actual next token) with {len(heads)} head(s) {kind}-ablated "
                                         f"(tokens {start}–{min(start + width, n + 1) - 1} of {n})"),
                "change in P(next token)")
    st.markdown("**Every token**, largest drop first (position = the predicted token's index in the text, "
                "the first token being 0; context = the token before it)")
    show.table(eff.sort_values("prob_change"), "every token, ablated")

st.subheader("Every head alone")
st.markdown(f"Ablate each of the {L * H} heads by itself ({kind}) and measure the loss on this text: which heads "
            "does the text need?")
flag = "abl_sweeps"
want = (key, text, kind)
if st.button(f"run the full sweep ({L * H} heads, {kind})", key="abl_sweep_btn"):
    st.session_state.setdefault(flag, set()).add(want)
if want in st.session_state.get(flag, set()):
    with st.spinner("sweeping every head…"), state.shown_errors("the sweep"):
        sw = compute.sweep(m, key, text, kind)
    show.chart(sweep_heatmap(sw, title=f"loss change, {kind}"), "sweep")
    st.caption(f"Change in the mean loss on this text (nats/token) when that head alone is {kind}-ablated; "
               f"clean loss {float(sw['clean'].iloc[0]):.3f}. Rows: block (from 1) and layer (code index).")
    show.table(sw.sort_values("change", ascending=False), "sweep")
else:
    st.caption("The sweep runs only when you ask: it is the slowest thing on this page.")
