"""A model's fingerprint is remembered until its weights, config or tokenizer change: the remembered one always
equals a fresh hash of the model as it is now."""
from __future__ import annotations

import hashlib

import pytest
import torch

from sprout_interp.core.fingerprints import fingerprint
from sprout_interp.core.hooked import HookedSprout

pytestmark = pytest.mark.unit


def _weights_hash(m: HookedSprout) -> str:
    """The weights' sha256 as the fingerprint defines it, by hand (names, shapes, float32 values in name order)."""
    h = hashlib.sha256()
    for name, t in sorted(m.model.state_dict().items()):
        h.update(f"{name}:{tuple(t.shape)};".encode())
        h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def test_remembered_fingerprint_follows_every_change_of_the_weights(hooked):
    first = fingerprint(hooked)
    assert first["weights_sha256"] == _weights_hash(hooked)
    again = fingerprint(hooked)
    assert again == first and again is not first  # a fresh dict: a caller may change its copy
    again["weights_sha256"] = "changed by the caller"
    assert fingerprint(hooked) == first
    with torch.no_grad():  # in place (its version counter moves)
        hooked.model.embed.weight[3, 1] += 0.5
    changed = fingerprint(hooked)
    assert changed["weights_sha256"] != first["weights_sha256"]
    assert changed["weights_sha256"] == _weights_hash(hooked)
    block = hooked.model.blocks[0].attn
    name = next(n for n, p in block.named_parameters())
    param = dict(block.named_parameters())[name]
    param.data = param.data * 2  # a new tensor under the same parameter
    assert fingerprint(hooked)["weights_sha256"] == _weights_hash(hooked) != changed["weights_sha256"]
    hooked.model.load_state_dict({k: v.clone() + 1 for k, v in hooked.model.state_dict().items()
                                  if k not in ("cos", "sin")}, strict=False)
    assert fingerprint(hooked)["weights_sha256"] == _weights_hash(hooked)


def test_two_models_with_equal_weights_share_a_fingerprint(tiny_model):
    other = HookedSprout(type(tiny_model)(tiny_model.cfg).eval())
    other.model.load_state_dict(tiny_model.state_dict())
    assert fingerprint(HookedSprout(tiny_model)) == fingerprint(other)
