"""sprout_interp: interpretability toolkit for Sprout, the course's small GPT."""
from .errors import (
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
from .hooked import HookedSprout, SproutCache, load_hooked
from .loading import LoadedCheckpoint, load_checkpoint

load = load_hooked  # si.load("gpt-4") -> HookedSprout

__all__ = [
    "load", "load_hooked", "HookedSprout", "SproutCache", "load_checkpoint", "LoadedCheckpoint",
    "SproutError", "CheckpointNotFoundError", "NotACheckpointError", "UnsafeCheckpointError",
    "StateDictMismatchError", "VocabularyMismatchError", "ContextLengthError", "HookNameError", "TokenizationError",
]
