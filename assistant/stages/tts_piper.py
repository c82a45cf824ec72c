"""The optional Piper voice (``[tts] engine = "piper"``, ``--tts piper``), streamed sentence by sentence.

piper-tts is GPL-3.0-or-later, so it is an opt-in extra (``scripts/setup.sh --piper``, or
``pip install -e '.[piper]'``), imported here only, and only when chosen. The voice
(``en_US-joe-medium``) comes from the model store like the other bundled models. When
piper-tts or the voice is missing or damaged, :func:`open_synthesizer` says so once, naming
the fix, and speaks with pyttsx3 (espeak-ng) instead: the app never stops for the voice.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from assistant.stages.streams import resample
from assistant.stages.tts import WARM_UP_TEXT, Synthesizer, TtsError, TtsOptions, TtsUnavailable
from store.bundled import BUNDLED, ModelStore
from store.records import check_files

logger = logging.getLogger(__name__)

FIX = "scripts/setup.sh --piper"
NATURAL_RATE_WPM = 175  # rate_wpm at which Piper speaks at the voice's own speed
CLAUSE_END = re.compile(r"(?<=[,;:])\s+")  # "8,849" has no space after its comma: not cut
MIN_CLAUSE_WORDS = 4  # a shorter clause is rendered with the next one


def clauses(text: str) -> list[str]:
    """``text`` cut after its commas, semicolons and colons, each piece at least 4 words long.

    Piper renders a sentence in one model call (about 1 s for 5 s of speech on one loaded
    core), so a long sentence after a short first chunk left the speaker silent until all of
    it was rendered; clause by clause, each plays while the next renders. A comma is a pause
    in speech anyway, so the cut is not heard as one.
    """
    pieces: list[str] = []
    current = ""
    for part in CLAUSE_END.split(text.strip()):
        current = f"{current} {part}".strip()
        if len(current.split()) >= MIN_CLAUSE_WORDS:
            pieces.append(current)
            current = ""
    if current:
        if pieces:
            pieces[-1] = f"{pieces[-1]} {current}"  # a short tail joins the clause before it
        else:
            pieces.append(current)
    return pieces


class PiperUnavailable(TtsUnavailable):
    """piper-tts is not installed, or the Piper voice is missing or damaged."""


def voice_files(name: str, store: ModelStore) -> tuple[Path, Path]:
    """The ``.onnx`` model and ``.onnx.json`` config of a voice: a store name or a ``.onnx`` path.

    A stored voice is checked against the sizes and sampled hashes recorded at fetch.

    Raises:
        PiperUnavailable: The voice is not fetched, not found, or damaged; the message names the fix.
    """
    path = Path(name).expanduser()
    if path.suffix == ".onnx":
        onnx, fix = path, f"point [tts] piper_voice (--piper-voice) at an intact {path.name}"
    elif store.is_present(name):
        folder = store.path(name)
        fix = f"run {FIX} (it fetches the voice again)"
        if problem := check_files(folder):
            raise PiperUnavailable(f"the Piper voice {name} is damaged ({problem}); {fix}")
        found = sorted(folder.glob("*.onnx"))
        if len(found) != 1:
            raise PiperUnavailable(f"{folder} holds {len(found)} .onnx voices, not one; {fix}")
        onnx = found[0]
    elif name in BUNDLED:
        raise PiperUnavailable(f"the Piper voice {name} is not fetched; run {FIX}")
    else:
        stored = ", ".join(n for n, m in BUNDLED.items() if m.kind == "tts")
        raise PiperUnavailable(
            f"no Piper voice {name!r}: give a store name ({stored}) "
            "or a .onnx file with its .onnx.json beside it"
        )
    config = onnx.with_name(onnx.name + ".json")
    for f in (onnx, config):
        if not f.is_file():
            raise PiperUnavailable(f"the Piper voice file {f} is missing; {fix}")
    return onnx, config


class PiperSynthesizer:
    """Renders text with a Piper voice (ONNX Runtime, CPU), one piece per clause as it is ready.

    Stateless between calls and safe from any thread (ONNX Runtime sessions are; piper
    locks its espeak-ng phonemizer): no owner thread. Warmed up on construction, so a
    voice that cannot speak fails here, not in the first turn.

    Raises:
        PiperUnavailable: piper-tts is not installed, or the voice is missing or damaged.
    """

    def __init__(self, options: TtsOptions, store: ModelStore) -> None:
        self.options = options
        try:
            import onnxruntime
            from piper import PiperVoice
            from piper.config import PiperConfig, SynthesisConfig
        except ImportError as e:
            raise PiperUnavailable(f"piper-tts is not installed ({e}); run {FIX}") from e
        onnx, config_path = voice_files(options.piper_voice, store)
        damaged = f"the Piper voice {onnx} cannot be loaded"
        try:
            config = PiperConfig.from_dict(json.loads(config_path.read_text(encoding="utf-8")))
            session_options = onnxruntime.SessionOptions()
            session_options.intra_op_num_threads = options.threads
            session_options.inter_op_num_threads = 1
            session = onnxruntime.InferenceSession(
                str(onnx), sess_options=session_options, providers=["CPUExecutionProvider"]
            )
        except Exception as e:  # bad JSON, a config without a key, a truncated or foreign .onnx
            raise PiperUnavailable(f"{damaged} ({type(e).__name__}: {str(e)[:200]}); run {FIX}") from e
        self._voice: Any = PiperVoice(session=session, config=config)
        self._config = SynthesisConfig(
            length_scale=config.length_scale * NATURAL_RATE_WPM / options.rate_wpm, volume=options.volume
        )
        self.name = onnx.name.removesuffix(".onnx")
        try:
            if self.synthesize(WARM_UP_TEXT).size == 0:
                raise TtsError("no audio")
        except Exception as e:
            raise PiperUnavailable(f"{damaged}: it does not speak ({e}); run {FIX}") from e

    def __enter__(self) -> PiperSynthesizer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def description(self) -> str:
        """The engine and voice, as the status bar and the turn record show them."""
        return f"piper {self.name}"

    def stream(self, text: str) -> Iterator[np.ndarray]:
        """``text`` as audio, piece by piece, each yielded as soon as Piper rendered it.

        A piece is a clause (:func:`clauses`), or a sentence within one (Piper's streaming).
        Lazy: the next piece is rendered only when the caller asks for it, so closing the
        iterator early (a cancelled reply) renders nothing more.

        Yields:
            Mono float32 samples at ``options.sample_rate_hz``.
        """
        for clause in clauses(text):
            for chunk in self._voice.synthesize(clause, self._config):
                audio = resample(chunk.audio_float_array, chunk.sample_rate, self.options.sample_rate_hz)
                if audio.size:
                    yield audio

    def synthesize(self, text: str) -> np.ndarray:
        """Render ``text`` whole; mono float32 at ``options.sample_rate_hz`` (empty for blank text)."""
        pieces = list(self.stream(text))
        return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)

    def close(self) -> None:
        """Nothing to stop: no thread of its own (idempotent, like the pyttsx3 synthesizer's)."""


def open_synthesizer(
    options: TtsOptions, store: ModelStore, notice: Callable[[str], None]
) -> Synthesizer | PiperSynthesizer:
    """The configured synthesizer; Piper falls back to pyttsx3 with one ``notice`` naming the fix.

    Raises:
        TtsUnavailable: pyttsx3 itself cannot start (espeak-ng missing).
    """
    if options.engine == "piper":
        try:
            return PiperSynthesizer(options, store)
        except PiperUnavailable as e:
            logger.warning("piper unavailable: %s", e)
            notice(f"Piper voice unavailable: {e}; speaking with pyttsx3 (espeak-ng) instead")
    return Synthesizer(options)
