"""Damaged model files, malformed cache records, leftovers and races, as a user meets them.

Issue #13, defects 8-10. Every case works on a copy of the store in ``tmp_path`` (model files
are symlinked, and a file a case damages is replaced, never written through the link), so
the real store stays as it is. ``slow`` cases load the real SmolLM2 or start the app.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from assistant.config import ModelSettings
from assistant.stages.dialogue import Dialogue
from assistant.stages.llm import resolve_llm_config
from assistant.stages.tokenizer import load_tokenizer
from bench.speech import speak
from engines.cache_lock import OWNER_FILE
from engines.driver import DecoderDriver
from engines.onnx_export import SIDECAR, ExportError, ExportOptions, check_export, export_decoder
from engines.tensorrt import builder, cache
from engines.tensorrt.builder import build_engine
from models.config import DecoderConfig, InvalidConfig
from models.weights import CorruptModel
from store.bundled import DEFAULT_LLM, DEFAULT_TURN, ModelStore
from store.records import MANIFEST, check_files, record_files
from tests.helpers.engines import TINY
from tests.helpers.families import qwen2

ROOT = Path(__file__).resolve().parents[2]


def assistant(*args: str, stdin: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m assistant ARGS`` from the checkout, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "assistant", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def link_model(src: Path, dst: Path, *, manifest: bool = True) -> Path:
    """``dst`` with a symlink to each file of ``src`` (not its caches: onnx/ stays behind).

    Without ``manifest`` it is a plain local folder (``--model DIR``), not a stored model.
    """
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and (manifest or f.name != MANIFEST):
            (dst / f.name).symlink_to(f)
    return dst


def replace(path: Path, data: bytes) -> None:
    """Write ``path`` anew: a symlink is removed first, so the real store is never touched."""
    path.unlink()
    path.write_bytes(data)


@pytest.fixture(scope="module")
def llm_record(model_dir: Path, tmp_path_factory) -> dict:
    """The file record a fetch by this version writes for SmolLM2 (sizes, sha256s)."""
    return record_files(link_model(model_dir, tmp_path_factory.mktemp("record") / DEFAULT_LLM))


def store_copy(root: Path, model_dir: Path, record: dict | None) -> Path:
    """A store under ``root`` holding SmolLM2 (linked).

    ``record``: the file record, as this version fetches it; ``None``: none, as an older
    version fetched it (whatever the store the tests run on was fetched by).
    """
    folder = link_model(model_dir, root / "models" / DEFAULT_LLM)
    manifest = json.loads((model_dir / MANIFEST).read_text())
    manifest.pop("files", None)
    replace(
        folder / MANIFEST, json.dumps(manifest if record is None else {**manifest, "files": record}).encode()
    )
    return folder


def overwrite_with_nan(weights: Path, src: Path) -> None:
    """``weights`` becomes ``src`` with every tensor byte NaN: same size, same header."""
    with src.open("rb") as f:
        head = f.read(8)
        header = f.read(struct.unpack("<Q", head)[0])
    data_bytes = src.stat().st_size - 8 - len(header)
    weights.unlink()
    with weights.open("wb") as out:
        out.write(head + header)
        block = np.full(1 << 20, np.nan, np.float32).tobytes()
        for start in range(0, data_bytes, len(block)):
            out.write(block[: min(len(block), data_bytes - start)])
    assert weights.stat().st_size == src.stat().st_size


# Defect 8: damaged model files.


@pytest.mark.slow
def test_weights_overwritten_with_nan_give_a_clear_error_not_empty_replies(model_dir, llm_record, tmp_path):
    folder = store_copy(tmp_path, model_dir, llm_record)
    overwrite_with_nan(folder / "model.safetensors", model_dir / "model.safetensors")
    out = assistant("chat", "--store", str(tmp_path), "--backend", "pytorch", stdin="What is 2+2?\n")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "model.safetensors does not match its recorded sha256" in out.stderr
    assert f"run 'assistant models fetch --force {DEFAULT_LLM}'" in out.stderr
    assert "Traceback" not in out.stderr and "[ttft" not in out.stdout  # no (empty) reply


@pytest.mark.slow
def test_nan_weights_in_a_store_fetched_before_records_are_still_refused(model_dir, tmp_path):
    from assistant.config import DecoderSettings
    from assistant.stages.llm import load_llm

    folder = store_copy(tmp_path, model_dir, record=None)  # no file record to compare with
    overwrite_with_nan(folder / "model.safetensors", model_dir / "model.safetensors")
    with pytest.raises(CorruptModel, match="holds NaN or Inf values") as info:
        load_llm(ModelSettings(store_dir=tmp_path), DecoderSettings(backend="pytorch", threads=2))
    assert f"assistant models fetch --force {DEFAULT_LLM}" in str(info.value)


class NanStep:
    """A step whose logits are NaN: what damaged weights or a damaged engine give."""

    def __init__(self, inner):
        self.inner, self.name, self.capacity_tokens = inner, inner.name, inner.capacity_tokens
        self.identity = inner.identity

    def forward(self, token_ids, start_pos):
        return self.inner.forward(token_ids, start_pos) * np.float32("nan")

    def close(self):
        self.inner.close()


@pytest.mark.slow
def test_nan_logits_at_warm_up_are_an_error_naming_the_fix(decoder, tokenizer):
    broken = DecoderDriver(NanStep(decoder.step), tokenizer, sorted(decoder.eos_token_ids))
    dialogue = Dialogue(broken, tokenizer, "You are helpful.", decoder_options())
    with pytest.raises(CorruptModel, match=r"NaN/Inf logits.*assistant models fetch --force"):
        dialogue.warm_up()


def decoder_options():
    from engines.base import GenerationOptions

    return GenerationOptions(max_new_tokens=8)


@pytest.mark.slow
def test_models_fetch_check_hashes_every_byte_and_names_the_damaged_file(model_dir, llm_record, tmp_path):
    store_copy(tmp_path, model_dir, llm_record)  # intact
    # A real fetch (12 MB from the package index) writes the record the checks read.
    turn = ModelStore(tmp_path).fetch(DEFAULT_TURN, progress=lambda _msg: None)
    [onnx_file] = turn.glob("*.onnx")
    record = json.loads((turn / MANIFEST).read_text())["files"][onnx_file.name]
    assert record["size"] == onnx_file.stat().st_size and len(record["sha256"]) == 64
    out = assistant("models", "fetch", "--check", "--store", str(tmp_path), DEFAULT_TURN)
    assert out.returncode == 0 and out.stdout.startswith(f"{DEFAULT_TURN}: intact (1 files"), out.stdout
    data = bytearray(onnx_file.read_bytes())
    data[65536 + 1000] ^= 0x01  # between two sampled blocks: one bit the cheap check cannot see
    onnx_file.write_bytes(bytes(data))
    assert check_files(turn) is None and check_files(turn, full=True) is not None
    out = assistant("models", "fetch", "--check", "--store", str(tmp_path))
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert f"{DEFAULT_LLM}: intact (" in out.stdout
    assert any(
        line.startswith(f"{DEFAULT_TURN}: DAMAGED: {onnx_file} does not match its recorded sha256")
        and f"'assistant models fetch --force {DEFAULT_TURN}'" in line
        for line in lines
    ), out.stdout
    assert "whisper-tiny.en: not fetched" in out.stdout and "Traceback" not in out.stderr


TOKENIZER_DAMAGE = {
    "a list": "[]",
    "a string": '"tokenizer"',
    "no model": '{"version": "1.0", "added_tokens": []}',
    "added_tokens a number": '{"model": {"type": "BPE"}, "added_tokens": 3}',
    "not JSON": "{not json",
    "empty BPE model": '{"model": {"type": "BPE"}, "added_tokens": []}',
}


@pytest.mark.parametrize("damage", TOKENIZER_DAMAGE)
def test_tokenizer_json_of_the_wrong_shape_is_named_with_the_fix(model_dir, tmp_path, damage):
    folder = link_model(model_dir, tmp_path / "model", manifest=False)
    replace(folder / "tokenizer.json", TOKENIZER_DAMAGE[damage].encode())
    with pytest.raises(CorruptModel, match="tokenizer.json") as info:
        load_tokenizer(folder)
    assert f"replace {folder} with an intact copy" in str(info.value)


CONFIG_DAMAGE = {
    "missing hidden_size": (
        lambda c: {k: v for k, v in c.items() if k != "hidden_size"},
        "'hidden_size' is missing",
    ),
    "heads a string": (lambda c: {**c, "num_attention_heads": "9"}, "'num_attention_heads' is '9'"),
    "eos a string": (lambda c: {**c, "eos_token_id": "2"}, "'eos_token_id' is '2'"),
    "a list": (lambda c: [c], "list where a JSON object belongs"),
}


@pytest.mark.parametrize("damage", CONFIG_DAMAGE)
def test_config_json_missing_a_setting_is_named_with_the_fix(model_dir, tmp_path, damage):
    folder = link_model(model_dir, tmp_path / "model", manifest=False)
    change, expected = CONFIG_DAMAGE[damage]
    replace(
        folder / "config.json",
        json.dumps(change(json.loads((model_dir / "config.json").read_text()))).encode(),
    )
    with pytest.raises(InvalidConfig) as info:
        DecoderConfig.from_dir(folder)
    assert str(folder / "config.json") in str(info.value) and expected in str(info.value)


SIZE_DAMAGE = {
    # setting changed in SmolLM2's config.json -> what the message says (the weights: 30 layers, 576 wide)
    "layers": ({"num_hidden_layers": 1_000_000}, "'num_hidden_layers' is 1,000,000, but {w} holds 30 layers"),
    "hidden": (
        {"hidden_size": 999_999},
        "'hidden_size' is 999,999, but {w} holds embed_tokens.weight of shape",
    ),
    "vocab": ({"vocab_size": 1000}, "'vocab_size' is 1,000, but {w} holds embed_tokens.weight"),
    "mlp": (
        {"intermediate_size": 7},
        "'intermediate_size' is 7, but {w} holds layers.0.mlp.down_proj.weight",
    ),
    "heads": ({"num_attention_heads": 18}, "'num_attention_heads' x 'head_dim' (18 x 64) is 1,152, but {w}"),
}


@pytest.mark.parametrize("damage", SIZE_DAMAGE)
def test_config_sizes_the_weights_do_not_have_are_refused_before_anything_is_built(
    model_dir, tmp_path, damage
):
    """Checked against the safetensors header only: a million layers were built until memory ran out."""
    folder = link_model(model_dir, tmp_path / "model", manifest=False)
    change, expected = SIZE_DAMAGE[damage]
    replace(
        folder / "config.json",
        json.dumps({**json.loads((model_dir / "config.json").read_text()), **change}).encode(),
    )
    with pytest.raises(InvalidConfig) as info:
        resolve_llm_config(ModelSettings(llm=str(folder)))
    text = str(info.value)
    assert (
        text.startswith(f"{folder / 'config.json'}: ")
        and expected.format(w=folder / "model.safetensors") in text
    )
    assert text.endswith(
        f"the config does not belong to these weights; replace {folder} with an intact copy of the model"
    )


@pytest.mark.slow
@pytest.mark.parametrize("setting", [{"hidden_size": 999_999}, {"hidden_size": 577}])
def test_cli_names_an_impossible_hidden_size_in_one_line(model_dir, tmp_path, setting):
    """It was blamed on the tokenizer files, or shown as a 275-line dump of mismatched shapes."""
    folder = link_model(model_dir, tmp_path / "model", manifest=False)
    replace(
        folder / "config.json",
        json.dumps({**json.loads((model_dir / "config.json").read_text()), **setting}).encode(),
    )
    out = assistant("chat", "--model", str(folder), "--backend", "pytorch", stdin="hi\n")
    assert out.returncode == 2, out.stderr
    (line,) = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert (
        line.startswith(f"error: {folder / 'config.json'}: 'hidden_size' is ")
        and "embed_tokens.weight" in line
    )
    assert (
        "size mismatch" not in out.stderr and "tokenizer" not in out.stderr and "Traceback" not in out.stderr
    )


BOOM = "{{ raise_exception('template boom') }}"
# SmolLM2's own template, which raises on a message with "again": the first turn is answered.
LATE_BOOM = (
    "{% for m in messages %}{% if 'again' in m['content'] %}{{ raise_exception('template boom') }}"
    "{% endif %}{% endfor %}"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "template"),
    [("chat", BOOM), ("chat", LATE_BOOM), ("run", BOOM)],
    ids=["chat at start", "chat at the second turn", "run --input"],
)
def test_a_chat_template_that_raises_is_one_line_naming_the_template_file(model_dir, tmp_path, how, template):
    """It was a traceback ending in jinja2's 'TemplateError: template boom'."""
    folder = link_model(model_dir, tmp_path / "model", manifest=False)
    original = (model_dir / "chat_template.jinja").read_text()
    text = template + original if template == LATE_BOOM else template
    replace(folder / "chat_template.jinja", text.encode())
    if how == "chat":
        out = assistant("chat", "--model", str(folder), "--backend", "pytorch", "--max-new-tokens", "4",
                        stdin="Hello.\nAnd again?\n")  # fmt: skip
    else:
        speak("What is the capital of France?", tmp_path, "question")
        out = assistant("run", "--model", str(folder), "--backend", "pytorch", "--input",
                        str(tmp_path / "question.wav"), "--output", str(tmp_path / "reply.wav"))  # fmt: skip
    assert out.returncode == 2, out.stderr
    named = f"error: the chat template in {folder / 'chat_template.jinja'} fails (TemplateError: "
    fix = f"template boom); fix the template or replace {folder} with an intact copy of the model"
    assert named + fix in out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("template boom") == 1, out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tokenizer.json", "config.json"])
def test_cli_names_the_damaged_file_instead_of_a_traceback(model_dir, tmp_path, name):
    folder = link_model(model_dir, tmp_path / "model", manifest=False)
    if name == "tokenizer.json":
        replace(folder / name, b'{"version": "1.0", "added_tokens": []}')
    else:
        config = json.loads((model_dir / name).read_text())
        replace(folder / name, json.dumps({k: v for k, v in config.items() if k != "hidden_size"}).encode())
    out = assistant("chat", "--model", str(folder), "--backend", "pytorch", stdin="hi\n")
    assert out.returncode == 2, out.stderr
    assert f"error: {folder / name}" in out.stderr or str(folder / name) in out.stderr
    assert "Traceback" not in out.stderr and f"replace {folder} with an intact copy" in out.stderr


# Defect 9: cache records of the wrong shape.


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random-weight Qwen2 folder with its fp32 and fp16 exports (~1 s each)."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny") / "tiny-qwen2"
    qwen2().save_pretrained(folder)
    for dtype in ("fp32", "fp16"):
        export_decoder(folder, ExportOptions(dtype=dtype))
    return folder


@pytest.fixture
def small_disk(tiny_model, tmp_path) -> Iterator[Path]:
    """The tiny model (no exports) on a real tmpfs with 64 KiB to spare; skipped where mounting is refused."""
    weights = sum(p.stat().st_size for p in tiny_model.iterdir() if p.is_file())
    mount = tmp_path / "small-disk"
    mount.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", f"size={weights // 1024 + 64}k", "tmpfs", str(mount)]
    done = subprocess.run(command, capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    shutil.copytree(tiny_model, mount / tiny_model.name, ignore=shutil.ignore_patterns("onnx"))
    yield mount / tiny_model.name
    subprocess.run(["umount", "--lazy", str(mount)], check=True)  # lazy: a file still open does not block it


@pytest.mark.parametrize("when", ["before exporting", "while writing"])
def test_a_full_disk_at_the_first_export_says_how_much_space_it_needs(small_disk, monkeypatch, when):
    """It said only "[Errno 28] No space left on device"."""
    from models.shapes import parameter_count

    if when == "while writing":  # an estimate too low lets the export start and fill the disk
        monkeypatch.setattr("engines.onnx_export.parameter_count", lambda d: parameter_count(d) // 8)
    with pytest.raises(ExportError) as info:
        export_decoder(small_disk, ExportOptions(dtype="fp32"))
    said = str(info.value)
    where = small_disk / "onnx"
    assert said.startswith(f"no space left under {where} for the ONNX export (fp32): it needs about "), said
    assert re.search(r"MB while it is written \([\d,]+ MB kept\), [\d,]+ MB are free; free some space there, "
                     r"or decode with --backend pytorch \(no export\)$", said), said  # fmt: skip
    assert not [p for p in (small_disk / "onnx").glob(".*") if p.is_dir()]  # no staging folder left


def damage_export_record(folder: Path, how: str) -> None:
    path = folder / SIDECAR
    record = json.loads(path.read_text())
    if how == "no metadata":
        del record["metadata"]
    elif how == "emptied files, truncated graph":
        record["files"] = {}
        graph = folder / "decoder.onnx"
        graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 2])
    elif how == "a file entry of the wrong type":
        record["files"]["decoder.onnx"] = "ok"
    elif how == "metadata a list":
        record["metadata"] = list(record["metadata"].items())
    elif how == "a list":
        record = [record]
    path.write_text(json.dumps(record))


@pytest.mark.parametrize(
    "how",
    [
        "no metadata",
        "emptied files, truncated graph",
        "a file entry of the wrong type",
        "metadata a list",
        "a list",
    ],
)
def test_malformed_export_record_means_export_again_with_a_log_line(tiny_model, tmp_path, how, caplog):
    model = tmp_path / tiny_model.name
    shutil.copytree(tiny_model, model)
    good = export_decoder(model, ExportOptions(dtype="fp32"))
    assert good.cache_hit
    damage_export_record(good.path.parent, how)
    assert check_export(good.path.parent) is not None
    with caplog.at_level(logging.WARNING, logger="engines.onnx_export"):
        again = export_decoder(model, ExportOptions(dtype="fp32"))
    assert not again.cache_hit and again.path == good.path
    assert "cached export unusable, exporting again" in caplog.text and SIDECAR in (again.notice or "")
    assert check_export(again.path.parent) is None


def engine_record(**changes) -> dict:
    """What build_engine records for an engine (hand-written: no TensorRT build needed)."""
    record = {
        "key": "0" * 64, "flavour": "tensorrt-rtx", "version": "1.7.1.116", "targets": ["sm89"],
        "device": "", "precision": "fp16", "strongly_typed": True, "onnx_sha256": "1" * 64,
        "contract": "past-present-concat/1", "workspace_mib": 1024, "optimization_level": 3,
        "builder_code_sha256": "2" * 64, "model_id": "tiny-qwen2", "built_at": "2026-12-03T08:00:00+00:00",
        "build_s": 2.5, "onnx": {"path": "/x/decoder.onnx", "dtype": "fp16"}, "verified": None,
        "profile": {"prefill_min_tokens": 1, "prefill_opt_tokens": 16, "prefill_max_tokens": 64,
                    "context_opt_tokens": 64, "context_max_tokens": 256, "decode_profile": False},
    }  # fmt: skip
    return {**record, **changes}


MALFORMED_ENGINE_RECORDS = {
    "verified yes": (lambda r: {**r, "verified": "yes"}, "'verified'"),
    "verified without passed": (lambda r: {**r, "verified": {"passed": "yes"}}, "'verified'"),
    "size a string": (
        lambda r: {**r, "engine": {**r["engine"], "size": str(r["engine"]["size"])}},
        "'engine'",
    ),
    "targets a string": (lambda r: {**r, "targets": "sm89"}, "'targets'"),
    "profile a list": (lambda r: {**r, "profile": [1, 16, 64]}, "'profile'"),
    "a list": (lambda r: [r], "unreadable"),  # handled well before #13 too: kept as it is
}


@pytest.mark.parametrize("how", MALFORMED_ENGINE_RECORDS)
def test_malformed_engine_record_is_listed_unusable_and_never_a_cache_hit(tmp_path, how):
    folder = tmp_path / "engines" / "tiny-qwen2-tensorrt-rtx-sm89-fp16-000000000000"
    written = cache.write_entry(folder, b"engine bytes" * 10, engine_record())
    assert cache.check_entry(folder, written) is None  # the intact record is a hit
    change, field = MALFORMED_ENGINE_RECORDS[how]
    (folder / cache.RECORD_FILE).write_text(json.dumps(change(written)))
    [entry] = cache.list_entries(tmp_path / "engines")
    assert entry.problem and field in entry.problem and "engine.json is unreadable" in entry.problem
    assert entry.describe() == entry.problem
    assert cache.check_entry(folder, written) is not None


def test_engine_list_shows_a_malformed_record_as_unusable(tmp_path):
    folder = tmp_path / "engines" / "tiny-qwen2-tensorrt-rtx-sm89-fp16-000000000000"
    written = cache.write_entry(folder, b"engine bytes" * 10, engine_record())
    (folder / cache.RECORD_FILE).write_text(json.dumps({**written, "verified": "yes"}))
    out = assistant("engine", "list", "--store", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "UNUSABLE" in out.stdout and "'verified' is 'yes'" in out.stdout
    assert "Traceback" not in out.stderr


def fake_build(*_args, **_kwargs) -> bytes:
    return b"serialized engine" * 64  # the builder's output, without TensorRT's minutes


def test_build_rebuilds_an_entry_whose_record_is_malformed(tiny_model, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(builder, "compile_engine", fake_build)
    exported = export_decoder(tiny_model, ExportOptions(dtype="fp16"))
    first = build_engine(exported, TINY, tmp_path)
    record = first.path.parent / cache.RECORD_FILE
    record.write_text(json.dumps({**json.loads(record.read_text()), "verified": "yes"}))
    with caplog.at_level(logging.WARNING, logger="engines.tensorrt.builder"):
        again = build_engine(exported, TINY, tmp_path)
    assert not again.cache_hit and "'verified'" in (again.notice or "")
    assert "cached engine unusable, building again" in caplog.text
    assert cache.check_entry(again.path.parent, again.record) is None


# Defect 10: leftovers and races.


@pytest.mark.slow
@pytest.mark.parametrize("after_s", [0.0, 0.5], ids=["while TTS starts", "during the turn"])
def test_sigterm_in_file_mode_leaves_no_temporary_files(tmp_path, after_s):
    speak("What is the capital of France?", tmp_path, "question")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cmd = [sys.executable, "-m", "assistant", "run", "--input", str(tmp_path / "question.wav"),
           "--output", str(tmp_path / "reply.wav"), "--backend", "pytorch"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 240
    while not list(tmp.glob("assistant-tts-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp.glob("assistant-tts-*")), "TTS never started"
    time.sleep(after_s)
    assert proc.poll() is None, "the turn ended before the signal"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert not list(tmp.glob("assistant-tts-*")) and "Traceback" not in stderr


def staging(entry: Path, suffix: str, *, owner: bool, age_s: float = 0.0) -> Path:
    """A staging folder as an export leaves it (``owner``: made by a version with locks)."""
    folder = entry.parent / f".{entry.name}-{suffix}"  # what tempfile names one
    (folder / "out" / "raw").mkdir(parents=True)
    (folder / "out" / "raw" / "decoder.onnx").write_bytes(b"\0" * 1_000_000)
    if owner:
        (folder / OWNER_FILE).write_text("12345\n")
    for path in (*folder.rglob("*"), folder):
        os.utime(path, (time.time() - age_s, time.time() - age_s))
    return folder


def test_export_sweeps_staging_left_by_a_killed_export_but_not_a_running_one(tiny_model, tmp_path):
    model = tmp_path / tiny_model.name
    shutil.copytree(tiny_model, model)
    entry = export_decoder(model, ExportOptions(dtype="fp32")).path.parent
    killed = staging(entry, "k1ll3d00", owner=True)  # its lock went with its process
    old = staging(entry, "o1dv3r00", owner=False, age_s=2 * 3600)  # a version before locks, long gone
    recent = staging(entry, "r3c3nt00", owner=False)  # a version before locks: may be running
    fp16 = next(p for p in entry.parent.iterdir() if p.name.startswith("decoder-fp16-"))
    live = staging(fp16, "runn1ng0", owner=True)
    holder = subprocess.Popen(  # another process exporting fp16 right now: it holds the lock
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from engines.cache_lock import EntryLock; EntryLock(Path(sys.argv[1])).acquire(); "
         "print('held', flush=True); time.sleep(120)", str(fp16)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        assert export_decoder(model, ExportOptions(dtype="fp32")).cache_hit
        assert not killed.exists() and not old.exists()
        assert recent.exists() and live.exists()
    finally:
        holder.kill()
        holder.wait()
    export_decoder(model, ExportOptions(dtype="fp32"))
    assert not live.exists()  # its process is gone


@pytest.mark.slow
def test_engine_clear_removes_what_a_killed_export_left(model_dir, tmp_path):
    folder = store_copy(tmp_path, model_dir, record=None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "assistant", "engine", "export", "--store", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < deadline:
        staged = list((folder / "onnx").glob(".decoder-fp32-*/out/raw"))
        if staged:
            break
        time.sleep(0.05)
    proc.kill()  # SIGKILL: nothing of the process runs any more
    proc.wait()
    [leftover] = list((folder / "onnx").glob(".decoder-fp32-*"))
    out = assistant("engine", "clear", "--store", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert f"removed {leftover}" in out.stdout and "interrupted build or export" in out.stdout
    assert not leftover.exists()


@pytest.mark.parametrize("stage", ["save", "done"])
def test_engine_clear_during_a_build_skips_it_and_the_build_keeps_its_engine(
    tiny_model, tmp_path, monkeypatch, stage
):
    monkeypatch.setattr(builder, "compile_engine", fake_build)
    exported = export_decoder(tiny_model, ExportOptions(dtype="fp16"))
    at_stage, go_on = threading.Event(), threading.Event()

    def progress(event):  # the build pauses here: before writing ("save") or reporting ("done")
        if event.stage == stage:
            at_stage.set()
            assert go_on.wait(120)

    result = {}
    build = threading.Thread(
        target=lambda: result.update(
            built=build_engine(exported, TINY, tmp_path / "engines", progress=progress)
        )
    )
    build.start()
    try:
        assert at_stage.wait(60)
        out = assistant("engine", "clear", "--store", str(tmp_path))
    finally:
        go_on.set()
        build.join(60)
    assert out.returncode == 0, out.stderr
    assert (
        "skipped tiny-qwen2-tensorrt-rtx-sm89-fp16-" in out.stdout and "being built by process" in out.stdout
    )
    built = result["built"]
    assert built.path.is_file() and cache.check_entry(built.path.parent, built.record) is None
    out = assistant("engine", "clear", "--store", str(tmp_path))  # once built, clear removes it
    assert f"removed {built.path.parent.name}" in out.stdout and not built.path.exists()
