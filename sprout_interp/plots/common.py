"""What every figure module shares: token labels made visible and safe for plotly's label markup, and the
figure writer that keeps one ``plotly.min.js`` per folder (figures open offline, tens of kB each).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional

import plotly.graph_objects as go

__all__ = ["PLOTLY_JS", "escape_label", "figures_html", "plotly_js", "save_figure", "show_token", "title_below_toolbar"]


def title_below_toolbar(text: str) -> dict:
    """A title just above the plot area, below the band where the chart's toolbar appears (a half-width chart's
    title would otherwise run under the toolbar)."""
    return dict(text=text, x=0, xref="paper", xanchor="left", y=1, yref="paper", yanchor="bottom", pad=dict(b=10))


def escape_label(s: str) -> str:
    """Escape what plotly's label mini-HTML would swallow (``<|endoftext|>`` would vanish as a tag)."""
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def show_token(s: str) -> str:
    """A token string made visible in a cell: newlines as ↵, tabs as ⇥, a lone space as ␣; < > & escaped.

    >>> show_token(" "), show_token("<b>\\n")
    ('␣', '&lt;b&gt;↵')
    """
    s = s.replace("\n", "↵").replace("\t", "⇥").replace("\r", "")
    return "␣" if s == " " else escape_label(s)


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
