"""The link: a page's view kept in its URL (``?model=…&text=…&layer=…``), so that a link, a bookmark or a reload
restores it.

The sidebar's model and text arrive through :func:`model_and_text_from_url` (``app.py`` calls it first in every
run); a page keeps its main choices with :func:`bind` before drawing their widgets, parsed by :func:`int_in`,
:func:`number_in`, :func:`block_in`, :func:`one_of` or :func:`as_bool`, each of which says what it accepts; and
:func:`write_url` writes the model, the text and every bound choice back after the run (``app.py`` calls it, also
after ``state.stop()``). A value a page cannot show is never applied silently: the page says which parameter, what
it accepts and what it shows instead.
"""
from __future__ import annotations

from collections.abc import Callable

import state
import streamlit as st

from sprout_interp.core.texts import TEXTS


def _seen() -> dict:
    """The URL value of each parameter already applied to (or written from) this session."""
    return st.session_state.setdefault("_url_seen", {})


def _arrived(param: str, many: bool = False):
    """The URL's value of ``param`` if it is new to this session (a link just opened, a reload), else None."""
    qp = st.query_params
    if param not in qp:
        return None
    raw = [state.clean_text(v) for v in qp.get_all(param)] if many else state.clean_text(qp.get(param) or "")
    if _seen().get(param) == raw:
        return None
    _seen()[param] = raw
    return raw


def model_and_text_from_url() -> None:
    """Apply a link's ``model`` (a shipped name; a path where the path box is allowed) and ``text`` (a ready-made
    text's name, else read as typed text, with a notice naming the ready-made texts when it is one word) to the
    sidebar's choices, once per link. Call before the sidebar's widgets are drawn; starts this run's record of
    bound parameters."""
    st.session_state["_url_run"] = {}  # the page parameters bound during this run (see bind)
    allowed = state.path_box_allowed()
    first = state.clean_text(state.default_model())
    fixed = [first] if first not in state.SHIPPED and not allowed else []
    raw = _arrived("model")
    if raw is not None:
        v = raw.strip()
        if v in state.SHIPPED or v in fixed:
            st.session_state["model_choice"] = v
        elif v and allowed:
            st.session_state["model_choice"], st.session_state["model_path"] = state.OWN_PATH, v
            st.session_state["model_tokenizer"] = state.clean_text(st.query_params.get("tokenizer") or "").strip()
        elif v:
            st.session_state["_url_refused"] = True
    raw = _arrived("text")
    if raw is not None:
        if raw in TEXTS:
            st.session_state["text_choice"] = raw
        else:
            st.session_state["text_choice"], st.session_state["own_text"] = state.OWN_TEXT, raw[:state.MAX_TEXT_CHARS]
            if raw.strip() and len(raw.split()) == 1:  # one word: a ready-made text's name mistyped, most likely
                st.session_state["_url_text_typed"] = raw.strip()


def bind(param: str, key: str, parse: Callable[[str], object] | None = None,
         fmt: Callable[[object], str] = str, many: bool = False, valid: str | None = None) -> None:
    """Keep the widget state ``st.session_state[key]`` in the URL as ``?param=…``.

    Call before the widget is drawn (and before :func:`remember`). A value that arrives in the URL (a shared
    link, a bookmark, a reload) is parsed by ``parse`` and applied once; after every run the state's value is
    written back by :func:`write_url` with ``fmt``. With ``many`` the parameter repeats (``?heads=1.0&heads=2.1``):
    ``parse`` gets the list and ``fmt`` returns one.

    A value ``parse`` refuses (it returns None or raises) is never applied silently: a warning, here on the page,
    names the parameter, the valid values (``valid``, else ``parse.valid`` as :func:`int_in` and :func:`one_of`
    set it) and, once the page has run, the value shown instead, which :func:`write_url` puts in the link.
    """
    raw = _arrived(param, many)
    if raw is not None:
        try:
            v = (parse or (lambda r: r))(raw)
        except (ValueError, TypeError, KeyError, IndexError):
            v = None
        if v is None:
            refused = st.session_state.setdefault("_url_refused_run", {})
            refused[param] = (st.empty(), raw, valid or getattr(parse, "valid", None) or "a value this page offers")
        else:
            st.session_state[key] = v
    st.session_state.setdefault("_url_run", {})[param] = (key, fmt, many)


def _described(parse: Callable, valid: str) -> Callable:
    parse.valid = valid  # type: ignore[attr-defined]  # what bind's warning names as the valid values
    return parse


def int_in(lo: int, hi: int) -> Callable[[str], int | None]:
    """A parser for :func:`bind`: a whole number in [lo, hi], else None."""
    def parse(raw: str) -> int | None:
        v = int(raw)
        return v if lo <= v <= hi else None
    return _described(parse, f"a whole number from {lo} to {hi}")


def number_in(lo: float, hi: float, digits: int = 3) -> Callable[[str], float | None]:
    """A parser for :func:`bind`: a number in [lo, hi], rounded to ``digits`` decimals, else None."""
    def parse(raw: str) -> float | None:
        v = float(raw)
        return round(v, digits) if lo <= v <= hi else None
    return _described(parse, f"a number from {lo} to {hi}")


def block_in(n_layers: int) -> Callable[[str], int | None]:
    """A parser for :func:`bind` of a block counted from 1 as the chapter does (``?block=3``): the 0-indexed
    layer (2), or None outside 1 … ``n_layers``. Write it back with :func:`fmt_block`."""
    def parse(raw: str) -> int | None:
        v = int(raw)
        return v - 1 if 1 <= v <= n_layers else None
    return _described(parse, f"a block from 1 to {n_layers} (blocks count from 1)")


def fmt_block(layer) -> str:
    """A 0-indexed layer as the block number :func:`block_in` reads (layer + 1)."""
    return str(int(layer) + 1)


def one_of(options) -> Callable[[str], object]:
    """A parser for :func:`bind`: the option whose ``str`` is the URL's value, else None."""
    by_text = {str(o): o for o in options}
    names = list(by_text)
    listed = ", ".join(names) if len(names) <= 12 else f"{', '.join(names[:5])}, …, {', '.join(names[-2:])}"
    return _described(lambda raw: by_text.get(raw), f"one of {listed}" if names else "nothing here (no choice)")


def as_bool(raw: str) -> bool | None:
    return {"1": True, "true": True, "0": False, "false": False}.get(raw.strip().lower())


as_bool.valid = "1 or 0 (or true / false)"  # type: ignore[attr-defined]


def fmt_bool(v) -> str:
    return "1" if v else "0"


def _say_refused(want: dict) -> None:
    """Fill each warning :func:`bind` left for a refused link value with what the page shows instead."""
    for param, (slot, raw, valid) in (st.session_state.pop("_url_refused_run", None) or {}).items():
        got = ", ".join(raw) if isinstance(raw, list) else raw
        now = want.get(param)
        now = ", ".join(now) if isinstance(now, list) else now
        instead = (f"Showing **{state.md(param)}={state.md(now)}** instead; the link now says so." if now not in (None, "")
                   else "The link no longer carries it.")
        slot.warning(f"The link's **{state.md(param)}={state.md(got)}** cannot be shown: {state.md(param)} must be {state.md(valid)}. {instead}")


def _model_param() -> dict:
    choice = st.session_state.get("model_choice")
    if choice == state.OWN_PATH:
        path = state.clean_text(st.session_state.get("model_path") or "").strip()
        tok = state.clean_text(st.session_state.get("model_tokenizer") or "").strip()
        return ({"model": path} if path else {}) | ({"tokenizer": tok} if path and tok else {})
    if choice in (None, state.UPLOAD):
        return {}
    return {"model": choice}


def _text_param() -> dict:
    choice = st.session_state.get("text_choice")
    if choice in TEXTS:
        return {"text": choice}
    own = state.clean_text(st.session_state.get("own_text") or "")
    return {"text": own} if choice == state.OWN_TEXT and 0 < len(own) <= state.MAX_URL_TEXT else {}


def write_url() -> None:
    """Put the model, the text and this run's bound page choices in the URL (replacing what was there)."""
    want: dict[str, str | list[str]] = {**_model_param(), **_text_param()}
    for param, (key, fmt, many) in (st.session_state.get("_url_run") or {}).items():
        if key in st.session_state and st.session_state[key] is not None:
            try:
                want[param] = [str(x) for x in fmt(st.session_state[key])] if many else str(fmt(st.session_state[key]))
            except (ValueError, TypeError):
                continue
    qp = st.query_params
    have = {k: (qp.get_all(k) if isinstance(want.get(k), list) else qp.get(k)) for k in qp}
    _seen().update(want)
    if have != want:
        qp.from_dict(want)
    _say_refused(want)
