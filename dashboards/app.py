"""Sprout, layer by layer: `streamlit run dashboards/app.py`."""
from __future__ import annotations

import traceback

import link
import show
import state
import streamlit as st

from sprout_interp.core.tokens import is_rust_panic

st.set_page_config(page_title="Sprout, layer by layer", page_icon="🌱", layout="wide")
link.model_and_text_from_url()  # a link's model and text, before the sidebar draws its pickers
state.sidebar()

pages = [
    st.Page("views/anatomy.py", title="Anatomy", default=True),
    st.Page("views/logit_lens.py", title="Logit lens"),
    st.Page("views/residual.py", title="Residual stream"),
    st.Page("views/attention.py", title="Attention heads"),
    st.Page("views/ablations.py", title="Ablations"),
    st.Page("views/patching.py", title="Patching / circuits"),
    st.Page("views/steering.py", title="Steering"),
    st.Page("views/features.py", title="Features"),
    st.Page("views/neurons.py", title="Neurons"),
    st.Page("views/attribution_graph.py", title="Attribution graph"),
    st.Page("views/compare.py", title="Compare models"),
    st.Page("views/positions.py", title="Positions (RoPE)"),
]
page = None
try:
    page = st.navigation(pages)
    page.run()
except state.PageStop:  # the page said why it stopped; the link and downloads below are still written
    pass
except BaseException as err:  # last line of defence: a page's failure is shown on that page, the app keeps running
    if not (isinstance(err, Exception) or is_rust_panic(err)):
        raise  # streamlit's stop and rerun signals, KeyboardInterrupt and SystemExit pass; a Rust panic is shown
    st.error(f"This page failed: {state.md(type(err).__name__)}: {state.md(err)}. The other pages still work.")
    with st.expander("details"):
        st.code(traceback.format_exc())
finally:  # also after state.stop(): the link keeps what was chosen, the sidebar offers what was drawn
    link.write_url()
    show.page_downloads(page.title if page is not None else "page")
