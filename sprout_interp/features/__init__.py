"""Features: sparse autoencoders (SAEs) on Sprout's residual stream and what their latents mean. The SAE and its
SAELens-format files (``sae``), activation collection and the TopK training recipe of Gao et al. 2024
(``train``), quality metrics on held-out text (``metrics``), running the model with a layer's stream replaced by
the reconstruction or with one feature clamped (``splice``), feature pages -- top contexts, histogram,
promoted tokens, a short description (``pages``) -- and the search for features tied to the chapter's story
(``search``); text longer than the context is cut with a notice (``inputs``). Tensors or text in, tensors or
DataFrames out; no plotting.

May import: ``sprout_interp.core``, ``sprout_interp.lens``, ``sprout_interp.circuits`` and modules of this package.
"""
