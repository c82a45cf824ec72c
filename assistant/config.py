"""Typed settings, one section per stage, built once: TOML file, then environment, then flags.

File sections and keys mirror the dataclasses (``[decoder] backend = "pytorch"``); an
environment variable ``ASSISTANT_<SECTION>_<KEY>`` (``ASSISTANT_DECODER_BACKEND=...``)
overrides the file; command-line flags override both.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_type_hints

from assistant.asr import AsrOptions
from assistant.audio import AudioOptions
from assistant.splitter import SplitterOptions
from assistant.tts import TtsOptions
from assistant.turn import TurnOptions
from assistant.vad import VadOptions
from engines.base import GenerationOptions
from engines.tensorrt.options import EngineOptions
from models.store import DEFAULT_LLM

DEFAULT_SYSTEM_PROMPT = (
    "You are a friendly voice assistant. Your replies are spoken aloud, so answer in one to "
    "three short sentences of plain speech: no markdown, lists, code, URLs or emoji."
)


class ConfigError(ValueError):
    """A settings file, variable or flag has an unknown key or a bad value."""


def _default_store_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "assistant"


def default_config_file() -> Path:
    """``$XDG_CONFIG_HOME/assistant/config.toml`` (read only when it exists)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "assistant" / "config.toml"


@dataclass
class ModelSettings:
    """Which models to use and where the store lives.

    ``llm`` is a store name (``smollm2-135m-instruct``), a local Hugging Face folder of a
    Llama/Qwen2 model, or a hub model named ``hf:org/name[@revision]`` such as
    ``hf:Qwen/Qwen2.5-0.5B-Instruct`` (downloaded once into the store, online, pinned to a
    commit: :mod:`assistant.hub`).
    """

    store_dir: Path = field(default_factory=_default_store_dir)
    llm: str = DEFAULT_LLM


@dataclass
class DecoderSettings:
    """The LLM backend: ``auto`` (default), ``pytorch``, ``onnxruntime``, ``tensorrt``, ``tensorrt-rtx``.

    ``onnxruntime`` runs the exported ONNX graph on the CPU; the TensorRT backends run an
    engine built per the ``[engine]`` section; ``auto`` picks the fastest one this machine
    runs (ONNX Runtime on a machine without a CUDA GPU) and says why.
    device/dtype ``auto`` pick CUDA fp16 or CPU fp32 (onnxruntime: CPU, fp32 or fp16 graph).
    """

    backend: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    context_tokens: int = 2048
    threads: int = 0
    cuda_graph: str = "auto"  # pytorch: auto (on for CUDA), on, off
    compile: bool = False  # pytorch: torch.compile the CUDA graphs (slower start, faster steps)


@dataclass
class GenerationSettings:
    """Sampling and stopping; temperature 0 is greedy (reproducible)."""

    max_new_tokens: int = 160
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int = 0
    stop_strings: list[str] = field(default_factory=list)

    def options(self) -> GenerationOptions:
        """The engine-level options these settings describe."""
        return GenerationOptions(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            repetition_penalty=self.repetition_penalty,
            seed=self.seed,
            stop_strings=tuple(self.stop_strings),
        )


@dataclass
class DialogueSettings:
    """Conversation behaviour: the system prompt and how much context a reply may use."""

    system_prompt: str = DEFAULT_SYSTEM_PROMPT


@dataclass(frozen=True)
class PipelineSettings:
    """Turn taking: ``barge_in`` lets user speech interrupt the reply (use a headset)."""

    barge_in: bool = False


@dataclass
class Settings:
    """The whole settings tree; each stage receives only its section."""

    models: ModelSettings = field(default_factory=ModelSettings)
    decoder: DecoderSettings = field(default_factory=DecoderSettings)
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    dialogue: DialogueSettings = field(default_factory=DialogueSettings)
    audio: AudioOptions = field(default_factory=AudioOptions)
    vad: VadOptions = field(default_factory=VadOptions)
    turn: TurnOptions = field(default_factory=TurnOptions)
    asr: AsrOptions = field(default_factory=AsrOptions)
    tts: TtsOptions = field(default_factory=TtsOptions)
    splitter: SplitterOptions = field(default_factory=SplitterOptions)
    pipeline: PipelineSettings = field(default_factory=PipelineSettings)
    engine: EngineOptions = field(default_factory=EngineOptions)


def _coerce(kind: Any, value: Any, where: str) -> Any:
    args = get_args(kind)
    if type(None) in args:  # X | None: "none" or "" mean None
        if value is None or (isinstance(value, str) and value.lower() in ("", "none")):
            return None
        kind = next(a for a in args if a is not type(None))
    try:
        if kind is bool:
            if isinstance(value, str):
                if value.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError(value)
                return value.lower() in ("1", "true", "yes", "on")
            return bool(value)
        if kind in (int, float, str, Path):
            return kind(value)
        if kind == list[str]:
            return [s for s in value.split(",") if s] if isinstance(value, str) else list(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: cannot use {value!r} as {getattr(kind, '__name__', kind)}") from e
    raise ConfigError(f"{where}: unsupported setting type {kind}")


def _apply(settings: Settings, section: str, key: str, value: Any, where: str) -> None:
    if section not in {f.name for f in dataclasses.fields(Settings)}:
        raise ConfigError(f"{where}: unknown section [{section}]")
    target = getattr(settings, section)
    hints = get_type_hints(type(target))
    if key not in hints:
        known = ", ".join(f.name for f in dataclasses.fields(target))
        raise ConfigError(f"{where}: unknown key {key!r} in [{section}] (known: {known})")
    # Stage options are frozen dataclasses: replace the section rather than mutate it.
    setattr(settings, section, dataclasses.replace(target, **{key: _coerce(hints[key], value, where)}))


def load_settings(
    config_file: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build settings from the file, then ``ASSISTANT_*`` variables, then ``overrides``.

    Args:
        config_file: A TOML file; ``None`` reads :func:`default_config_file` when it exists.
        env: Environment to read (``os.environ`` when ``None``).
        overrides: ``{"section.key": value}`` from command-line flags; ``None`` values are skipped.

    Raises:
        ConfigError: Unknown keys or values of the wrong type, naming where they came from.
    """
    settings = Settings()
    path = config_file or default_config_file()
    if config_file is not None or path.exists():
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read config file {path}: {e}") from e
        for section, values in data.items():
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: top-level key {section!r} must be a [section]")
            for key, value in values.items():
                _apply(settings, section, key, value, str(path))
    sections = {f.name for f in dataclasses.fields(Settings)}
    for name, value in (os.environ if env is None else env).items():
        if not name.startswith("ASSISTANT_"):
            continue
        rest = name.removeprefix("ASSISTANT_").lower()
        section, _, key = rest.partition("_")
        if section in sections:
            _apply(settings, section, key, value, f"${name}")
    for dotted, value in (overrides or {}).items():
        if value is not None:
            section, _, key = dotted.partition(".")
            _apply(settings, section, key, value, f"flag for {dotted}")
    return settings
