"""The Streamlit dashboard, driven headless with streamlit.testing.v1.AppTest (no browser).

Every page with its default inputs, every bad input the issue lists (each shows a clear message and
the other pages keep working), a model switch, and the main interactions. The shipped gpt-4 (and
gpt-1) keep it quick; models and results are cached per process, so later tests reuse them.
"""
from __future__ import annotations

import base64
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

import sprout_interp as si  # noqa: E402
from sprout_interp.core import loading  # noqa: E402
from sprout_interp.core.texts import TEXTS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "dashboards" / "app.py"
PAGES = {
    "anatomy": "views/anatomy.py",
    "logit_lens": "views/logit_lens.py",
    "residual": "views/residual.py",
    "attention": "views/attention.py",
    "ablations": "views/ablations.py",
    "compare": "views/compare.py",
    "positions": "views/positions.py",
    "patching": "views/patching.py",
}
OWN_PATH = "a checkpoint folder or course .pt…"
OWN_TEXT = "type your own…"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not (Path(loading.SHIPPED_DIR) / "gpt-4" / "model.safetensors").is_file(),
                       reason="the shipped gpt-4 checkpoint is not installed"),
]


def app(page: str = "logit_lens", model: str = "gpt-4", path: str | None = None, text: str | None = None) -> AppTest:
    """A fresh session on ``page`` with the sidebar set (not yet run)."""
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.session_state["model_choice"] = OWN_PATH if path is not None else model
    if path is not None:
        at.session_state["model_path"] = path
    if text is not None:
        at.session_state["text_choice"] = OWN_TEXT
        at.session_state["own_text"] = text
    return at.switch_page(PAGES[page])


def ok(at: AppTest) -> AppTest:
    """No exception box and no error box on the page."""
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def charts(at: AppTest) -> list[dict]:
    """The plotly figures on the page, as their JSON specs."""
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def grid(at: AppTest) -> dict:
    """The logit-lens grid's heat-map trace."""
    heat = [d for spec in charts(at) for d in spec["data"] if d.get("type") == "heatmap"]
    assert heat, "no logit-lens grid on the page"
    return heat[0]


def shape(arr) -> tuple[int, ...]:
    """Shape of an array in a figure's JSON: a nested list, or plotly's typed array {"bdata", "shape"}."""
    if isinstance(arr, dict):
        if "shape" in arr:
            return tuple(int(n) for n in str(arr["shape"]).split(","))
        return (len(np.frombuffer(base64.b64decode(arr["bdata"]), dtype=np.dtype(arr["dtype"]))),)
    if arr and isinstance(arr[0], (list, dict)):
        return (len(arr), *shape(arr[0]))
    return (len(arr),)


def shown(markdown: str) -> str:
    """A message as a person reads it: the dashboard backslash-escapes punctuation in what it quotes."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown)


def messages(at: AppTest) -> str:
    return " ".join(shown(str(e.value)) for e in [*at.error, *at.warning, *at.info])


# -- every page with its default inputs -----------------------------------------------------------


@pytest.mark.parametrize("page", list(PAGES))
def test_page_defaults(page):
    at = ok(app(page).run())
    assert at.header and at.header[0].value  # the page drew its title
    if page in ("logit_lens", "residual", "attention", "ablations", "compare"):
        assert charts(at), f"{page}: no figure"
        assert at.dataframe, f"{page}: no table"
        assert any("block N" in c.value for c in at.caption), f"{page}: no layer convention"
    if page == "logit_lens":
        g = grid(at)
        assert shape(g["z"])[0] == 5  # embedding + 4 blocks of gpt-4
        assert list(at.dataframe[0].value.columns[:2]) == ["rank", "token"]  # the chosen cell's candidates
        assert len(at.dataframe[0].value) == 5
        assert any("77%" in m.value for m in at.markdown)  # the chapter's figure beside ours
    if page == "attention":
        scores = at.dataframe[0].value
        assert {"prev_token_random", "induction_random", "induction_text"} <= set(scores.columns)
        assert at.success or at.info  # the circuit summary
    if page == "ablations":
        assert {"clean_prob", "ablated_prob", "prob_change"} <= set(at.dataframe[0].value.columns)
        assert len(at.metric) == 4
    if page == "compare":
        assert {"gpt-1", "gpt-4"} <= set(at.dataframe[0].value.columns)


def test_default_model_is_the_best_installed():
    sys.path.insert(0, str(APP.parent))
    try:
        import state
    finally:
        sys.path.remove(str(APP.parent))
    have = state.installed_shipped()
    assert have and have[0] == state.default_model()
    assert state.default_model() == next(n for n in ("sprout", "gpt-4", "gpt-1") if n in have)


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   \n\t  "])
def test_empty_text(text):
    at = app(text=text).run()
    assert not at.exception
    assert "empty" in messages(at)
    ok(at.switch_page(PAGES["positions"]).run())  # another page still works


def test_text_longer_than_the_context():
    long = " ".join(["Zorbin Plax came home late from the harbour."] * 120)  # ~1,200 tokens
    at = ok(app(text=long).run())
    assert any("only the first 512" in w.value for w in at.warning)
    assert shape(grid(at)["z"]) == (5, 20)  # the default window of the 512 tokens read
    ok(at.switch_page(PAGES["compare"]).run())
    assert any("first 512 tokens" in w.value for w in at.warning)


def test_emoji_and_other_scripts():
    text = "Zorbin 🌱 Plax sagte: «Привет», 你好, مرحبا, नमस्ते — and then 🎉🎉 went home."
    at = ok(app(text=text).run())
    assert grid(at)["z"]
    for page in ("residual", "attention", "ablations"):
        ok(at.switch_page(PAGES[page]).run())


def test_single_token_text():
    at = ok(app(text="The").run())  # one token: the lens still draws its one column
    assert grid(at)
    at = app("ablations", text="The").run()
    assert not at.exception and "single token" in messages(at)


def _shows_load_error(at: AppTest, *words: str) -> None:
    assert not at.exception, [e.value for e in at.exception]
    msg = " ".join(shown(e.value) for e in at.error)
    assert "Could not load" in msg and all(w in msg for w in words), msg


def test_path_that_does_not_exist(tmp_path):
    at = app(path=str(tmp_path / "no_such_model")).run()
    _shows_load_error(at, "no checkpoint")
    ok(at.switch_page(PAGES["positions"]).run())
    ok(at.switch_page(PAGES["compare"]).run())  # compares the shipped models, leaving the bad path out …
    assert "no_such_model" in messages(at)  # … and says so


def test_file_that_is_not_a_checkpoint(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("these are my notes, not a model\n")
    at = app(path=str(f)).run()
    _shows_load_error(at)
    assert isinstance(pytest.raises(si.SproutError, si.load, str(f)).value, si.NotACheckpointError)
    at.switch_page(PAGES["anatomy"]).run()  # anatomy says the model did not load, and its calculator still works
    assert not at.exception and at.error and len(at.metric) == 4


def test_folder_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "readme.md").write_text("hello")
    _shows_load_error(app(path=str(tmp_path)).run())


def test_vocabulary_mismatch(tmp_path):
    import torch
    from sprout_model import GPT, Config
    from sprout_model.checkpoint import save_checkpoint

    torch.manual_seed(0)
    gpt = GPT(Config(vocab_size=300, context=64, n_layer=1, n_head=2, d_model=32, d_ff=64)).eval()
    folder = save_checkpoint(gpt, tmp_path / "small", Path(loading.SHIPPED_DIR) / "tokenizer.json", {})
    at = app(path=str(folder)).run()
    _shows_load_error(at, "8,192", "300")
    _shows_load_error(at.switch_page(PAGES["residual"]).run())  # the model's pages say why …
    ok(at.switch_page(PAGES["positions"]).run())  # … the others keep working …
    at.selectbox(key="model_choice").set_value("gpt-4")
    ok(at.switch_page(PAGES["residual"]).run())  # … and choosing a shipped model again works


def test_own_checkpoint_folder_loads():
    at = ok(app(path=str(Path(loading.SHIPPED_DIR) / "gpt-1")).run())
    assert shape(grid(at)["z"])[0] == 2  # embedding + 1 block


def test_model_switch():
    at = ok(app().run())
    assert shape(grid(at)["z"])[0] == 5
    at.selectbox(key="model_choice").set_value("gpt-1")
    ok(at.run())
    assert shape(grid(at)["z"])[0] == 2
    at.selectbox(key="model_choice").set_value("gpt-4")
    ok(at.run())
    assert shape(grid(at)["z"])[0] == 5


# -- interactions ---------------------------------------------------------------------------


def test_logit_lens_cell_and_window():
    at = ok(app().run())
    at.number_input(key="lens_pos").set_value(3)
    at.selectbox(key="lens_row").set_value(0)  # the embedding row
    ok(at.run())
    cand = at.dataframe[0].value
    tokens = si.load("gpt-4").to_str_tokens(next(iter(TEXTS.values())))
    assert cand["token"].iloc[0] == repr(tokens[3])  # tied weights: the embedding row echoes its input
    at.slider(key="lens_start").set_value(20)
    ok(at.run())
    g = grid(at)
    assert shape(g["z"])[1] == 20 and "tokens 20–39" in charts(at)[0]["layout"]["title"]["text"]


def test_residual_per_position():
    at = ok(app("residual").run())
    at.toggle(key="rms_per_position").set_value(True)
    ok(at.run())
    per_pos = [c for c in charts(at) if "at each position" in c["layout"]["title"]["text"]]
    lines = [d for spec in per_pos for d in spec["data"]]
    assert len(lines) == 5 and shape(lines[0]["x"])[0] > 100


def test_residual_block_knockouts():
    at = ok(app("residual").run())
    bars = [c for c in charts(at) if "stops writing" in c["layout"]["title"]["text"]]
    assert len(bars) == 1 and shape(bars[0]["data"][0]["y"])[0] == 4  # gpt-4: one bar per block
    table = next(d.value for d in at.dataframe if "change" in d.value.columns)
    assert table["blocks"].tolist() == ["1", "2", "3", "4"] and (table["change"] > 0).all()
    one = ok(app("residual", text="The").run())  # one token: no loss to measure, and the page says so
    assert "at least two tokens" in messages(one) and charts(one)


def test_attention_choice_and_repeated_tokens():
    at = ok(app("attention").run())
    at.selectbox(key="attn_layer").set_value(0)
    at.selectbox(key="attn_head").set_value(2)
    ok(at.run())
    assert "block 1 (layer 0), head 2" in charts(at)[0]["layout"]["title"]["text"]
    assert len(at.metric) == 3  # copy 1, copy 2, ratio


@pytest.mark.slow
def test_ablation_kinds_and_sweep():
    at = ok(app("ablations").run())
    at.multiselect(key="abl_heads_gpt-4").set_value([(1, 0)])
    for kind in ("zero", "mean", "resample"):
        at.radio(key="abl_kind").set_value(kind)
        ok(at.run())
        eff = at.dataframe[0].value
        assert len(eff) > 50 and eff["prob_change"].abs().max() > 0, kind
    at.radio(key="abl_kind").set_value("zero")
    at.button(key="abl_sweep_btn").click()
    ok(at.run())
    sweep = [d for spec in charts(at) for d in spec["data"] if d.get("type") == "heatmap"]
    assert sweep and shape(sweep[0]["z"]) == (4, 3)  # blocks × heads


def test_sessions_do_not_see_each_others_ablations():
    """Two sessions share one cached model; one ablating every head leaves the other's numbers clean."""
    clean = ok(app("compare").run()).dataframe[0].value["gpt-4"].iloc[0]
    a = app("ablations")
    a.session_state["abl_heads_gpt-4"] = [(l, h) for l in range(4) for h in range(3)]
    ok(a.run())
    assert a.metric[1].value != a.metric[0].value  # the ablation did something
    state = sys.modules["state"]  # the dashboard's module, imported by the runs above
    hooked = state.load_model("gpt-4")  # the one cached model every session uses
    assert all(not hp._forward_hooks for hp in hooked.hook_dict.values())  # no hook left behind
    b = ok(app("compare").run())
    assert b.dataframe[0].value["gpt-4"].iloc[0] == clean


def test_patching_page_defaults_show_the_induction_story():
    at = ok(app("patching").run())
    specs = charts(at)
    assert len(specs) == 3  # layer x position, heads, contribution graph
    heat = specs[0]["data"][0]
    assert heat["type"] == "heatmap" and "block x position" in specs[0]["layout"]["title"]["text"]
    assert "block" in specs[1]["layout"]["yaxis"]["title"]["text"]
    values = {m.label: m.value for m in at.metric}
    assert float(values["logit difference, clean run"]) > float(values["logit difference, corrupted run"])
    assert any("promotes" in md.value for md in at.markdown)


def test_patching_page_clear_messages_for_bad_pairs():
    def page_with(**state) -> AppTest:
        at = app("patching")
        for k, v in state.items():
            at.session_state[k] = v
        return at.run()

    at = page_with(patch_corrupted="Velmat Plax was waiting")
    assert any("same length" in e.value for e in at.error) and not at.exception
    same = "The cat sat on the mat and looked at the dog"
    at = page_with(patch_clean=same, patch_corrupted=same)
    assert any("the texts are the same" in e.value for e in at.error) and not at.exception
    at = page_with(patch_clean="   ")
    assert any("Type both texts" in w.value for w in at.warning) and not at.exception
    at = page_with(patch_answer=" Plaxworth")
    assert any("not one" in e.value for e in at.error) and not at.exception


def test_logit_lens_tuned_toggle_and_trajectories():
    at = ok(app().run())
    traj = [c for c in charts(at) if "text = top-1 token" in c["layout"]["title"]["text"]]
    assert len(traj) == 1 and len([d for d in traj[0]["data"] if d.get("type") == "heatmap"]) == 2  # both lenses
    at.radio(key="lens_which").set_value("tuned")
    ok(at.run())
    assert "tuned lens" in charts(at)[0]["layout"]["title"]["text"] and not at.warning
    at.selectbox(key="lens_traj_metric").set_value("cross_entropy")
    ok(at.run())


def test_logit_lens_tuned_falls_back_with_a_notice(tmp_path):
    import shutil

    src = Path(loading.SHIPPED_DIR) / "gpt-4"
    for f in ("config.json", "model.safetensors", "train.json"):
        shutil.copy(src / f, tmp_path / f)
    shutil.copy(Path(loading.SHIPPED_DIR) / "tokenizer.json", tmp_path / "tokenizer.json")
    at = ok(app(path=str(tmp_path)).run())
    at.radio(key="lens_which").set_value("tuned")
    ok(at.run())
    assert any("no tuned lens" in w.value for w in at.warning)
