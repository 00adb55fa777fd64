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
from .loading import LoadedCheckpoint, load_checkpoint

load = load_checkpoint  # placeholder: becomes the loader that returns the hooked wrapper

__all__ = [
    "load", "load_checkpoint", "LoadedCheckpoint",
    "SproutError", "CheckpointNotFoundError", "NotACheckpointError", "UnsafeCheckpointError",
    "StateDictMismatchError", "VocabularyMismatchError", "ContextLengthError", "HookNameError", "TokenizationError",
]
