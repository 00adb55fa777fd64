"""The package's layers, read from the code with ``ast``: imports run downwards only, there are no cycles, and
no module imports another's private names or reaches into the wrapper's private attributes.

docs/ARCHITECTURE.md describes the same layers; this test keeps the two honest.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "sprout_interp"

#: module -> layer; a module may import modules of its own layer or lower ones (see docs/ARCHITECTURE.md)
LAYERS = {
    # 0: foundations, no model
    "errors": 0, "tokens": 0, "texts": 0, "rope": 0, "anatomy": 0,
    # 1: the model: loading a checkpoint, the hooked wrapper, exports
    "loading": 1, "hooked": 1, "export": 1,
    # 2: analyses: tensors or text in, tensors or DataFrames out
    "residual": 2, "logit_lens": 2, "ablation": 2, "attention": 2, "knockout": 2, "compare": 2, "per_token": 2,
    "attribution": 2, "patching": 2, "composition": 2, "tuned_lens": 2,
    # 3: figures, from analysis results
    "plots": 3, "plots_heads": 3, "plots_anatomy": 3, "plots_patching": 3, "plots_lens": 3,
    # 4: what scripts share
    "cli": 4,
}
#: attributes of the wrapper's classes that only hooked.py may touch
PRIVATE_ATTRS = {"_attn", "_ffn", "_norm", "_ln", "_lock", "_check_tokens", "_check_mask", "_model"}


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(encoding="utf-8")) for p in PKG.glob("*.py") if p.stem != "__init__"}


def _imports(tree: ast.Module) -> list[tuple[str, list[str], int]]:
    """(module imported from inside the package, names, line) for every relative import, lazy ones included."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.append((node.module.split(".")[0], [a.name for a in node.names], node.lineno))
            else:
                out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sprout_interp."):
            out.append((node.module.split(".")[1], [a.name for a in node.names], node.lineno))
    return out


def test_every_module_has_a_layer():
    assert set(_modules()) == set(LAYERS), "add the new module to LAYERS here and to docs/ARCHITECTURE.md"


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_imports_run_downwards_and_no_private_names(name):
    tree = _modules()[name]
    for mod, names, line in _imports(tree):
        assert mod in LAYERS, f"{name}.py:{line} imports {mod}, which has no layer"
        assert LAYERS[mod] <= LAYERS[name], (
            f"{name}.py:{line} (layer {LAYERS[name]}) imports {mod} (layer {LAYERS[mod]}): imports run downwards only"
        )
        private = [n for n in names if n.startswith("_")]
        assert not private, f"{name}.py:{line} imports private names {private} from {mod}"
    if name != "hooked":
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRS:
                base = node.value
                assert isinstance(base, ast.Name) and base.id == "self", (
                    f"{name}.py:{node.lineno} reaches {ast.unparse(node)}: use the wrapper's public API"
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


def test_dashboards_and_analyses_do_no_tensor_maths():
    """Pages and scripts call the library: no torch import, no tensor method calls of their own."""
    for folder in ("dashboards", "analyses"):
        for p in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(p.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                    assert not any(m == "torch" or m.startswith("torch.") for m in mods), f"{p}:{node.lineno} imports torch"
