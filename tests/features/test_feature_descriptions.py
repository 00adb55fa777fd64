"""Feature descriptions from measurements: where in its text a latent fires (features.pages.repeat_flags,
where_it_fires) checked against a brute-force count written independently, and the description's wording."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from sprout_interp.features.pages import FeatureIndex, describe, repeat_flags, where_it_fires

pytestmark = pytest.mark.unit


def _brute(rows: list[list[int]], lengths: list[int], firings: dict[tuple[int, int], float]) -> dict:
    """The same shares by plain scanning: a token is a repeat when it equals an earlier token of its row; the pair
    continues when some earlier q has rows[q-1], rows[q] equal to the pair ending here."""
    def seen(b, p):
        return any(rows[b][q] == rows[b][p] for q in range(p))

    def cont(b, p):
        return p > 0 and any(rows[b][q - 1] == rows[b][p - 1] and rows[b][q] == rows[b][p] for q in range(1, p))

    real = [(b, p) for b in range(len(rows)) for p in range(lengths[b])]
    total = sum(firings.values())
    return dict(repeat_share=sum(w for (b, p), w in firings.items() if seen(b, p)) / total,
                repeat_base=sum(seen(b, p) for b, p in real) / len(real),
                continued_share=sum(w for (b, p), w in firings.items() if cont(b, p)) / total,
                continued_base=sum(cont(b, p) for b, p in real) / len(real),
                mean_pos=sum(w * p for (b, p), w in firings.items()) / total, n=len(firings))


def test_where_a_latent_fires_equals_a_brute_force_count():
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 6, (5, 30), generator=g)  # a small vocabulary: many repeats and repeated pairs
    lengths = [30, 30, 22, 30, 9]
    mask = torch.arange(30)[None, :] < torch.tensor(lengths)[:, None]
    acts = torch.rand(5, 30, generator=g) * mask
    order = torch.argsort(acts.flatten(), descending=True)[:40]
    index = FeatureIndex(tokens=rows, vals=acts[..., None], idx=torch.zeros(5, 30, 1, dtype=torch.long),
                         hook_name="blocks.0.hook_resid_post", d_sae=1, mask=mask)
    got = where_it_fires(index, acts, order)
    firings = {(int(j) // 30, int(j) % 30): float(acts.flatten()[j]) for j in order}
    want = _brute(rows.tolist(), lengths, firings)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12), k
    seen, cont = repeat_flags(rows, mask)
    assert not (seen & ~mask).any() and not (cont & ~mask).any()  # padding is neither
    assert (cont <= seen).all()  # a repeated pair ends on a repeated token


def _tables(tokens: list[str], shares: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"token": tokens, "count": [3] * len(tokens), "share": shares, "mean_act": [1.0] * len(tokens)})


def test_the_description_says_where_it_fires_only_when_that_stands_out():
    top = _tables([" Plax", " Zorbin", " Marsk"], [0.4, 0.2, 0.1])
    prev = _tables([" the", " a", "."], [0.1, 0.1, 0.1])
    promoted = _tables([" said", " was", " had"], [0, 0, 0])
    second = dict(repeat_share=0.9, repeat_base=0.3, continued_share=0.8, continued_base=0.06, mean_pos=70.0, n=50)
    text = describe(top, prev, promoted, 0.01, second)
    assert "second occurrence of a name (80% of its activation, 6% of tokens)" in text
    assert text.startswith("fires on ' Plax', ' Zorbin', ' Marsk' (70% of its activation)")
    assert text.endswith("promotes ' said', ' was', ' had'")
    repeats = dict(second, continued_share=0.1)
    assert "on tokens seen earlier in the text (90% of its activation, 30% of tokens)" in describe(top, prev, promoted,
                                                                                                   0.01, repeats)
    firsts = dict(second, repeat_share=0.05, continued_share=0.0)
    assert "first occurrence" in describe(top, prev, promoted, 0.01, firsts)
    usual = dict(second, repeat_share=0.3, continued_share=0.07)
    assert describe(top, prev, promoted, 0.01, usual) == describe(top, prev, promoted, 0.01)  # nothing stands out


def test_vocabulary_labels_are_kept_per_tokenizer_and_equal_each_token_read_alone(tiny_checkpoint):
    """vocabulary_strings keeps one tokenizer's labels (made once: every feature, neuron and graph page reads them),
    each the label of its id read alone, and a caller's change to the list does not reach the next call; another
    tokenizer gets its own."""
    import sprout_interp as si
    from sprout_interp.core.tokens import byte_labels, token_bytes
    from sprout_interp.features import pages
    from sprout_model.tokenizer import train_tokenizer

    m = si.load(str(tiny_checkpoint))
    first = pages.vocabulary_strings(m)
    want = [byte_labels([b])[0] for b in token_bytes(m.tokenizer, range(m.cfg.d_vocab))]
    assert first == want and len(first) == m.cfg.d_vocab
    first[0] = "changed"
    assert pages.vocabulary_strings(m) == want
    other = si.load(str(tiny_checkpoint))
    from sprout_interp.core.texts import TEXTS

    other.tokenizer = train_tokenizer([t[::-1] for t in TEXTS.values()] * 3, vocab_size=300)  # another vocabulary
    assert other.tokenizer.get_vocab() != m.tokenizer.get_vocab()
    assert pages.vocabulary_strings(other) == [byte_labels([b])[0]
                                               for b in token_bytes(other.tokenizer, range(other.cfg.d_vocab))]
    assert pages.vocabulary_strings(m) == want
