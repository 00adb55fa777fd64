"""Shared fixtures: tiny random models for unit tests; the shipped checkpoints for integration tests. Every test
has one tier (tests/tiers.py, docs/testing.md)."""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

from sprout_interp.core.hooked import HookedSprout
from sprout_model import GPT, Config

# tests/tiers.py gives every test exactly one tier (unit, integration, acceptance) and stops a run where one has
# none; pytester runs the made-up suites of tests/test_tiers.py
pytest_plugins = ["tiers", "pytester"]

ROOT = Path(__file__).resolve().parents[1]


def _test_threads() -> int | None:
    """``SPROUT_TEST_THREADS``: torch's thread count for the whole run (docs/testing.md, "Machine-independent
    tests"); None where it is not set."""
    raw = os.environ.get("SPROUT_TEST_THREADS", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= 256:
        raise pytest.UsageError(f"SPROUT_TEST_THREADS={raw!r}: a whole number of torch threads, 1 to 256")
    return int(raw)


#: the run's torch threads when SPROUT_TEST_THREADS is set; a test that pins one thread for speed takes this instead
TEST_THREADS = _test_threads()
if TEST_THREADS is not None:
    torch.set_num_threads(TEST_THREADS)


def pinned_threads() -> int:
    """The threads for a test that runs on one thread for speed (a shared 2-core machine): SPROUT_TEST_THREADS
    where it is set, so a run under another thread count runs every test under it."""
    return TEST_THREADS or 1


def pytest_report_header(config) -> str:
    """Which kernels and how many threads the run uses: a result that depends on them is a defect (docs/testing.md)."""
    return (f"torch {torch.__version__}: {torch.get_num_threads()} thread(s), CPU kernels "
            f"{torch.backends.cpu.get_cpu_capability()} (ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', '')!r})")


@contextlib.contextmanager
def unchecked_types():
    """Inside, the run-time type checks (pyproject's jaxtyping option) are off: for a line that passes invalid
    input on purpose, to check the library's own error message."""
    import jaxtyping

    before = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", before)


@pytest.fixture(autouse=True)
def _type_checks(request):
    """Run-time type checks stay on, except in tests marked ``unchecked_types`` (invalid input on purpose)."""
    if request.node.get_closest_marker("unchecked_types") is None:
        yield
        return
    with unchecked_types():
        yield


@pytest.fixture(scope="session")
def course():
    """The chapter's model.py (tests/fixtures/course_model.py) as a module, registered so its dataclass and pickling
    work: the independent implementation the toolkit's results are checked against."""
    spec = importlib.util.spec_from_file_location("course_model", Path(__file__).parent / "fixtures" / "course_model.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["course_model"] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("course_model", None)


def tiny_config(**overrides) -> Config:
    """A 2-block model small enough for a unit test to run in milliseconds."""
    base = dict(vocab_size=64, context=32, n_layer=2, n_head=2, d_model=16, d_ff=24)
    base.update(overrides)
    return Config(**base)


@pytest.fixture
def no_shipped(tmp_path, monkeypatch) -> Path:
    """The loader's shipped-checkpoint folder made an empty one: a test of loading never sees the real shipped
    checkpoints (they may or may not be there). Use it with ``pytest.mark.usefixtures("no_shipped")``."""
    from sprout_interp.core import loading

    empty = tmp_path / "no_shipped"
    empty.mkdir()
    monkeypatch.setattr(loading, "SHIPPED_DIR", empty)
    return empty


@pytest.fixture
def shipped_gpt4_per_layer(tmp_path, monkeypatch) -> Path:
    """The loader's shipped folder made a copy holding gpt-4 with its per-layer transcoders only (its shipped CLT
    left out) and the shared tokenizer files; the dashboard's caches emptied before and after (a model cached under
    the name "gpt-4" must not cross into other tests). A test may add files (a CLT) to ``<returned>/gpt-4``."""
    st = pytest.importorskip("streamlit")
    import shutil

    from sprout_interp.core import loading

    real = Path(loading.SHIPPED_DIR)
    shipped = tmp_path / "shipped"
    shutil.copytree(real / "gpt-4", shipped / "gpt-4", ignore=shutil.ignore_patterns("clt"))
    for f in real.glob("*.json"):
        shutil.copy(f, shipped / f.name)
    monkeypatch.setattr(loading, "SHIPPED_DIR", shipped)
    st.cache_resource.clear()
    st.cache_data.clear()
    yield shipped
    st.cache_resource.clear()
    st.cache_data.clear()


@pytest.fixture
def tiny_cfg() -> Config:
    return tiny_config()


@pytest.fixture
def tiny_model(tiny_cfg) -> GPT:
    torch.manual_seed(0)
    return GPT(tiny_cfg).eval()


@pytest.fixture
def hooked(tiny_model) -> HookedSprout:
    """The tiny model inside the hook-instrumented wrapper (a module may override it)."""
    return HookedSprout(tiny_model)


@functools.cache
def _claims_table() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_claims_table", ROOT / "analyses" / "claims_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def analysis_script(name: str) -> ModuleType:
    """The script ``analyses/<name>.py`` as a fresh module (``analyses/claims_table.load_script``): a test may
    replace its attributes without touching another test's copy."""
    return _claims_table().load_script(name)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A saved checkpoint folder of a random 2-block model (context 1024) with a 300-token tokenizer trained on the
    ready-made and the name-copying texts, for running the analysis scripts end to end; shared, so read only."""
    from sprout_interp.core.texts import TEXTS
    from sprout_model.checkpoint import save_checkpoint
    from sprout_model.evaluation import NAME_TEXTS
    from sprout_model.tokenizer import train_tokenizer

    tmp = tmp_path_factory.mktemp("ckpt")
    tok = train_tokenizer([*TEXTS.values(), *(t for _, t in NAME_TEXTS)] * 3, vocab_size=300)
    tok.save(str(tmp / "tokenizer.json"))
    torch.manual_seed(0)
    g = GPT(tiny_config(vocab_size=300, context=1024)).eval()
    return save_checkpoint(g, tmp / "tiny", tmp / "tokenizer.json", {"steps": 3, "init_from": {"steps": 4}})


@pytest.fixture(scope="session")
def gpt4():
    """The shipped gpt-4, loaded once for the whole run (skips where it is not installed); shared, so a test must
    leave it as it found it (hooks removed, weights untouched)."""
    import sprout_interp as si
    from sprout_interp.core import loading

    if not (Path(loading.SHIPPED_DIR) / "gpt-4" / "model.safetensors").is_file():
        pytest.skip("the shipped gpt-4 checkpoint is not installed")
    return si.load("gpt-4")
