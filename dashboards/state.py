"""What every page shares: the chosen model (cached once per process), the chosen text, error display.

Everything a person typed (a path, a text) or that derives from it (a model's name, an error message
quoting it) is shown through :func:`md` (inside markdown) or :func:`plain` (inside a plotly title or
legend), so it is always literal text: no markdown, link or image of its own. Typed text is cleaned of
lone surrogates by :func:`clean_text` before any widget or the tokenizer sees it.
"""
from __future__ import annotations

import contextlib
import html
import os
import re
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import streamlit as st

import sprout_interp as si
from sprout_interp.core import loading
from sprout_interp.core.texts import TEXTS

SHIPPED = ["sprout", "gpt-4", "gpt-1"]  # best first
OWN_PATH = "a checkpoint folder or course .pt…"
OWN_TEXT = "type your own…"
TOKENIZER_SEP = " + tokenizer "  # a model key with a tokenizer passed for it: "<path> + tokenizer <path>"
MAX_TEXT_CHARS = 100_000  # a typed text is cut here (the model reads at most its context, 512 tokens)
TYPED = ("own_text", "model_path", "model_tokenizer")  # session keys of what a person types


def clean_text(s: str) -> str:
    """``s`` as valid Unicode: a lone surrogate (which no UTF-8 can carry, and which would stop the page from
    being sent to the browser) becomes U+FFFD; a surrogate pair becomes its character."""
    return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


_PUNCT = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation character


def md(s: object) -> str:
    """``s`` as literal text inside Streamlit markdown: every ASCII punctuation character backslash-escaped
    (no code span, emphasis, link, image, colour or emoji directive can start), on one line."""
    return _PUNCT.sub(r"\\\1", " ".join(clean_text(str(s)).split()))


def plain(s: object) -> str:
    """``s`` as literal text inside a plotly title, legend or hover label (its pseudo-HTML escaped)."""
    return html.escape(clean_text(str(s)), quote=False)

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
def load_model(key: str) -> si.HookedSprout:
    """The model of a key from :func:`model_key`: a shipped name or a path, optionally with a tokenizer."""
    path, _, tokenizer = key.partition(TOKENIZER_SEP)
    return si.load(path, tokenizer=tokenizer or None)


def sidebar() -> None:
    """Model and text pickers; their values live in st.session_state for the pages."""
    with st.sidebar:
        options = SHIPPED + [OWN_PATH]
        for k in TYPED:  # before the widgets are drawn: a lone surrogate would stop the page from reaching the browser
            v = st.session_state.get(k)
            if isinstance(v, str) and clean_text(v) != v:
                st.session_state[k] = clean_text(v)
        # first visit: the default model (a --model path goes into the path box); index only when the
        # session has no choice yet (setting both makes Streamlit warn)
        first = clean_text(default_model())
        if first not in options and "model_choice" not in st.session_state:
            st.session_state["model_choice"], st.session_state["model_path"] = OWN_PATH, first
        kw = {} if "model_choice" in st.session_state else {"index": options.index(first)}
        choice = st.selectbox("model", options, key="model_choice",
                              format_func=lambda o: o if o == OWN_PATH or o in installed_shipped() else f"{o} (not installed)",
                              **kw)
        if choice == OWN_PATH:
            st.text_input("path", key="model_path", placeholder="runs/gpt-4/checkpoint or my_model.pt",
                          help="A checkpoint folder or a .pt/.safetensors file on this machine (regular files only).")
            st.text_input("tokenizer (optional)", key="model_tokenizer", placeholder="its tokenizer.json",
                          help="Only for weights without a tokenizer.json beside them: the model then loads with a "
                               "warning, since nothing can check that it was trained with this tokenizer.")
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
    """The chosen model: a shipped name, or the typed path (with `` + tokenizer <path>`` when one is typed)."""
    choice = st.session_state.get("model_choice") or default_model()
    if choice != OWN_PATH:
        return choice
    path = clean_text(st.session_state.get("model_path") or "").strip()
    tokenizer = clean_text(st.session_state.get("model_tokenizer") or "").strip()
    return path + (TOKENIZER_SEP + tokenizer if path and tokenizer else "")


def current_model() -> si.HookedSprout | None:
    """The chosen model, or None after showing why it could not be loaded."""
    key = model_key()
    if not key:
        st.info("Type the path of a checkpoint folder or a course `.pt` file in the sidebar.")
        return None
    try:
        m = load_model(key)
    except si.SproutError as err:
        st.error(f"Could not load **{md(key)}**: {md(err)}")
        return None
    except Exception as err:  # a damaged file can make torch or safetensors raise anything
        st.error(f"Could not load **{md(key)}**: {md(type(err).__name__)}: {md(err)}")
        return None
    for w in m.info.get("warnings") or []:
        st.warning(f"**{md(m.name or key)}**: {md(w)}")
    return m


def current_text() -> str:
    """The chosen text: a ready-made one, or the typed one cleaned (lone surrogates replaced, cut at MAX_TEXT_CHARS)."""
    choice = st.session_state.get("text_choice", next(iter(TEXTS)))
    if choice != OWN_TEXT:
        return TEXTS[choice]
    return clean_text(st.session_state.get("own_text") or "")[:MAX_TEXT_CHARS]


def current_tokens(model: si.HookedSprout):
    """Token ids (1, pos) of the chosen text, truncated to the context with a visible notice; None if empty."""
    text = current_text()
    if not text.strip():
        st.warning("The text is empty: pick a ready-made text or type something in the sidebar.")
        return None
    if st.session_state.get("text_choice") == OWN_TEXT and len(st.session_state.get("own_text") or "") > MAX_TEXT_CHARS:
        st.warning(f"The text is longer than {MAX_TEXT_CHARS:,} characters; only its first {MAX_TEXT_CHARS:,} are read.")
    if model.tokenizer is None:
        st.error("This checkpoint has no tokenizer, so it cannot read text: put its tokenizer.json beside it.")
        return None
    try:
        full = len(model.tokenizer.encode(text, add_special_tokens=False).ids)
        toks = model.to_tokens(text, truncate=True)
    except si.SproutError as err:
        st.error(md(err))
        return None
    except Exception as err:  # the tokenizer itself failing on odd input
        st.error(f"Could not read the text: {md(type(err).__name__)}: {md(err)}")
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
        st.error(f"Could not compute {what}: {md(err)}")
        st.stop()
    except Exception as err:  # a bug: show it with its traceback, keep the app alive
        st.error(f"Could not compute {what}: {md(type(err).__name__)}: {md(err)}")
        with st.expander("details"):
            st.code(traceback.format_exc())
        st.stop()
