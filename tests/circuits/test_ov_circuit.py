"""Full OV circuits: the copying score and the self-ranks against the explicit (d_vocab x d_vocab) matrix, against
TransformerLens's FactoredMatrix, and on planted heads whose answer is known."""
from __future__ import annotations

import pytest
import torch
from conftest import tiny_config
from transformer_lens import FactoredMatrix

from sprout_interp import HookedSprout, SproutError
from sprout_interp.circuits.ov_circuit import full_ov_circuit, ov_copying_scores
from sprout_model import GPT

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def model() -> HookedSprout:
    torch.manual_seed(3)
    return HookedSprout(GPT(tiny_config(n_layer=2, n_head=2)).eval())


def _explicit(m: HookedSprout, l: int, h: int, normalize: bool) -> torch.Tensor:
    """W_E W_V W_O W_U built in full, from the weights directly (RMS of each embedding row by hand)."""
    e = m.W_E.detach().double()
    if normalize:
        e = e / (e.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    return e @ m.W_V[l, h].detach().double() @ m.W_O[l, h].detach().double() @ m.W_U.detach().double()


@pytest.mark.parametrize("normalize", [True, False])
def test_scores_and_ranks_equal_the_explicit_matrix(model, normalize):
    df = ov_copying_scores(model, normalize=normalize, k=3, chunk=7)  # a chunk that does not divide the vocabulary
    assert list(df.columns) == ["layer", "block", "head", "copying_score", "self_top_k", "self_rank_median"]
    for r in df.itertuples():
        F = _explicit(model, r.layer, r.head, normalize)
        lam = torch.linalg.eigvals(F)
        lam = lam[lam.abs().argsort(descending=True)][: model.cfg.d_head]  # rank d_head: the rest are zero
        assert r.copying_score == pytest.approx(float(lam.sum().real / lam.abs().sum()), abs=1e-4)
        own = F.diagonal()
        rank = (F > own[:, None]).sum(-1)
        assert r.self_top_k == pytest.approx(float((rank < 3).double().mean()), abs=1e-9)
        assert r.self_rank_median == float(rank.double().median())
        torch.testing.assert_close(full_ov_circuit(model, r.layer, r.head, normalize).AB.double(), F, atol=1e-4, rtol=1e-4)
        assert r.block == r.layer + 1


def test_eigenvalues_are_transformer_lens_factored_matrix_eigenvalues(model):
    df = ov_copying_scores(model, normalize=False, ranks=False)
    assert "self_top_k" not in df.columns
    with torch.no_grad():
        full = FactoredMatrix(model.W_E, model.OV.A @ model.OV.B) @ model.W_U  # TransformerLens's own product
    for r in df.itertuples():
        lam = full[r.layer, r.head].eigenvalues
        assert r.copying_score == pytest.approx(float(lam.sum().real / lam.abs().sum()), abs=1e-4)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_planted_copying_head_scores_one_and_its_negation_minus_one(sign):
    """Head 0 of layer 0 given W_V W_O = ±U Uᵀ (a projection): with tied embeddings and unit gains the full OV
    circuit is ±D W_E U Uᵀ W_Eᵀ, positive (negative) semi-definite up to the positive row scaling D, so every
    eigenvalue has that sign."""
    torch.manual_seed(0)
    gpt = GPT(tiny_config(n_layer=1, n_head=2)).eval()
    m = HookedSprout(gpt)
    d, dh = m.cfg.d_model, m.cfg.d_head
    U, _ = torch.linalg.qr(torch.randn(d, dh))
    with torch.no_grad():
        gpt.blocks[0].attn.qkv.weight[2 * d: 2 * d + dh] = U.T      # W_V[0, 0] = U (ln1's gain is 1)
        gpt.blocks[0].attn.proj.weight[:, :dh] = sign * U          # W_O[0, 0] = ±Uᵀ
    torch.testing.assert_close(m.OV[0, 0].AB, sign * U @ U.T, atol=1e-6, rtol=0)
    df = ov_copying_scores(m, ranks=False)
    assert df.loc[(df["layer"] == 0) & (df["head"] == 0), "copying_score"].item() == pytest.approx(sign, abs=1e-5)


def test_the_shipped_gpt4_induction_heads_copy_and_its_last_block_suppresses():
    """On gpt-4: block 2 heads 0 and 1 (the induction heads of the claims table) are among the most positive
    full OV circuits, and every head of block 4 is negative (it writes against the token it reads)."""
    import sprout_interp as si

    df = ov_copying_scores(si.load("gpt-4"), ranks=False)
    top = df.sort_values("copying_score", ascending=False).head(3)
    assert {(1, 0), (1, 1)} <= set(zip(top["layer"], top["head"]))
    assert (df[df.layer == 3]["copying_score"] < 0).all()


@pytest.mark.unchecked_types
def test_bad_arguments_are_refused(model):
    with pytest.raises(SproutError, match="no head 5 in layer 0"):
        full_ov_circuit(model, 0, 5)
    with pytest.raises(SproutError, match="at least 1"):
        ov_copying_scores(model, k=0)
