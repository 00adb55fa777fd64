"""Hostile input to the dashboard: where it listens, what its path box reads, what it renders.

The dashboard binds to this machine only; its path box reads regular files and folders only and
boundedly (the loader's limits); everything typed is shown as literal text (no markdown, link or
image of its own, in messages, titles and legends); a lone surrogate in the text box never stops a
page. Driven headless with ``streamlit.testing.v1.AppTest``; the hostile paths are built here.
"""
from __future__ import annotations

import html
import json
import os
import re
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from markdown_it import MarkdownIt  # noqa: E402  (streamlit's own dependency, through rich)
from streamlit.testing.v1 import AppTest  # noqa: E402

from sprout_interp.core import loading  # noqa: E402

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dashboards" / "app.py"
OWN_PATH = "a checkpoint folder or course .pt…"
OWN_TEXT = "type your own…"
SHIPPED_TOKENIZER = Path(loading.SHIPPED_DIR) / "tokenizer.json"
needs_shipped = pytest.mark.skipif(not (Path(loading.SHIPPED_DIR) / "gpt-1" / "model.safetensors").is_file(),
                                   reason="the shipped gpt-1 checkpoint is not installed")


def app(page: str = "views/anatomy.py", path: str | None = None, text: str | None = None,
        tokenizer: str | None = None, model: str = "gpt-1") -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.session_state["model_choice"] = OWN_PATH if path is not None else model
    if path is not None:
        at.session_state["model_path"] = path
    if tokenizer is not None:
        at.session_state["model_tokenizer"] = tokenizer
    if text is not None:
        at.session_state["text_choice"] = OWN_TEXT
        at.session_state["own_text"] = text
    return at.switch_page(page)


def rendered(markdown: str) -> str:
    """The HTML a CommonMark renderer makes of a message."""
    return MarkdownIt("commonmark").render(markdown)


def literal(markdown: str) -> str:
    """A message as a person reads it: rendered, tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", rendered(markdown))).strip()


def only_text(markdown: str) -> None:
    """The message renders to plain text: no image, link, code span, heading, list, raw HTML."""
    out = rendered(markdown)
    tags = set(re.findall(r"</?(\w+)", out)) - {"p", "strong"}
    assert not tags, (tags, out)


# --- where it listens ------------------------------------------------------------------------------


def test_the_config_binds_to_this_machine_only():
    cfg = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert cfg["server"]["address"] == "localhost"
    assert cfg["browser"]["gatherUsageStats"] is False


def _listening(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp* write them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if int(p, 16) == port and state == "0A":  # LISTEN
                found.add(addr)
    return found


@pytest.mark.acceptance  # starts a Streamlit server
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net/tcp")
def test_the_server_started_as_the_readme_says_listens_on_loopback_only():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    streamlit = Path(sys.executable).with_name("streamlit")
    proc = subprocess.Popen([str(streamlit), "run", str(APP), "--server.port", str(port)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while not _listening(port) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        addrs = _listening(port)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1
    assert addrs and addrs <= loopback, addrs


# --- the path box ------------------------------------------------------------------------------------


def _load_error(at: AppTest) -> str:
    assert not at.exception, [e.value for e in at.exception]
    msgs = [e.value for e in at.error]
    assert msgs and "Could not load" in msgs[0], msgs
    only_text(msgs[0])
    return literal(msgs[0])


def test_special_files_are_refused_without_reading_them(tmp_path):
    os.mkfifo(tmp_path / "pipe.pt")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    for path, words in [("/dev/zero", "character device"), (str(tmp_path / "pipe.pt"), "FIFO"),
                        (str(tmp_path / "loop"), "loop"), ("/", "not a Sprout checkpoint")]:
        t0 = time.perf_counter()
        msg = _load_error(app(path=path).run())
        assert words in msg and time.perf_counter() - t0 < 30, msg


@pytest.mark.parametrize("path", [
    "x` ![pwned](http://example.com/p.png) `y",
    "[click](javascript:alert(1)) <img src=x onerror=alert(1)>",
    ":red[big] :material/home: $x^2$ **bold** # heading",
    "a\n\n# heading\n- item\n```\ncode",
], ids=["backtick image", "link and html", "streamlit directives", "newlines"])
def test_a_typed_path_is_shown_as_literal_text(tmp_path, path):
    msg = _load_error(app(path=path).run())
    assert " ".join(path.split()) in msg  # the person sees exactly what they typed …
    # … and only_text() has checked that nothing in it became markup


@pytest.mark.parametrize("path", ["caf\udce9.pt", "\ud800", "model\x00.pt"], ids=["surrogate-escaped", "lone", "NUL"])
def test_undecodable_paths_are_refused_not_crashed_on(path):
    at = app(path=path).run()
    _load_error(at)
    assert not app("views/anatomy.py", path=path).run().exception


def _tiny_checkpoint(folder: Path, tokenizer: bool = True) -> Path:
    import torch

    from sprout_model import GPT, Config
    from sprout_model.checkpoint import save_checkpoint

    torch.manual_seed(0)
    gpt = GPT(Config(vocab_size=8192, context=64, n_layer=1, n_head=2, d_model=16, d_ff=32)).eval()
    return save_checkpoint(gpt, folder, SHIPPED_TOKENIZER if tokenizer else None, {})


@needs_shipped
def test_weights_without_a_tokenizer_are_refused_and_a_typed_tokenizer_shows_a_warning(tmp_path):
    folder = _tiny_checkpoint(tmp_path / "a" / "b" / "mine", tokenizer=False)
    msg = _load_error(app(path=str(folder)).run())
    assert "no tokenizer.json beside the weights" in msg
    at = app("views/logit_lens.py", path=str(folder), tokenizer=str(SHIPPED_TOKENIZER)).run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    warned = [literal(w.value) for w in at.warning]
    assert any("could not be checked against the weights" in w for w in warned), warned


@needs_shipped
def test_a_model_name_with_markup_is_literal_in_titles_and_text(tmp_path):
    folder = _tiny_checkpoint(tmp_path / "<b>x<i>_[img](http:..)")
    at = app("views/logit_lens.py", path=str(folder)).run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    assert titles and all("<b>" not in t and "&lt;b&gt;x&lt;i&gt;" in t for t in titles), titles
    at = app("views/anatomy.py", path=str(folder)).run()
    names = [m.value for m in at.markdown if "Parameters in" in m.value]
    assert names and "[img](http" not in names[0]
    only_text(names[0])


# --- the text box ---------------------------------------------------------------------------------------


@needs_shipped
@pytest.mark.parametrize("text", ["Hello \ud800 world.", "\udfff", "Zorbin \ud83c\udf31 Plax came home."],
                         ids=["lone high", "lone low", "pair"])
def test_a_lone_surrogate_in_the_text_box_does_not_wedge_the_session(text):
    at = app("views/logit_lens.py", text=text).run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    assert "\ud800" not in at.session_state["own_text"] and "\udfff" not in at.session_state["own_text"]
    if "\ud83c" in text:
        assert "🌱" in at.session_state["own_text"]  # a pair that came as two halves is its character again
    for page in ("views/residual.py", "views/positions.py"):  # navigation goes on
        at.switch_page(page).run()
        assert not at.exception, [e.value for e in at.exception]


@needs_shipped
def test_a_huge_text_is_cut_with_a_notice():
    at = app("views/residual.py", text="The cat sat. " * 20_000).run()
    assert not at.exception and not at.error
    assert any("only its first 100,000" in w.value for w in at.warning)


def test_markup_in_a_typed_text_never_reaches_markdown_unescaped():
    sys.path.insert(0, str(APP.parent))
    try:
        import state
    finally:
        sys.path.remove(str(APP.parent))
    for s in ["` ![x](http://e/p.png) `", "<script>alert(1)</script>", ":red[x] $y$", "\\`*_{}[]()#+-.!|~"]:
        only_text(state.md(s))
        assert literal(state.md(s)) == s
    assert state.plain("<b>x</b> & y") == "&lt;b&gt;x&lt;/b&gt; &amp; y"
    assert state.clean_text("a\ud800b") == "a\ufffdb"
