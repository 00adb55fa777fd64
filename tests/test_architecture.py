"""The package's layers, read from the code with ``ast``: imports run downwards only, there are no cycles, and
no module imports another's private names or reaches into the wrapper's private attributes.

docs/ARCHITECTURE.md describes the same layers; this test keeps the two honest.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "sprout_interp"

#: sub-package -> layer; a module may import modules of its own layer or lower ones (see docs/ARCHITECTURE.md)
LAYERS = {
    "core": 0,       # the model: errors, tokens, texts, loading, the hooked wrapper, exports
    "anatomy": 1,    # the chapter's parameter counts and RoPE maths, from a config
    "lens": 2,       # reading the residual stream: residual, logit lens, tuned lens
    "circuits": 3,   # heads, ablation, attribution, patching, composition, attribution graphs
    "features": 3,   # sparse autoencoders, transcoders, neurons and their pages
    "behaviour": 4,  # what the model does and what it does changed as a whole: per-token tables, comparison, knockout, steering
    "plots": 5,      # figures, from analysis results
    "report": 6,     # what scripts share
}
#: inside core, the order its modules may import each other in (a module imports only ones before it)
CORE_ORDER = ["errors", "arguments", "tokens", "texts", "limits", "files", "pickles", "configs", "loading", "export", "hook_points",
              "attention_maths", "components",
              "cache", "generation", "hooked", "fingerprints"]
#: attributes of the wrapper's classes that only the wrapper's own modules (WRAPPER) may touch
WRAPPER = {"core.hooked", "core.components", "core.generation"}
PRIVATE_ATTRS = {"_attn", "_ffn", "_norm", "_ln", "_lock", "_check_tokens", "_check_mask", "_model"}


@functools.cache  # parsed once a run, not twice in each test
def _modules() -> dict[str, ast.Module]:
    """'package.module' -> its syntax tree, for every module of every sub-package."""
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).with_suffix("")
        if rel.name == "__init__":
            continue
        out[".".join(rel.parts)] = ast.parse(p.read_text(encoding="utf-8"))
    return out


def _imports(tree: ast.Module) -> list[tuple[str, list[str], int]]:
    """('package.module' imported from inside sprout_interp, names, line) for every import, lazy ones included.
    ``from sprout_interp.pkg import module`` counts as importing that module."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"line {node.lineno}: relative import; the package imports absolutely"
            parts = (node.module or "").split(".")
            if parts[0] != "sprout_interp" or len(parts) < 2:
                continue
            if len(parts) == 2:  # from sprout_interp.pkg import module
                out += [(f"{parts[1]}.{a.name}", [], node.lineno) for a in node.names]
            else:
                out.append((".".join(parts[1:3]), [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "sprout_interp" and len(parts) >= 3:
                    out.append((".".join(parts[1:3]), [], node.lineno))
    return out


def _rank(mod: str) -> tuple[int, int]:
    pkg, name = mod.split(".")
    return LAYERS[pkg], (CORE_ORDER.index(name) if pkg == "core" else 0)


def test_every_module_sits_in_a_layered_package():
    mods = _modules()
    assert all("." in m for m in mods), "no modules at the top of sprout_interp/: put them in a sub-package"
    assert {m.split(".")[0] for m in mods} <= set(LAYERS), "add the new sub-package to LAYERS and docs/ARCHITECTURE.md"
    assert {m.split(".")[1] for m in mods if m.startswith("core.")} == set(CORE_ORDER)
    for pkg in {m.split(".")[0] for m in mods}:
        init = PKG / pkg / "__init__.py"
        assert init.is_file() and ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), (
            f"{pkg}/__init__.py needs a docstring saying what the package is for and what it may import"
        )


@pytest.mark.parametrize("name", sorted(_modules()))
def test_imports_run_downwards_and_no_private_names(name):
    tree = _modules()[name]
    known = _modules()
    for mod, names, line in _imports(tree):
        assert mod in known, f"{name}:{line} imports {mod}, which is not a module of the package"
        assert _rank(mod) <= _rank(name), (
            f"{name}:{line} (layer {_rank(name)}) imports {mod} (layer {_rank(mod)}): imports run downwards only"
        )
        private = [n for n in names if n.startswith("_")]
        assert not private, f"{name}:{line} imports private names {private} from {mod}"
    if name not in WRAPPER:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRS:
                base = node.value
                assert isinstance(base, ast.Name) and base.id == "self", (
                    f"{name}:{node.lineno} reaches {ast.unparse(node)}: use the wrapper's public API"
                )


def test_no_import_cycles():
    graph = {name: {mod for mod, _, _ in _imports(tree)} - {name} for name, tree in _modules().items()}
    seen, stack = set(), []

    def visit(n):
        assert n not in stack, "import cycle: " + " -> ".join(stack[stack.index(n):] + [n])
        if n in seen:
            return
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            visit(m)
        stack.pop()
        seen.add(n)

    for n in sorted(graph):
        visit(n)


def test_the_architecture_page_lists_every_module():
    """docs/ARCHITECTURE.md describes the tree as it is: every module appears there by its path."""
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    missing = [m for m in _modules() if f"`{m.split('.')[1]}`" not in page and f"{m.replace('.', '/')}.py" not in page]
    assert not missing, f"docs/ARCHITECTURE.md does not mention {missing}"


def test_dashboards_and_analyses_do_no_tensor_maths():
    """Pages and scripts call the library: no torch import, no tensor method calls of their own."""
    for folder in ("dashboards", "analyses"):
        for p in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(p.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                    assert not any(m == "torch" or m.startswith("torch.") for m in mods), f"{p}:{node.lineno} imports torch"


def test_every_sub_package_is_installed():
    """pyproject's package list names every sub-package, so a non-editable install has the whole library."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    subs = {f"sprout_interp.{p.parent.name}" for p in PKG.glob("*/__init__.py")}
    assert subs <= listed, f"add {sorted(subs - listed)} to [tool.setuptools] packages in pyproject.toml"


#: column names the library once used for things the table vocabulary names otherwise (docs/conventions.md)
RETIRED_COLUMNS = {"position": "pos", "Layer": "layer", "Head": "head", "Block": "block"}


def test_tables_use_one_vocabulary():
    """No module of the library, pages or scripts names a table column with a retired name (a string constant
    used as a subscript or a dict key, or a keyword of ``dict(...)`` / ``DataFrame(...)``)."""
    for folder in ("sprout_interp", "dashboards", "analyses"):
        for p in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
                keys = []
                if isinstance(node, ast.Subscript):
                    keys = [node.slice]
                elif isinstance(node, ast.Dict):
                    keys = [k for k in node.keys if k is not None]
                elif isinstance(node, ast.Call):
                    keys = [ast.Constant(k.arg) for k in node.keywords if k.arg]
                for k in keys:
                    if isinstance(k, ast.Constant) and k.value in RETIRED_COLUMNS:
                        raise AssertionError(f"{p.relative_to(ROOT)}:{node.lineno}: column {k.value!r}; "
                                             f"the tables call it {RETIRED_COLUMNS[k.value]!r}")


@pytest.mark.parametrize("name", sorted(_modules()))
def test_all_lists_are_true(name):
    """``__all__`` names what the module defines (or imports on purpose) and every public function and class it
    defines, so ``from module import *`` and the API reference show the module as it is."""
    import importlib

    mod = importlib.import_module(f"sprout_interp.{name}")
    declared = getattr(mod, "__all__", None)
    assert declared is not None, f"sprout_interp.{name} has no __all__"
    assert len(declared) == len(set(declared)), f"sprout_interp.{name}.__all__ names something twice"
    missing = [n for n in declared if not hasattr(mod, n)]
    assert not missing, f"sprout_interp.{name}.__all__ names {missing}, which it does not have"
    tree = _modules()[name]
    defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")
               and n.name != "main"]  # a module's command-line entry point is run, not imported
    unlisted = [n for n in defined if n not in declared]
    assert not unlisted, f"sprout_interp.{name} defines {unlisted} but leaves them out of __all__"
