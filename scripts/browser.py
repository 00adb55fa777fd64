"""Run the dashboard on a free localhost port and drive it with headless Chromium (selenium 4).

Shared by ``tests/test_browser.py`` and ``scripts/screenshots.py``. Uses Debian's ``chromium`` and
``chromium-driver`` (``apt-get install -y chromium chromium-driver``; ``.ci/run`` installs them when
missing); the driver path is passed explicitly, so selenium never tries to download one.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "dashboards" / "app.py"
CHROME_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]
#: CSS of the boxes that mean something went wrong on a page.
EXCEPTION_CSS = '[data-testid="stException"]'
ERROR_CSS = '[data-testid="stAlertContentError"]'
PLOT_CSS = '[data-testid="stPlotlyChart"] .main-svg'


def find_chromium() -> tuple[Optional[str], Optional[str], str]:
    """(chromium, chromedriver, why not) -- the paths, or None and a reason a person can act on."""
    chrome = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium", shutil.which("chromium-browser"),
                               shutil.which("google-chrome")) if p and os.path.exists(p)), None)
    driver = next((p for p in (shutil.which("chromedriver"), "/usr/bin/chromedriver") if p and os.path.exists(p)), None)
    if chrome is None:
        return None, driver, "Chromium is not installed (apt-get install -y chromium chromium-driver)"
    if driver is None:
        return chrome, None, "chromedriver is not installed (apt-get install -y chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return chrome, driver, "selenium is not installed (pip install -e '.[test]')"
    return chrome, driver, ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(model: Optional[str] = None, port: Optional[int] = None, timeout: float = 90.0,
          log: Optional[Path] = None) -> Iterator[str]:
    """Start ``streamlit run dashboards/app.py`` on a free localhost port; yields its base URL; stops it after.

    ``model`` is passed as ``-- --model NAME`` (default: the app's own choice, the best shipped checkpoint).
    """
    port = port or free_port()
    cmd = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port),
           "--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    if model:
        cmd += ["--", "--model", model]
    out = open(log, "w") if log else subprocess.DEVNULL
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with code {proc.returncode}" + (f"; see {log}" if log else ""))
            try:
                with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"streamlit did not answer on {url} within {timeout:.0f} s")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log:
            out.close()


@contextlib.contextmanager
def chrome(width: int = 1600, height: int = 1200) -> Iterator:
    """A headless Chromium WebDriver with a fresh profile; quit and cleaned up afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    path, driver_path, why = find_chromium()
    if why:
        raise RuntimeError(why)
    profile = tempfile.mkdtemp(prefix="sprout-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = path
    for f in CHROME_FLAGS + [f"--user-data-dir={profile}", f"--window-size={width},{height}"]:
        opts.add_argument(f)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for_page(driver, n_plots: int = 1, timeout: float = 180.0) -> None:
    """Wait until the page has drawn ``n_plots`` plotly figures and Streamlit has finished running the script
    (or an exception box appeared)."""
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if driver.find_elements(By.CSS_SELECTOR, EXCEPTION_CSS):
            return
        running = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]')
        spinners = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stSpinner"]')
        plots = driver.find_elements(By.CSS_SELECTOR, PLOT_CSS)
        if len(plots) >= n_plots and not running and not spinners:
            time.sleep(1.0)  # let plotly finish laying out
            return
        time.sleep(0.5)
    raise TimeoutError(f"the page did not draw {n_plots} figure(s) within {timeout:.0f} s")


def texts(driver, css: str, attribute: str = "innerText") -> list[str]:
    """``attribute`` of every element matching ``css``, read in one script call: Streamlit re-renders
    elements at any moment, and reading them one by one from Python can hit a stale element."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(e => e[arguments[1]]);", css, attribute)


def problems(driver) -> list[str]:
    """Texts of the exception and error boxes on the page (empty when all is well)."""
    return [t for css in (EXCEPTION_CSS, ERROR_CSS) for t in texts(driver, css)]


def full_page_screenshot(driver, path: Path, max_height: int = 9000) -> Path:
    """Resize the window to the page's height (up to ``max_height``), scroll to the top, and save a PNG."""
    height = driver.execute_script(
        "const m = document.querySelector('[data-testid=\"stMain\"]') || document.body;"
        "return Math.max(m.scrollHeight, document.body.scrollHeight);")
    width = driver.get_window_size()["width"]
    driver.set_window_size(width, min(int(height) + 80, max_height))
    time.sleep(1.0)
    driver.execute_script("window.scrollTo(0, 0); const m = document.querySelector('[data-testid=\"stMain\"]');"
                          "if (m) m.scrollTo(0, 0);")
    time.sleep(0.3)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    return path
