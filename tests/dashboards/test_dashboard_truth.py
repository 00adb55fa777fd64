"""What the dashboard names is what the library finds, and what a link asks for is shown or refused out loud.

Driven headless with streamlit.testing.v1.AppTest. For every shipped model, every head a page names (the attention
page's circuit box, its red frame and its first head; the ablations page's first choice; before and after the circuit
is confirmed by ablation) is the circuit ``find_induction_circuit`` returns when called as the README's claims script
calls it (``analyses/induction_heads.py``, computed here independently of the dashboard). A value in a link (or a
remembered widget value) that a page cannot show gets a warning naming the parameter and its valid values, and the
link is corrected to what is shown. A typed text opens the Features page on its features.
"""
from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import analysis_script

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

import sprout_interp as si  # noqa: E402
from sprout_interp.circuits.attention import head_scores  # noqa: E402
from sprout_interp.circuits.induction import find_induction_circuit  # noqa: E402
from sprout_interp.core import loading  # noqa: E402
from sprout_interp.core.texts import TEXTS  # noqa: E402
from sprout_interp.report import cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dashboards" / "app.py"
MODELS = ["gpt-1", "gpt-4", "sprout"]
OWN_TEXT = "type your own…"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not all((Path(loading.SHIPPED_DIR) / n / "model.safetensors").is_file() for n in MODELS),
                       reason="the shipped checkpoints are not installed"),
]


def _compute():
    """The dashboard's compute module (the one every page run imports), imported now if no page has run yet."""
    if "compute" not in sys.modules:
        sys.path.insert(0, str(APP.parent))
        import compute  # noqa: F401
    return sys.modules["compute"]


@pytest.fixture(autouse=True)
def _no_confirmed_circuits():
    """A circuit confirmed by ablation is shared by every session of the process: each test starts, and leaves
    the process, without one."""
    _compute()._confirmed_circuits.clear()
    yield
    _compute()._confirmed_circuits.clear()


def app(page: str, model: str, params: dict | None = None, text: str | None = None) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=600)
    if params is None:
        at.session_state["model_choice"] = model
    else:
        at.query_params.update({"model": model, **params})
    if text is not None:
        at.session_state["text_choice"], at.session_state["own_text"] = OWN_TEXT, text
    return at.switch_page(f"views/{page}.py")


def ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def shown(markdown: str) -> str:
    """A message as a person reads it: the dashboard backslash-escapes punctuation in what it quotes."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown).replace("**", "")


def boxes(at: AppTest) -> list[str]:
    return [shown(str(e.value)) for e in [*at.success, *at.info, *at.warning]]


HEAD = re.compile(r"block (\d+)(?: \(layer \d+\))?,? head (\d+)")


def heads_in(text: str) -> set[tuple[int, int]]:
    """Every head a sentence names ("block 2 head 0", "block 2 (layer 1), head 0"), as 0-indexed (layer, head)."""
    return {(int(b) - 1, int(h)) for b, h in HEAD.findall(text)}


def _args():
    return analysis_script("induction_heads").parser().parse_args([])


def claims_scores(m, a):
    """The head scores exactly as analyses/induction_heads.py computes them (its measure(), claims settings)."""
    natural = cli.held_out(m, SimpleNamespace(n=a.n, length=a.length, seed=a.seed))
    return head_scores(m, seq_len=a.seq_len, batch=a.batch, seed=a.seed,
                       natural=natural if natural is not None else list(TEXTS.values()), copying=False)


def named(circ, threshold: float) -> tuple[tuple[int, int] | None, list[tuple[int, int]]]:
    """(the induction head a page may frame, the heads it may preselect) for a library circuit: none below the
    finder's own threshold."""
    ind = (circ.induction_layer, circ.induction_head) if circ.induction_score >= threshold else None
    return ind, (list(circ.heads()) if circ.found else [ind] if ind else [])


def check_attention_page(at: AppTest, circ, ind, confirmed: bool) -> None:
    """The attention page names ``circ``: its summary in the box, ``ind`` framed and chosen first (none framed and
    a message when there is none), and no head the circuit does not name."""
    box = next(b for b in boxes(at) if f"{circ.model}: " in b and "induction head" in b)
    assert circ.summary() in box and box.startswith("The induction circuit (confirmed by ablation)") == confirmed, box
    chosen = (at.selectbox(key="attn_layer").value, at.selectbox(key="attn_head").value)
    assert chosen == (ind or (0, 0))
    every = next(spec for spec in (json.loads(c.proto.spec) for c in at.get("plotly_chart"))
                 if spec["layout"]["title"]["text"].startswith("every head"))
    framed = [a["text"] for a in every["layout"]["annotations"] if a["text"].startswith("<b>")]  # the red frame's title
    assert [(int(b) - 1, int(h)) for t in framed for b, h in re.findall(r"block (\d+) head (\d+)", t)] == (
        [ind] if ind else [])
    assert bool(every["layout"].get("shapes")) == bool(ind)
    caption = next(shown(c.value) for c in at.caption if "One small pattern per head" in c.value)
    if ind:
        assert "Framed in red" in caption and heads_in(caption.split("Framed in red")[1].split(".")[0]) == {ind}
    else:
        assert "No head is framed" in caption
        assert any(b.startswith("No induction head") and f"{circ.induction_score:.2f}" in b
                   and f"{circ.threshold:.2f}" in b for b in boxes(at))
    said = set().union(*(heads_in(b) for b in boxes(at)), heads_in(caption))
    assert said <= heads_in(circ.summary()) | ({ind} if ind else set()), said


def test_the_dashboard_circuit_uses_the_claims_scripts_settings():
    """The dashboard's circuit settings (dashboards/precomputed.py, which compute calls and the precomputed files
    record) are analyses/induction_heads.py's defaults and the library's own defaults."""
    a, compute = _args(), _compute()
    pre = compute.precomputed
    assert (pre.CIRCUIT_REF_N, pre.CIRCUIT_LOSS_N, pre.CIRCUIT_LENGTH, pre.CIRCUIT_SEED) == (
        a.ref_n, a.loss_n, a.length, a.seed)
    assert a.kind == "mean" and (a.seq_len, a.batch, a.n) == (64, 16, 8)
    assert pre.SCORES == dict(seq_len=a.seq_len, batch=a.batch, seed=a.seed)
    finder = inspect.signature(find_induction_circuit).parameters
    assert finder["on"].default == "both" and finder["threshold"].default == a.threshold
    scores = inspect.signature(head_scores).parameters
    assert (scores["natural_n"].default, scores["natural_length"].default) == (a.n, a.length)
    for src in (inspect.getsource(compute), inspect.getsource(pre)):
        assert 'on="random"' not in src and "on='random'" not in src


@pytest.mark.acceptance  # 3-15 s each
@pytest.mark.parametrize("model", MODELS)
def test_every_page_names_the_circuit_the_library_finds(model):
    """First load, no ablation yet: the circuit as the claims script's head scores rank it, on every page."""
    a = _args()
    m = si.load(model)
    lib = find_induction_circuit(scores=claims_scores(m, a), threshold=a.threshold)
    ind, heads = named(lib, a.threshold)
    if model == "gpt-1":  # one block: no induction head, nothing framed or preselected
        assert ind is None and heads == []
    else:  # the README's claims: the induction head is block 2 head 0, fed by block 1 head 0 (and head 2)
        assert ind == (1, 0) and heads == [(0, 0), (1, 0)]
    at = ok(app("attention", model).run())
    check_attention_page(at, lib, ind, confirmed=False)
    at.switch_page("views/ablations.py")
    ok(at.run())
    assert at.multiselect(key=f"abl_heads_{model}").value == heads
    if not heads:
        assert any("names no induction head" in b and f"{lib.induction_score:.2f}" in b for b in boxes(at))


@pytest.mark.acceptance  # 3-86 s each
@pytest.mark.parametrize("model", ["gpt-1", "gpt-4", pytest.param("sprout", marks=pytest.mark.slow)])
def test_a_confirmed_circuit_is_the_claims_scripts_circuit_on_every_page(model):
    """Once confirmed by ablation (the ablations page's button), every page names the circuit the claims script's
    own measure() finds, the one the README's claims table reports (block 1 heads 0 and 2 -> block 2 head 0)."""
    a = _args()
    nm = cli.load_models([model])[0]
    lib = analysis_script("induction_heads").measure([nm], a, claims_only=True)["circuits"][model]
    ind, heads = named(lib, a.threshold)
    if model != "gpt-1":
        assert lib.confirmed and heads == [(0, 0), (0, 2), (1, 0)]
    at = ok(app("ablations", model).run())
    at.button(key="abl_confirm_btn").click()
    ok(at.run())
    assert at.multiselect(key=f"abl_heads_{model}").value == heads
    assert any("confirmed by ablation" in shown(c.value) for c in at.caption)
    at.switch_page("views/attention.py")
    ok(at.run())
    lib.model = model
    check_attention_page(at, lib, ind, confirmed=True)
    other = ok(app("ablations", model).run())  # another session: the confirmed circuit, no button, no new search
    assert other.multiselect(key=f"abl_heads_{model}").value == heads
    assert not [b for b in other.button if b.key == "abl_confirm_btn"]


# -- links and widgets a page cannot show ---------------------------------------------------------------

def _block(v) -> str:
    return str(v + 1)


#: (page, model, link parameters, {bad parameter: (session key, how the link writes the value, the valid range)})
LINKS = [
    ("attention", "gpt-4", {"layer": "9", "head": "7", "n": "0"},
     {"layer": ("attn_layer", str, "from 0 to 3"), "head": ("attn_head", str, "from 0 to 2"),
      "n": ("attn_n", str, "from 1 to 140")}),
    ("attention", "gpt-4", {"layer": "1.5", "head": "true", "repeated": "maybe"},
     {"layer": ("attn_layer", str, "from 0 to 3"), "head": ("attn_head", str, "from 0 to 2"),
      "repeated": ("rep_open", lambda v: "1" if v else "0", "1 or 0")}),
    ("logit_lens", "gpt-4", {"pos": "999", "row": "-1"},
     {"pos": ("lens_pos", str, "from 0 to 139"), "row": ("lens_row", str, "from 0 to 4")}),
    ("neurons", "gpt-4", {"how": "by number", "pos": "999", "layer": "4", "neuron": "99999"},
     {"pos": ("nrn_pos", str, "from 0 to 139"), "layer": ("nrn_layer", str, "from 0 to 3"),
      "neuron": ("nrn_n", str, "from 0 to 511")}),
    ("steering", "gpt-4", {"block": "9", "coeff": "3.7"},
     {"block": ("steer_layer", _block, "from 1 to 4"), "coeff": ("steer_coeff", lambda v: f"{v:g}", "one of -8, ")}),
    ("positions", "gpt-4", {"qk": "model", "layer": "9", "head": "x", "m": "600", "size": "4"},
     {"layer": ("pos_layer", str, "from 0 to 3"), "head": ("pos_head", str, "from 0 to 2"),
      "m": ("pos_m", str, "from 0 to 139"), "size": ("pos_size", str, "from 16 to 128")}),
    ("patching", "gpt-4", {"pos": "999", "threshold": "0"},
     {"pos": ("patch_pos", str, "from 0 to "), "threshold": ("patch_threshold_pct", str, "from 1 to 50")}),
    ("ablations", "gpt-4", {"heads": ["9.9", "1.0"], "kind": "bogus"},
     {"heads": ("abl_heads_gpt-4", lambda v: [f"{l}.{h}" for l, h in v], "layer 0 to 3 and head 0 to 2"),
      "kind": ("abl_kind", str, "one of zero, mean, resample")}),
    ("residual", "gpt-4", {"log": "maybe"}, {"log": ("rms_log", lambda v: "1" if v else "0", "1 or 0")}),
    ("anatomy", "gpt-4", {"part": "nonsense"}, {"part": ("anatomy_part", str, "one of ")}),
    ("features", "sprout", {"layer": "7", "feature": "99999"},
     {"layer": ("feat_layer_sprout", str, "one of 1, 3"), "feature": ("feat_n_sprout_1", str, "from 0 to 3071")}),
]


@pytest.mark.parametrize("page, model, params, bad", LINKS, ids=[f"{c[0]}-{'-'.join(c[3])}" for c in LINKS])
def test_a_link_a_page_cannot_show_says_so_and_is_corrected(page, model, params, bad):
    at = ok(app(page, model, params).run())
    said = [shown(str(w.value)) for w in at.warning]
    qp = at.query_params
    for param, (key, fmt, valid) in bad.items():
        asked = ", ".join(params[param]) if isinstance(params[param], list) else params[param]
        msg = next((w for w in said if w.startswith(f"The link's {param}={asked} ")), None)
        assert msg is not None, (param, said)
        assert f"{param} must be " in msg and valid in msg, msg
        link = qp.get(param)
        assert link == fmt(at.session_state[key]), (param, link)  # the link says what the page shows
        now = ", ".join(link) if isinstance(link, list) else link
        assert f"Showing {param}={now} instead; the link now says so." in msg, msg
        assert now != asked
    ok(at.run())  # the next run: the link was corrected, nothing more to say about it
    assert not any(w.startswith("The link's") for w in (shown(str(w.value)) for w in at.warning))


def test_a_value_the_link_allows_but_the_page_cannot_show_is_said_too():
    """``start`` of the logit lens is a position of the text, but the grid cannot start past its last full width:
    the remembered value is clamped with a warning naming the range, and the link follows."""
    at = ok(app("logit_lens", "gpt-4", {"start": "130", "tokens": "30"}).run())
    msg = next(shown(str(w.value)) for w in at.warning if "start=130" in shown(str(w.value)))
    assert "start must be from 0 to 110" in msg and "Showing start=110 instead" in msg, msg
    assert at.query_params["start"] == "110" == str(at.session_state["lens_start"])


def test_the_logit_lens_opens_on_the_copy_unless_the_link_chooses_its_window():
    """With no window in the link the lens opens on the position that predicts the story's copied name (56: "in",
    before the second " Pl"), its window around it; a link's ``start`` keeps its window, the position at its start."""
    at = ok(app("logit_lens", "gpt-4").run())
    assert at.session_state["lens_pos"] == 56
    assert at.session_state["lens_start"] <= 56 < at.session_state["lens_start"] + 30
    at = ok(app("logit_lens", "gpt-4", {"start": "5", "tokens": "30"}).run())
    assert (at.session_state["lens_start"], at.session_state["lens_pos"]) == (5, 5)
    assert at.query_params["start"] == "5"


def test_a_remembered_position_past_a_new_texts_end_is_said():
    """A widget's value that a new text makes impossible (the neurons page's position) is moved with a warning."""
    at = ok(app("neurons", "gpt-4", {"pos": "120"}).run())
    assert at.session_state["nrn_pos"] == 120 and not any("pos=" in shown(str(w.value)) for w in at.warning)
    at.session_state["text_choice"], at.session_state["own_text"] = OWN_TEXT, "Zorbin Plax came home. Zorbin Plax"
    ok(at.run())
    T = len(si.load("gpt-4").to_str_tokens("Zorbin Plax came home. Zorbin Plax"))
    msg = next(shown(str(w.value)) for w in at.warning if "pos=120" in shown(str(w.value)))
    assert f"pos must be from 0 to {T - 1}" in msg and f"Showing pos={T - 1} instead" in msg, msg
    assert at.query_params["pos"] == str(T - 1) == str(at.session_state["nrn_pos"])


# -- the Features page opens on what a typed text is about --------------------------------------------------

@pytest.mark.skipif(not (Path(loading.SHIPPED_DIR) / "sprout" / "saes").is_dir(), reason="no shipped SAEs")
def test_a_typed_text_opens_the_features_page_on_its_features():
    text = "Zorbin Plax came home late. Then Zorbin Plax slept."
    at = ok(app("features", "sprout", text=text).run())
    assert at.session_state["feat_tab"] == "On your text" and at.query_params["tab"] == "On your text"
    # the strongest features in a table whose cells wrap (st.table: a description is cut in a data grid)
    assert any({"feature", "max_act", "description"} <= set(d.value.columns) for d in [*at.dataframe, *at.table])
    assert not any(shown(m.value).startswith("feature 0,") for m in at.markdown)  # not feature 0's page
    at.session_state["feat_tab"] = "Feature page"  # a tab chosen afterwards stays
    ok(at.run())
    assert at.session_state["feat_tab"] == "Feature page"
    at.session_state["own_text"] = text + " Again."  # a new text opens on its features again
    ok(at.run())
    assert at.session_state["feat_tab"] == "On your text"
    linked = ok(app("features", "sprout", {"text": text, "tab": "Feature page", "feature": "5"}).run())
    assert linked.session_state["feat_tab"] == "Feature page"  # a link's own tab wins
    assert any("feature 5" in shown(m.value) for m in linked.markdown)
    ready = ok(app("features", "sprout").run())  # a ready-made text opens on the feature page
    assert ready.session_state.get("feat_tab", "Feature page") == "Feature page"


#: every page whose link takes a layer: (page, model, its other parameters, the session key of the layer it shows)
LAYER_LINKS = [("attention", "gpt-4", {}, "attn_layer"), ("positions", "gpt-4", {"qk": "model"}, "pos_layer"),
               ("neurons", "gpt-4", {"how": "by number"}, "nrn_layer"), ("features", "sprout", {}, "feat_layer_sprout")]


@pytest.mark.parametrize("page, model, params, key", LAYER_LINKS, ids=[c[0] for c in LAYER_LINKS])
def test_layer_in_a_link_is_the_0_indexed_layer_on_every_page(page, model, params, key):
    """``layer=3`` opens layer 3 (block 4) on every page that takes a layer, and the link keeps it as 3 (the
    project's convention: ``layer`` 0-indexed as in code, ``block`` = layer + 1)."""
    at = ok(app(page, model, {**params, "layer": "3"}).run())
    assert at.session_state[key] == 3
    assert at.query_params["layer"] == "3"
    assert not [w for w in at.warning if "The link's layer" in shown(str(w.value))]


def test_a_feed_forward_node_opens_the_neurons_page_on_its_own_layer():
    """A click on block 3's feed-forward node of the contribution graph opens the Neurons page on layer 2."""
    from sprout_interp.plots.patching import NODE_KINDS

    at = ok(app("patching", "gpt-4").run())
    at.session_state["patch_graph"] = {"selection": {"points": [{"customdata": [NODE_KINDS["mlp"], 2, 0],
                                                                 "curve_number": 0, "point_number": 0}],
                                                     "point_indices": [0], "box": [], "lasso": []}}
    at = ok(at.run())
    assert at.session_state["nrn_layer"] == 2 and at.query_params["layer"] == "2"
