"""sprout_interp: interpretability toolkit for Sprout, the course's small GPT."""
from .errors import (
    AblationError,
    CheckpointNotFoundError,
    ContextLengthError,
    HookNameError,
    NotACheckpointError,
    SproutError,
    StateDictMismatchError,
    TokenizationError,
    UnsafeCheckpointError,
    VocabularyMismatchError,
)
from . import logit_lens  # noqa: F401  (the module: si.logit_lens.logit_lens(model, tokens))
from .ablation import ablate, ablation_sweep, attribution_sweep
from .knockout import block_knockout
from .attention import attention_patterns, find_induction_circuit, head_scores
from .compare import compare_models
from .hooked import HookedSprout, SproutCache, load_hooked
from .residual import residual_rms
from .loading import LoadedCheckpoint, load_checkpoint

load = load_hooked  # si.load("gpt-4") -> HookedSprout

__all__ = [
    "load", "load_hooked", "HookedSprout", "SproutCache", "load_checkpoint", "LoadedCheckpoint",
    "residual_rms", "attention_patterns", "head_scores", "find_induction_circuit",
    "ablate", "ablation_sweep", "attribution_sweep", "block_knockout", "compare_models",
    "SproutError", "AblationError", "CheckpointNotFoundError", "NotACheckpointError", "UnsafeCheckpointError",
    "StateDictMismatchError", "VocabularyMismatchError", "ContextLengthError", "HookNameError", "TokenizationError",
]
