"""What every page shares: the chosen model (cached once per process), the chosen text, error display."""
from __future__ import annotations

import contextlib
import os
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import streamlit as st

import sprout_interp as si
from sprout_interp import loading
from sprout_interp.texts import TEXTS

SHIPPED = ["sprout", "gpt-4", "gpt-1"]  # best first
OWN_PATH = "a checkpoint folder or course .pt…"
OWN_TEXT = "type your own…"

#: What every page says about layer numbers (the chapter counts blocks from 1, code from 0).
CONVENTION = ("Layer numbers: **block N** counts from 1 as the chapter does (\"layer 2\" = block 2); "
              "code and hook names count from 0, so block N is `blocks.{N-1}`. Heads are numbered from 0.")


def installed_shipped() -> list[str]:
    """The shipped checkpoints present on this machine, best first."""
    return [n for n in SHIPPED if (Path(loading.SHIPPED_DIR) / n / "model.safetensors").is_file()]


def _model_argument() -> str | None:
    """``streamlit run dashboards/app.py -- --model gpt-4`` (a shipped name or a path), if given."""
    import sys

    args = sys.argv[1:]
    for i, a in enumerate(args):
        if a == "--model" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--model="):
            return a.split("=", 1)[1]
    return None


def default_model() -> str:
    """``--model`` if given after ``--``, else the best shipped checkpoint installed (sprout, else gpt-4, else gpt-1)."""
    arg = _model_argument()
    if arg:
        return arg
    have = installed_shipped()
    return have[0] if have else SHIPPED[0]


@st.cache_resource(show_spinner="loading the model…", max_entries=6)
def load_model(name_or_path: str) -> si.HookedSprout:
    return si.load(name_or_path)


def sidebar() -> None:
    """Model and text pickers; their values live in st.session_state for the pages."""
    with st.sidebar:
        options = SHIPPED + [OWN_PATH]
        # first visit: the default model (a --model path goes into the path box); index only when the
        # session has no choice yet (setting both makes Streamlit warn)
        first = default_model()
        if first not in options and "model_choice" not in st.session_state:
            st.session_state["model_choice"], st.session_state["model_path"] = OWN_PATH, first
        kw = {} if "model_choice" in st.session_state else {"index": options.index(first)}
        choice = st.selectbox("model", options, key="model_choice",
                              format_func=lambda o: o if o == OWN_PATH or o in installed_shipped() else f"{o} (not installed)",
                              **kw)
        if choice == OWN_PATH:
            st.text_input("path", key="model_path", placeholder="runs/gpt-4/checkpoint or my_model.pt")
        tchoice = st.selectbox("text", list(TEXTS) + [OWN_TEXT], key="text_choice")
        if tchoice == OWN_TEXT:
            st.text_area("your text", key="own_text", height=160)
        st.caption("Layers: the chapter counts blocks from 1 (\"block 3\"); code and hook names from 0 (`blocks.2`).")


def header(title: str, what: str = "") -> None:
    """The page title, one line on what it shows, and the layer convention."""
    st.header(title)
    if what:
        st.markdown(what)
    st.caption(CONVENTION)


def model_key() -> str:
    choice = st.session_state.get("model_choice") or default_model()
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
    except Exception as err:  # a damaged file can make torch or safetensors raise anything
        st.error(f"Could not load `{key}`: {type(err).__name__}: {err}")
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
    if model.tokenizer is None:
        st.error("This checkpoint has no tokenizer, so it cannot read text: put its tokenizer.json beside it.")
        return None
    try:
        full = len(model.tokenizer.encode(text, add_special_tokens=False).ids)
        toks = model.to_tokens(text, truncate=True)
    except si.SproutError as err:
        st.error(str(err))
        return None
    except Exception as err:  # the tokenizer itself failing on odd input
        st.error(f"Could not read the text: {type(err).__name__}: {err}")
        return None
    if full > toks.shape[1]:
        st.warning(f"The text has {full:,} tokens; the model reads at most {toks.shape[1]:,}, so only the first "
                   f"{toks.shape[1]:,} are used.")
    return toks


def page_inputs():
    """(model, model key, text, tokens) for a page; stops the page (with the message already shown) if any is missing."""
    m = current_model()
    if m is None:
        st.stop()
    toks = current_tokens(m)
    if toks is None:
        st.stop()
    return m, model_key(), current_text(), toks


def clamp_state(key: str, lo: int, hi: int) -> None:
    """Keep a numeric widget's remembered value inside [lo, hi] (the model or text may have changed)."""
    v = st.session_state.get(key)
    if v is not None and not lo <= v <= hi:
        st.session_state[key] = min(max(v, lo), hi)


def remember(key: str, default: int, lo: int, hi: int) -> None:
    """Give a widget its first value through Session State (so it is never also passed as value=),
    and keep it inside [lo, hi]."""
    st.session_state.setdefault(key, default)
    clamp_state(key, lo, hi)


@contextlib.contextmanager
def shown_errors(what: str = "this view"):
    """Run a block; a SproutError (a mistake a person can fix) or any other failure is shown on the page
    instead of killing it, and the rest of the page is skipped. Other pages are not affected."""
    try:
        yield
    except si.SproutError as err:
        st.error(f"Could not compute {what}: {err}")
        st.stop()
    except Exception as err:  # a bug: show it with its traceback, keep the app alive
        st.error(f"Could not compute {what}: {type(err).__name__}: {err}")
        with st.expander("details"):
            st.code(traceback.format_exc())
        st.stop()
