"""A checkpoint's fingerprint, and what differs between two: what every artefact trained for one checkpoint (a tuned
lens, an SAE, transcoders, the dashboard's precomputed tables) records, so it is never used with another.

A fingerprint is the model's Config (``config``), the sha256 of its weights (names, shapes and float32 values, in
name order: ``weights_sha256``) and of its vocabulary (``vocab_sha256``; ``"none"`` without a tokenizer).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import weakref

import torch

from sprout_interp.core.errors import SproutError
from sprout_interp.core.hooked import as_hooked

__all__ = ["fingerprint", "check_fingerprint", "fingerprint_mismatch"]


# the last fingerprint of each model, with what it was computed from: every parameter's and buffer's storage and
# version counter (an in-place change of a weight bumps its version), the config and the tokenizer object; hashing
# Sprout's 69 MB of float32 weights is most of a dashboard page's check of its shipped files
_MEMO: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()


def _state_key(m) -> tuple:
    cfg = m.model.cfg
    cfg_key = json.dumps(dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(vars(cfg)), default=str,
                         sort_keys=True)
    tensors = tuple((name, t.data_ptr(), t._version, tuple(t.shape), str(t.dtype), str(t.device))
                    for name, t in m.model.state_dict(keep_vars=True).items())
    return cfg_key, tensors, id(m.tokenizer)


def fingerprint(model) -> dict:
    """``{"config": ..., "weights_sha256": ..., "vocab_sha256": ...}`` of ``model`` (a HookedSprout or anything
    :func:`~sprout_interp.core.hooked.as_hooked` takes): what an artefact trained for it must match. Remembered
    per model until a weight, the config or the tokenizer changes (a fresh dict each call)."""
    m = as_hooked(model)
    key = _state_key(m)
    got = _MEMO.get(m.model)
    if got is not None and got[0] == key:
        return copy.deepcopy(got[1])
    fp = _fingerprint(m)
    _MEMO[m.model] = (key, fp)
    return copy.deepcopy(fp)


def _fingerprint(m) -> dict:
    cfg = m.model.cfg
    config = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(vars(cfg))
    h = hashlib.sha256()
    for name, t in sorted(m.model.state_dict().items()):
        h.update(f"{name}:{tuple(t.shape)};".encode())
        h.update(t.detach().float().contiguous().cpu().numpy().tobytes())
    tok = m.tokenizer
    if tok is None:
        vocab = "none"
    else:
        items = sorted(tok.get_vocab(with_added_tokens=True).items())
        vocab = hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()
    return {"config": json.loads(json.dumps(config, default=str)), "weights_sha256": h.hexdigest(), "vocab_sha256": vocab}


def check_fingerprint(fp: object, where: str, error: type[SproutError]) -> dict:
    """``fp``, a fingerprint read from a file, when it has the form :func:`fingerprint` gives (an object whose
    ``config`` is an object and whose ``weights_sha256`` / ``vocab_sha256`` are strings; missing parts count as
    different). Raises ``error``, naming ``where``, for anything else (a list, a string, a number)."""
    ok = isinstance(fp, dict) and isinstance(fp.get("config", {}), dict) and all(
        isinstance(fp.get(k, ""), str) for k in ("weights_sha256", "vocab_sha256"))
    if not ok:
        raise error(f"{where} is damaged: its fingerprint is {str(fp)[:80]!r} ({type(fp).__name__}), not an object "
                    "with a config object and sha256 strings as fingerprint(model) writes. Train it again")
    return fp


def fingerprint_mismatch(expected: dict, found: object, owner: str = "file") -> list[str]:
    """What differs between the model's fingerprint ``expected`` and the one an artefact records, ``found``: a list
    of ``"config (key: <owner>'s value vs model's value, ...)"`` (at most four keys), ``"vocabulary"``,
    ``"weights"``; empty when they match, ``["fingerprint"]`` when ``found`` is not an object."""
    if not isinstance(found, dict):
        return ["fingerprint"]
    out = []
    ce, cf = expected.get("config", {}), found.get("config", {})
    cf = cf if isinstance(cf, dict) else {"(not an object)": cf}
    diff = sorted(k for k in set(ce) | set(cf) if ce.get(k) != cf.get(k))
    if diff:
        out.append("config (" + ", ".join(f"{k}: {owner}'s {cf.get(k)!r} vs model's {ce.get(k)!r}" for k in diff[:4]) + ")")
    for key, what in (("vocab_sha256", "vocabulary"), ("weights_sha256", "weights")):
        if expected.get(key) != found.get(key):
            out.append(what)
    return out
