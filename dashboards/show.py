"""Figures and tables on a page, with their downloads: :func:`chart` draws a figure with the dashboard's tool bar and
adds it to the page's one HTML file (:func:`page_downloads`, in the sidebar), :func:`table` draws a table with its
CSV button (both files made only when clicked), and :func:`take_click` reads a click on a chart once."""
from __future__ import annotations

import re

import streamlit as st

#: the plotly tool bar of every chart: its camera button saves a PNG drawn by the browser (no network, no kaleido)
PLOTLY_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


def chart(fig, name: str, **kw):
    """``st.plotly_chart`` with the dashboard's tool bar; the figure joins this page's HTML download."""
    st.session_state.setdefault("_figs_run", []).append((name, fig))
    kw.setdefault("width", "content")
    return st.plotly_chart(fig, config=PLOTLY_CONFIG, **kw)


def table(df, name: str, data=None, **kw):
    """``st.dataframe(data or df)`` with a button that downloads ``df`` as CSV (written only when clicked)."""
    kw.setdefault("hide_index", True)
    out = st.dataframe(df if data is None else data, **kw)
    st.download_button(f"⬇ {name} (CSV)", data=lambda: df.to_csv(index=False).encode("utf-8"),
                       file_name=_file_name(name) + ".csv", mime="text/csv", on_click="ignore",
                       key=f"csv_{_file_name(name)}")
    return out


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").lower() or "table"


def page_downloads(page: str) -> None:
    """In the sidebar: every figure the page drew, in one HTML file (plotly.js inline once: it opens offline)."""
    figs = list(st.session_state.get("_figs_run") or [])
    if not figs:
        return
    from sprout_interp.plots.common import figures_html

    title = f"Sprout dashboard: {page}"
    st.sidebar.download_button(
        f"⬇ this page's {len(figs)} figure(s) (HTML)", data=lambda: figures_html(figs, title).encode("utf-8"),
        file_name=_file_name(page) + "_figures.html", mime="text/html", on_click="ignore", key="dl_page_figures",
        help="One HTML file with every figure of this page, plotly.js inside it once: it opens without a network. "
             "Each chart's camera button saves it as a PNG (and in the HTML file, as an SVG).")


def take_click(chart_key: str, n: int = 2) -> tuple[int, ...] | None:
    """What a click on the chart ``chart_key`` (drawn with ``on_select="rerun"``) picked in the previous run: the
    first ``n`` ints of the selected point's customdata (:func:`sprout_interp.plots.picking.picked`), once. None
    when nothing is selected, or when this selection was taken already (the widgets it set may have moved on
    since). Call it before drawing the widgets the click sets."""
    from sprout_interp.plots.picking import picked

    now, seen = picked(st.session_state.get(chart_key), n), f"_taken_{chart_key}"
    if now is None:
        st.session_state.pop(seen, None)  # deselected: the same point, clicked again, counts again
        return None
    if st.session_state.get(seen) == now:
        return None
    st.session_state[seen] = now
    return now
