"""How long each dashboard page takes to load the first time, and to redraw after an interaction.

    .venv/bin/python benchmarks/dashboard_interaction.py                 # sprout (gpt-4 if not installed)
    .venv/bin/python benchmarks/dashboard_interaction.py --model gpt-4 --reps 7
    .venv/bin/python benchmarks/dashboard_interaction.py --sprout-shaped  # also a random-weight Sprout-sized model
    .venv/bin/python benchmarks/dashboard_interaction.py --cold --load    # each page first after a restart, busy CPU

Each page is opened in its own session (streamlit.testing.v1.AppTest, the script run without a
browser) on a 512-token text, loaded once (first load: model, analyses, caches; the pages are opened
in the order below, so a page's first load reuses the model and whatever an earlier page cached), then one
interaction per page is repeated, alternating between two values so every redraw is a real change;
rounds are interleaved over the pages so machine noise hits them alike. The table gives the first
load (wall-clock, and the CPU time of the whole process over it, every thread: the work the page does, which
waiting for a busy machine's CPUs does not inflate), and the median, fastest and slowest redraw over ``--reps``
rounds. Times are the script run (what the server does for an interaction); the browser's own drawing is not
included. The load average before and after is printed: on a shared machine, read the table with it.

``--cold`` empties every Streamlit cache (models included) before each page's first load: each first load is
then that page opened first on a freshly started server (the model's load included), in any order.
``--load`` runs one training thread beside the measured pages for the whole run (:func:`training_load`: a
gpt-1-sized model trained on random tokens in a subprocess with one torch thread, as a training run shares a
machine), and stops it at the end, even on failure; the table's heading gives the steps it made.

``--text short`` types a 50-token held-out text instead (the Attribution graph page graphs a typed text at once up to
96 tokens; a 512-token one only when asked): ``--pages graph --text short`` times a typed text's graph.

``--text default`` opens every page on the dashboard's own default text (what a first visit shows: the pages'
own defaults, several of them precomputed for the shipped checkpoints) instead of the typed 512-token text; first
loads only (the interactions' values are the typed text's).

``--sprout-shaped`` adds a model with Sprout's shape (8 blocks, d_model 384, 6 heads) and random
weights, saved to a temporary folder: its timings stand in for the trained sprout before that
checkpoint exists (the work per redraw does not depend on the weights' values).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "dashboards" / "app.py"
OWN_PATH = "a checkpoint folder or course .pt…"
OWN_TEXT = "type your own…"
N_TOKENS = 512
SHORT_TOKENS = 50


def text_of(model, n: int = N_TOKENS) -> tuple[str, str]:
    """A text of at least ``n`` tokens for ``model``'s tokenizer, and where it came from."""
    from sprout_interp.core.texts import TEXTS, validation_sample

    try:
        ids = validation_sample(model.tokenizer, n=1, length=n, seed=0)[0]
        return model.to_string(ids), f"{n} tokens of held-out text"
    except Exception:  # no corpus installed: the ready-made texts, repeated
        text = " ".join(TEXTS.values())
        while len(model.tokenizer.encode(text, add_special_tokens=False).ids) < n:
            text += " " + text
        return text, f"the ready-made texts repeated, cut to {n} tokens"


def sprout_shaped(folder: Path) -> Path:
    """Save a random-weight model with Sprout's preset shape (and the shipped tokenizer) to ``folder``."""
    import torch

    from sprout_interp.core import loading
    from sprout_model import GPT
    from sprout_model.checkpoint import save_checkpoint
    from sprout_model.presets import PRESETS

    torch.manual_seed(0)
    gpt = GPT(PRESETS["sprout"]).eval()
    return save_checkpoint(gpt, folder, Path(loading.SHIPPED_DIR) / "tokenizer.json", {"note": "random weights"})


LOAD_SCRIPT = """
import sys, time, torch
torch.set_num_threads(1)
from sprout_model import GPT
from sprout_model.presets import PRESETS
torch.manual_seed(0)
model = GPT(PRESETS["gpt-1"]).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
vocab = PRESETS["gpt-1"].vocab_size
steps, t0 = 0, time.perf_counter()
while True:
    x = torch.randint(0, vocab, (8, 257))
    _, loss = model(x[:, :-1], targets=x[:, 1:])
    opt.zero_grad()
    loss.backward()
    opt.step()
    steps += 1
    print(f"{steps} {time.perf_counter() - t0:.1f}", flush=True)
"""


class training_load:
    """One training thread beside the benchmark, as a context manager: a subprocess that trains a gpt-1-sized model
    (sprout_model's preset, one torch thread) on random tokens until the block ends; ``steps()`` is how many steps
    it has made and how many seconds it has run. Stopped (terminated, then killed) on leaving, even on failure."""

    def __init__(self, on: bool = True):
        self.on, self.proc, self.last = on, None, "0 0"

    def __enter__(self):
        if self.on:
            import subprocess

            self.log = tempfile.TemporaryFile(mode="w+")
            self.proc = subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT], stdout=self.log,
                                         stderr=subprocess.DEVNULL, cwd=ROOT)
            t = time.perf_counter()
            while self._read() == "0 0" and self.proc.poll() is None and time.perf_counter() - t < 60:
                time.sleep(0.2)  # running: its first step is done
            if self.proc.poll() is not None:
                raise RuntimeError(f"the training load stopped at once (exit code {self.proc.returncode})")
        return self

    def _read(self) -> str:
        self.log.seek(0)
        lines = self.log.read().split()
        return " ".join(lines[-2:]) if len(lines) >= 2 else "0 0"

    def steps(self) -> tuple[int, float]:
        """(training steps made, seconds it ran) so far."""
        if self.proc is None:
            return 0, 0.0
        n, secs = self._read().split()
        return int(n), float(secs)

    def __exit__(self, *exc):
        if self.proc is not None:
            self.last = self.steps()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
            self.log.close()
        return False


def empty_caches() -> None:
    """Forget every cached answer and model, as a freshly started server has none: Streamlit's caches and the
    library's own (the held-out documents, read and cleaned from the corpus packages, and their tokens)."""
    import streamlit as st

    from sprout_interp.core import texts

    st.cache_data.clear()
    st.cache_resource.clear()
    texts.clear_caches()


# page -> (file, widget kind, key ("{key}": the model's), two values to alternate, what the interaction is)
INTERACTIONS = {
    "anatomy": ("views/anatomy.py", "radio", "anatomy_part", ("ffn", "attention"), "show another part's code"),
    "logit_lens": ("views/logit_lens.py", "number_input", "lens_pos", (100, 101), "pick another cell"),
    "residual": ("views/residual.py", "toggle", "rms_log", (False, True), "toggle log scale"),
    "attention": ("views/attention.py", "selectbox", "attn_head", (1, 0), "pick another head"),
    "ablations": ("views/ablations.py", "slider", "abl_start", (200, 1), "scroll the per-token chart"),
    "compare": ("views/compare.py", "slider", "cmp_start", (200, 1), "scroll the per-token chart"),
    "patching": ("views/patching.py", "slider", "patch_pos", (38, 39), "graph of another prediction"),
    "positions": ("views/positions.py", "number_input", "pos_m", (50, 51), "move the query"),
    "features": ("views/features.py", "selectbox", "feat_layer_{key}", (3, 1), "another SAE's layer"),
    "steering": ("views/steering.py", "select_slider", "steer_coeff", (4.0, 2.0), "another coefficient"),
    "neurons": ("views/neurons.py", "radio", "nrn_kind", ("mean", "zero"), "ablate the neuron another way"),
    "graph": ("views/attribution_graph.py", "slider", "ag_node_thr", (0.7, 0.8), "another node threshold"),
}


def run_model(key: str, path: str | None, text: str | None, reps: int, cold: bool = False,
              first_loads: int = 1) -> list[dict]:
    """Each page's first load (``first_loads`` rounds over the pages, interleaved: the median and the slowest) and
    its interaction's redraws; ``text`` None: the dashboard's default text."""
    from streamlit.testing.v1 import AppTest

    sessions, pages = {}, dict(INTERACTIONS)
    first: dict[str, list[float]] = {p: [] for p in INTERACTIONS}
    first_cpu: dict[str, list[float]] = {p: [] for p in INTERACTIONS}
    for _round in range(first_loads):
        for page, (file, kind, wkey, *_rest) in INTERACTIONS.items():
            if cold:
                empty_caches()
            at = AppTest.from_file(str(APP), default_timeout=900)
            at.session_state["model_choice"] = OWN_PATH if path else key
            if path:
                at.session_state["model_path"] = path
            if text is not None:
                at.session_state["text_choice"] = OWN_TEXT
                at.session_state["own_text"] = text
            at.switch_page(file)
            t, c = time.perf_counter(), time.process_time()
            at.run()
            first[page].append(time.perf_counter() - t)
            first_cpu[page].append(time.process_time() - c)
            if at.exception or at.error:
                raise RuntimeError(f"{page}: {[e.value for e in [*at.exception, *at.error]]}")
            sessions[page] = at
    for page, (file, kind, wkey, *_rest) in INTERACTIONS.items():
        try:
            getattr(sessions[page], kind)(key=wkey.format(key=key))
        except KeyError:  # the page has nothing to interact with for this model (a features page without an SAE)
            print(f"note: {page}: no {kind} {wkey!r} on the page for {key}; first load only", file=sys.stderr)
            del pages[page]
    if text is None:  # the interactions' values are chosen for the typed text (a position past 100, …)
        pages = {}

    def interact(page: str, value) -> float:
        _, kind, wkey, _, _ = INTERACTIONS[page]
        at = sessions[page]
        getattr(at, kind)(key=wkey.format(key=key)).set_value(value)
        t = time.perf_counter()
        at.run()
        dt = time.perf_counter() - t
        if at.exception or at.error:
            raise RuntimeError(f"{page}: {[e.value for e in [*at.exception, *at.error]]}")
        return dt

    for page, (*_, values, _) in pages.items():  # warm-up: each value once (fills the caches)
        for v in values:
            interact(page, v)
    times = {p: [] for p in pages}
    for r in range(reps):
        for page, (*_, values, _) in pages.items():
            times[page].append(interact(page, values[r % 2]))
    nan = float("nan")
    return [
        dict(model=key, page=page, interaction=INTERACTIONS[page][4] if page in times else "(none: first load only)",
             first=statistics.median(first[page]), first_max=max(first[page]),
             first_cpu=statistics.median(first_cpu[page]), median=statistics.median(times[page]) if page in times else nan,
             fastest=min(times[page]) if page in times else nan, slowest=max(times[page]) if page in times else nan)
        for page in INTERACTIONS
    ]


# button -> (page file, URL parameters that open its section, button key, what it computes)
BUTTONS = {
    "confirm the circuit": ("views/ablations.py", {}, "abl_confirm_btn", "mean-ablates the circuit's candidates"),
    "copying sweep": ("views/attention.py", {"repeated": "1"}, "copy_btn", "each head zero-ablated alone"),
}


def time_buttons(key: str, path: str | None, text: str) -> list[dict]:
    """Seconds from a click on each of :data:`BUTTONS` to the page drawn again, each on empty caches (the page's
    first load before the click is not counted)."""
    from streamlit.testing.v1 import AppTest

    rows = []
    for name, (file, params, button, what) in BUTTONS.items():
        empty_caches()
        at = AppTest.from_file(str(APP), default_timeout=900)
        at.query_params.update(params)
        at.session_state["model_choice"] = OWN_PATH if path else key
        if path:
            at.session_state["model_path"] = path
        at.session_state["text_choice"], at.session_state["own_text"] = OWN_TEXT, text
        at.switch_page(file).run()
        at.button(key=button).click()
        t, c = time.perf_counter(), time.process_time()
        at.run()
        rows.append(dict(model=key, button=name, what=what, seconds=time.perf_counter() - t,
                         cpu=time.process_time() - c))
        if at.exception or at.error:
            raise RuntimeError(f"{name}: {[e.value for e in [*at.exception, *at.error]]}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="shipped name or checkpoint path (default: sprout, else gpt-4)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--sprout-shaped", action="store_true", help="also time a random-weight Sprout-shaped model")
    ap.add_argument("--pages", nargs="*", default=list(INTERACTIONS), choices=list(INTERACTIONS))
    ap.add_argument("--cold", action="store_true", help="empty every cache before each page's first load")
    ap.add_argument("--load", action="store_true", help="run one training thread beside the pages (training_load)")
    ap.add_argument("--buttons", action="store_true", help="also time the slowest buttons (BUTTONS) after a click")
    ap.add_argument("--first-loads", type=int, default=1,
                    help="rounds of first loads over the pages (with --cold: each a fresh server's); the table gives "
                         "their median and the slowest")
    ap.add_argument("--text", choices=["typed", "default", "short"], default="typed",
                    help=f"typed: a {N_TOKENS}-token held-out text typed in; default: the dashboard's own default text; "
                         f"short: a {SHORT_TOKENS}-token held-out text typed in (the attribution graph computes a typed "
                         "text's graph at once up to 96 tokens)")
    a = ap.parse_args(argv)
    for page in list(INTERACTIONS):
        if page not in a.pages:
            del INTERACTIONS[page]

    import torch

    import sprout_interp as si
    from sprout_interp.core import loading

    models: list[tuple[str, str | None]] = []
    if a.model:
        models.append((a.model, None if a.model in loading.SHIPPED else a.model))
    elif (Path(loading.SHIPPED_DIR) / "sprout" / "model.safetensors").is_file():
        models.append(("sprout", None))
    else:
        print("note: the sprout checkpoint is not installed; timing gpt-4 instead", file=sys.stderr)
        models.append(("gpt-4", None))
    tmp = None
    if a.sprout_shaped:
        tmp = tempfile.TemporaryDirectory(prefix="sprout-shaped-")
        models.append(("sprout-shaped (random weights)", str(sprout_shaped(Path(tmp.name) / "sprout-shaped"))))

    load_before = os.getloadavg()
    rows, clicks = [], []
    with training_load(a.load) as load:
        for key, path in models:
            m = si.load(path or key)
            text, source = text_of(m, SHORT_TOKENS if a.text == "short" else N_TOKENS)
            if a.text == "default":
                source = "the dashboard's default text"
            print(f"{key}: {m.cfg.n_layers} blocks, d_model {m.cfg.d_model}, {m.cfg.n_heads} heads; text: {source}; "
                  f"torch threads {torch.get_num_threads()}", file=sys.stderr)
            rows += run_model(key, path, None if a.text == "default" else text, a.reps, cold=a.cold,
                              first_loads=a.first_loads)
            clicks += time_buttons(key, path, text) if a.buttons else []
    beside = (f"; beside one training thread ({load.last[0]} steps of a gpt-1-sized model in {load.last[1]:.0f} s)"
              if a.load else "")
    how = "each page first on an empty cache" if a.cold else "pages in this order, each reusing what earlier ones cached"
    what = {"typed": f"a typed {N_TOKENS}-token text", "short": f"a typed {SHORT_TOKENS}-token text"}.get(
        a.text, "the default text")
    loads = f"first load: median of {a.first_loads} rounds, " if a.first_loads > 1 else ""
    print(f"\nDashboard first load and redraw after one interaction (AppTest script run, {what}, "
          f"{how}, {loads}redraw: median of {a.reps} interleaved rounds; {os.cpu_count()} CPUs, torch threads "
          f"{torch.get_num_threads()}; load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after{beside})\n")
    w = max(len(r["model"]) for r in rows)
    wi = max(26, *(len(r["interaction"]) for r in rows))
    print(f"| {'model':{w}s} | page       | {'interaction':{wi}s} | first load | slowest first | its CPU time | "
          "median redraw | fastest | slowest |")
    print(f"|{'-' * (w + 2)}|------------|{'-' * (wi + 2)}|-----------:|--------------:|-------------:|--------------:|"
          "--------:|--------:|")
    for r in rows:
        print(f"| {r['model']:{w}s} | {r['page']:10s} | {r['interaction']:{wi}s} | {r['first']:8.2f} s | "
              f"{r['first_max']:11.2f} s | {r['first_cpu']:10.2f} s | {r['median']:11.2f} s | {r['fastest']:5.2f} s | "
              f"{r['slowest']:5.2f} s |")
    if clicks:
        print("\n| model | button | what it computes | click to page drawn | its CPU time |\n|---|---|---|---:|---:|")
        for r in clicks:
            print(f"| {r['model']} | {r['button']} | {r['what']} | {r['seconds']:.2f} s | {r['cpu']:.2f} s |")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
