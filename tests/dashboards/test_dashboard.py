"""The Streamlit dashboard, driven headless with streamlit.testing.v1.AppTest (no browser).

Every page with its default inputs, every bad input a user can give (each shows a clear message and
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

ROOT = Path(__file__).resolve().parents[2]
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
    "steering": "views/steering.py",
    "neurons": "views/neurons.py",
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


def values(arr) -> np.ndarray:
    """The numbers of an array in a figure's JSON (a nested list, or plotly's typed array), in its shape."""
    if isinstance(arr, dict):
        return np.frombuffer(base64.b64decode(arr["bdata"]), dtype=np.dtype(arr["dtype"])).reshape(shape(arr))
    return np.array(arr, dtype=float)


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
        ranked, rest = at.dataframe[0].value, at.dataframe[1].value  # the scores the circuit is ranked by; the rest
        assert {"prev_token_ranked", "prev_token_random", "induction_random"} <= set(ranked.columns)
        assert {"duplicate_random", "prev_token_text", "induction_text"} <= set(rest.columns)
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
    assert shape(grid(at)["z"]) == (5, 30)  # the default window of the 512 tokens read
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


def test_logit_lens_cell_and_window(gpt4):
    at = ok(app().run())
    at.number_input(key="lens_pos").set_value(3)
    at.selectbox(key="lens_row").set_value(0)  # the embedding row
    ok(at.run())
    cand = at.dataframe[0].value
    tokens = gpt4.to_str_tokens(next(iter(TEXTS.values())))
    assert cand["token"].iloc[0] == repr(tokens[3])  # tied weights: the embedding row echoes its input
    at.slider(key="lens_start").set_value(20)
    ok(at.run())
    g = grid(at)
    assert shape(g["z"])[1] == 30 and "tokens 20–49" in charts(at)[0]["layout"]["title"]["text"]


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


def _attention_with_the_test_open() -> AppTest:
    at = app("attention")
    at.session_state["rep_open"] = True  # what opening the repeated-tokens test's expander does
    return ok(at.run())


def test_attention_choice_and_repeated_tokens():
    """The repeated-tokens test runs once its expander is opened (or a link with repeated=1 opens it)."""
    at = ok(app("attention").run())
    assert not at.metric and not any("random tokens repeated" in c["layout"]["title"]["text"] for c in charts(at))
    assert not [b for b in at.button if b.key == "copy_btn"]  # closed: the test has not run
    at.selectbox(key="attn_layer").set_value(0)
    at.selectbox(key="attn_head").set_value(2)
    at.session_state["rep_open"] = True
    ok(at.run())
    chosen = next(c for c in charts(at) if "hook_pattern" in c["layout"]["title"]["text"])
    assert "block 1 (layer 0), head 2" in chosen["layout"]["title"]["text"].replace("<br>", " ")  # wrapped to fit
    assert len(at.metric) == 3  # copy 1, copy 2, ratio
    assert any("head 2 on 32 random tokens repeated twice" in c["layout"]["title"]["text"].replace("<br>", " ")
               for c in charts(at))
    assert at.query_params["repeated"] == "1"
    at.select_slider(key="rep_len").set_value(16)
    ok(at.run())
    at.session_state["rep_open"] = False
    ok(at.run())
    at.session_state["rep_open"] = True
    ok(at.run())
    assert at.select_slider(key="rep_len").value == 16  # kept while the expander was closed


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


def _compute():
    """The dashboard's compute module (the one every page run imports), imported now if no page has run yet."""
    if "compute" not in sys.modules:
        sys.path.insert(0, str(APP.parent))
        import compute  # noqa: F401
    return sys.modules["compute"]


@pytest.mark.acceptance  # over 3 s
def test_ablations_first_load_ranks_the_heads_and_searches_only_when_asked(monkeypatch, gpt4):
    """The first load offers the circuit the head scores rank (no ablation); the confirming search (dozens of
    forwards) runs once, on the button, and its heads replace the choice."""
    from sprout_interp.circuits.attention import head_scores
    from sprout_interp.circuits.induction import find_induction_circuit

    compute = _compute()
    monkeypatch.setattr(compute, "_shipped", lambda _m, key: None)  # searched here, not read from dashboard.json
    real, found = compute.precomputed.induction.find_induction_circuit, []

    def spy(model=None, *args, **kwargs):
        circ = real(model, *args, **kwargs)
        if model is not None:  # with the model: the search that confirms by ablation
            found.append(circ)
        return circ

    monkeypatch.setattr(compute.precomputed.induction, "find_induction_circuit", spy)
    compute._confirmed_circuits.clear()
    try:
        at = ok(app("ablations").run())
        assert found == []  # the first load ran no ablation search
        m = gpt4
        ranked = find_induction_circuit(scores=head_scores(m, copying=False))  # the claims scripts' scores
        assert at.multiselect(key="abl_heads_gpt-4").value == ranked.heads()
        assert any("not yet confirmed" in c.value for c in at.caption)
        at.button(key="abl_confirm_btn").click()
        ok(at.run())
        assert len(found) == 1 and found[0].confirmed
        assert at.multiselect(key="abl_heads_gpt-4").value == found[0].heads()
        assert any("confirmed by ablation" in c.value for c in at.caption)
        ok(at.run())
        other = ok(app("ablations").run())  # another session: the confirmed circuit, searched once for every session
        assert other.multiselect(key="abl_heads_gpt-4").value == found[0].heads() and len(found) == 1
    finally:
        compute._confirmed_circuits.clear()  # the process's other tests start from the ranked circuit


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


def test_patching_pages_link_opens_the_neurons_page_on_the_graphs_prediction_whose_neurons_sum_to_its_nodes(gpt4):
    from urllib.parse import parse_qs

    from sprout_interp.features import neurons as N

    at = ok(app("patching").run())
    link = at.get("page_link")[0].proto
    assert link.page == "neurons"
    q = {k: v[0] for k, v in parse_qs(link.query_string, keep_blank_values=True).items()}
    clean, pos, token = q["text"], int(q["pos"]), q["answer"]
    assert clean == at.session_state["patch_clean"] and pos == at.session_state["patch_pos"]
    again = AppTest.from_file(str(APP), default_timeout=180)
    again.session_state["model_choice"] = "gpt-4"
    for k, v in q.items():
        again.query_params[k] = v
    again = ok(again.switch_page(PAGES["neurons"]).run())
    assert again.session_state["nrn_pos"] == pos and again.session_state["nrn_answer"] == token
    assert again.session_state["own_text"] == clean
    m = gpt4
    want = N.neuron_attribution(m, clean, token, pos=pos, top=20)
    np.testing.assert_allclose(values(charts(again)[0]["data"][0]["x"])[::-1], want["attribution"], atol=1e-5)
    # each feed-forward node of the graph is the sum of its block's neurons
    from sprout_interp.circuits.attribution import contribution_graph

    nodes, _ = contribution_graph(m, clean, pos=pos, threshold=0.0)
    every = N.neuron_attribution(m, clean, token, pos=pos, top=None).groupby("layer")["attribution"].sum()
    mlp = nodes[nodes["kind"] == "mlp"].set_index("layer")["attribution"]
    np.testing.assert_allclose(every.loc[mlp.index].to_numpy(), mlp.to_numpy(), atol=1e-4)


def test_patching_page_compares_attribution_patching_with_the_exact_scores(gpt4):
    from sprout_interp import patching as P
    from sprout_interp.core.tokens import token_id

    at = app("patching")
    at.session_state["patch_attribution"] = True
    ok(at.run())
    specs = charts(at)
    assert len(specs) == 5  # layer x position, heads, the two agreement scatters, contribution graph
    scatters = [sp for sp in specs if "attribution estimate vs exact" in sp["layout"]["title"]["text"].replace("<br>", " ")]
    assert len(scatters) == 2 and all(sp["data"][1]["mode"] == "markers" for sp in scatters)
    values = {m.label: m.value for m in at.metric}
    # the page's numbers are the library's, from the page's own pair and metric
    m = gpt4
    clean, corrupted = at.session_state["patch_clean"], at.session_state["patch_corrupted"]
    metric = P.LogitDiff(token_id(m, at.session_state["patch_answer"]), token_id(m, at.session_state["patch_wrong"]))
    want = P.patching_agreement(P.activation_patch(m, clean, corrupted, metric, "z", "head"),
                                P.attribution_patch(m, clean, corrupted, metric, "z", "head"))
    assert values["r, heads"] == f"{want.attrs['r']:.2f}"
    assert len(scatters[1]["data"][1]["text"]) == len(want) == m.cfg.n_layers * m.cfg.n_heads
    assert at.query_params.get("attribution") == ["1"] or at.query_params.get("attribution") == "1"


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


def _trajectories(at: AppTest) -> list[dict]:
    return [c for c in charts(at) if "text = top-1 token" in c["layout"]["title"]["text"]]


def test_logit_lens_trajectories_wait_until_opened(monkeypatch):
    """Both lenses over every row (more work than the rest of the page) run only once their section is opened."""
    compute = _compute()
    calls = []
    real = compute.trajectories
    monkeypatch.setattr(compute, "trajectories", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    compute.lens_trajectories.clear()
    at = ok(app().run())
    assert calls == [] and _trajectories(at) == []
    assert at.query_params["trajectories"] == "0"
    at.session_state["lens_traj_open"] = True  # what opening the expander does
    ok(at.run())
    assert calls == [1] and len(_trajectories(at)) == 1
    assert at.query_params["trajectories"] == "1"  # a link opens it too


def test_logit_lens_tuned_toggle_and_trajectories():
    at = app()
    at.session_state["lens_traj_open"] = True
    at = ok(at.run())
    traj = _trajectories(at)
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


# -- every head at a glance, links that keep their state, downloads, uploads ----------------------------


def _state_module():
    return sys.modules["state"]  # the dashboard's module, imported by a run


@pytest.mark.acceptance  # over 3 s
def test_attention_starts_on_the_induction_head_with_every_head_drawn(gpt4):
    from sprout_interp.circuits.attention import head_scores
    from sprout_interp.circuits.induction import find_induction_circuit

    m = gpt4
    circ = find_induction_circuit(scores=head_scores(m, copying=False))  # as the claims scripts call it
    at = ok(app("attention").run())
    assert (at.selectbox(key="attn_layer").value, at.selectbox(key="attn_head").value) == (
        circ.induction_layer, circ.induction_head)
    every = next(c for c in charts(at) if c["layout"]["title"]["text"].startswith("every head"))
    heads = [d for d in every["data"] if d["type"] == "heatmap"]
    assert len(heads) == 4 * 3 and {d["name"] for d in heads} == {f"block {l + 1} head {h}" for l in range(4) for h in range(3)}
    assert every["layout"]["shapes"]  # the detected induction head framed
    hover = [h for h in at.html if "sprout-attn" in h.proto.body]
    assert len(hover) == 1 and "textContent" in hover[0].proto.body  # the text to hover over, offline


@pytest.mark.acceptance  # Sprout: over 3 s
@pytest.mark.skipif(not (Path(loading.SHIPPED_DIR) / "sprout" / "model.safetensors").is_file(),
                    reason="the shipped Sprout checkpoint is not installed")
def test_attention_page_names_the_previous_token_head_its_table_ranks_first_and_opens_on_the_story():
    """Sprout's story: the page names the best previous-token head by the rule it states (the lower of the scores on
    random tokens and held-out text), and its table's prev_token_ranked column puts that head first (block 1
    head 5 leads prev_token_random at 0.61 but scores 0.27 on held-out text); the window opens centred on position
    56, where "Zorbin Plax" is copied, and holds its whole second occurrence (53-58) and its first (0-5)."""
    at = ok(app("attention", model="sprout").run())
    said = " ".join(shown(str(e.value)) for e in [*at.success, *at.info])
    assert "lower of its two previous-token scores" in said
    table = next(d.value for d in at.dataframe if "prev_token_ranked" in d.value.columns)
    assert list(table.columns[:4]) == ["layer", "block", "head", "prev_token_ranked"]
    ranked = table[["prev_token_random", "prev_token_heldout"]].min(axis=1)
    assert np.allclose(table["prev_token_ranked"], ranked)
    top = table.loc[table["prev_token_ranked"].idxmax()]
    named = re.search(r"best previous-token head block (\d+) head (\d+)", said)
    if named:  # the circuit as the scores rank it (not yet confirmed by ablation in this process)
        assert (int(top["block"]), int(top["head"])) == (int(named.group(1)), int(named.group(2))), (top, said)
        assert f"score {top['prev_token_ranked']:.2f}" in said
    assert at.session_state["attn_pos"] == 56
    n = at.session_state["attn_n"]
    start = min(max(56 - n // 2, 0), 140 - n)
    assert start <= 0 and 58 < start + n and abs((start + start + n - 1) / 2 - 56) <= 1
    assert at.query_params["pos"] == "56"


@pytest.mark.acceptance  # over 3 s
def test_attention_page_shows_each_heads_full_ov_circuit(gpt4):
    """The copying-score heat map is ov_copying_scores of the page's model, cell for cell; the toggle adds the
    self-rank table."""
    from sprout_interp.circuits.ov_circuit import ov_copying_scores

    at = ok(app("attention").run())
    spec = next(c for c in charts(at) if c["layout"]["title"]["text"].startswith("full OV circuit copying score"))
    grid = values(spec["data"][0]["z"])
    want = ov_copying_scores(gpt4, ranks=False).pivot(index="layer", columns="head", values="copying_score")
    # the page reads the shipped dashboard.json, computed on another machine: precomputed.FRESH_TOLERANCE
    np.testing.assert_allclose(grid.astype(float), want.to_numpy(), rtol=1e-4, atol=1e-4)
    assert not any("self_top_k" in str(df.value.columns.tolist()) for df in at.dataframe)
    at.toggle(key="ov_ranks_open").set_value(True)
    ok(at.run())
    table = next(df.value for df in at.dataframe if "self_top_k" in df.value.columns)
    assert len(table) == 12 and table["self_top_k"].between(0, 1).all()


@pytest.mark.acceptance  # over 3 s
def test_copying_button_runs_the_exact_fast_sweep_once(monkeypatch, gpt4):
    """The button's sweep is ablation_sweep's exact fast method (equal to one full forward per head), drawn with
    its progress, and computed once per model for every session."""
    from sprout_interp.circuits.ablation import ablation_sweep
    from sprout_model.evaluation import repeated_tokens_batch

    compute = _compute()
    monkeypatch.setattr(compute, "_shipped", lambda _m, key: None)  # computed here, not read from dashboard.json
    real, calls = compute.precomputed.ablation.ablation_sweep, []

    def spy(*args, **kwargs):
        done = []
        progress = kwargs.get("progress")
        kwargs["progress"] = lambda d, t: done.append((d, t)) or (progress and progress(d, t))
        calls.append((kwargs.get("method"), kwargs.get("metric"), done))
        return real(*args, **kwargs)

    monkeypatch.setattr(compute.precomputed.ablation, "ablation_sweep", spy)
    compute._copying_sweeps.clear()
    at = _attention_with_the_test_open()
    assert calls == []  # nothing before the button
    at.button(key="copy_btn").click()
    ok(at.run())
    assert [(method, metric) for method, metric, _ in calls] == [("fast", "copying_ratio")]
    assert calls[0][2][-1] == (12, 12)  # the progress reached every head of gpt-4
    table = next(d.value for d in at.dataframe if "ablated" in d.value.columns)
    assert table.attrs.get("method") == "fast" and len(table) == 12
    m = gpt4
    rep = repeated_tokens_batch(m.cfg.d_vocab, 64, 16, 0)
    naive = ablation_sweep(m, rep, metric="copying_ratio", method="naive")
    np.testing.assert_allclose(table["ablated"].to_numpy(), naive["ablated"].to_numpy(), rtol=1e-4, atol=1e-5)
    other = ok(_attention_with_the_test_open().button(key="copy_btn").click().run())  # another session: the same sweep
    assert len(calls) == 1
    again = next(d.value for d in other.dataframe if "ablated" in d.value.columns)
    assert again.equals(table)


def _every_head(at: AppTest) -> dict:
    return next(c for c in charts(at) if c["layout"]["title"]["text"].startswith("every head"))


def _selection(*customdata) -> dict:
    """A plotly chart's selection state as Streamlit keeps it after a click on points with this customdata."""
    points = [{"customdata": list(c), "curve_number": 0, "point_number": 0} for c in customdata]
    return {"selection": {"points": points, "point_indices": [0] * len(points), "box": [], "lasso": []}}


def test_picked_maps_a_selection_to_the_points_customdata():
    from sprout_interp.plots.picking import picked

    assert picked(_selection((2, 1))) == (2, 1)
    assert picked(_selection((2, 1, 7)), n=3) == (2, 1, 7)
    assert picked({"selection": {"points": [{"x": 3}, {"customdata": [1, 0]}]}}) == (1, 0)  # the first with customdata
    for nothing in (None, {}, {"selection": {}}, _selection(), {"selection": {"points": [{"customdata": ["a", 1]}]}},
                    {"selection": {"points": [{"customdata": [1]}]}}):
        assert picked(nothing) is None, nothing


def test_a_click_on_a_heads_small_pattern_chooses_that_head():
    at = ok(app("attention").run())
    every = _every_head(at)
    pickers = [d for d in every["data"] if d["type"] == "scatter"]
    assert sorted(tuple(d["customdata"][0]) for d in pickers) == [(l, h) for l in range(4) for h in range(3)]
    layout = every["layout"]
    for d in pickers:  # each marker covers its panel: plotly hovers it within its radius + 20 px
        xa, ya = layout["xaxis" + d["xaxis"][1:]], layout["yaxis" + d["yaxis"][1:]]
        mg = layout["margin"]
        w = (layout["width"] - mg["l"] - mg["r"]) * (xa["domain"][1] - xa["domain"][0])
        h = (layout["height"] - mg["t"] - mg["b"]) * (ya["domain"][1] - ya["domain"][0])
        assert d["marker"]["size"] / 2 + 20 >= np.hypot(w, h) / 2 and d["marker"]["opacity"] == 0
        assert xa["fixedrange"] and ya["fixedrange"]  # no zoom strips at the edges to take a click
    at.session_state["attn_all"] = _selection((2, 1))  # what a click on block 3's head 1 leaves
    ok(at.run())
    assert (at.selectbox(key="attn_layer").value, at.selectbox(key="attn_head").value) == (2, 1)
    assert at.subheader[1].value == "block 3 (layer 2), head 1"
    assert at.query_params["layer"] == "2" and at.query_params["head"] == "1"
    at.selectbox(key="attn_head").set_value(0)  # then a choice above: the old click does not win it back
    ok(at.run())
    assert (at.selectbox(key="attn_layer").value, at.selectbox(key="attn_head").value) == (2, 0)
    at.session_state["attn_all"] = _selection()  # deselected, then the same head clicked again
    ok(at.run())
    at.session_state["attn_all"] = _selection((2, 1))
    ok(at.run())
    assert at.selectbox(key="attn_head").value == 1
    at.session_state["attn_all"] = _selection((9, 9))  # not a head of this model: ignored
    ok(at.run())
    assert (at.selectbox(key="attn_layer").value, at.selectbox(key="attn_head").value) == (2, 1)


def test_anatomy_code_has_the_files_line_numbers_and_project_path():
    at = ok(app("anatomy").run())
    caption = next(c.value for c in at.caption if "lines" in c.value)
    first, last = (int(x) for x in re.search(r"lines (\d+)–(\d+)", caption).groups())
    assert "model/model.py" in caption and str(ROOT) not in caption
    code = at.code[0]
    lines = code.value.split("\n")
    assert lines[0].startswith(f"{first} │") and lines[-1].startswith(f"{last} │") and len(lines) == last - first + 1
    assert code.proto.wrap_lines and not code.proto.show_line_numbers  # the file's numbers, not 1..n; long lines wrap


def test_logit_lens_pickers_reset_when_the_text_changes():
    at = app(text=TEXTS["story"])
    at.session_state["lens_pos"], at.session_state["lens_row"] = 10, 0
    ok(at.run())
    assert at.subheader[0].value == "embedding, position 10"
    at.text_area(key="own_text").set_value("A new text, typed by hand, that is long enough for a few tokens.")
    ok(at.run())
    pos, row = at.number_input(key="lens_pos").value, at.selectbox(key="lens_row").value
    assert (pos, row) == (0, 4)  # back to the first token and the model's own output
    assert at.subheader[0].value == f"block 4, position {pos}"  # the detail panel names the same cell


def test_final_confidence_delta_never_reads_minus_zero():
    state = _state_module() if "state" in sys.modules else None
    if state is None:
        ok(app("positions").run())
        state = _state_module()
    assert state.points_delta(-0.004) == ("no change (within 0.5 points)", "off")
    assert state.points_delta(0.0) == ("no change (within 0.5 points)", "off")
    assert state.points_delta(-0.05) == ("-5 points", "normal") and state.points_delta(0.031) == ("+3 points", "normal")
    at = ok(app().run())
    final = next(mt for mt in at.metric if "(final)" in mt.label)
    assert final.delta and not re.match(r"^-0\b", final.delta)


def test_residual_log_axis_labels_decades_only():
    at = ok(app("residual").run())
    rms = next(c for c in charts(at) if "after each block" in c["layout"]["title"]["text"])
    labels = rms["layout"]["yaxis"]["ticktext"]
    assert labels and all(re.fullmatch(r"1(0*)|0\.0*1", t) for t in labels), labels
    assert "ticktext" not in rms["layout"]["yaxis"].get("minor", {})


def test_compare_colours_are_distinct():
    at = ok(app("compare").run())
    bars = charts(at)[0]["data"]
    assert len(bars) >= 2 and len({b["marker"]["color"] for b in bars}) == len(bars)


def test_positions_page_offers_a_real_heads_queries_and_keys():
    at = ok(app("positions").run())
    assert any("random" in r.value for r in at.radio)
    at.radio(key="pos_source").set_value("model")
    ok(at.run())
    at.selectbox(key="pos_layer").set_value(1)
    at.selectbox(key="pos_head").set_value(0)
    ok(at.run())
    titles = [c["layout"]["title"]["text"] for c in charts(at)]
    assert any("score by distance" in t for t in titles) and any("before the softmax" in t for t in titles)
    table = next(d.value for d in at.dataframe if "distance" in d.value.columns)
    assert {"layer", "block", "head", "distance", "mean", "std", "n"} <= set(table.columns)
    assert table["layer"].iloc[0] == 1 and table["block"].iloc[0] == 2
    assert any("variance the distance explains" in mt.label for mt in at.metric)


@pytest.mark.parametrize("page, params, expect", [
    ("logit_lens", {"lens": "logit", "pos": "3", "row": "0", "tokens": "40", "trajectories": "1"},
     {"lens_which": "logit", "lens_pos": 3, "lens_row": 0, "lens_width": 40, "lens_traj_open": True}),
    ("attention", {"layer": "0", "head": "2", "n": "20", "repeated": "1", "rep_len": "16"},
     {"attn_layer": 0, "attn_head": 2, "attn_n": 20, "rep_open": True, "rep_len": 16}),
    ("residual", {"log": "0", "per_position": "1"}, {"rms_log": False, "rms_per_position": True}),
    ("ablations", {"heads": ["1.0", "3.2"], "kind": "mean"}, {"abl_heads_gpt-4": [(1, 0), (3, 2)], "abl_kind": "mean"}),
    ("positions", {"qk": "random", "m": "40", "n": "7", "seed": "5"}, {"pos_m": 40, "pos_n": 7, "pos_seed": 5}),
    ("anatomy", {"part": "ffn"}, {"anatomy_part": "ffn"}),
    ("patching", {"pos": "20", "threshold": "10", "wrong": " a"},
     {"patch_pos": 20, "patch_threshold_pct": 10, "patch_wrong": " a"}),
    ("compare", {"models": ["gpt-1", "gpt-4"]}, {"cmp_models_*": ["gpt-1", "gpt-4"]}),
])
def test_a_link_restores_model_text_and_the_pages_choices(page, params, expect):
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.query_params.update({"model": "gpt-4", "text": "dialogue", **params})
    ok(at.switch_page(PAGES[page]).run())
    assert at.session_state["model_choice"] == "gpt-4" and at.session_state["text_choice"] == "dialogue"
    for k, v in expect.items():
        if k.endswith("*"):  # a key named after what is installed
            k = next(name for name in at.session_state.keys() if name.startswith(k[:-1]))
        assert at.session_state[k] == v, k
    for k, v in params.items():  # the link is still the same after the run
        assert at.query_params[k] == v, k


def test_the_link_follows_the_widgets_and_carries_a_typed_text():
    at = ok(app("attention", text="Zorbin Plax & co. <b>came</b> home.").run())
    at.selectbox(key="attn_head").set_value(2)
    ok(at.run())
    qp = at.query_params
    assert qp["head"] == "2" and qp["model"] == "gpt-4" and qp["text"] == "Zorbin Plax & co. <b>came</b> home."
    again = AppTest.from_file(str(APP), default_timeout=180)  # a reload of that link: a new session
    again.query_params.update(qp)
    ok(again.switch_page(PAGES["attention"]).run())
    assert again.session_state["own_text"] == qp["text"] and again.selectbox(key="attn_head").value == 2


def test_a_page_that_stops_early_still_writes_the_link():
    """A page that stops on a bad input (here patching without a corrupted text) keeps the link in step with what
    was typed, so the link and a reload show the same page; st.stop() would have dropped it."""
    at = ok(app("patching").run())
    at.text_area(key="patch_corrupted").set_value("")
    at.run()
    assert any("Type both texts" in w.value for w in at.warning) and not at.exception
    assert at.query_params["corrupted"] == ""
    at.text_area(key="patch_corrupted").set_value("two words")
    at.run()
    assert at.query_params["corrupted"] == "two words"  # a length mismatch: the error is shown, the link still follows
    assert any("same length" in e.value or "tokens" in e.value for e in at.error)

def test_a_link_with_impossible_values_falls_back_to_the_defaults():
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.query_params.update({"model": "gpt-4", "layer": "99", "head": "x", "pos": "-3"})
    ok(at.switch_page(PAGES["attention"]).run())
    assert 0 <= at.selectbox(key="attn_layer").value < 4 and 0 <= at.selectbox(key="attn_head").value < 3
    said = messages(at)
    assert "layer=99" in said and "head=x" in said and "from 0 to 3" in said  # not silently: the range is named


@pytest.mark.parametrize("given, notice", [("nosuchtext", True), ("Story", True), ("story", False),
                                           ("Zorbin Plax came home.", False)])
def test_a_link_text_that_names_no_ready_made_text_is_read_as_typed_text_and_says_so(given, notice):
    """``?text=nosuchtext`` is read as typed text (a link may carry any text), and the page says so, naming the
    ready-made texts; a ready-made name or a typed sentence gets no notice."""
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.query_params.update({"model": "gpt-4", "text": given})
    ok(at.switch_page(PAGES["anatomy"]).run())
    said = [i.value for i in at.info]
    typed = given not in TEXTS
    assert at.session_state["text_choice"] == (OWN_TEXT if typed else given)
    if typed:
        assert at.session_state["own_text"] == given
    hits = [s for s in said if "is read as typed text" in s]
    assert bool(hits) == notice, said
    if notice:
        assert all(name in hits[0] for name in TEXTS) and given in hits[0].replace("\\", "")
    ok(at.run())  # said once, for the link that brought it
    assert not [i.value for i in at.info if "is read as typed text" in i.value]


def test_a_path_in_the_link_is_refused_when_the_path_box_is_hidden(monkeypatch, tmp_path):
    monkeypatch.setenv("SPROUT_DASHBOARD_NO_PATH_BOX", "1")
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.query_params.update({"model": str(tmp_path / "somewhere"), "text": "story"})
    at.switch_page(PAGES["residual"]).run()
    assert not at.exception and OWN_PATH not in at.selectbox(key="model_choice").options
    assert any("does not read paths" in w.value for w in at.sidebar.warning)
    assert at.session_state["model_choice"] != OWN_PATH and not at.sidebar.text_input


@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_offers_its_downloads(page):
    at = ok(app(page).run())
    labels = [b.proto.label for b in at.get("download_button")]
    assert any("figure(s) (HTML)" in lb for lb in labels), labels
    if page not in ("anatomy", "positions"):  # pages with a main table
        assert any(lb.endswith("(CSV)") for lb in labels), labels


def _upload(at: AppTest, files: list[tuple[str, bytes]]) -> AppTest:
    at.session_state["model_choice"] = "upload checkpoint files…"
    at.run()
    assert not at.exception and any("Upload a checkpoint" in i.value for i in at.info)
    at.file_uploader(key="model_upload").set_value([(n, b, "application/octet-stream") for n, b in files])
    return at.run()


def test_upload_a_checkpoint_folder():
    gpt1 = Path(loading.SHIPPED_DIR) / "gpt-1"
    files = [(n, (gpt1 / n).read_bytes()) for n in ("config.json", "model.safetensors")]
    files.append(("tokenizer.json", (Path(loading.SHIPPED_DIR) / "tokenizer.json").read_bytes()))
    at = ok(_upload(app(), files))
    assert shape(grid(at)["z"])[0] == 2  # gpt-1's embedding + 1 block, read through the loader
    assert "model" not in at.query_params  # an upload is not a link


def test_upload_that_is_not_a_checkpoint_is_refused_clearly():
    at = _upload(app(), [("model.safetensors", b"\x00" * 64)])
    assert not at.exception
    msg = " ".join(shown(e.value) for e in at.error)
    assert "Could not load" in msg and "the uploaded checkpoint" in msg and "sprout-dashboard-uploads" not in msg
    at = _upload(app(), [("a.pt", b"x"), ("b.pt", b"y")])
    assert not at.exception and any("exactly one weights file" in shown(e.value) for e in at.sidebar.error)
    at = _upload(app(), [("model.pt", b"x"), ("notes.json", b"y")])
    assert not at.exception and any("may go with the weights" in shown(e.value) for e in at.sidebar.error)


def test_upload_a_text_file():
    at = ok(app().run())
    at.file_uploader(key="text_upload").upload("story.txt", "Zorbin Plax came home. \u00e9".encode() + b"\xff")
    ok(at.run())
    assert at.session_state["text_choice"] == OWN_TEXT
    assert at.session_state["own_text"] == "Zorbin Plax came home. \u00e9\ufffd"


def test_old_uploads_are_deleted(monkeypatch, tmp_path):
    """At most MAX_UPLOADS upload folders stay on the server: the newest, and always the one in use."""
    sys.path.insert(0, str(APP.parent))
    try:
        import uploads
    finally:
        sys.path.remove(str(APP.parent))
    monkeypatch.setattr(uploads, "upload_dir", lambda: tmp_path)
    import os
    import time

    for i in range(5):
        (tmp_path / f"u{i}").mkdir()
        os.utime(tmp_path / f"u{i}", (time.time() - 100 + i, time.time() - 100 + i))
    uploads.forget_old_uploads(keep=tmp_path / "u0", most=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u0", "u3", "u4"]


def test_no_path_box_flag_keeps_the_operators_model(monkeypatch):
    """``-- --no-path-box --model <path>``: no path box, no typed paths, but the model the server was started with."""
    folder = str(Path(loading.SHIPPED_DIR) / "gpt-1")
    monkeypatch.setattr(sys, "argv", ["app.py", "--no-path-box", "--model", folder])
    at = AppTest.from_file(str(APP), default_timeout=180).switch_page(PAGES["logit_lens"])
    ok(at.run())
    options = at.selectbox(key="model_choice").options
    assert OWN_PATH not in options and folder in options and at.session_state["model_choice"] == folder
    assert shape(grid(at)["z"])[0] == 2 and not at.sidebar.text_input  # gpt-1, and nowhere to type a path


@pytest.mark.acceptance  # over 3 s
def test_steering_page_shows_the_librarys_numbers_and_samples_only_when_asked(gpt4):
    from sprout_interp.behaviour import steering
    from sprout_interp.circuits.metrics import LogitDiff

    at = ok(app("steering").run())
    specs = charts(at)
    assert len(specs) == 2  # by block, by coefficient
    assert "counted from 1" in specs[0]["layout"]["xaxis"]["title"]["text"]
    m = gpt4
    ex = steering.EXAMPLE
    metric = LogitDiff(m.to_single_token(ex["answer"]), m.to_single_token(ex["wrong"]))
    want = steering.steering_layers(m, list(ex["positive"]), list(ex["negative"]), ex["prompt"], 2.0, metric)
    np.testing.assert_allclose(values(specs[0]["data"][0]["y"]), want["change"], atol=1e-5)
    layer = int(want.loc[want["change"].abs().idxmax(), "layer"])  # the page opens on the block that steers most
    assert at.session_state["steer_layer"] == layer
    v = steering.steering_vector(m, list(ex["positive"]), list(ex["negative"]), layer)
    eff = steering.steering_effect(m, ex["prompt"], v, layer, [2.0], metric)
    shown_metrics = {x.label: x.value for x in at.metric}
    assert shown_metrics["logit difference at coefficient 2"] == f"{eff['value'].item():.3f}"
    assert not any("Steered" in str(d.value) for d in at.dataframe)
    assert any("only when you ask" in c.value for c in at.caption)  # nothing sampled yet
    assert at.query_params.get("block") in ([str(layer + 1)], str(layer + 1))
    at.button(key="steer_generate_btn").click()
    ok(at.run())
    gens = at.dataframe[-1].value
    assert gens["coeff"].tolist() == [-2.0, 0.0, 2.0]
    lib = steering.steered_generations(m, ex["prompt"], v, layer, (-2.0, 0.0, 2.0), max_new_tokens=20, seed=0)
    assert gens["continuation"].tolist() == lib["continuation"].tolist()


def test_steering_page_says_what_is_missing_or_wrong():
    at = app("steering")
    at.session_state["steer_pos"] = "  \n "
    at = at.run()
    assert any("at least one text" in w.value for w in at.warning) and not at.exception
    at = app("steering")
    at.session_state["steer_answer"] = " Plaxworth"
    at = at.run()
    assert any("not one" in e.value for e in at.error) and not at.exception



@pytest.mark.acceptance  # over 3 s
def test_neurons_page_shows_the_librarys_numbers_for_the_prediction_and_the_neuron(gpt4):
    from sprout_interp.features import neurons as N

    text = "Zorbin Plax came home. The next day Zorbin"
    at = app("neurons", text=text)
    at.session_state["nrn_page_open"] = True  # the held-out page opened
    at = ok(at.run())
    m = gpt4
    T = m.to_tokens(text).shape[1]
    assert at.session_state["nrn_pos"] == T - 1  # the last position first, its answer the model's top guess
    guess = m.to_string([int(m(text)[0, -1].argmax())])
    want = N.neuron_attribution(m, text, guess, pos=T - 1, top=20)
    specs = charts(at)
    bars = specs[0]["data"][0]
    np.testing.assert_allclose(values(bars["x"])[::-1], want["attribution"], atol=1e-5)  # strongest drawn at the top
    assert "pos" in specs[0]["layout"]["title"]["text"]
    # the neuron page opens on the strongest of those neurons, and its numbers are the library's
    layer, neuron = int(want["layer"].iloc[0]), int(want["neuron"].iloc[0])
    assert (at.session_state["nrn_layer"], at.session_state["nrn_n"]) == (layer, neuron)
    page = N.neuron_summary(m, layer, neuron)
    shown_metrics = {x.label: x.value for x in at.metric}
    assert shown_metrics["largest / most negative"] == f"{page.max_activation:+.2f} / {page.min_activation:+.2f}"
    abl = N.ablate_neurons(m, text, [(layer, neuron)])
    assert shown_metrics["loss on the text (nats/token)"] == f"{abl.loc[0, 'ablated']:.4f}"
    assert any(f"block {layer + 1} neuron {neuron}" in str(md.value) for md in at.markdown)
    # by number, against a wrong token: the link keeps the choices
    at.radio(key="nrn_how").set_value("by number")
    ok(at.run())
    assert (at.selectbox(key="nrn_layer").value, at.number_input(key="nrn_n").value) == (layer, neuron)  # kept
    at.selectbox(key="nrn_layer").set_value(1)
    at.number_input(key="nrn_n").set_value(7)
    at.text_input(key="nrn_wrong").set_value(" the")
    ok(at.run())
    page = N.neuron_summary(m, 1, 7)
    shown_metrics = {x.label: x.value for x in at.metric}
    assert shown_metrics["largest / most negative"] == f"{page.max_activation:+.2f} / {page.min_activation:+.2f}"
    lib = N.neuron_attribution(m, text, guess, " the", pos=T - 1, top=20)
    np.testing.assert_allclose(values(charts(at)[0]["data"][0]["x"])[::-1], lib["attribution"], atol=1e-5)
    q = at.query_params
    assert q.get("neuron") in (["7"], "7") and q.get("layer") in (["1"], "1") and q.get("wrong") in ([" the"], " the")


@pytest.mark.acceptance  # over 3 s
def test_neurons_page_reads_held_out_text_only_when_the_neurons_page_is_opened(monkeypatch, gpt4):
    """The first load attributes the prediction without reading the layer on held-out text (the slowest part);
    opening the section, a link's held_out=1, or choosing a neuron by number opens it."""
    compute = _compute()
    real, calls = compute.neuron_page, []
    monkeypatch.setattr(compute, "neuron_page", lambda *a: calls.append(a[2:]) or real(*a))
    at = ok(app("neurons").run())
    assert calls == [] and at.session_state["nrn_page_open"] is False and at.query_params["held_out"] == "0"
    at.session_state["nrn_page_open"] = True  # opened
    at = ok(at.run())
    assert calls == [(at.session_state["nrn_layer"], at.session_state["nrn_n"])]
    assert at.query_params["held_out"] == "1"
    linked = AppTest.from_file(str(APP), default_timeout=180)
    linked.query_params.update({"model": "gpt-4", "held_out": "1"})
    ok(linked.switch_page(PAGES["neurons"]).run())
    assert len(calls) == 2
    by_number = app("neurons")
    by_number.session_state["nrn_how"] = "by number"
    by_number = ok(by_number.run())
    assert by_number.session_state["nrn_page_open"] is True and len(calls) == 3


@pytest.mark.acceptance  # over 3 s
def test_neurons_page_finds_neurons_by_token_and_says_what_is_wrong(gpt4):
    at = app("neurons")
    at.session_state["nrn_how"] = "by token"
    at.session_state["nrn_token"] = " she"
    at = ok(at.run())
    assert any("standard deviations" in c.value for c in at.caption)
    from sprout_interp.features import neurons as N

    m = gpt4
    found = [d.value for d in at.dataframe if "z" in d.value.columns]
    want = N.neurons_for_token(N.index_neurons(m, 0), " she", n=15, model=m)
    assert len(found) == 1 and found[0]["neuron"].tolist() == want["neuron"].tolist()
    assert at.number_input(key="nrn_n").value == int(want["neuron"].iloc[0])  # the first found is shown
    at = app("neurons")
    at.session_state["nrn_answer"] = " Plaxworth"
    at = at.run()
    assert any("not one" in e.value for e in at.error) and not at.exception
