"""The helpers every analysis script shares (steps as sprout_model.info counts them, figures that share one
plotly.js) and the two circuit scripts end to end on a tiny checkpoint: each part of the circuit gets its
own verdict line."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import plotly.graph_objects as go
import pytest
from conftest import analysis_script
from plotly.offline import get_plotlyjs

from sprout_interp.report import cli
from sprout_interp.report.cli import PLOTLY_JS, NamedModel, load_models, plotly_js, save_figure
from sprout_model.info import total_steps

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_describe_counts_the_steps_of_every_stage():
    staged = {"steps": 732, "init_from": {"steps": 5000, "init_from": {"steps": 67}}, "tokens_seen": 2_000_000}
    fake = SimpleNamespace(cfg=SimpleNamespace(n_layers=4), model=SimpleNamespace(num_params=lambda: 1234), info=staged,
                           source="/x")
    line = NamedModel(label="gpt-4", preset="gpt-4", model=fake).describe()
    assert "5,799 steps" in line and "732 steps" not in line and "2.0M tokens" in line
    fake.info = {}
    assert "steps" not in NamedModel(label="x", preset=None, model=fake).describe()


def test_one_slug_for_every_scripts_file_names():
    assert cli.slug("runs/gpt-4#2") == "runs_gpt-4_2" and cli.slug("sprout") == "sprout"
    assert not any("def _slug" in p.read_text(encoding="utf-8") for p in (ROOT / "analyses").glob("*.py"))


def test_figures_share_one_plotly_js(tmp_path):
    fig = go.Figure(go.Bar(x=[1, 2], y=[3, 4]))
    written, note = save_figure(fig, tmp_path / "a")
    save_figure(fig, tmp_path / "b")
    js = tmp_path / PLOTLY_JS
    assert written == [tmp_path / "a.html"] and note is None
    assert js.read_text(encoding="utf-8") == get_plotlyjs()  # the installed plotly's own bundle: opens offline
    for name in ("a", "b"):
        html = (tmp_path / f"{name}.html").read_text(encoding="utf-8")
        assert f'src="{PLOTLY_JS}"' in html and "cdn" not in html.lower()
        assert len(html) < 50_000 < js.stat().st_size  # tens of kilobytes, not the 4.8 MB bundle
    stamp = js.stat().st_mtime_ns
    save_figure(fig, tmp_path / "c")
    assert js.stat().st_mtime_ns == stamp  # written once per folder
    js.write_text("stale", encoding="utf-8")
    assert plotly_js(tmp_path).read_text(encoding="utf-8") == get_plotlyjs()  # a wrong copy is replaced
    save_figure(fig, tmp_path / "sub" / "d")
    assert (tmp_path / "sub" / PLOTLY_JS).is_file()  # beside every figure that refers to it


@pytest.fixture
def no_corpus(monkeypatch):
    """The scripts fall back to the three ready-made texts, as without the corpus packages (fast and offline)."""
    monkeypatch.setattr(cli, "held_out", lambda *a, **k: None)


@pytest.mark.acceptance  # each script end to end
@pytest.mark.parametrize("name, extra", [("head_ablation", ["--seq-len", "16", "--batch", "2"]),
                                         ("induction_heads", ["--seq-len", "16", "--batch", "2"])])
def test_circuit_scripts_judge_each_part(name, extra, tiny_checkpoint, tmp_path, capsys, no_corpus):
    mod = analysis_script(name)
    mod.held_out = cli.held_out  # the script imported it by name
    out = tmp_path / "out"
    assert mod.main(["--models", str(tiny_checkpoint), "--out", str(out), *extra]) == 0
    text = capsys.readouterr().out
    assert "7 steps" in text  # every stage, as sprout_model.info counts
    verdicts = text[text.index("== verdicts =="):]
    assert "previous-token part" in verdicts and "induction part" in verdicts
    assert "NOT established" in verdicts  # a random tiny model copies nothing: no part is established
    assert "REPRODUCED" not in verdicts.split("\n", 1)[1].replace("one block cannot", "")
    htmls = list(out.glob("*.html"))
    assert htmls and (out / PLOTLY_JS).is_file() and all(h.stat().st_size < 200_000 for h in htmls)
    assert "layer" in text and "block 1 head 0 (layer 0)" in text


@pytest.mark.integration
def test_scripts_print_the_steps_sprout_model_info_prints():
    from sprout_interp.core.loading import SHIPPED_DIR

    if not (Path(SHIPPED_DIR) / "gpt-4" / "model.safetensors").is_file():
        pytest.skip("the shipped gpt-4 checkpoint is not installed")
    (nm,) = load_models(["gpt-4"])
    assert f"{total_steps(nm.model.info):,} steps" in nm.describe()
    assert total_steps(nm.model.info) != nm.model.info["steps"]  # gpt-4 was trained in stages


@pytest.mark.acceptance  # the script end to end on the shipped checkpoints
def test_trace_induction_judges_each_step_from_its_measurement(tmp_path, capsys):
    """The causal-tracing script on the shipped Sprout, two texts: four verdict lines, each from measured numbers."""
    trace = analysis_script("trace_induction")
    assert trace.main(["--models", "sprout", "--texts", "2", "--out", str(tmp_path)]) == 0
    import pandas as pd

    v = pd.read_csv(tmp_path / "verdicts.csv")
    assert list(v["step"]) == ["1 residual stream", "2 heads", "3 path to the induction head's keys",
                               "4 K-composition (weights)"]
    assert set(v["verdict"]) <= {"CONSISTENT", "PARTLY", "NOT SEEN"}
    heads = pd.read_csv(tmp_path / "trace_heads.csv")
    top = heads.sort_values("score", ascending=False).iloc[0]
    assert (top["block"], top["head"]) == (2, 0)  # the induction head restores the most
    assert v.loc[1, "verdict"] == "CONSISTENT"
    assert "rank" in v.loc[3, "measured"] and "x the random baseline" in v.loc[3, "measured"]
