"""What every figure module shares: token labels made visible and safe for plotly's label markup, and the
figure writer that keeps one ``plotly.min.js`` per folder (figures open offline, tens of kB each).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional, Sequence

import plotly.graph_objects as go

__all__ = ["FULL_COLUMN", "HALF_COLUMN", "PLOTLY_JS", "escape_label", "figures_html", "plotly_js", "save_figure",
           "show_token", "title_below_toolbar", "top_margin", "wrap_text", "MODEL_COLORS", "model_style",
           "thinned_ticks"]

#: the narrowest a page draws a figure: the main column of a 1280-pixel browser window (Streamlit's wide layout,
#: sidebar open), and half of it (a figure in one of two columns); pixels
FULL_COLUMN, HALF_COLUMN = 820, 390

#: the band at the top of a chart where its tool bar appears (pixels)
TOOLBAR_PX = 42

#: the width of an average character of plotly's default font, as a share of the font size (a little generous,
#: so that a wrapped line fits with room to spare)
CHAR_EM = 0.58


def wrap_text(text: str, width_px: int | float, font_px: int | float = 17) -> str:
    """``text`` broken into lines (plotly's ``<br>``) each at most ``width_px`` pixels wide at ``font_px``: a title or
    label that stays whole where a page draws its figure narrow. Lines break between phrases where they can (after
    a comma, semicolon or colon, before a bracket), else between words; existing ``<br>`` breaks are kept.

    >>> wrap_text("the quick brown fox jumps", 100, 10)
    'the quick brown<br>fox jumps'
    >>> wrap_text("block 2 (layer 1), head 0 (blocks.1.attn.hook_pattern)", 240, 14)
    'block 2 (layer 1), head 0<br>(blocks.1.attn.hook_pattern)'
    """
    most = max(8, int(width_px / (CHAR_EM * font_px)))
    lines = []
    for part in str(text).split("<br>"):
        phrases, words = [], []
        for word in part.split(" "):
            if word.startswith("(") and words:
                phrases.append(" ".join(words))
                words = []
            words.append(word)
            if word.endswith((",", ";", ":")):
                phrases.append(" ".join(words))
                words = []
        if words or not phrases:
            phrases.append(" ".join(words))
        line = ""
        for phrase in phrases:
            fits = len(line) + 1 + len(phrase) <= most
            if line and not fits and len(line) >= most // 2:  # a new line for the phrase; a short line is filled on
                lines.append(line)
                line = ""
            whole = len(phrase) <= most and (fits or not line)
            for word in [phrase] if whole else phrase.split(" "):
                if line and len(line) + 1 + len(word) > most:
                    lines.append(line)
                    line = word
                else:
                    line = f"{line} {word}" if line else word
        lines.append(line)
    return "<br>".join(lines)


def title_below_toolbar(text: str, width: int | float | None = None, font: int | float = 16, ref: str = "paper") -> dict:
    """A title just above the plot area, below the band where the chart's toolbar appears (a half-width chart's
    title would otherwise run under the toolbar). ``width``: the narrowest the title's room is drawn (pixels); the
    title is wrapped to fit it; give the figure a top margin of :func:`top_margin` for its lines. ``ref``: where the title starts,
    at the plot area's left edge (``"paper"``) or the figure's (``"container"``, for a figure whose plot area is
    narrow beside its labels)."""
    if width is not None:
        text = wrap_text(text, width, font)
    # hung from the figure's top, below the tool bar's band: lines of a wrapped title run down into the top margin
    # that :func:`top_margin` sizes (anchored above the plot area instead, plotly would run them down over it)
    return dict(text=text, x=0 if ref == "paper" else 0.02, xref=ref, xanchor="left", y=1, yref="container",
                yanchor="top", pad=dict(t=TOOLBAR_PX), font=dict(size=font))


def top_margin(title: dict) -> int:
    """The top margin (pixels) that a :func:`title_below_toolbar` title needs: the band where the chart's tool bar
    appears, the title's lines, and a gap above the plot area."""
    lines = str(title.get("text", "")).count("<br>") + 1
    size = float((title.get("font") or {}).get("size", 17))
    return int(TOOLBAR_PX + 12 + lines * 1.3 * size)


def escape_label(s: str) -> str:
    """Escape what plotly's label mini-HTML would swallow (``<|endoftext|>`` would vanish as a tag)."""
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def show_token(s: str, most: Optional[int] = None) -> str:
    """A token string made visible in a label or cell: its leading spaces as ␣ (a drawn label would drop them, and
    " Plax" and "Plax" are different tokens), newlines as ↵, tabs as ⇥; < > & escaped. ``most``: cut to that many
    characters, the last one "…", where it is longer (a cell's width).

    >>> show_token(" "), show_token(" Plax"), show_token("<b>\\n"), show_token(" Jonathan", 6)
    ('␣', '␣Plax', '&lt;b&gt;↵', '␣Jona…')
    """
    s = s.replace("\n", "↵").replace("\t", "⇥").replace("\r", "")
    if most is not None and len(s) > most:
        s = s[: max(most - 1, 1)] + "…"
    rest = s.lstrip(" ")
    return "␣" * (len(s) - len(rest)) + escape_label(rest)


PLOTLY_JS = "plotly.min.js"


@functools.lru_cache(maxsize=1)
def _plotly_source() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def plotly_js(folder) -> Path:
    """``folder/plotly.min.js``, the plotly.js bundled with the installed plotly (no CDN: figures open
    offline); written when missing or different, so a folder of figures holds it once."""
    js = _plotly_source()
    path = Path(folder) / PLOTLY_JS
    if not path.is_file() or path.stat().st_size != len(js.encode("utf-8")) or path.read_text(encoding="utf-8") != js:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(js, encoding="utf-8")
    return path


def save_figure(fig: go.Figure, path: str | Path, png: bool = False) -> tuple[list[Path], Optional[str]]:
    """Write ``path`` + ``.html``, which loads ``plotly.min.js`` from its own folder (:func:`plotly_js`;
    keep the two together), and ``.png`` when asked and static export works (``kaleido`` and a browser).

    Returns (written files, a note saying why the PNG was skipped, or None).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    plotly_js(path.parent)
    html = path.with_suffix(".html")
    fig.write_html(html, include_plotlyjs=PLOTLY_JS)
    written, note = [html], None
    if png:
        try:
            import kaleido  # noqa: F401
        except ImportError:
            return written, "PNG skipped: static export needs the kaleido package (and a Chrome it can drive)"
        try:
            fig.write_image(path.with_suffix(".png"))
            written.append(path.with_suffix(".png"))
        except Exception as e:  # kaleido present but no browser, or export failed
            note = f"PNG skipped: static export failed ({type(e).__name__}: {str(e).splitlines()[0][:160]})"
    return written, note


def figures_html(figures, title: str = "figures") -> str:
    """One self-contained HTML page of several figures: plotly.js inline once (it opens offline, no CDN),
    then each figure under its name. ``figures``: ``(name, figure)`` pairs. Each figure's camera button
    saves it as an SVG, drawn by the browser."""
    import html as _html

    config = {"displaylogo": False, "toImageButtonOptions": {"format": "svg"}}
    parts = [f"<h2>{_html.escape(str(name))}</h2>\n"
             + fig.to_html(full_html=False, include_plotlyjs=False, config=config)
             for name, fig in figures]
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + _html.escape(str(title))
            + "</title>\n<script>" + _plotly_source() + "</script></head>\n<body style=\"font-family: sans-serif\">"
            + "<h1>" + _html.escape(str(title)) + "</h1>\n" + "\n".join(parts) + "\n</body></html>\n")


#: one colour per model, of clearly different hues (ColorBrewer Set1, colour-blind safer than shades of one
#: hue), and a bar pattern each, so models stay apart in grey print too
MODEL_COLORS = ("#e41a1c", "#377eb8", "#4daf4a", "#984ea3", "#ff7f00", "#a65628", "#f781bf", "#999999")
MODEL_PATTERNS = ("", "/", ".", "x", "-", "|", "+", "\\")


def model_style(i: int) -> dict:
    """The bar ``marker`` of the ``i``-th model: its colour and its fill pattern."""
    return dict(color=MODEL_COLORS[i % len(MODEL_COLORS)],
                pattern=dict(shape=MODEL_PATTERNS[i % len(MODEL_PATTERNS)], fillmode="overlay", size=6))


def thinned_ticks(labels: Sequence[str], most: int = 24) -> dict:
    """x-axis settings that label at most ``most`` of a category axis's ``labels`` (every k-th one, in order)."""
    labels = list(dict.fromkeys(labels))
    if len(labels) <= most:
        return {}
    step = -(-len(labels) // most)
    keep = labels[::step]
    return dict(tickmode="array", tickvals=keep, ticktext=keep)
