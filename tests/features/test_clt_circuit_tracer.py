"""A cross-layer transcoder saved here, loaded by circuit-tracer 0.5.0's own ``load_clt`` (in ``.venv-ct``, a
subprocess): the same feature activations and the same reconstruction of every layer's feed-forward output, with
its decoders read eagerly and lazily (slice by slice from the files), in float32 and from the float16 copy that
ships. Skipped, with the reason, when ``.venv-ct`` is not built (``bash scripts/setup_circuit_tracer.sh``)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from safetensors.torch import load_file, save_file

from sprout_interp.core.hooked import HookedSprout
from sprout_interp.features.clt import save_clt
from sprout_interp.features.clt_train import train_clt
from sprout_model import GPT

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
CT_PY = ROOT / ".venv-ct" / "bin" / "python"

WORKER = r"""
import sys, torch
from safetensors.torch import load_file, save_file
from circuit_tracer.transcoder.cross_layer_transcoder import load_clt
folder, inputs, out = sys.argv[1:4]
xs = load_file(inputs)["xs"]
res = {}
for lazy in (False, True):
    clt = load_clt(folder, feature_input_hook="mlp.hook_in", feature_output_hook="mlp.hook_out",
                   device=torch.device("cpu"), dtype=torch.float32, lazy_decoder=lazy)
    assert clt.feature_input_hook == "mlp.hook_in" and clt.W_skip is None
    feats = clt.encode(xs)
    res[f"acts_{int(lazy)}"] = feats.contiguous()
    res[f"recon_{int(lazy)}"] = clt.decode(feats.to_sparse()).contiguous()
    res[f"n_layers_{int(lazy)}"] = torch.tensor([clt.n_layers, clt.d_transcoder, clt.d_model])
    res[f"jump_relu_{int(lazy)}"] = torch.tensor([type(clt.activation_function).__name__ == "JumpReLU"])
save_file(res, out)
"""


@pytest.fixture(scope="module")
def clt():
    torch.manual_seed(0)
    m = HookedSprout(GPT(tiny_config()).eval(), name="tiny")
    tokens = torch.randint(0, 64, (48, 32), generator=torch.Generator().manual_seed(1))
    return train_clt(m, None, d_transcoder=48, k=4, chunks=2, chunk_tokens=768, passes=3, batch_size=128, lr=3e-3,
                     tokens=tokens, progress=False)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_circuit_tracers_load_clt_reads_what_we_save(clt, dtype, tmp_path):
    if not CT_PY.is_file():
        pytest.skip(".venv-ct is not built: run `bash scripts/setup_circuit_tracer.sh` (circuit-tracer 0.5.0 in a "
                    "virtual environment of its own)")
    folder = save_clt(clt, tmp_path / "clt", dtype)
    assert json.loads((folder / "config.yaml").read_text())["model_kind"] == "cross_layer_transcoder"
    xs = torch.randn(clt.n_layers, 9, clt.d_model, generator=torch.Generator().manual_seed(2)) * 3
    save_file({"xs": xs}, tmp_path / "xs.safetensors")
    (tmp_path / "worker.py").write_text(WORKER)
    run = subprocess.run([str(CT_PY), str(tmp_path / "worker.py"), str(folder), str(tmp_path / "xs.safetensors"),
                          str(tmp_path / "out.safetensors")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = load_file(tmp_path / "out.safetensors")
    ours = clt if dtype == torch.float32 else _rounded(clt)
    with torch.no_grad():
        acts, recon = ours.encode(xs), ours(xs)
    assert 0 < int((acts != 0).sum()) < acts.numel() / 2  # a sparse code, not all or nothing
    for lazy in (0, 1):
        assert got[f"n_layers_{lazy}"].tolist() == [clt.n_layers, clt.d_transcoder, clt.d_model]
        assert bool(got[f"jump_relu_{lazy}"])
        torch.testing.assert_close(got[f"acts_{lazy}"], acts, rtol=0, atol=1e-5)
        torch.testing.assert_close(got[f"recon_{lazy}"], recon, rtol=0, atol=1e-4)


def _rounded(clt):
    """Our CLT with every weight rounded to float16 (what the shipped copy holds), in float32."""
    import copy

    out = copy.deepcopy(clt)
    with torch.no_grad():
        for p in out.parameters():
            p.copy_(p.half().float())
    return out
