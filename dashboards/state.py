"""What every page shares: the chosen model (cached once per process), the chosen text, and error display. The link
that keeps a view (``?model=…&text=…`` and each page's choices) is ``link.py``'s; figures and tables with their
downloads are ``show.py``'s; uploaded checkpoints ``uploads.py``'s.

``-- --no-path-box`` or ``SPROUT_DASHBOARD_NO_PATH_BOX=1`` hides the path box, and so does listening on anything
but loopback, unless started with ``-- --allow-remote-paths`` (:func:`path_box_allowed`, ``serving.py``).

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
import sys
import traceback
from pathlib import Path
from typing import NoReturn

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import serving
import streamlit as st
import uploads

import sprout_interp as si
from sprout_interp.core import loading
from sprout_interp.core.texts import TEXTS
from sprout_interp.core.tokens import encode_ids

SHIPPED = ["sprout", "gpt-4", "gpt-1"]  # best first
OWN_PATH = "a checkpoint folder or course .pt…"
OWN_TEXT = "type your own…"
TOKENIZER_SEP = " + tokenizer "  # a model key with a tokenizer passed for it: "<path> + tokenizer <path>"
MAX_TEXT_CHARS = 100_000  # a typed text is cut here (the model reads at most its context, 512 tokens)
TYPED = ("own_text", "model_path", "model_tokenizer")  # session keys of what a person types
UPLOAD = "upload checkpoint files…"
MAX_TEXT_UPLOAD_MB = 1
MAX_URL_TEXT = 2_000  # a typed text longer than this is not put in the link (links this long are already unwieldy)
NO_PATH_BOX_ENV = "SPROUT_DASHBOARD_NO_PATH_BOX"


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


def path_box_allowed(exposed: list[str] | None = None) -> bool:
    """False when the dashboard is served to others: ``streamlit run dashboards/app.py -- --no-path-box``,
    ``SPROUT_DASHBOARD_NO_PATH_BOX=1``, or listening on any address but loopback (``exposed``: those addresses,
    default :func:`serving.exposed_addresses`) unless started with ``-- --allow-remote-paths``. Then nobody can
    make the server read a path of their choosing (neither the path box nor a ``?model=<path>`` link); the
    shipped models and uploads still work."""
    if _path_box_hidden():
        return False
    return not (serving.exposed_addresses() if exposed is None else exposed) or serving.remote_paths_accepted()


def _model_argument() -> str | None:
    """``streamlit run dashboards/app.py -- --model gpt-4`` (a shipped name or a path), if given."""
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
    """Model and text pickers; their values live in st.session_state for the pages, and in the URL (``link.py``,
    whose ``model_and_text_from_url`` runs before this) so that a link or a reload restores them."""
    st.session_state["_figs_run"] = []  # the figures drawn during this run (see chart)
    exposed = serving.exposed_addresses()
    allowed = path_box_allowed(exposed)
    with st.sidebar:
        _exposure_notice(exposed, allowed)
        for k in TYPED:  # before the widgets are drawn: a lone surrogate would stop the page from reaching the browser
            v = st.session_state.get(k)
            if isinstance(v, str) and clean_text(v) != v:
                st.session_state[k] = clean_text(v)
        # first visit: the default model (a --model path goes into the path box, or, with the path box
        # hidden, is offered as it is: the server's operator chose it); index only when the session has
        # no choice yet (setting both makes Streamlit warn)
        first = clean_text(default_model())
        fixed = [first] if first not in SHIPPED and not allowed else []
        options = SHIPPED + fixed + ([OWN_PATH] if allowed else []) + [UPLOAD]
        if st.session_state.get("model_choice") not in (None, *options):
            del st.session_state["model_choice"]
        if first not in options and "model_choice" not in st.session_state:
            st.session_state["model_choice"], st.session_state["model_path"] = OWN_PATH, first
        kw = {} if "model_choice" in st.session_state else {"index": options.index(first)}
        choice = st.selectbox("model", options, key="model_choice",
                              format_func=lambda o: o if o in (OWN_PATH, UPLOAD) or o not in SHIPPED
                              or o in installed_shipped() else f"{o} (not installed)", **kw)
        if choice == OWN_PATH:
            st.text_input("path", key="model_path", placeholder="runs/gpt-4/checkpoint or my_model.pt",
                          help="A checkpoint folder or a .pt/.safetensors file on this machine (regular files only).")
            st.text_input("tokenizer (optional)", key="model_tokenizer", placeholder="its tokenizer.json",
                          help="Only for weights without a tokenizer.json beside them: the model then loads with a "
                               "warning, since nothing can check that it was trained with this tokenizer.")
        elif choice == UPLOAD:
            files = st.file_uploader(
                "checkpoint files", accept_multiple_files=True, key="model_upload", max_upload_size=uploads.MAX_UPLOAD_MB,
                type=["json", "safetensors", "pt", "pth"],
                help="A checkpoint folder's files (model.safetensors with its config.json, and tokenizer.json, "
                     "train.json if you have them), or one .pt/.safetensors file. The loader checks them as it "
                     "checks a path; an uploaded model is not kept in the page's link.")
            try:
                st.session_state["upload_key"] = uploads.save_upload(files or [])
            except uploads.UploadError as err:
                st.session_state["upload_key"] = ""
                st.error(md(err))
        tchoice = st.selectbox("text", list(TEXTS) + [OWN_TEXT], key="text_choice")
        typed = st.session_state.pop("_url_text_typed", None)  # a one-word link text (link.model_and_text_from_url)
        if typed is not None and tchoice == OWN_TEXT:
            st.info(f"The link's **text={md(typed)}** is not the name of a ready-made text ({md(', '.join(TEXTS))}), "
                    "so it is read as typed text: the model reads those characters. Choose a ready-made text above, "
                    "or give its name in the link (`text=story`).")
        if tchoice == OWN_TEXT:
            st.text_area("your text", key="own_text", height=160)
            if len(st.session_state.get("own_text") or "") > MAX_URL_TEXT:
                st.caption(f"A text over {MAX_URL_TEXT:,} characters is not kept in the page's link.")
        st.file_uploader("or read a text file", type=["txt", "md"], key="text_upload",
                         max_upload_size=MAX_TEXT_UPLOAD_MB, on_change=_read_text_upload,
                         help=f"UTF-8 text, at most {MAX_TEXT_UPLOAD_MB} MB; it becomes 'your text'.")
        st.caption("Layers: the chapter counts blocks from 1 (\"block 3\"); code and hook names from 0 (`blocks.2`).")
        if st.session_state.pop("_url_refused", None):
            st.warning("The link names a model path, but this dashboard does not read paths: "
                       "its default model is shown instead.")


def _path_box_hidden() -> bool:
    """Whether the operator hid the path box: ``-- --no-path-box`` or ``SPROUT_DASHBOARD_NO_PATH_BOX=1``."""
    return ("--no-path-box" in sys.argv[1:]
            or os.environ.get(NO_PATH_BOX_ENV, "").strip().lower() in ("1", "true", "yes", "on"))


def _exposure_notice(exposed: list[str], allowed: bool) -> None:
    """Say so when the dashboard listens where other machines may reach it, and what that does to the path box
    (nothing to say when the operator hid the path box already)."""
    if not exposed or _path_box_hidden():
        return
    where = md(", ".join(serving.shown_address(a) for a in exposed))
    if allowed:
        st.warning(f"This dashboard listens on {where}, not only on this machine, and was started with "
                   f"`{serving.ALLOW_REMOTE_PATHS}`: everyone who reaches it can make it read this machine's files "
                   "through the path box or a link.")
    else:
        st.warning(f"This dashboard listens on {where}, not only on this machine, so it reads no paths: the path "
                   "box and model paths in links are off (the shipped models and uploads still work). To keep it "
                   "private, start it with `--server.address localhost`; to accept that everyone who reaches it "
                   f"can read this machine's files, add `-- {serving.ALLOW_REMOTE_PATHS}`.")


def is_upload(key: str) -> bool:
    """Whether a model key is an uploaded checkpoint's folder or file."""
    # by its text only: a typed path is never resolved here (it may be a symlink loop, or not exist)
    return key.partition(TOKENIZER_SEP)[0].startswith(str(uploads.upload_dir()) + os.sep)


def shown_key(key: str) -> str:
    """A model key as a person should read it: an upload's temporary path is the server's business."""
    return "the uploaded checkpoint" if is_upload(key) else key


def _read_text_upload() -> None:
    """The text file just uploaded becomes 'your text' (UTF-8; undecodable bytes become U+FFFD)."""
    f = st.session_state.get("text_upload")
    if f is None:
        return
    raw = f.getvalue()[: MAX_TEXT_UPLOAD_MB << 20]
    st.session_state["own_text"] = clean_text(raw.decode("utf-8", errors="replace"))[:MAX_TEXT_CHARS]
    st.session_state["text_choice"] = OWN_TEXT


def header(title: str, what: str = "") -> None:
    """The page title, one line on what it shows, and the layer convention."""
    st.header(title)
    if what:
        st.markdown(what)
    st.caption(CONVENTION)


def model_key() -> str:
    """The chosen model: a shipped name, or the typed path (with `` + tokenizer <path>`` when one is typed)."""
    choice = st.session_state.get("model_choice") or default_model()
    if choice == UPLOAD:
        return st.session_state.get("upload_key") or ""
    if choice != OWN_PATH:
        return choice
    path = clean_text(st.session_state.get("model_path") or "").strip()
    tokenizer = clean_text(st.session_state.get("model_tokenizer") or "").strip()
    return path + (TOKENIZER_SEP + tokenizer if path and tokenizer else "")


def current_model() -> si.HookedSprout | None:
    """The chosen model, or None after showing why it could not be loaded."""
    key = model_key()
    if not key:
        if st.session_state.get("model_choice") == UPLOAD:
            st.info("Upload a checkpoint's files in the sidebar (model.safetensors with its config.json, or one .pt file).")
        else:
            st.info("Type the path of a checkpoint folder or a course `.pt` file in the sidebar.")
        return None
    shown = shown_key(key)
    try:
        m = load_model(key)
    except si.SproutError as err:
        st.error(f"Could not load **{md(shown)}**: {md(uploads.hide_upload_paths(str(err)))}")
        return None
    except Exception as err:  # a damaged file can make torch or safetensors raise anything
        st.error(f"Could not load **{md(shown)}**: {md(type(err).__name__)}: {md(uploads.hide_upload_paths(str(err)))}")
        return None
    for w in m.info.get("warnings") or []:
        st.warning(f"**{md(shown if is_upload(key) else m.name or key)}**: {md(uploads.hide_upload_paths(str(w)))}")
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
        full = len(encode_ids(model.tokenizer, text))  # bounded chunks; a tokenizer's panic is a TokenizationError
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


class PageStop(Exception):
    """Raised by :func:`stop`; ``app.py`` catches it."""


def stop() -> NoReturn:
    """Skip the rest of the page, its message already shown. Unlike ``st.stop()``, which ends the script run so
    that what ``app.py`` writes afterwards is dropped, the run then ends normally: the link still records what
    was chosen and the sidebar still offers the downloads."""
    raise PageStop


def page_inputs():
    """(model, model key, text, tokens) for a page; stops the page (with the message already shown) if any is missing."""
    m = current_model()
    if m is None:
        stop()
    toks = current_tokens(m)
    if toks is None:
        stop()
    return m, model_key(), current_text(), toks


def points_delta(change: float) -> tuple[str, str]:
    """(``st.metric`` delta, delta colour) of a change in a probability: "+3 points" (green), "-3 points" (red),
    and "no change (within 0.5 points)" in grey when it rounds to 0, never "-0 points"."""
    pts = round(100 * float(change))
    if pts == 0:
        return "no change (within 0.5 points)", "off"
    return f"{pts:+d} points", "normal"


def clamp_state(key: str, lo: int, hi: int) -> None:
    """Keep a numeric widget's remembered value inside [lo, hi] (the model or text may have changed), with a
    warning that names it (by its link parameter where ``link.bind`` keeps it in the link), the range and the
    value shown instead."""
    v = st.session_state.get(key)
    if v is not None and not lo <= v <= hi:
        st.session_state[key] = new = min(max(v, lo), hi)
        param, fmt = key, str
        for p, (k, f, many) in (st.session_state.get("_url_run") or {}).items():
            if k == key and not many:
                param, fmt = p, f
        st.warning(f"**{md(param)}={md(fmt(v))}** is out of range for this model and text: {md(param)} must be from "
                   f"{md(fmt(lo))} to {md(fmt(hi))}. Showing **{md(param)}={md(fmt(new))}** instead.")


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
    except PageStop:
        raise
    except si.SproutError as err:
        st.error(f"Could not compute {what}: {md(err)}")
        stop()
    except Exception as err:  # a bug: show it with its traceback, keep the app alive
        st.error(f"Could not compute {what}: {md(type(err).__name__)}: {md(err)}")
        with st.expander("details"):
            st.code(traceback.format_exc())
        stop()
