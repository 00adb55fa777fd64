"""The three model sizes this project trains; all share vocabulary 8,192 and context 512."""
from __future__ import annotations

from .model import Config

PRESETS: dict[str, Config] = {
    "gpt-1": Config(vocab_size=8192, context=512, n_layer=1, n_head=3, d_model=192, d_ff=512),
    "gpt-4": Config(vocab_size=8192, context=512, n_layer=4, n_head=3, d_model=192, d_ff=512),
    "sprout": Config(vocab_size=8192, context=512, n_layer=8, n_head=6, d_model=384, d_ff=1024),
}


def preset(name: str) -> Config:
    """A fresh copy of the named preset's Config."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return Config(**PRESETS[name].to_dict())
