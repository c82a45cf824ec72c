"""Any GGUF file as the chat model: ``--model FILE.gguf`` (or a folder holding one).

Tiny random GGUFs of the real layout (:mod:`tests.gguf_files`) go through the app's own path
(``assistant.stages.llm``): converted once into a store in ``tmp_path``, then decoded greedily by our
decoder and compared with transformers' own load of the same file.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from assistant.config import DecoderSettings, ModelSettings
from assistant.stages.llm import load_llm, resolve_llm_dir
from engines.progress import EngineProgress
from models.config import SUPPORTED_MODEL_TYPES, UnsupportedModel
from models.weights import CorruptModel, ModelNotFound
from store.bundled import FetchError
from store.records import sha256_file
from tests.helpers.gguf_files import write_tiny_gguf

PROMPT = "<|im_start|>user\nthe cat in the hat<|im_end|>\n<|im_start|>assistant\n"


NEW_TOKENS = 24


CPU = DecoderSettings(backend="pytorch", device="cpu", dtype="fp32", threads=1)


def resolve(store: Path, model: Path | str) -> tuple[Path, list[EngineProgress]]:
    events: list[EngineProgress] = []
    folder = resolve_llm_dir(ModelSettings(store_dir=store, llm=str(model)), events.append)
    return folder, events


def stages(events: list[EngineProgress]) -> list[str]:
    return [e.stage for e in events]


def models_in(store: Path) -> list[str]:
    """Every entry of the store's models folder, hidden (temporary) ones included."""
    folder = store / "models"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_tokens_equal_transformers_own_load_of_the_file(tmp_path, arch):
    gguf = write_tiny_gguf(tmp_path / f"tiny-{arch}.gguf", arch)
    decoder, tokenizer = load_llm(ModelSettings(store_dir=tmp_path / "store", llm=str(gguf)), CPU)
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=gguf.name, dtype=torch.float32)
    ref_tokenizer = AutoTokenizer.from_pretrained(tmp_path, gguf_file=gguf.name)
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    assert ids == ref_tokenizer.encode(PROMPT, add_special_tokens=False)
    assert tokenizer.chat_template == ref_tokenizer.chat_template
    with torch.inference_mode():  # min_new_tokens masks EOS, so both sides give NEW_TOKENS
        out = reference.eval().generate(
            torch.tensor([ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
        )
    expected = out[0, len(ids) :].tolist()
    eos = sorted(decoder.eos_token_ids)
    logits, got = decoder.prefill(ids), []
    for _ in range(NEW_TOKENS):
        logits[eos] = -float("inf")
        got.append(int(logits.argmax()))
        logits = decoder.decode(got[-1])
    decoder.close()
    assert got == expected
    assert len(set(got)) > 3  # a real continuation, not one token repeated


def test_converted_once_then_found_by_file_and_by_folder_without_hashing(tmp_path):
    folder = tmp_path / "downloads"
    folder.mkdir()
    gguf = write_tiny_gguf(folder / "Tiny Model.Q8_0.gguf")
    store = tmp_path / "store"
    first, events = resolve(store, gguf)
    assert "convert" in stages(events) and "cached" not in stages(events)
    assert any(e.message.startswith("hashing") for e in events)
    assert events[-1].step == events[-1].num_steps == 100 and events[-1].finished
    assert any(e.message.startswith("de-quantizing tensor 1/21") for e in events)  # the bar moves per tensor
    steps = [e.step for e in events if not e.message.startswith("hashing")]
    assert steps == sorted(steps)
    assert first.parent == store / "models" and first.name.startswith("Tiny-Model.Q8_0-")
    assert models_in(store) == [first.name]  # no temporary folder left behind
    again, events = resolve(store, gguf)
    assert again == first and stages(events) == ["cached"]  # no conversion, no hashing
    by_folder, events = resolve(store, folder)
    assert by_folder == first and stages(events) == ["cached"]
    copy = shutil.copy2(gguf, tmp_path / "same-bytes.gguf")  # keyed by content, not by name
    by_copy, events = resolve(store, copy)
    assert by_copy == first and stages(events)[-1] == "cached"
    assert [e.message.split()[0] for e in events[:-1]] == ["hashing"]  # a new path: hashed, not converted


def test_a_changed_file_is_noticed_and_converted_anew(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", seed=1)
    store = tmp_path / "store"
    first, _ = resolve(store, gguf)
    write_tiny_gguf(gguf, seed=2)  # same path, other weights
    second, events = resolve(store, gguf)
    assert second != first and "convert" in stages(events)
    assert models_in(store) == sorted([first.name, second.name])


def test_an_ollama_blob_without_a_gguf_name_is_converted(tmp_path):
    blobs = tmp_path / "models" / "blobs"
    blobs.mkdir(parents=True)
    blob = write_tiny_gguf(blobs / f"sha256-{'ab' * 32}")
    folder, events = resolve(tmp_path / "store", blob)
    assert folder.name.startswith("ollama-blob-") and "convert" in stages(events)


def test_a_folder_with_several_gguf_files_lists_them(tmp_path):
    for name in ("a.gguf", "b.gguf"):
        write_tiny_gguf(tmp_path / name)
    with pytest.raises(ModelNotFound, match=r"holds 2 GGUF files \(a\.gguf, b\.gguf\); name one"):
        resolve(tmp_path / "store", tmp_path)


def test_one_part_of_a_split_gguf_is_refused_with_the_merge_command(tmp_path):
    part = write_tiny_gguf(tmp_path / "model-00001-of-00003.gguf", split_count=3)
    with pytest.raises(CorruptModel, match=r"split into 3 files; merge .*llama-gguf-split --merge"):
        resolve(tmp_path / "store", part)


def test_a_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(ModelNotFound, match=r"no such GGUF file .*nope\.gguf; check the path"):
        resolve(tmp_path / "store", tmp_path / "nope.gguf")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("truncated", r"is truncated: its tensors need [\d,]+ bytes, it has [\d,]+; re-download it"),
        ("cut in the header", r"is a damaged or truncated GGUF file .*; re-download it"),
        ("not a gguf", r"is not a GGUF file \(its first bytes are b'PK\\x03\\x04', not b'GGUF'\)"),
        ("empty", r"is not a GGUF file \(an empty file\)"),
        ("a text file", r"notes\.txt is not a GGUF file \(its first bytes are b'shop'"),
    ],
)
def test_a_damaged_gguf_is_refused_with_the_fix_and_nothing_stored(tmp_path, damage, message):
    data = write_tiny_gguf(tmp_path / "good.gguf").read_bytes()
    damaged = {
        "truncated": data[: len(data) - 1000],
        "cut in the header": data[:3000],
        "not a gguf": b"PK\x03\x04" + data[4:],
        "empty": b"",
        "a text file": b"shopping list: eggs",
    }[damage]
    bad = tmp_path / ("notes.txt" if damage == "a text file" else "bad.gguf")
    bad.write_bytes(damaged)
    with pytest.raises(CorruptModel, match=message):
        resolve(tmp_path / "store", bad)
    assert models_in(tmp_path / "store") == []


def huge_declaration(kind: str) -> bytes:
    """The audit's hostile header: one key whose value declares far more than the file holds."""
    key = b"general.architecture"
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    if kind == "array":  # an array of 2^40 uint8 items: 132 bytes in all, as in the issue
        return head + struct.pack("<IIQ", 9, 0, 2**40) + bytes(64)
    return head + struct.pack("<IQ", 8, 2**60) + bytes(64)  # a string of 2^60 bytes


def test_a_string_longer_than_the_file_is_a_damaged_gguf(tmp_path):
    """The reader took the 64 zero bytes after it for the architecture's name: 'unsupported model'."""
    bad = tmp_path / "s.gguf"
    bad.write_bytes(huge_declaration("string"))
    with pytest.raises(CorruptModel, match=r"damaged or truncated GGUF file \(128 bytes; the value of key "):
        resolve(tmp_path / "store", bad)
    assert models_in(tmp_path / "store") == []


def test_an_array_of_2_to_the_40_items_is_a_damaged_gguf_not_a_hang(tmp_path):
    """In a child process, because the gguf reader looped on it while memory grew (15.5 GB at 180 s).

    The timeout and the 4 GB address-space limit only keep the old code from hanging the suite;
    the fix answers at once.
    """
    bad = tmp_path / "b.gguf"
    bad.write_bytes(huge_declaration("array"))
    assert bad.stat().st_size == 132
    code = (
        "import resource, sys; from pathlib import Path\n"
        "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
        "from store.gguf import inspect_gguf\n"
        "from models.files import CorruptModel\n"
        "try:\n    inspect_gguf(Path(sys.argv[1]))\n"
        "except CorruptModel as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    damaged = "is a damaged or truncated GGUF file (132 bytes; the value of key 'general.architecture' "
    assert damaged in out.stdout
    assert "(an array declared with 1,099,511,627,776 items)" in out.stdout and "re-download it" in out.stdout


def test_an_unsupported_architecture_names_the_supported_ones(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "ssm.gguf", "mamba")
    with pytest.raises(UnsupportedModel) as e:
        resolve(tmp_path / "store", gguf)
    assert "holds a 'mamba' model" in str(e.value)
    assert f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}" in str(e.value)
    assert models_in(tmp_path / "store") == []


def test_a_quantisation_that_cannot_be_dequantized_is_named_with_what_works(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "q81.gguf", quant="Q8_1")
    with pytest.raises(UnsupportedModel) as e:  # store.gguf.UnsupportedQuantization
        resolve(tmp_path / "store", gguf)
    assert "stores tensors as Q8_1, which cannot be de-quantized" in str(e.value)
    assert "Q4_K" in str(e.value) and "Q8_0" in str(e.value)


def test_an_unwritable_store_is_named_with_the_fix(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    store = tmp_path / "store"
    store.mkdir()
    (store / "models").write_text("a file where the models folder belongs")
    with pytest.raises(FetchError, match=r"cannot write the converted model into the store .*--store DIR"):
        resolve(store, gguf)


@pytest.fixture
def small_disk(tmp_path):
    """A real 420 KiB file system (tmpfs) for the store; skipped where mounting is not allowed."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", "size=420k", "tmpfs", str(mount)]
    done = subprocess.run(command, capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_no_space_in_the_store_is_named_before_converting(tmp_path, small_disk):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")  # ~0.4 MB of fp32 weights + headroom: too big
    with pytest.raises(FetchError, match=r"no space left in .* free some space, or .*--store DIR"):
        resolve(small_disk / "store", gguf)
    assert models_in(small_disk / "store") == []


def test_a_disk_that_fills_up_while_writing_is_named_and_nothing_is_left(tmp_path, small_disk, monkeypatch):
    """The check before converting is loosened (its headroom), so that the write itself fills the disk."""
    monkeypatch.setattr("store.gguf_import.HEADROOM_BYTES", -(1 << 20))
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    with pytest.raises(FetchError, match=r"no space left in .* free some space, or .*--store DIR"):
        resolve(small_disk / "store", gguf)
    assert models_in(small_disk / "store") == []


def test_an_interrupted_conversion_leaves_nothing_and_the_next_start_converts(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    store = tmp_path / "store"

    def interrupt(event: EngineProgress) -> None:
        if event.message.startswith("writing"):  # Ctrl-C while the weights are written
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        resolve_llm_dir(ModelSettings(store_dir=store, llm=str(gguf)), interrupt)
    assert models_in(store) == []
    folder, events = resolve(store, gguf)
    assert "convert" in stages(events) and models_in(store) == [folder.name]


def test_a_killed_conversion_leaves_a_hidden_folder_that_the_next_one_removes(tmp_path):
    from store.gguf_import import OWNER, store_name

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    store = tmp_path / "store"
    pid = [sys.executable, "-c", "import os; print(os.getpid())"]
    dead = subprocess.run(pid, capture_output=True, text=True)  # a process id that has ended
    abandoned = store / "models" / f".{store_name(gguf, sha256_file(gguf))}-killed"
    abandoned.mkdir(parents=True)
    (abandoned / OWNER).write_text(dead.stdout.strip())
    (abandoned / "out").mkdir()  # what a conversion killed with SIGKILL or SIGHUP leaves
    folder, _ = resolve(store, gguf)
    assert models_in(store) == [folder.name]


def test_the_load_bar_of_the_ui_moves_through_the_conversion(tmp_path):
    from assistant.app import ENGINE_SPAN, EngineSteps

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    seen: list[tuple[str, float]] = []
    settings = ModelSettings(store_dir=tmp_path / "store", llm=str(gguf))
    resolve_llm_dir(settings, EngineSteps(lambda text, fraction: seen.append((text, fraction))))
    fractions = [f for _, f in seen]
    assert fractions == sorted(fractions) and fractions[-1] == ENGINE_SPAN[1]
    assert len(set(fractions)) > 10  # it moves, step by step, not in one jump
    texts = [t for t, _ in seen]
    assert texts[0].startswith("hashing") and any(t.startswith("de-quantizing tensor") for t in texts)
    seen.clear()
    resolve_llm_dir(settings, EngineSteps(lambda text, fraction: seen.append((text, fraction))))
    assert len(seen) == 1 and "converted already" in seen[0][0] and seen[0][1] == ENGINE_SPAN[1]
