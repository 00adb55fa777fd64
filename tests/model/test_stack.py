"""Depthwise stacking (sprout_model.stack): the stacked model is the source's blocks run in the stacked order."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from fixtures.weights import trained_like

from sprout_model import GPT, Config
from sprout_model.checkpoint import load_folder, save_checkpoint
from sprout_model.stack import main as stack_main
from sprout_model.stack import output_scaled, parse_blocks, stacked_state

pytestmark = pytest.mark.unit

CFG = Config(vocab_size=300, context=64, n_layer=4, n_head=2, d_model=32, d_ff=64)


def _logits_in_order(m: GPT, x: torch.Tensor, order: list[int]) -> torch.Tensor:
    """A hand-written forward that runs the source model's own blocks in ``order``."""
    h = m.embed(x)
    cos, sin = m.cos[: x.size(1)], m.sin[: x.size(1)]
    for i in order:
        h = m.blocks[i](h, cos, sin)
    return m.head(m.norm(h))


def test_parse_blocks_counts_from_one():
    assert parse_blocks("5-8", 8) == [4, 5, 6, 7]
    assert parse_blocks("1,3-4", 8) == [0, 2, 3]
    for bad in ("0-3", "7-9", "x", "4-2"):
        with pytest.raises(ValueError, match="block numbers"):
            parse_blocks(bad, 8)


def test_stacked_model_runs_the_source_blocks_in_the_stacked_order():
    src = trained_like(CFG, 0)
    big = GPT(CFG).eval()
    big.load_state_dict(stacked_state(src.state_dict(), targets=[2, 3], sources=[0, 1]))
    x = torch.randint(0, CFG.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(big(x)[0], _logits_in_order(src, x, [0, 1, 0, 1]), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(big(x)[0], src(x)[0], atol=1e-2)  # it is not the source's function
    # copies, not shared tensors: training one block leaves its twin alone
    with torch.no_grad():
        big.blocks[2].ffn.w2.weight.add_(1.0)
    assert not torch.equal(big.blocks[2].ffn.w2.weight, big.blocks[0].ffn.w2.weight)


def test_stacking_checks_what_it_is_given():
    sd = trained_like(CFG, 0).state_dict()
    with pytest.raises(ValueError, match="as many"):
        stacked_state(sd, [2, 3], [0])
    with pytest.raises(ValueError, match="filled twice"):
        stacked_state(sd, [2, 2], [0, 1])
    with pytest.raises(ValueError, match="no block 5"):
        stacked_state(sd, [4], [0])


def test_stack_command_writes_a_folder_train_can_start_from(tmp_path, capsys):
    src = trained_like(CFG, 2)
    save_checkpoint(src, tmp_path / "src", None, {"tokens_seen": 1234, "steps": 5, "history": [], "preset": "x"})
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    rng.integers(0, CFG.vocab_size, 4 * 33, dtype=np.uint16).tofile(data / "val.bin")
    stack_main([str(tmp_path / "src"), "--blocks", "3-4", "--copies-of", "1-2", "--out", str(tmp_path / "out"),
                "--data", str(data), "--rows", "4", "--seq-len", "32"])
    report = json.loads(capsys.readouterr().out)
    stacked, info = load_folder(tmp_path / "out")
    assert info["tokens_seen"] == 1234 and info["stacked"] == {"from": str(tmp_path / "src"), "blocks": [3, 4], "copies_of": [1, 2],
                                                                "out_scales": [1.0, 1.0]}
    x = torch.as_tensor(np.fromfile(data / "val.bin", dtype=np.uint16).astype(np.int64)).view(4, 33)
    with torch.no_grad():
        logits = _logits_in_order(src, x[:, :-1], [0, 1, 0, 1])
        want = torch.nn.functional.cross_entropy(logits.reshape(-1, CFG.vocab_size), x[:, 1:].reshape(-1)).item()
        assert report["val_loss_stacked"] == pytest.approx(want, abs=1e-4)
        assert report["val_loss_source"] == pytest.approx(src(x[:, :-1], x[:, 1:])[1].item(), abs=1e-4)
    from sprout_model.grow import read_source  # what train --init-from reads
    sd, prev = read_source(tmp_path / "out")
    assert prev["tokens_seen"] == 1234 and torch.equal(sd["blocks.2.attn.qkv.weight"], src.blocks[0].attn.qkv.weight)


def test_interleaved_copies_with_silenced_twins_compute_the_source_blocks_alone():
    src = trained_like(CFG, 3)
    sd = stacked_state(src.state_dict(), targets=[0, 1, 2, 3], sources=[0, 0, 1, 1])
    big = GPT(CFG).eval()
    big.load_state_dict(output_scaled(sd, [0, 1, 2, 3], [1.0, 0.0, 1.0, 0.0]))
    x = torch.randint(0, CFG.vocab_size, (2, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        # a block whose two output matrices are zero adds nothing to the residual stream
        torch.testing.assert_close(big(x)[0], _logits_in_order(src, x, [0, 1]), atol=1e-5, rtol=1e-5)
        big.load_state_dict(output_scaled(sd, [0, 1, 2, 3], [0.7, 0.3, 0.7, 0.3]))
        assert not torch.allclose(big(x)[0], _logits_in_order(src, x, [0, 1]), atol=1e-3)
    scaled = output_scaled(sd, [1], [0.25])
    for k, v in sd.items():
        want = v * 0.25 if k in ("blocks.1.attn.proj.weight", "blocks.1.ffn.w2.weight") else v
        assert torch.equal(scaled[k], want), k
    with pytest.raises(ValueError, match="one per filled block"):
        output_scaled(sd, [0, 1], [1.0])


def test_stack_command_records_its_output_scales(tmp_path, capsys):
    src = trained_like(CFG, 5)
    save_checkpoint(src, tmp_path / "src", None, {"tokens_seen": 10, "steps": 1, "history": [], "preset": "x"})
    stack_main([str(tmp_path / "src"), "--blocks", "1-4", "--copies-of", "1,1,2,2", "--out-scales", "1,0,1,0",
                "--out", str(tmp_path / "out"), "--data", str(tmp_path / "none")])
    assert "no " in capsys.readouterr().out
    stacked, info = load_folder(tmp_path / "out")
    assert info["stacked"]["copies_of"] == [1, 1, 2, 2] and info["stacked"]["out_scales"] == [1.0, 0.0, 1.0, 0.0]
    x = torch.randint(0, CFG.vocab_size, (1, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        torch.testing.assert_close(stacked(x)[0], _logits_in_order(src, x, [0, 1]), atol=1e-5, rtol=1e-5)
    with pytest.raises(SystemExit):
        stack_main([str(tmp_path / "src"), "--blocks", "1-2", "--copies-of", "1,1", "--out-scales", "a,b",
                    "--out", str(tmp_path / "bad")])
