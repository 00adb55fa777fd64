"""The claims table of docs/claims.md, generated: every claim script's measure and judge, run with the script's own
default settings on one set of loaded models, rendered by sprout_interp.report.claims.claims_markdown.

    python analyses/claims_table.py            # print the table (markdown) on stdout
    python analyses/claims_table.py --write    # and put it between the claims markers of docs/claims.md
    python analyses/claims_table.py --check    # exit 1 when docs/claims.md's block differs from it
    python analyses/claims_table.py --write FILE   # another file's claims markers

The slow scripts measure only what their verdicts need (``measure(..., claims_only=True)``: no per-head copying
sweep beyond its clean ratio, no attribution estimates, no attention patterns or control heads), with the same
seeds and sizes as a full run, so the numbers are the ones each script prints. Each script's time goes to stderr.
"""
from __future__ import annotations

import importlib.util
import inspect
import sys
import time
from pathlib import Path
from types import ModuleType

from sprout_interp.core.arguments import command_line
from sprout_interp.report.claims import Claim, claims_markdown, read_block, replace_block
from sprout_interp.report.cli import SHIPPED, NamedModel, load_models, script_parser, set_threads

HERE = Path(__file__).resolve().parent
#: the page whose claims block --write and --check read by default
CLAIMS_PAGE = HERE.parent / "docs" / "claims.md"
#: the claim scripts, in the order of the table
SCRIPTS = ["parameter_counts", "confidence_drop", "lens_comparison", "residual_growth", "induction_heads", "name_copying",
           "head_ablation", "trace_induction", "induction_qk"]


def load_script(name: str) -> ModuleType:
    """The claim script ``analyses/<name>.py`` as a module (scripts are files, not a package)."""
    spec = importlib.util.spec_from_file_location(f"_claims_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def collect(models: list[NamedModel], scripts: list[str] | None = None, stream=None) -> list[Claim]:
    """Every script's claims: its measure (claims_only where it has that) and judge on the models among ``models``
    that its default ``--models`` names, with its default arguments. Returns the claims in script order; each
    script's time is reported on ``stream`` (stderr)."""
    stream = sys.stderr if stream is None else stream
    out = []
    for name in scripts or SCRIPTS:
        t = time.time()
        mod = load_script(name)
        args = mod.parser().parse_args([])
        chosen = [nm for nm in models if nm.label in args.models]
        extra = {"claims_only": True} if "claims_only" in inspect.signature(mod.measure).parameters else {}
        claims = mod.judge(mod.measure(chosen, args, **extra))
        out += claims
        print(f"[{name}: {len(claims)} claims, {time.time() - t:.1f}s]", file=stream)
    return out


@command_line
def main(argv: list[str] | None = None) -> int:
    """Print the table; with --write replace the claims block of docs/claims.md (or of the file given), with --check
    compare it. Returns the exit status (1: --check found a difference; 2: a shipped checkpoint is missing)."""
    p = script_parser("claims_table", __doc__)
    p.add_argument("--write", metavar="FILE", nargs="?", const=str(CLAIMS_PAGE),
                   help="replace the block between the claims markers of this file (docs/claims.md when none is given)")
    p.add_argument("--check", metavar="FILE", nargs="?", const=str(CLAIMS_PAGE),
                   help="exit 1 when this file's claims block (docs/claims.md's when none is given) differs from the table")
    a = p.parse_args(argv)
    set_threads(a.threads)
    models = load_models(a.models)
    if [nm.label for nm in models] != list(SHIPPED):
        print(f"the table is measured on the shipped checkpoints {', '.join(SHIPPED)}; loaded: "
              f"{', '.join(nm.label for nm in models) or 'none'}", file=sys.stderr)
        return 2
    t0 = time.time()
    table = claims_markdown(collect(models))
    print(table, end="")
    print(f"[all: {time.time() - t0:.1f}s]", file=sys.stderr)
    if a.write:
        print(f"{a.write}: {'updated' if replace_block(a.write, table) else 'already up to date'}", file=sys.stderr)
    if a.check and read_block(Path(a.check).read_text(encoding="utf-8")) != table:
        print(f"{a.check}: its claims block differs from the table above; rerun with --write {a.check}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
