"""Finding and testing circuits: attention patterns and head scores, the induction-circuit finder with its
per-part verdicts (``attention``), head ablations and the exact fast sweep (``ablation``), direct logit attribution and
the contribution graph (``attribution``), activation and attribution patching (``patching``; the two runs they
compare in ``patch_runs``), path patching (``path_patching``), Q/K/V composition scores (``composition``), each
head's full OV circuit (``ov_circuit``), attribution graphs over transcoder features (``attribution_graph``, in
the frozen model of ``local_replacement``; the graph object, its file, pruning and scores in ``graphs``;
the graph in circuit-tracer's frontend JSON, written and read back, in ``graph_json``;
intervention checks in ``graph_interventions``). Tensors or text in, tensors or DataFrames out; no plotting.

May import: ``sprout_interp.core``, ``sprout_interp.lens``, ``sprout_interp.features.transcoder`` (the transcoders
an attribution graph replaces the feed-forwards with) and modules of this package.
"""
