"""Load an SAE folder with SAELens's own loader (``sae_lens.SAE.load_from_disk``) and compare it with ours.

sae-lens 6.54.12 (the registry's newest) requires TransformerLens < 4, and this project pins TransformerLens 4, so
it is not installed into the project's environment. To check the file format against the real thing anyway:

    .venv/bin/pip install --no-deps --target /tmp/saelens sae-lens==6.54.12 simple-parsing==0.1.9 docstring_parser==0.18.0
    PYTHONPATH=/tmp/saelens .venv/bin/python scripts/sae_lens_check.py model/checkpoints/sprout/saes/blocks.3.hook_resid_post

sae_lens imports TransformerLens 3's ``HookedTransformer`` at import time (only to run models, which this check does
not do), so a placeholder class is put under that name, and modules it cannot find are stubbed; its SAE classes,
config handling and loader are its own. Prints the class SAELens built, its cfg, and the largest differences
between its encode/decode and ours on random stream vectors (both in float32).
"""
from __future__ import annotations

import re
import sys
import types

import torch
import transformer_lens

transformer_lens.HookedTransformer = type("HookedTransformer", (), {})  # removed in TransformerLens 4


def stub(name: str, **attrs) -> types.ModuleType:
    mod = sys.modules.get(name) or types.ModuleType(name)
    mod.__path__ = []
    for k, v in attrs.items():
        setattr(mod, k, v)
    sys.modules[name] = mod
    return mod


KEEP = ("sae_lens.analysis", "sae_lens.analysis.hooked_sae_transformer", "sae_lens.load_model")
stub("transformer_lens.HookedTransformer", HookedRootModule=transformer_lens.HookedRootModule,
     HookedTransformer=transformer_lens.HookedTransformer)
stub("sae_lens.load_model", load_model=lambda *a, **k: None)
stub("sae_lens.analysis", HookedSAETransformer=type("HookedSAETransformer", (), {}))
stub("sae_lens.analysis.hooked_sae_transformer", HookedSAETransformer=sys.modules["sae_lens.analysis"].HookedSAETransformer)


def import_sae_lens():
    for _ in range(40):
        try:
            import sae_lens
            return sae_lens
        except ModuleNotFoundError as e:
            stub(e.name)
        except ImportError as e:
            m = re.search(r"cannot import name '(\w+)' from '([\w.]+)'", str(e))
            if not m:
                raise
            stub(m.group(2), **{m.group(1): type(m.group(1), (), {})})
            for k in [k for k in sys.modules if k.startswith("sae_lens") and k not in KEEP]:
                del sys.modules[k]
    raise SystemExit("could not import sae_lens")


def main(folder: str) -> int:
    sae_lens = import_sae_lens()
    from sprout_interp.features.sae import read_sae

    theirs = sae_lens.SAE.load_from_disk(folder, device="cpu")
    c = theirs.cfg
    print(f"sae_lens {sae_lens.__version__}: {type(theirs).__name__}, d_in {c.d_in}, d_sae {c.d_sae}, k {c.k}, "
          f"dtype {c.dtype}, hook {c.metadata.hook_name}, model {c.metadata.model_name}")
    theirs = theirs.to(dtype=torch.float32)
    ours = read_sae(folder)
    x = torch.randn(256, c.d_in, generator=torch.Generator().manual_seed(0)) * 40
    with torch.no_grad():
        a, b = theirs.encode(x), ours.encode(x)
        r1, r2 = theirs.decode(a), ours(x)
    print(f"max |encode difference| {float((a - b).abs().max()):.3g}, max |decode difference| "
          f"{float((r1 - r2).abs().max()):.3g} (reconstructions up to {float(r2.abs().max()):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
