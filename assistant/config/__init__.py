"""Typed settings, one section per stage, built once: TOML file, then environment, then flags.

File sections and keys mirror the dataclasses (``[decoder] backend = "pytorch"``); an
environment variable ``ASSISTANT_<SECTION>_<KEY>`` (``ASSISTANT_DECODER_BACKEND=...``)
overrides the file; command-line flags override both. Every value is checked as it is read:
its type (``2048.7`` is no token count, ``true`` no temperature) and, for numbers, the range
kept in its field's metadata (:mod:`engines.bounds`); an error names the source, the
setting (as config key and flag), the value and the allowed range.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_type_hints

from assistant.config.sections import (
    AsrOptions,
    AudioOptions,
    EchoOptions,
    MetricsOptions,
    ServeSettings,
    SplitterOptions,
    TtsOptions,
    TurnOptions,
    VadOptions,
)
from assistant.config.store_path import StorePathError, check_store_dir
from engines.base import GenerationOptions
from engines.bounds import bounds, out_of_bounds
from engines.serving.address import BadServerAddress, parse_server_address
from engines.tensorrt.options import EngineOptions
from engines.verify import GateOptions
from store.bundled import DEFAULT_LLM

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
    supported family (docs/models.md), or a hub model named ``hf:org/name[@revision]`` such as
    ``hf:Qwen/Qwen2.5-0.5B-Instruct`` (downloaded once into the store, online, pinned to a
    commit: :mod:`store.hub`).

    A GGUF file, or a folder holding one, is converted once into the store
    (:mod:`store.gguf_import`).
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
    # The floor only catches nonsense early; whether the system prompt, a question and a
    # reply fit is checked once the tokenizer is known (assistant.modes.preflight).
    context_tokens: int = field(default=2048, metadata=bounds(min=64, max=131072))
    threads: int = field(default=0, metadata=bounds(min=0, max=1024))
    cuda_graph: str = "auto"  # pytorch: auto (on for CUDA), on, off
    compile: bool = False  # pytorch: torch.compile the CUDA graphs (slower start, faster steps)
    # host:port of 'assistant serve' (Triton): decode there instead of here; the rest stays local.
    server: str = ""

    def __post_init__(self) -> None:
        """Read ``server`` in the forms 'assistant serve' prints (engines.serving.address)."""
        if self.server:
            try:
                self.server = parse_server_address(self.server)
            except BadServerAddress as e:
                raise ValueError(f"server (--llm-server) {e}") from e


# The ranges of the engine's options, so that they are defined once (engines/base.py).
_GENERATION = {f.name: f.metadata for f in dataclasses.fields(GenerationOptions)}


@dataclass
class GenerationSettings:
    """Sampling and stopping; temperature 0 is greedy (reproducible)."""

    max_new_tokens: int = field(default=160, metadata=_GENERATION["max_new_tokens"])
    temperature: float = field(default=0.0, metadata=_GENERATION["temperature"])
    top_k: int = field(default=0, metadata=_GENERATION["top_k"])
    top_p: float = field(default=1.0, metadata=_GENERATION["top_p"])
    repetition_penalty: float = field(default=1.0, metadata=_GENERATION["repetition_penalty"])
    seed: int = field(default=0, metadata=_GENERATION["seed"])
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
    """Turn taking: ``barge_in`` lets user speech interrupt the reply.

    ``auto`` (default): while echo cancellation has converged (full duplex, speakers fine);
    ``on``: always, also without echo cancellation (use a headset); ``off``: never.
    """

    barge_in: str = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.barge_in, bool):  # older config files: barge_in = true
            object.__setattr__(self, "barge_in", "on" if self.barge_in else "off")
        if self.barge_in not in ("auto", "on", "off"):
            raise ValueError(f"barge_in {self.barge_in!r}: use auto, on or off")


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
    gate: GateOptions = field(default_factory=GateOptions)
    metrics: MetricsOptions = field(default_factory=MetricsOptions)
    echo: EchoOptions = field(default_factory=EchoOptions)
    serve: ServeSettings = field(default_factory=ServeSettings)


_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True}
_BOOL_WORDS |= {"0": False, "false": False, "no": False, "off": False}
_KINDS: dict[Any, str] = {
    bool: "true or false (bool)",
    int: "a whole number (int)",
    float: "a number (float)",
    str: "text (str)",
    Path: "a path (str)",
    list[str]: "a list of text, or text separated by commas",
    list[int]: "a list of whole numbers, or numbers separated by commas",
}


def _convert(kind: Any, value: Any) -> Any:
    """``value`` as ``kind``; ``TypeError``/``ValueError`` when it is not one (no silent casts)."""
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.strip().lower()]
    elif kind is int and not isinstance(value, bool):
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            return int(value)
    elif kind is float and not isinstance(value, bool):
        if isinstance(value, int | float | str):
            return float(value)
    elif kind in (str, Path) and isinstance(value, str | Path):
        return kind(value)
    elif kind == list[int]:
        items = value.split(",") if isinstance(value, str) else value
        if isinstance(items, list):
            return [_convert(int, v) for v in items if v != ""]
    elif kind == list[str]:
        if isinstance(value, str):
            return [s for s in value.split(",") if s]
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            return list(value)
    raise TypeError(f"not {_KINDS[kind]}")


def _show(value: Any) -> str:
    """A value as the user wrote it: TOML's ``true``, a variable's text in quotes, a number."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def _coerce(kind: Any, value: Any, f: dataclasses.Field[Any], name: str, where: str) -> Any:
    """``value`` as the field's type, within its range; ``name`` says the setting in errors."""
    args = get_args(kind)
    if type(None) in args:  # X | None: "none" or "" mean None
        if value is None or (isinstance(value, str) and value.lower() in ("", "none")):
            return None
        kind = next(a for a in args if a is not type(None))
    if kind not in _KINDS:
        raise ConfigError(f"{where}: {name}: unsupported setting type {kind}")
    try:
        converted = _convert(kind, value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {name} = {_show(value)} is not {_KINDS[kind]}") from e
    numbers = converted if kind == list[int] else [converted] if kind in (int, float) else []
    for number in numbers:  # each number of a list is held to the field's range
        problem = out_of_bounds(number, f.metadata)
        if problem:
            raise ConfigError(f"{where}: {name} = {_show(value)} {problem}")
    return converted


class _Pending:
    """Values read so far, per section, with where each came from; later sources win."""

    def __init__(self, flags: Mapping[str, str]) -> None:
        self.flags = flags
        self.values: dict[str, dict[str, tuple[Any, str]]] = {}

    def name(self, section: str, key: str) -> str:
        """``[generation] temperature (--temperature)``: the config key, and the flag if any."""
        flag = self.flags.get(f"{section}.{key}")
        return f"[{section}] {key}" + (f" ({flag})" if flag else "")

    def add(self, settings: Settings, section: str, key: str, value: Any, where: str) -> None:
        if section not in {f.name for f in dataclasses.fields(Settings)}:
            raise ConfigError(f"{where}: unknown section [{section}]")
        target = getattr(settings, section)
        fields = {f.name: f for f in dataclasses.fields(target)}
        if key not in fields:
            raise ConfigError(f"{where}: unknown key {key!r} in [{section}] (known: {', '.join(fields)})")
        kind = get_type_hints(type(target))[key]
        coerced = _coerce(kind, value, fields[key], self.name(section, key), where)
        self.values.setdefault(section, {})[key] = (coerced, where)

    def apply(self, settings: Settings) -> None:
        """Build each section once from all its values, so checks across keys see them all."""
        for section, values in self.values.items():
            target = getattr(settings, section)
            try:
                # Stage options are frozen dataclasses: replace the section rather than mutate it.
                built = dataclasses.replace(target, **{k: v for k, (v, _) in values.items()})
                setattr(settings, section, built)
            except ValueError as e:
                wheres = ", ".join(dict.fromkeys(where for _, where in values.values()))
                raise ConfigError(f"{wheres}: [{section}]: {e}") from e


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"cannot read config file {path}: it is not UTF-8 text (byte 0x{e.object[e.start]:02x} "
            f"at offset {e.start}); save it as UTF-8"
        ) from e
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from e
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from e


def load_settings(
    config_file: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    flags: Mapping[str, str] | None = None,
) -> Settings:
    """Build settings from the file, then ``ASSISTANT_*`` variables, then ``overrides``.

    Args:
        config_file: A TOML file; ``None`` reads :func:`default_config_file` when it exists.
        env: Environment to read (``os.environ`` when ``None``).
        overrides: ``{"section.key": value}`` from command-line flags; ``None`` values are skipped.
        flags: ``{"section.key": "--flag"}``: the flag of each setting that has one, for errors.

    Raises:
        ConfigError: Unknown keys, values of the wrong type or out of range, naming where they
            came from, the setting and the allowed range.
    """
    settings = Settings()
    pending = _Pending(flags or {})
    path = config_file or default_config_file()
    if config_file is not None or path.exists():
        for section, values in _read_toml(path).items():
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: top-level key {section!r} must be a [section]")
            for key, value in values.items():
                pending.add(settings, section, key, value, str(path))
    sections = {f.name for f in dataclasses.fields(Settings)}
    for name, value in (os.environ if env is None else env).items():
        if not name.startswith("ASSISTANT_"):
            continue
        rest = name.removeprefix("ASSISTANT_").lower()
        section, _, key = rest.partition("_")
        if section in sections:
            pending.add(settings, section, key, value, f"${name}")
    for dotted, value in (overrides or {}).items():
        if value is not None:
            section, _, key = dotted.partition(".")
            pending.add(settings, section, key, value, "command line")
    pending.apply(settings)
    store_where = pending.values.get("models", {}).get("store_dir", (None, None))[1]
    try:
        check_store_dir(settings.models.store_dir, store_where, os.environ if env is None else env)
    except StorePathError as e:
        raise ConfigError(str(e)) from e
    return settings
