"""Where the dashboard listens does not depend on the folder it is started from, and anywhere but loopback the
path box is off (and the page says so) unless the operator passes ``-- --allow-remote-paths``.

The real-server tests run ``streamlit run <repo>/dashboards/app.py`` as a person would, from a folder of their
own, read the listening socket's address from ``/proc/net/tcp`` and ``/proc/net/tcp6``, and stop the server's
whole process group even when the test fails.
"""
from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit import config as st_config  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from sprout_interp.core.errors import ArgumentError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dashboards" / "app.py"
STREAMLIT = Path(sys.executable).with_name("streamlit")
OWN_PATH = "a checkpoint folder or course .pt…"
LOOPBACK_HEX = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1 as /proc/net writes them
pytestmark = pytest.mark.unit
linux_proc = pytest.mark.skipif(not Path("/proc/net/tcp").exists() or not Path("/proc/self/fd").is_dir(),
                                reason="needs Linux /proc/net/tcp and /proc/self/fd")

sys.path.insert(0, str(APP.parent))
try:
    import serving  # the module the app itself imports (dashboards/ is on its sys.path too)
finally:
    sys.path.remove(str(APP.parent))


# --- the decision, unit by unit ------------------------------------------------------------------------


@linux_proc
def test_listening_sockets_finds_this_processs_own_listeners():
    """Sockets this test opens, on loopback and on every interface, are found with their addresses and ports;
    a socket that does not listen is not."""
    opened = []
    try:
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::1")):
            s = socket.socket(family)
            opened.append(s)
            try:
                s.bind((host, 0))
            except OSError:  # no IPv6 on this machine
                continue
            s.listen()
        quiet = socket.socket()
        opened.append(quiet)
        quiet.bind(("127.0.0.1", 0))  # bound, not listening
        want = {(s.getsockname()[0], s.getsockname()[1]) for s in opened[:-1] if s.getsockname()[1]}
        found = set(serving.listening_sockets())
        assert want <= found, (want, found)
        assert ("127.0.0.1", quiet.getsockname()[1]) not in found
        with socket.socket() as later:  # a new listener is seen at once, and is gone once closed
            later.bind(("0.0.0.0", 0))
            later.listen()
            port = later.getsockname()[1]
            assert ("0.0.0.0", port) in serving.listening_sockets()
        assert ("0.0.0.0", port) not in serving.listening_sockets()
    finally:
        for s in opened:
            s.close()


@pytest.mark.skipif(sys.byteorder != "little", reason="/proc/net writes each word in the machine's byte order")
def test_proc_addresses_are_decoded():
    assert serving.proc_address("0100007F") == "127.0.0.1"
    assert serving.proc_address("00000000") == "0.0.0.0"
    assert serving.proc_address("00000000000000000000000001000000") == "::1"
    assert serving.proc_address("00000000000000000000000000000000") == "::"
    mapped = serving.proc_address("0000000000000000FFFF00000100007F")  # Python 3.11 writes it ::ffff:7f00:1
    assert ipaddress.ip_address(mapped) == ipaddress.ip_address("::ffff:127.0.0.1") and serving.is_loopback(mapped)
    for bad in ("", "0100007", "XYZ0007F", "0100007F00", 0x0100007F):
        with pytest.raises(ArgumentError, match="hex_address"):
            serving.proc_address(bad)


@pytest.mark.parametrize("address, loopback", [
    ("localhost", True), ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("[::1]", True),
    ("::ffff:127.0.0.1", True), ("", False), ("0.0.0.0", False), ("::", False), ("192.0.2.7", False),
    ("2001:db8::1", False), ("myhost.example", False), ("unix:///tmp/s.sock", False)])
def test_only_loopback_counts_as_this_machine(address, loopback):
    assert serving.is_loopback(address) is loopback
    assert serving.exposed_addresses([address]) == ([] if loopback else [address])


def test_the_flag_that_accepts_the_exposure():
    assert serving.remote_paths_accepted(["--model", "gpt-4", "--allow-remote-paths"])
    assert not serving.remote_paths_accepted(["--model", "gpt-4"])
    assert not serving.remote_paths_accepted([])


# --- the page, through AppTest (no server: Streamlit's effective server.address decides) --------------------


@contextlib.contextmanager
def _address(value: str | None) -> Iterator[None]:
    old = st_config.get_option("server.address")
    st_config.set_option("server.address", value)
    try:
        yield
    finally:
        st_config.set_option("server.address", old)


def _sidebar_of(tmp_path: Path) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.session_state["model_choice"] = "gpt-1"
    at.query_params["model"] = str(tmp_path / "a-server-path")
    return at.switch_page("views/anatomy.py").run()


@pytest.mark.integration
@pytest.mark.parametrize("address", ["0.0.0.0", "", "192.0.2.7"])
def test_the_page_turns_the_path_box_off_and_says_so_when_served_beyond_loopback(tmp_path, address):
    with _address(address):
        at = _sidebar_of(tmp_path)
    assert not at.exception
    assert OWN_PATH not in at.sidebar.selectbox(key="model_choice").options
    assert at.session_state["model_choice"] != OWN_PATH and not at.sidebar.text_input
    notes = " ".join(w.value for w in at.sidebar.warning)
    assert "not only on this machine, so it reads no paths" in notes and "--allow-remote-paths" in notes
    assert "does not read paths" in notes  # the link's path was refused


@pytest.mark.integration
def test_the_path_box_stays_on_for_an_operator_who_accepts_the_exposure(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["app.py", "--allow-remote-paths"])
    with _address("0.0.0.0"):
        at = _sidebar_of(tmp_path)
    assert not at.exception and OWN_PATH in at.sidebar.selectbox(key="model_choice").options
    assert at.sidebar.text_input(key="model_path").value == str(tmp_path / "a-server-path")
    notes = " ".join(w.value for w in at.sidebar.warning)
    assert "started with `--allow-remote-paths`" in notes and "read this machine's files" in notes


@pytest.mark.integration
def test_on_loopback_the_path_box_is_on_and_nothing_is_said(tmp_path):
    with _address("localhost"):
        at = _sidebar_of(tmp_path)
    assert not at.exception and OWN_PATH in at.sidebar.selectbox(key="model_choice").options
    assert not any("not only on this machine" in w.value for w in at.sidebar.warning)


# --- a real server, started as a person would ------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listen_lines(port: int) -> list[str]:
    """The /proc/net/tcp{,6} lines (prefixed with their table) of sockets in LISTEN state on ``port``."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "0A":
                out.append(f"{table}: {line.strip()}")
    return out


def _hex_addresses(lines: list[str]) -> set[str]:
    return {line.split()[2].rsplit(":", 1)[0] for line in lines}


@contextlib.contextmanager
def _served(cwd: Path, *args: str, timeout: float = 120) -> Iterator[tuple[int, list[str]]]:
    """``streamlit run <repo>/dashboards/app.py`` started in ``cwd``; yields (port, its /proc/net LISTEN lines)
    once it answers; its process group is stopped afterwards, also when the test fails."""
    port = _free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("STREAMLIT_SERVER_ADDRESS", None)
    proc = subprocess.Popen([str(STREAMLIT), "run", str(APP), "--server.headless", "true", "--server.port", str(port),
                             *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not _listen_lines(port):
            assert proc.poll() is None, f"streamlit exited with code {proc.returncode}"
            assert time.monotonic() < deadline, f"streamlit did not listen on port {port} within {timeout:.0f} s"
            time.sleep(0.2)
        yield port, _listen_lines(port)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@linux_proc
@pytest.mark.acceptance
@pytest.mark.parametrize("where", ["another folder", "the repository root"])
def test_the_readme_command_listens_on_loopback_from_any_folder(tmp_path, where):
    """``streamlit run <path>/dashboards/app.py`` with no address of its own: loopback, whatever the cwd."""
    with _served(tmp_path if where == "another folder" else ROOT) as (_, lines):
        addrs = _hex_addresses(lines)
    assert addrs and addrs <= LOOPBACK_HEX, lines


@linux_proc
@pytest.mark.acceptance
@pytest.mark.slow
def test_served_on_every_interface_the_page_in_a_browser_has_no_path_box(tmp_path):
    """Shared on purpose (``--server.address 0.0.0.0``, from another folder): the socket listens on 0.0.0.0, and
    the page, as Chromium shows it, says the path box is off and refuses a link's path."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import browser  # scripts/browser.py
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    why = browser.find_chromium()[2]
    if why:
        pytest.skip(f"no browser to test with: {why}")
    from selenium.webdriver.common.by import By

    target = str(tmp_path / "a-server-path")
    with _served(tmp_path, "--server.address", "0.0.0.0") as (port, lines), browser.chrome() as d:
        assert _hex_addresses(lines) == {"00000000"}, lines  # 0.0.0.0: every interface
        d.get(f"http://127.0.0.1:{port}/?model={target}")
        deadline, side, boxes = time.monotonic() + 240, "", []
        while time.monotonic() < deadline:
            side = "\n".join(browser.texts(d, '[data-testid="stSidebar"]'))
            boxes = browser.texts(d, '[data-testid="stSidebar"] [data-testid="stTextInput"] input', "value")
            if "counts blocks from 1" in side and ("does not read paths" in side or boxes):
                break
            time.sleep(0.5)
        time.sleep(1.0)  # the rest of the sidebar's run
        side = "\n".join(browser.texts(d, '[data-testid="stSidebar"]'))
        boxes = browser.texts(d, '[data-testid="stSidebar"] [data-testid="stTextInput"] input', "value")
        assert d.find_elements(By.CSS_SELECTOR, '[data-testid="stSidebar"]')
    assert target not in boxes, (boxes, side)  # the path box is not there to read the server's files
    assert "every network interface (0.0.0.0)" in side and "so it reads no paths" in side, side
    assert "does not read paths" in side, side
