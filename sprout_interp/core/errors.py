"""Exceptions for mistakes a user can make. Each message says what is wrong and what to do.

All derive from :class:`SproutError`, so a notebook or the dashboard can catch one class and
show ``str(err)`` to a person.
"""
from __future__ import annotations

__all__ = [
    "SproutError", "ArgumentError", "CheckpointNotFoundError", "NotACheckpointError", "UnsafeCheckpointError",
    "StateDictMismatchError", "VocabularyMismatchError", "ContextLengthError", "HookNameError", "TokenizationError",
    "AblationError", "HookOutputError", "NotAPathError", "UnreadablePathError", "InvalidConfigError",
    "InvalidWeightsError", "MissingTokenizerError", "ExportError", "PatchingError", "MetricError", "TunedLensMismatchError",
    "TunedLensNotFoundError", "SAEMismatchError", "SAENotFoundError", "SteeringError", "UnequalLengthsError",
    "TranscoderMismatchError", "TranscoderNotFoundError", "AttributionGraphError", "QKAttributionError",
]


class SproutError(Exception):
    """Base class of every error sprout_interp raises on purpose."""


class CheckpointNotFoundError(SproutError, FileNotFoundError):
    """The name or path does not point to a shipped model, a folder or a file."""


class NotACheckpointError(SproutError, ValueError):
    """The file or folder exists but does not hold Sprout weights."""


class UnsafeCheckpointError(SproutError, ValueError):
    """A pickle that would run code when loaded; refused, never executed."""


class StateDictMismatchError(SproutError, ValueError):
    """Weights with missing or unexpected keys, or with the wrong shapes, for the model's Config."""


class VocabularyMismatchError(SproutError, ValueError):
    """The tokenizer's vocabulary size differs from the model's embedding."""


class ArgumentError(SproutError, ValueError):
    """An argument of the wrong kind or outside its range (an index, a count, a number, the form of an input)."""


class ContextLengthError(SproutError, ValueError):
    """A text longer than the model's context window."""


class HookNameError(SproutError, KeyError):
    """An unknown hook point name."""

    def __str__(self) -> str:  # KeyError would print the message inside quotes
        return str(self.args[0]) if self.args else ""


class TokenizationError(SproutError, ValueError):
    """Text the tokenizer cannot encode (for example a lone surrogate)."""


class UnequalLengthsError(SproutError, ValueError):
    """Texts of different lengths given to a function that reads every row at the same positions, where the
    padding would enter its numbers: pass one text at a time, or texts that tokenize to the same length."""


class AblationError(SproutError, ValueError):
    """A (layer, head) the model does not have, or an ablation / sweep / head-score argument that cannot work."""


class HookOutputError(SproutError, ValueError):
    """A hook function returned something other than a tensor of the activation's shape and dtype."""


class NotAPathError(SproutError, TypeError):
    """A model, folder or file argument that is neither a shipped name nor a path (for example a number or None)."""


class UnreadablePathError(SproutError, OSError):
    """A file or folder that exists but cannot be read: no permission, a symlink loop, an I/O error."""


class InvalidConfigError(SproutError, ValueError):
    """A config (``config.json`` or a ``.pt``'s ``config``) with a value of the wrong type or out of range."""


class InvalidWeightsError(SproutError, ValueError):
    """Weights that are not usable numbers: NaN or infinite values, integer, bool or complex tensors, meta, sparse or
    nested tensors, or views that show more values than the file stores (a zero stride, shared storage)."""


class MissingTokenizerError(CheckpointNotFoundError):
    """Weights without a tokenizer of their own, and none passed: the token ids would mean nothing."""


class ExportError(SproutError, RuntimeError):
    """An export that cannot be done with the installed libraries, or whose result would not match Sprout."""


class PatchingError(SproutError, ValueError):
    """Inputs or arguments that activation or path patching cannot use (lengths differ, runs that do not differ ...)."""


class MetricError(AblationError, PatchingError):
    """A metric that cannot be bound to a batch (unknown name, positions outside it, ids not one per row); one
    metric protocol serves ablations and patching, so this is caught as either's error."""


class TunedLensMismatchError(SproutError, ValueError):
    """A tuned lens trained for another checkpoint (a different config, vocabulary or weights), or a damaged one."""


class TunedLensNotFoundError(SproutError, FileNotFoundError):
    """No tuned lens saved beside the checkpoint (``lens="tuned"`` then falls back to the logit lens, with a notice)."""


class SAEMismatchError(SproutError, ValueError):
    """A sparse autoencoder made for another checkpoint or another hook point (layer), or a damaged SAE folder."""


class SAENotFoundError(SproutError, FileNotFoundError):
    """No sparse autoencoder saved for this checkpoint and layer (train one with ``python -m sprout_interp.features.train``)."""


class TranscoderMismatchError(SAEMismatchError):
    """Transcoders made for another checkpoint, width or layer, or a damaged or hostile transcoder folder."""


class TranscoderNotFoundError(SAENotFoundError):
    """No transcoder saved for this checkpoint and layer (train them with ``python -m sprout_interp.features.transcoder_train``)."""


class SteeringError(SproutError, ValueError):
    """Arguments activation steering cannot use (a vector of the wrong width, a site outside the residual stream,
    positions outside the input ...)."""


class AttributionGraphError(SproutError, ValueError):
    """Arguments an attribution graph cannot use (a batch of texts, thresholds outside 0..1, nodes it does not
    have), or a graph file that is damaged or not a graph."""


class QKAttributionError(AttributionGraphError):
    """Arguments a QK attribution or a head loading cannot use (a layer, head or position outside the model or the
    prompt, a key after its query, an edge the graph does not have)."""
