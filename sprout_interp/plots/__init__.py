"""Plotly figures drawn from analysis results, one module per topic: the logit lens and residual stream
(``lens``), tuned-lens trajectories (``trajectories``), heads, ablations and model comparison (``heads``),
the anatomy diagram and RoPE grid (``anatomy``), patching and the contribution graph (``patching``), activation
steering (``steering``), feed-forward neurons (``neurons``), and what
they share (``common``: visible token labels and ``save_figure``, which keeps one ``plotly.min.js`` per
folder). No tensor maths beyond picking cells out.

May import: every analysis package (``core``, ``anatomy``, ``lens``, ``circuits``, ``features``).

The figure writer and the logit-lens figures are re-exported here: ``from sprout_interp.plots import
save_figure, logit_lens_grid``.
"""
from sprout_interp.plots.common import PLOTLY_JS, plotly_js, save_figure, show_token
from sprout_interp.plots.lens import (
    block_knockout_chart,
    layer_metrics_chart,
    logit_lens_grid,
    rms_growth_chart,
    rms_position_chart,
    token_change_chart,
)

__all__ = [
    "PLOTLY_JS", "plotly_js", "save_figure", "show_token", "logit_lens_grid", "layer_metrics_chart",
    "rms_growth_chart", "rms_position_chart", "token_change_chart", "block_knockout_chart",
]
