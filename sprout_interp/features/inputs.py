"""Model input for the feature analyses: a text longer than the context is cut to it, with a notice.

The rest of the toolkit refuses a text longer than the model's context (ContextLengthError); a person reading
which features fire on their own text would rather see the first ``n_ctx`` tokens, told that the rest was left
out. :func:`feature_input` does that cut, warns :class:`TruncatedTextWarning` and returns the notice, then
passes the result through ``HookedSprout.prepare_input`` like every other analysis.
"""
from __future__ import annotations

import warnings
from typing import Optional

from jaxtyping import Bool, Int
from torch import Tensor

from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.tokens import encode_text

__all__ = ["TruncatedTextWarning", "feature_input"]


class TruncatedTextWarning(UserWarning):
    """A text was longer than the model's context: only its first ``n_ctx`` tokens were read."""


def feature_input(
    model, input, attention_mask=None
) -> tuple[Int[Tensor, "batch pos"], Optional[Bool[Tensor, "batch pos"]], Optional[str]]:
    """``(tokens, mask or None, notice or None)`` for a text, a list of texts or token ids.

    Texts longer than the context keep their first ``n_ctx`` tokens; the notice says how many were dropped
    (and a :class:`TruncatedTextWarning` is raised as a warning). Ids are checked as ``prepare_input`` checks
    them: ids longer than the context are refused, since ids are the caller's exact choice.
    """
    m = as_hooked(model)
    notice = None
    texts = [input] if isinstance(input, str) else input
    if isinstance(texts, (list, tuple)) and texts and all(isinstance(t, str) for t in texts):
        n_ctx = m.cfg.n_ctx
        longest = max((len(encode_text(m.tokenizer, t, context=1 << 30)) for t in texts if t), default=0)
        if longest > n_ctx:
            notice = (f"the text is {longest} tokens long but the model reads at most {n_ctx}: only its first "
                      f"{n_ctx} tokens were used ({longest - n_ctx} left out)")
            warnings.warn(notice, TruncatedTextWarning, stacklevel=3)
            toks, mask = m.to_tokens_with_mask(input, truncate=True)
            toks, mask = m.prepare_input(toks, mask if not bool(mask.all()) else None)
            return toks, mask, notice
    toks, mask = m.prepare_input(input, attention_mask)
    return toks, mask, notice
