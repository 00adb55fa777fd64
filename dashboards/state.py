"""What every page shares: the chosen model (cached once per process), the chosen text, error display."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import streamlit as st

import sprout_interp as si
from sprout_interp.texts import TEXTS

SHIPPED = ["sprout", "gpt-4", "gpt-1"]
OWN_PATH = "a checkpoint folder or course .pt…"
OWN_TEXT = "type your own…"


@st.cache_resource(show_spinner="loading the model…", max_entries=6)
def load_model(name_or_path: str) -> si.HookedSprout:
    return si.load(name_or_path)


def sidebar() -> None:
    """Model and text pickers; their values live in st.session_state for the pages."""
    with st.sidebar:
        choice = st.selectbox("model", SHIPPED + [OWN_PATH], key="model_choice")
        if choice == OWN_PATH:
            st.text_input("path", key="model_path", placeholder="runs/gpt-4/checkpoint or my_model.pt")
        tchoice = st.selectbox("text", list(TEXTS) + [OWN_TEXT], key="text_choice")
        if tchoice == OWN_TEXT:
            st.text_area("your text", key="own_text", height=160)
        st.caption("Layers: the chapter counts blocks from 1 (\"block 3\"); code and hook names from 0 (`blocks.2`).")


def model_key() -> str:
    choice = st.session_state.get("model_choice", SHIPPED[0])
    return st.session_state.get("model_path", "").strip() if choice == OWN_PATH else choice


def current_model() -> si.HookedSprout | None:
    """The chosen model, or None after showing why it could not be loaded."""
    key = model_key()
    if not key:
        st.info("Type the path of a checkpoint folder or a course `.pt` file in the sidebar.")
        return None
    try:
        return load_model(key)
    except si.SproutError as err:
        st.error(f"Could not load `{key}`: {err}")
        return None


def current_text() -> str:
    choice = st.session_state.get("text_choice", next(iter(TEXTS)))
    return st.session_state.get("own_text", "") if choice == OWN_TEXT else TEXTS[choice]


def current_tokens(model: si.HookedSprout):
    """Token ids (1, pos) of the chosen text, truncated to the context with a visible notice; None if empty."""
    text = current_text()
    if not text.strip():
        st.warning("The text is empty: pick a ready-made text or type something in the sidebar.")
        return None
    try:
        full = len(model.tokenizer.encode(text, add_special_tokens=False).ids)
        toks = model.to_tokens(text, truncate=True)
    except si.SproutError as err:
        st.error(str(err))
        return None
    if full > toks.shape[1]:
        st.warning(f"The text has {full:,} tokens; the model reads at most {toks.shape[1]:,}, so only the first "
                   f"{toks.shape[1]:,} are used.")
    return toks
