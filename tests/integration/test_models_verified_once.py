"""Stored files: checked cheaply at start, every byte by `assistant models verify`; no torch without need."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from assistant.stages.smart_turn import SmartTurn
from store.bundled import DEFAULT_TURN, ModelStore

ROOT = Path(__file__).resolve().parents[2]


def assistant(*args: str) -> subprocess.CompletedProcess:
    """``python -m assistant ARGS`` from the checkout, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "assistant", *args], capture_output=True, text=True, timeout=300, cwd=ROOT
    )


def flip_byte_keeping_size_and_mtime(path: Path, offset: int) -> None:
    """Change one bit of ``path`` in place, then set its modification time back."""
    st = path.stat()
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_a_byte_changed_in_place_is_missed_at_start_and_named_by_models_verify(store, tmp_path):
    copy = ModelStore(tmp_path)
    shutil.copytree(store.path(DEFAULT_TURN), copy.path(DEFAULT_TURN))  # copy2: mtimes kept
    SmartTurn.from_store(copy)  # the first start hashes the file and remembers it by size and mtime
    [onnx_file] = copy.path(DEFAULT_TURN).glob("*.onnx")
    flip_byte_keeping_size_and_mtime(onnx_file, onnx_file.stat().st_size // 2)

    # Honest limit: a start trusts a file whose size and mtime are unchanged (no 8 MB hash,
    # no 540 MB export hash at every start), so this damage loads without a word.
    SmartTurn.from_store(copy)

    out = assistant("models", "verify", "--store", str(tmp_path))
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"DAMAGED: {onnx_file} does not match its recorded sha256" in out.stdout
    assert f"fix: run 'assistant models fetch --force {DEFAULT_TURN}'" in out.stdout
    assert "0 OK, 1 damaged" in out.stdout and "Traceback" not in out.stderr


def test_models_verify_says_ok_for_an_intact_store(store, tmp_path):
    shutil.copytree(store.path(DEFAULT_TURN), ModelStore(tmp_path).path(DEFAULT_TURN))
    out = assistant("models", "verify", "--store", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"model   {DEFAULT_TURN}  OK" in out.stdout and "1 OK, 0 damaged" in out.stdout


@pytest.mark.parametrize(
    "command", [["--help"], ["devices"], ["models", "list"], ["models", "verify"], ["engine", "list"]]
)
def test_commands_that_need_no_torch_do_not_import_it(command, tmp_path):
    code = (
        "import sys\n"
        "from assistant.__main__ import main\n"
        "try:\n"
        f"    main({[*command, *([] if command == ['--help'] else ['--store', str(tmp_path)])]!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith("torch imported: False"), out.stdout[-500:] + out.stderr


def test_the_cpu_path_probes_the_machine_and_loads_the_tokenizer_without_torch(model_dir):
    """Without an NVIDIA driver, choosing the backend and loading the tokenizer import no torch.

    The ONNX Runtime decoder (the CPU default) never needs it; importing it cost 2.5 s of start-up.
    """
    from engines.selection import nvidia_driver_present

    if nvidia_driver_present():
        pytest.skip("an NVIDIA driver is loaded here: probing CUDA needs torch")
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from engines.selection import choose_backend, probe\n"
        "from assistant.stages.tokenizer import load_tokenizer\n"
        "choice = choose_backend(probe())\n"
        f"tokenizer = load_tokenizer(Path({str(model_dir)!r}))\n"
        "loaded = 'torch' in sys.modules, 'transformers' in sys.modules\n"
        "print(choice.backend, type(tokenizer).__name__, *loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    # Not even transformers: the bundled tokenizer is a plain TokenizersBackend (tokenizers + jinja2).
    assert out.stdout.split() == ["onnxruntime", "PlainTokenizer", "False", "False"], out.stdout + out.stderr


@pytest.mark.slow
def test_a_start_parses_config_json_and_tokenizer_json_once(model_dir, monkeypatch):
    from assistant.config import DecoderSettings, ModelSettings
    from assistant.stages.llm import load_llm
    from models.config import DecoderConfig

    configs: list[Path] = []
    read: list[str] = []
    from_dir, read_text = DecoderConfig.from_dir.__func__, Path.read_text

    def counted_from_dir(cls, folder: Path):  # noqa: ANN001, ANN202
        configs.append(folder)
        return from_dir(cls, folder)

    def counted_read_text(self: Path, *args, **kwargs):  # noqa: ANN202
        read.append(self.name)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(DecoderConfig, "from_dir", classmethod(counted_from_dir))
    monkeypatch.setattr(Path, "read_text", counted_read_text)
    settings = ModelSettings(store_dir=model_dir.parents[1], llm=model_dir.name)
    decoder, _tokenizer = load_llm(settings, DecoderSettings(backend="pytorch", threads=2))
    decoder.close()
    assert configs == [model_dir]  # resolved once; the backend and load_decoder get the parsed config
    assert "tokenizer.json" not in read  # only the tokenizer library parses it (no shape pre-check)
