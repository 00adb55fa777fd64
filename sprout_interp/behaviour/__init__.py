"""What the model does, and what it does when changed as a whole: next-token tables with heads ablated
(``per_token``), several models side by side on one text (``compare``), whole blocks knocked out (``knockout``) and
activation steering (``steering``: a contrast's mean-difference vector added to the stream, its effect on a metric
per coefficient or per layer, steered generations). Unlike ``circuits/``, nothing here names a mechanism; these
are the behaviours a circuit explains. Tensors or text in, tensors or DataFrames out; no plotting.

May import: ``sprout_interp.core``, ``sprout_interp.lens``, ``sprout_interp.circuits`` (the metric protocol,
ablations, head names) and modules of this package.
"""
