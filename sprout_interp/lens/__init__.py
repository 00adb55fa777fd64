"""Reading the residual stream: its size block by block and each block's delta (``residual``), the logit lens
and per-token trajectories (``logit_lens``), and the tuned lens, one trained affine translator per block
(``tuned_lens``). Tensors or text in, tensors or DataFrames out; no plotting.

May import: ``sprout_interp.core`` and modules of this package.
"""
