"""``SproutCache``: TransformerLens's ``ActivationCache`` whose failed look-ups say what to type instead."""
from __future__ import annotations

from torch import Tensor
from transformer_lens import ActivationCache
from transformer_lens.utilities import get_act_name

from sprout_interp.core.errors import (
    HookNameError,
)
from sprout_interp.core.hook_points import unknown_name_message

__all__ = ["SproutCache"]


# --------------------------------------------------------------------------------------------
# cache


class SproutCache(ActivationCache):
    """TransformerLens's ``ActivationCache`` whose failed lookups say what to type instead.

    ``cache["blocks.3.hook_resid_post"]``, the shorthand ``cache["resid_post", 3]`` and
    ``cache["pattern", 0]`` work as in TransformerLens. A name that is not a hook point raises
    :class:`HookNameError` with the closest valid names; a valid name that this run did not cache
    (excluded by ``names_filter``, or in a block that ``stop_at_layer``/``start_at_layer`` skipped)
    says so.
    """

    def __getitem__(self, key) -> Tensor:
        try:
            return super().__getitem__(key)
        except (KeyError, ValueError, IndexError, TypeError, AttributeError):
            pass
        try:
            full = key if isinstance(key, str) else get_act_name(*key)
        except Exception:
            full = str(key)
        model = self.model
        if model is not None and hasattr(model, "hook_dict") and full in model.hook_dict:
            raise HookNameError(
                f"{full!r} is a valid hook point but this cache does not hold it: the run's names_filter "
                f"excluded it, or its block did not run (stop_at_layer/start_at_layer). Cached: "
                f"{len(self.cache_dict)} activations, e.g. {list(self.cache_dict)[:3]}"
            )
        valid = list(model.hook_dict) if model is not None and hasattr(model, "hook_dict") else list(self.cache_dict)
        raise HookNameError(unknown_name_message(full, valid, getattr(getattr(model, "cfg", None), "n_layers", None)))

    def __contains__(self, key) -> bool:
        return key in self.cache_dict

    def get(self, key, default=None):
        """The cached activation of a full hook name, or ``default`` (no shorthand keys, no error)."""
        return self.cache_dict.get(key, default)

