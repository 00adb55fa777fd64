"""A tokenizer is untrusted input: a ``tokenizer.json`` comes with every checkpoint folder, path, link and upload.

Hostile files are built here from the shipped tokenizer by editing its JSON: a normalizer that multiplies the
text (it aborted the dashboard's whole process: a 3.3 GB allocation failed in Rust), a split regex that
backtracks until the regex engine gives up (a Rust panic, ``pyo3_runtime.PanicException``, which is a
``BaseException`` and passed every ``except Exception``). They are refused when loaded; one that slips past the
check is stopped by the bounded chunks (after one chunk) and by the panic guard; the shipped tokenizer still
gives the very same ids.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Tokenizer

import sprout_interp as si
from sprout_interp.core import errors, loading, tokens
from sprout_interp.core.export import hf_tokenizer
from sprout_interp.core.loading import load_checkpoint
from sprout_interp.core.texts import TEXTS
from sprout_model import GPT, Config
from sprout_model.checkpoint import save_checkpoint
from sprout_model.tokenizer import train_tokenizer

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("no_shipped")]

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_TOKENIZER = ROOT / "model" / "checkpoints" / "tokenizer.json"
SHIPPED = json.loads(SHIPPED_TOKENIZER.read_text(encoding="utf-8"))
EXPANDING = {"type": "Replace", "pattern": {"String": "a"}, "content": "x" * 4000}
BACKTRACKING = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(a|a)*$"}, "behavior": "Isolated", "invert": False},
    SHIPPED["pre_tokenizer"],
]}
GPT2_FORM = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": tokens.GPT2_SPLIT_PATTERN}, "behavior": "Isolated", "invert": False},
    {**SHIPPED["pre_tokenizer"], "use_regex": False},
]}
BACKTRACKS_ON = "a" * 5000 + "b"  # "(a|a)*$" tries 2**5000 ways before it fails at the "b"


def edited(**parts) -> dict:
    """The shipped tokenizer's JSON with some top-level parts replaced."""
    spec = copy.deepcopy(SHIPPED)
    spec.update(parts)
    return spec


def write(folder: Path, spec: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return folder / "tokenizer.json"


def unchecked(spec: dict) -> Tokenizer:
    """The tokenizers library's own object, as a user could build it: past every check of Sprout's loader."""
    return Tokenizer.from_str(json.dumps(spec))


@pytest.fixture(scope="module")
def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(Config(vocab_size=8192, context=64, n_layer=1, n_head=2, d_model=16, d_ff=32)).eval()


def checkpoint(tmp_path: Path, gpt: GPT, spec: dict, name: str = "ckpt") -> Path:
    """A checkpoint folder whose own tokenizer.json is ``spec``."""
    return save_checkpoint(gpt, tmp_path / name, write(tmp_path / f"{name}-src", spec), {})


def refused(call, *words: str) -> str:
    with pytest.raises(errors.TokenizationError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


# --- refused when loaded --------------------------------------------------------------------------------


HOSTILE = {
    "expanding normalizer": (edited(normalizer=EXPANDING), ["normalizer", "Replace", "have none"]),
    "backtracking split regex": (edited(pre_tokenizer=BACKTRACKING), ["(a|a)*$", "GPT-2"]),
    "fixed padding": (edited(padding={"strategy": {"Fixed": 10**9}, "direction": "Right", "pad_to_multiple_of": None,
                                      "pad_id": 0, "pad_type_id": 0, "pad_token": "<|endoftext|>"}), ["padding"]),
    "template post-processor": (edited(post_processor={"type": "TemplateProcessing", "single": [], "pair": [],
                                                       "special_tokens": {}}), ["post-processor", "TemplateProcessing"]),
    "BPE dropout": (edited(model={**SHIPPED["model"], "dropout": 0.5}), ["dropout"]),
    "Unigram model": (edited(model={"type": "Unigram", "unk_id": 0, "vocab": [["a", 0.0]]}), ["model", "Unigram"]),
    "added token that strips": (edited(added_tokens=[{**SHIPPED["added_tokens"][0], "rstrip": True}]), ["strips"]),
    "whole-text ByteLevel": (edited(pre_tokenizer={**SHIPPED["pre_tokenizer"], "use_regex": False}), ["use_regex"]),
    "Metaspace decoder": (edited(decoder={"type": "Metaspace", "replacement": "x", "prepend_scheme": "always",
                                          "split": True}), ["decoder", "Metaspace"]),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_hostile_tokenizer_is_refused_when_loaded(kind, tmp_path, tiny_gpt):
    spec, words = HOSTILE[kind]
    folder = checkpoint(tmp_path, tiny_gpt, spec)
    msg = refused(lambda: load_checkpoint(folder), str(folder / "tokenizer.json"), *words)
    assert "byte-level BPE" in msg and "Pass the tokenizer.json the model was trained with" in msg  # what is allowed
    own = checkpoint(tmp_path, tiny_gpt, SHIPPED, "own")
    refused(lambda: load_checkpoint(own, tokenizer=folder / "tokenizer.json"), *words)  # the tokenizer argument
    refused(lambda: load_checkpoint(own, tokenizer=folder), *words)  # a folder holding it
    refused(lambda: si.load(own, tokenizer=folder), *words)
    if kind not in ("Unigram model",):  # the library can build these: a Tokenizer object is checked too
        refused(lambda: load_checkpoint(own, tokenizer=unchecked(spec)), "the tokenizer passed", *words)
    refused(lambda: hf_tokenizer(folder / "tokenizer.json"), *words)  # the export reads it through the same check


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_the_training_tools_refuse_what_the_loader_refuses_with_the_same_words(kind, tmp_path, tiny_gpt):
    """One check: ``sprout_model.tokenizer.load_tokenizer`` (what ``prepare --tokenizer`` and ``train`` read a
    tokenizer with) refuses each hostile file with the very message the loader gives."""
    from sprout_model.tokenizer import TokenizerError, load_tokenizer

    spec, words = HOSTILE[kind]
    path = write(tmp_path / "t", spec)
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(path)
    own = checkpoint(tmp_path, tiny_gpt, SHIPPED, "own")
    assert str(e.value) == refused(lambda: load_checkpoint(own, tokenizer=path), *words)


@pytest.mark.parametrize("text, words", [
    ("[]", ["not a JSON object (it holds an array)"]), ('"tokenizer"', ["not a JSON object (it holds a string)"]),
    ("5", ["not a JSON object (it holds a number)"]), ("null", ["not a JSON object (it holds null)"]),
    ("[" * 100_000, ["not a Hugging Face tokenizers file"]),
])
def test_a_tokenizer_json_that_is_no_object_is_refused(text, words, tmp_path, tiny_gpt):
    """A tokenizer.json holding ``[]`` raised a plain AttributeError ('list' object has no attribute 'to_str')."""
    from sprout_model.tokenizer import TokenizerError, load_tokenizer

    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "tokenizer.json").write_text(text)
    own = checkpoint(tmp_path, tiny_gpt, SHIPPED, "own")
    with pytest.raises(errors.SproutError) as e:
        load_checkpoint(own, tokenizer=tmp_path / "t")
    assert isinstance(e.value, (errors.TokenizationError, errors.NotACheckpointError)), type(e.value)
    assert all(w in str(e.value) for w in words), str(e.value)
    (tmp_path / "c").mkdir()
    save_checkpoint(tiny_gpt, tmp_path / "c" / "ckpt", None, {})
    (tmp_path / "c" / "ckpt" / "tokenizer.json").write_text(text)  # a checkpoint's own tokenizer.json too
    with pytest.raises((errors.TokenizationError, errors.NotACheckpointError)):
        si.load(tmp_path / "c" / "ckpt")
    with pytest.raises(TokenizerError):  # and the training tools' reader
        load_tokenizer(tmp_path / "t" / "tokenizer.json")
    if text.startswith("[" * 2) or text.startswith('"'):  # a str passed to check_tokenizer is a file's text
        return
    with pytest.raises(errors.TokenizationError, match="not a JSON object"):
        tokens.check_tokenizer(json.loads(text), "x")  # the parsed value itself


def test_the_training_tools_encoding_stops_an_expanding_tokenizer():
    """The expansion bound has one home (sprout_model.tokenizer.check_expansion): prepare's encoder stops a tokenizer
    that slipped past the check as the library's chunked encoder does."""
    from sprout_model.tokenizer import TokenizerError, encode, encode_pieces

    tok = unchecked(edited(normalizer=EXPANDING))
    with pytest.raises(TokenizerError, match="expands text"):
        encode(tok, "a cat")
    with pytest.raises(TokenizerError, match="expands text"):
        next(encode_pieces(tok, "a banana " * 10))
    with pytest.raises(errors.TokenizationError, match="expands text"):
        tokens.encode_ids(tok, "a cat")
    shipped = Tokenizer.from_file(str(SHIPPED_TOKENIZER))
    text = TEXTS["story"]
    assert encode(shipped, text) == shipped.encode(text, add_special_tokens=False).ids  # a real tokenizer passes


def test_refusal_comes_before_the_rust_library_builds_the_tokenizer(tmp_path, tiny_gpt, monkeypatch):
    folder = checkpoint(tmp_path, tiny_gpt, edited(pre_tokenizer=BACKTRACKING))
    built = []
    monkeypatch.setattr(loading, "tokenizer_call", lambda what, fn, *a, **k: built.append(what))
    refused(lambda: load_checkpoint(folder), "(a|a)*$")
    assert built == []


def test_the_shapes_sprout_trains_are_accepted(tmp_path, tiny_gpt):
    tokens.check_tokenizer(SHIPPED_TOKENIZER.read_text(encoding="utf-8"), "shipped")
    tokens.check_tokenizer(train_tokenizer(list(TEXTS.values()) * 3, vocab_size=300))  # the trainer's own output
    tokens.check_tokenizer(edited(pre_tokenizer=GPT2_FORM))  # GPT-2's pattern as a Split before ByteLevel
    c = load_checkpoint(checkpoint(tmp_path, tiny_gpt, edited(pre_tokenizer=GPT2_FORM)))
    shipped = Tokenizer.from_file(str(SHIPPED_TOKENIZER))
    for text in TEXTS.values():
        assert c.tokenizer.encode(text).ids == shipped.encode(text).ids


# --- the shipped tokenizer: the same ids as before ----------------------------------------------------------


def test_the_shipped_tokenizer_loads_and_gives_the_same_ids(tmp_path, tiny_gpt, monkeypatch):
    raw = Tokenizer.from_file(str(SHIPPED_TOKENIZER))  # the tokenizers library alone, as the old path encoded
    folder = checkpoint(tmp_path, tiny_gpt, SHIPPED)
    c = load_checkpoint(folder)
    assert not c.warnings and c.tokenizer.get_vocab_size() == 8192
    m = si.load(folder)
    for name, text in TEXTS.items():
        want = raw.encode(text, add_special_tokens=False).ids
        assert len(want) > 64, name
        assert tokens.encode_ids(c.tokenizer, text) == want, name
        assert m.to_tokens(text, truncate=True)[0].tolist() == want[:64], name  # the tiny model's context is 64
        assert tokens.ids_to_string(c.tokenizer, want) == text
        calls = []
        spy = SimpleNamespace(encode=lambda s, **k: calls.append(s) or c.tokenizer.encode(s, **k))
        monkeypatch.setattr(tokens, "CHUNK_CHARS", 48)  # many chunks, each cut where the pre-tokenizer cuts anyway
        assert tokens.encode_ids(spy, text) == want, name
        assert len(calls) >= len(text) // 48 and "".join(calls) == text and all(len(s) <= 48 for s in calls)
        assert all(s.startswith(" ") for s in calls[1:]), calls
        monkeypatch.undo()


@pytest.mark.parametrize("run", ["1234567890" * 60, "abc" * 300, "中文文本" * 150, "x" * 700 + "," * 50])
def test_a_long_run_without_spaces_keeps_the_whole_texts_ids(run):
    """A run longer than a chunk with no space to cut before stays in one chunk, so its ids are the whole text's."""
    raw = Tokenizer.from_file(str(SHIPPED_TOKENIZER))
    text = "Some words first, then " + run + " and some words after it."
    assert len(run) > 2 * tokens.CHUNK_CHARS
    assert tokens.encode_ids(raw, text) == raw.encode(text, add_special_tokens=False).ids


# --- what slips past the check: bounded chunks ----------------------------------------------------------------


def test_the_expansion_bound_is_one_id_per_utf8_byte_plus_one():
    def fake(per_byte_extra: int):
        return SimpleNamespace(encode=lambda s, **k: SimpleNamespace(ids=[1] * (len(s.encode()) + per_byte_extra)))

    assert len(tokens.encode_ids(fake(1), "héllo")) == 7  # 6 bytes + a prefix space: the most accepted
    refused(lambda: tokens.encode_ids(fake(2), "héllo"), "5 characters (6 UTF-8 bytes)", "8 token ids", "expands text")
    emoji = "\U0001f331" * 10  # 4 bytes each: a byte-level BPE may give 4 ids per character
    assert len(tokens.encode_ids(fake(0), emoji)) == 40


def test_an_expanding_tokenizer_that_slips_through_is_stopped_after_one_bounded_chunk():
    tok = unchecked(edited(normalizer=EXPANDING))
    calls = []
    spy = SimpleNamespace(encode=lambda s, **k: calls.append(len(s)) or tok.encode(s, **k))
    text = "a" * 100_000  # the dashboard's longest text; encoded whole it needed 3.3 GB and aborted the process
    msg = refused(lambda: tokens.encode_ids(spy, text), "256 characters (256 UTF-8 bytes) at character 0",
                  "1,024,000 token ids", "expands text")
    assert calls == [tokens.CHUNK_CHARS] == [256], msg


# --- a Rust panic is a TokenizationError ------------------------------------------------------------------------


def _real_panic() -> BaseException:
    try:
        unchecked(edited(pre_tokenizer=BACKTRACKING)).encode(BACKTRACKS_ON)
    except BaseException as err:  # noqa: BLE001 - the point: it is no Exception
        return err
    raise AssertionError("the backtracking regex did not panic")


def test_a_real_rust_panic_becomes_a_tokenization_error():
    err = _real_panic()
    assert type(err).__name__ == "PanicException" and not isinstance(err, Exception)  # what passed every handler
    assert tokens.is_rust_panic(err)
    tok = unchecked(edited(pre_tokenizer=BACKTRACKING))
    refused(lambda: tokens.encode_ids(tok, BACKTRACKS_ON), "crashed inside its Rust code while encoding the text",
            "PanicException", "retry-limit")
    m = si.HookedSprout(GPT(Config(vocab_size=8192, context=64, n_layer=1, n_head=2, d_model=16, d_ff=32)).eval(),
                        tokenizer=tok)  # a tokenizer handed to the wrapper directly, past the loader's check
    refused(lambda: m.to_tokens(BACKTRACKS_ON, truncate=True), "PanicException")
    refused(lambda: m.to_str_tokens(BACKTRACKS_ON, truncate=True), "PanicException")


def test_every_rust_call_goes_through_the_panic_guard():
    panic = type(_real_panic())
    boom = SimpleNamespace(encode=_raiser(panic), decode=_raiser(panic), decode_batch=_raiser(panic))
    refused(lambda: tokens.encode_ids(boom, "some text"), "while encoding the text")
    refused(lambda: tokens.ids_to_string(boom, [1, 2]), "while decoding token ids")
    refused(lambda: tokens.ids_to_str_tokens(boom, [1, 2]), "while decoding token ids")
    refused(lambda: tokens.tokenizer_call("reading x", _raiser(panic)), "while reading x")


def _raiser(cls: type):
    def f(*args, **kwargs):
        raise cls("thread panicked: hostile")
    return f


def test_the_panic_guard_lets_other_exceptions_through():
    class PanicException(BaseException):  # how pyo3 names its class, in another module
        pass

    refused(lambda: tokens.tokenizer_call("x", _raiser(PanicException)), "PanicException: thread panicked: hostile")
    for cls in (KeyboardInterrupt, SystemExit, ValueError, GeneratorExit):
        with pytest.raises(cls):
            tokens.tokenizer_call("x", _raiser(cls))


# --- the dashboard shows the error and keeps running ----------------------------------------------------------


def _app(path: str, text: str):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "dashboards" / "app.py"), default_timeout=180)
    at.session_state["model_choice"] = "a checkpoint folder or course .pt…"
    at.session_state["model_path"] = path
    at.session_state["text_choice"] = "type your own…"
    at.session_state["own_text"] = text
    return at.switch_page("views/logit_lens.py")


def _errors(at) -> list[str]:
    assert not at.exception, [e.value for e in at.exception]
    return [e.value for e in at.error]


def test_the_dashboard_shows_a_refused_tokenizer_and_keeps_running(tmp_path, tiny_gpt):
    folder = checkpoint(tmp_path, tiny_gpt, edited(normalizer=EXPANDING), "expanding")
    at = _app(str(folder), "a" * 100_000).run()
    msgs = _errors(at)
    assert msgs and "Could not load" in msgs[0] and "normalizer" in msgs[0], msgs
    at.switch_page("views/anatomy.py").run()  # the session goes on
    assert not at.exception, [e.value for e in at.exception]


def test_the_dashboard_shows_a_panic_that_slips_past_the_check(tmp_path, tiny_gpt, monkeypatch):
    folder = checkpoint(tmp_path, tiny_gpt, edited(pre_tokenizer=BACKTRACKING), "backtracking")
    monkeypatch.setattr(loading, "check_tokenizer", lambda *a, **k: None)  # as if the check had missed it
    at = _app(str(folder), BACKTRACKS_ON).run()
    msgs = _errors(at)
    assert any("PanicException" in m and "crashed inside its Rust code" in m for m in msgs), msgs
    at.switch_page("views/anatomy.py").run()
    assert not at.exception, [e.value for e in at.exception]
