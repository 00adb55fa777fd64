"""The model and everything needed to run it: every error class (``errors``), text <-> ids (``tokens``), the
ready-made texts and held-out samples (``texts``), loading and validating a checkpoint (``loading``), the
hook-instrumented wrapper ``HookedSprout`` with TransformerLens hook names (``hooked``) and the Hugging Face /
TransformerLens bridge exports (``export``).

May import: ``sprout_model`` (Sprout itself) and third-party packages; nothing else of ``sprout_interp``.
"""
