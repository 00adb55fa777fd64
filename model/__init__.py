"""sprout_model: Sprout's architecture, presets, corpus, tokenizer and training pipeline.

Installed under the distinct name ``sprout_model`` (the folder is ``model/``) so it never
shadows a course user's own ``model.py``.
"""
from .model import GPT, Config, RMSNorm, apply_rope, rope_tables
from .presets import PRESETS, preset

__all__ = ["GPT", "Config", "RMSNorm", "apply_rope", "rope_tables", "PRESETS", "preset"]
