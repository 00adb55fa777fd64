"""sprout_model: Sprout's architecture, presets, corpus, tokenizer and training pipeline.

Installed under the distinct name ``sprout_model`` (the folder is ``model/``) so it never
shadows a course user's own ``model.py``: ``import sprout_model`` (or ``from sprout_model.train import train``),
never ``import model``.

Modules, one job each: ``model`` (the architecture, the course's parameter names and maths), ``presets``,
``tokenizer``, ``cleaning`` (bytes to clean paragraphs and documents), ``decoders`` (R and SWORD data formats read
without R or SWORD), ``corpus`` (the sources and the split), ``augment`` (names randomised, copy rows),
``prepare`` (corpus to token files), ``batches`` (the training batches, host or GPU), ``train`` (the training
loop and its command line), ``evaluation``, ``checkpoint`` and ``run_state`` (what is saved, read with
``weights_only=True``), ``grow`` and ``stack`` (a model grown or stacked from a smaller one), ``device`` (the
recipe for a lent GPU), ``transport`` (what travels to and from that machine; the checkpoint in parts),
``ship`` (a run's checkpoint made the shipped one), ``info`` (checkpoints described), ``cli`` (the command
lines' checked arguments).
"""
from .model import GPT, Config, RMSNorm, apply_rope, rope_tables
from .presets import PRESETS, preset

__all__ = ["GPT", "Config", "RMSNorm", "apply_rope", "rope_tables", "PRESETS", "preset"]
