"""What a checkpoint load may read and build: the size of each file, the pickle's length and cost, the config's
ranges and the size of the model that would be built.

Module attributes, read at every load, so a test (or a user with a bigger model) can change them:
``sprout_interp.core.limits.MAX_WEIGHTS_BYTES = 8 << 30``.
"""
from __future__ import annotations

from sprout_model import tokenizer
from sprout_model.checkpoint import CONFIG_LIMITS

__all__ = ["MAX_WEIGHTS_BYTES", "MAX_JSON_BYTES", "MAX_TOKENIZER_BYTES", "MAX_MODEL_BYTES", "MAX_PICKLE_BYTES",
           "PICKLE_OPS", "PICKLE_OPS_PER_TENSOR", "LIMITS", "SHOW", "MAX_WEIGHT_ABS", "MAX_GRAPH_BYTES",
           "MAX_GRAPH_JSON_BYTES"]

MAX_WEIGHTS_BYTES = 4 << 30  # a .safetensors or .pt file; Sprout's own is 70 MB in float32
MAX_JSON_BYTES = 16 << 20  # config.json, train.json (a long run's history is well under 1 MB)
MAX_TOKENIZER_BYTES = tokenizer.MAX_TOKENIZER_BYTES  # tokenizer.json (Sprout's 8,192-token BPE is about 0.5 MB)
MAX_MODEL_BYTES = 8 << 30  # float32 parameters plus the RoPE tables of the model that would be built
MAX_PICKLE_BYTES = 64 << 20  # the pickle inside a .pt
PICKLE_OPS = 200_000  # pickle opcodes allowed in a .pt, plus PICKLE_OPS_PER_TENSOR for each tensor in it
PICKLE_OPS_PER_TENSOR = 200
LIMITS = dict(CONFIG_LIMITS)  # upper bounds of the config's whole-number fields (the training tools refuse the same)
SHOW = 5  # how many keys or names an error message shows
# The largest |value| a weight may hold (checkpoints, tuned lenses, SAEs, transcoders: core.configs.check_weights).
# Trained weights are of order 1: the largest in the shipped files is 6.9 (an SAE's b_dec), a norm gain 3.6. With
# every weight within 1e4, an RMSNorm output is at most sqrt(d_model) * 1e4, so a feed-forward of Sprout's size
# writes at most d_ff * 1e4 * (d_model * 1e4 * sqrt(d_model) * 1e4)^2 ~ 6e30 per block, inside float32's 3.4e38,
# and the next norm rescales it; a value near float32's largest overflows at its first product. Much larger
# configs can still overflow through their products: a checkpoint's forward on a probe input is checked too
# (core.configs.check_runs).
MAX_WEIGHT_ABS = 1e4
# The memory an attribution graph may use for its own tensors (circuits.attribution_graph.graph_memory: its rows,
# the per-position sources, the attention patterns, a batch's gradients), checked before any is allocated. 1 GiB
# keeps the whole process under 2 GB at any prompt length: Python and torch take 0.4 GiB, with Sprout, its
# transcoders and a 511-token prompt's forward 0.9 GiB (benchmarks/graph_memory.py measures it).
MAX_GRAPH_BYTES = 1 << 30
# A graph in circuit-tracer's frontend JSON (circuits.graph_json): the pruned nodes and edges only (Sprout's graph of
# the chapter's story, the page's 2,048 features: 1.1 MB at node_threshold 0.8, 4.1 MB at 0.9; docs/attribution_graphs.md);
# parsed, JSON takes about three times its size in memory (that 4.1 MB file: 12 MB, by tracemalloc), so 64 MB keeps
# a hostile file's parse well under 1 GB.
MAX_GRAPH_JSON_BYTES = 64 << 20
