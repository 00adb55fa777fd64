"""One HookedSprout shared by many threads (as Streamlit shares a cached model between sessions).

Every caller must get exactly the result it would get alone: module hooks are global state, so a
hook added by one thread must never fire in another thread's forward pass.
"""
from __future__ import annotations

import random
import sys
import threading
import time

import pytest
import torch

from sprout_interp.core.hooked import HookedSprout

pytestmark = pytest.mark.unit

N_THREADS = 8
CALLS_PER_THREAD = 25
FILTERS = {
    "all": None,
    "resid": lambda n: n.endswith("hook_resid_post"),
    "pattern0": ["blocks.0.attn.hook_pattern", "blocks.0.attn.hook_z"],
}


def _zero_head(head: int):
    def hook(z, hook):
        time.sleep(0)  # let other threads run while this hook is registered
        z[:, :, head] = 0.0
        return z

    return hook


def _boom(x, hook):
    time.sleep(0)
    raise RuntimeError("hook failed on purpose")


def run_call(m: HookedSprout, spec: tuple, inputs: list[torch.Tensor]):
    """Run one call; return plain tensors (or a marker) to compare with the sequential answer."""
    kind, i = spec[0], spec[1]
    toks = inputs[i]
    if kind == "plain":
        return {"logits": m(toks)}
    if kind == "loss":
        return {"loss": m(toks, return_type="loss")}
    if kind == "cache":
        logits, cache = m.run_with_cache(toks, names_filter=FILTERS[spec[2]])
        return {"logits": logits, **{k: v for k, v in cache.items()}}
    if kind == "ablate":
        _, _, layer, head = spec
        return {"logits": m.run_with_hooks(toks, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", _zero_head(head))])}
    if kind == "ctx":  # a hooks() block holding two calls, one a cache
        _, _, layer, head = spec
        with m.hooks(fwd_hooks=[(f"blocks.{layer}.hook_mlp_out", lambda x, hook: x * (head + 2))]):
            a = m(toks)
            time.sleep(0)
            _, cache = m.run_with_cache(toks, names_filter="blocks.1.hook_resid_post")
        return {"a": a, "resid": cache["blocks.1.hook_resid_post"]}
    if kind == "raise":
        try:
            m.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_attn_out", _boom)])
        except RuntimeError as e:
            return {"raised": str(e)}
        return {"raised": None}
    raise AssertionError(spec)


def all_specs(n_inputs: int) -> list[tuple]:
    specs = [("plain", i) for i in range(n_inputs)] + [("loss", i) for i in range(n_inputs)]
    specs += [("cache", i, f) for i in range(n_inputs) for f in FILTERS]
    specs += [("ablate", i, l, h) for i in range(n_inputs) for l in (0, 1) for h in (0, 1)]
    specs += [("ctx", i, l, h) for i in range(n_inputs) for l in (0,) for h in (0, 1)]
    specs += [("raise", i) for i in range(n_inputs)]
    return specs


def same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or not torch.allclose(x, y, rtol=0, atol=1e-6):
                return False
        elif x != y:
            return False
    return True


@pytest.fixture
def shared(tiny_model) -> HookedSprout:
    return HookedSprout(tiny_model)


@pytest.mark.acceptance  # over 5 s
@torch.no_grad()
def test_threads_see_only_their_own_hooks(shared):
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randint(0, 64, (b, t), generator=g) for b, t in [(1, 7), (2, 12), (3, 5), (2, 20), (4, 9)]]
    specs = all_specs(len(inputs))
    expected = {spec: run_call(shared, spec, inputs) for spec in specs}
    # sanity: the calls really differ from one another, so a leaked hook would show
    assert not same(expected[("ablate", 1, 0, 0)], expected[("plain", 1)])
    assert not same(expected[("ablate", 1, 0, 0)], expected[("ablate", 1, 0, 1)])
    assert expected[("raise", 0)]["raised"] == "hook failed on purpose"

    plans = [random.Random(t).choices(specs, k=CALLS_PER_THREAD) for t in range(N_THREADS)]
    results: list[list] = [[] for _ in range(N_THREADS)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(N_THREADS)

    def worker(t: int):
        try:
            barrier.wait()
            with torch.no_grad():
                for spec in plans[t]:
                    results[t].append((spec, run_call(shared, spec, inputs)))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(N_THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=300)
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors
    assert all(len(r) == CALLS_PER_THREAD for r in results)
    wrong = [(t, spec) for t in range(N_THREADS) for spec, got in results[t] if not same(got, expected[spec])]
    assert not wrong, f"{len(wrong)} of {N_THREADS * CALLS_PER_THREAD} calls differ from the sequential result: {wrong[:5]}"
    assert all(not hp.fwd_hooks and not hp._forward_hooks for hp in shared.hook_dict.values())
    assert shared.context_level == 0


def test_hooks_block_holds_other_threads_off(shared):
    """A plain forward started while another thread is inside ``hooks()`` runs after it, unhooked."""
    toks = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        plain = shared(toks)
    inside, got = threading.Event(), {}

    def other():
        inside.wait()
        with torch.no_grad():
            got["logits"] = shared(toks)

    th = threading.Thread(target=other)
    th.start()
    with torch.no_grad(), shared.hooks(fwd_hooks=[("hook_embed", lambda x, hook: x * 0)]):
        inside.set()
        time.sleep(0.2)
        assert "logits" not in got  # still waiting for the lock
        hooked_logits = shared(toks)
    th.join(timeout=60)
    assert torch.equal(got["logits"], plain)
    assert not torch.allclose(hooked_logits, plain)


def _patch_calls(m: HookedSprout, clean: torch.Tensor, corrupt: torch.Tensor):
    from sprout_interp.behaviour.knockout import block_knockout
    from sprout_interp.circuits.metrics import LogitDiff
    from sprout_interp.circuits.patching import activation_patch, path_patch

    metric = LogitDiff(3, 5)
    return {
        "layer_pos": activation_patch(m, clean, corrupt, metric)["value"].tolist(),
        "head": activation_patch(m, clean, corrupt, metric, site="z", by="head")["value"].tolist(),
        "path": path_patch(m, clean, corrupt, metric, receivers=[(1, 0, "k")])["value"].tolist(),
        "knockout": block_knockout(m, clean, groups=[(0,), (1,)])["loss"].tolist(),
    }


def _pair(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, 64, (1, 12), generator=g)
    corrupt = clean.clone()
    corrupt[0, 2] = (clean[0, 2] + 7) % 64
    return clean, corrupt


@pytest.mark.acceptance  # over 5 s
@torch.no_grad()
def test_patching_in_threads_equals_sequential_bit_for_bit(shared):
    """Four threads patching one shared model get exactly the sequential tables (no path chosen on another
    thread's hooks)."""
    pairs = [_pair(s) for s in range(4)]
    expected = [_patch_calls(shared, c, x) for c, x in pairs]
    got: dict[tuple[int, int], dict] = {}

    def work(t: int):
        for rep in range(3):
            i = (t + rep) % len(pairs)
            got[(t, rep)] = (i, _patch_calls(shared, *pairs[i]))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(got) == 12
    for i, res in got.values():
        assert res == expected[i]  # lists of floats: equal bit for bit

