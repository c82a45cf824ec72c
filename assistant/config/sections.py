"""The settings sections each stage receives: one frozen dataclass a stage, ranges beside each field.

The stages (``assistant.stages``), the metrics endpoint and ``assistant serve`` import their
section from here, so the settings tree (:mod:`assistant.config`) needs none of their code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engines.bounds import bounds
from store.bundled import DEFAULT_PIPER_VOICE, DEFAULT_TURN

DETECTIONS = ("smart-turn", "off")  # [turn] detection
ENGINES = ("pyttsx3", "piper")  # [tts] engine
ECHO_MODES = ("auto", "on", "off")  # [echo] enabled
ASR_WINDOWS = ("fit", "full")  # [asr] window


@dataclass(frozen=True)
class AudioOptions:
    """Devices by name substring or index (``None``: the system default) and block size.

    ``stall_ms``: a stream that delivered audio and then none for this long counts as lost.
    """

    input_device: str | None = None
    output_device: str | None = None
    block_ms: int = field(default=32, metadata=bounds(min=1, max=1000))
    stall_ms: int = field(default=1000, metadata=bounds(min=200, max=60000))


@dataclass(frozen=True)
class VadOptions:
    """Endpointing thresholds.

    A turn needs ``min_speech_ms`` of speech; with fixed-silence endpointing it ends after
    ``end_silence_ms`` of silence (400 ms: shorter cuts people off at commas and breaths,
    longer adds directly to voice-to-voice latency; see docs); with turn detection
    (``assistant.stages.endpoint``) a model decides. ``onset_ms`` of speech raises ``SpeechOnset`` (what
    barge-in reacts to: short, so the reply stops within 200 ms). ``pre_roll_ms`` of audio
    before the onset is kept so soft first syllables reach ASR. An utterance that reaches
    ``max_utterance_s`` is cut at the quietest 32 ms chunk of its last ``cut_search_ms``
    (between words rather than inside one); the rest starts the next turn at once.
    ``over_reply_threshold`` replaces ``threshold`` while a reply plays and is heard (full
    duplex, a headset): AEC3's double-talk suppression takes the start of a word said over
    the reply's echo, and a quick "Stop." then peaked at 0.3-0.5 and was never heard.
    """

    threshold: float = field(default=0.5, metadata=bounds(min=0.0, max=1.0))
    over_reply_threshold: float = field(default=0.4, metadata=bounds(min=0.0, max=1.0))
    neg_threshold: float = field(default=0.35, metadata=bounds(min=0.0, max=1.0))
    min_speech_ms: int = field(default=250, metadata=bounds(min=0, max=60_000))
    onset_ms: int = field(default=96, metadata=bounds(min=0, max=60_000))
    end_silence_ms: int = field(default=400, metadata=bounds(min=1, max=60_000))
    pre_roll_ms: int = field(default=300, metadata=bounds(min=0, max=60_000))
    max_utterance_s: float = field(default=20.0, metadata=bounds(above=0.0, max=3600.0))
    cut_search_ms: int = field(default=1000, metadata=bounds(min=0, max=60_000))


@dataclass(frozen=True)
class TurnOptions:
    """How the end of a turn is found, and what runs while it is undecided.

    ``speculate``: after ``speculate_after_ms`` of silence, transcribe and start the reply
    while the policy decides; nothing plays and nothing enters the history until the turn is
    confirmed, and speech that comes back discards the work.
    ``partials``: re-transcribe the utterance in progress every ``partial_interval_ms`` for
    the live transcript: ``on``, ``off``, or ``auto``: on where ASR has room (a CUDA ASR
    device, or 2 cores or more). With the fitted window and partials bounded to it, they no
    longer delay the answer on 2 CPU cores (docs/benchmarks.md); with Whisper's 30 s window
    they did (+350 ms median voice-to-voice).
    ``continuation_ms``: in full duplex, words spoken over a reply that begin this soon after
    its first audio are the rest of the question: the reply is dropped and the question
    answered whole (docs/voice.md, "Full duplex").
    ``question_ms``: when the speculative transcript of the pause is a question of five words
    or more, the turn ends after this much silence whatever Smart Turn says (0: never; needs
    ``speculate``).
    """

    detection: str = "smart-turn"
    model: str = DEFAULT_TURN
    pause_ms: int = field(default=200, metadata=bounds(min=1, max=60_000))
    max_silence_ms: int = field(default=1200, metadata=bounds(min=1, max=60_000))
    question_ms: int = field(default=500, metadata=bounds(min=0, max=60_000))
    threshold: float = field(default=0.5, metadata=bounds(min=0.0, max=1.0))
    rescore_ms: int = field(default=300, metadata=bounds(min=1, max=60_000))
    speculate: bool = True
    speculate_after_ms: int = field(default=128, metadata=bounds(min=0, max=60_000))
    partials: str = "auto"
    partial_interval_ms: int = field(default=700, metadata=bounds(min=0, max=60_000))
    continuation_ms: int = field(default=1800, metadata=bounds(min=0, max=10_000))

    def __post_init__(self) -> None:
        if self.detection not in DETECTIONS:
            raise ValueError(f"turn detection {self.detection!r}: use one of {', '.join(DETECTIONS)}")
        if not 0 < self.pause_ms <= self.max_silence_ms:
            raise ValueError(
                f"turn pause_ms {self.pause_ms} must be > 0 and <= max_silence_ms ({self.max_silence_ms})"
            )
        if self.partials not in ("auto", "on", "off"):
            raise ValueError(f"turn partials {self.partials!r}: use auto, on or off")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"turn threshold {self.threshold} must be within 0..1")


@dataclass(frozen=True)
class AsrOptions:
    """Which Whisper model to run and how.

    ``model`` is a model-store name (``whisper-tiny.en``), a local CTranslate2 folder, or
    (online only) a faster-whisper size name such as ``base.en``. ``device`` ``auto`` is
    ``cuda`` when CTranslate2 sees a GPU, else ``cpu``; ``compute_type`` ``auto`` is float16
    on CUDA and int8 on CPU. ``cpu_threads`` 0 is one thread per usable core, at most 4:
    CTranslate2's own default is always 4, which oversubscribes a 2-core machine that also
    runs torch (LLM) and the audio threads. On 2 cores a 2 s utterance took 0.52 s with 1
    thread, 0.37 s with 2 and 0.45 s with 4 (with torch busy: 0.85, 0.51, 0.51 s).
    ``beam_size`` 5 (faster-whisper's default): on the 107-utterance corpus (docs/benchmarks.md,
    "ASR on a window fitted to the speech") beam 1 lost 1.9-2.4 WER points on the 30 s window
    (every fallback's) and up to 0.7 on the fitted one, for 20-60 ms less. ``window``: ``fit``
    (default) encodes only ``max(floor_s, speech + 0.5 s)`` of an utterance up to 30 s and
    falls back to the 30 s window when that decode looks wrong (``assistant.stages.asr_fit``);
    ``full`` pads every utterance to 30 s as faster-whisper does. On 2 shared cores the fitted
    window took the ASR median from ~1.2 s to 120-190 ms with WER 14.0-14.9 % against 14.9 %;
    a 10 s floor fell back on 7 % of utterances (5 s: 14 %, a higher P95). The torch backend
    always uses 30 s.
    """

    model: str = "whisper-tiny.en"
    device: str = "auto"
    compute_type: str = "auto"
    cpu_threads: int = field(default=0, metadata=bounds(min=0, max=1024))
    beam_size: int = field(default=5, metadata=bounds(min=1, max=100))
    language: str | None = "en"
    backend: str = "auto"
    window: str = "fit"
    floor_s: float = field(default=10.0, metadata=bounds(min=1.0, max=30.0))

    def __post_init__(self) -> None:
        """Reject an unknown backend or window name (the settings loader reports it as a config error)."""
        if self.backend not in ("auto", "ctranslate2", "torch"):
            raise ValueError(f"backend = {self.backend!r}: choose auto, ctranslate2 or torch")
        if self.window not in ASR_WINDOWS:
            raise ValueError(f"window = {self.window!r}: choose {' or '.join(ASR_WINDOWS)}")


@dataclass(frozen=True)
class SplitterOptions:
    """Where sentences may be cut besides their ends.

    ``max_chars``: a sentence with no end in sight is cut at a comma or space before this.
    ``first_clause_chars``: the reply's first sentence is cut at its first ``,``/``;``/``:``
    at or after this many characters, so a long opening sentence starts playing after one
    clause instead of after all of it (0: never).
    ``first_chunk_words``: the reply's first chunk also ends after this many words when no
    sentence or clause end has come by then, so a run-on opening starts playing sooner
    (0: never). It moves up to 3 words on rather than end on a number or a word that cannot
    end a phrase (``NO_END_WORDS``: "going to | the shop"), and is skipped if none can.
    ``refill_ms``: once the reply plays on a speaker, when less than this much of it is left to
    play and nothing is being rendered, the words so far go to the voice at the last word a
    phrase may end on, instead of waiting for a sentence or clause end: a long run-on sentence
    (or a run of digits) does not fall silent mid-reply (0: never; a file is never hurried).
    """

    max_chars: int = field(default=200, metadata=bounds(min=10))
    first_clause_chars: int = field(default=24, metadata=bounds(min=0))
    first_chunk_words: int = field(default=3, metadata=bounds(min=0))
    refill_ms: int = field(default=300, metadata=bounds(min=0, max=60_000))


@dataclass(frozen=True)
class TtsOptions:
    """The engine, its voice and the output format.

    ``engine`` is ``pyttsx3`` (espeak-ng, the default) or ``piper`` (the neural voice
    ``piper_voice``: a store name or a ``.onnx`` file with its ``.onnx.json`` beside it, run
    on ``threads`` ONNX Runtime threads, 0 = one per core). ``voice`` is pyttsx3's voice id
    (``gmw/en-us``), the part after the slash (``en-us``) or part of a name (``America``);
    ``None`` keeps espeak-ng's default. ``rate_wpm`` is espeak-ng's rate; Piper speaks at
    ``rate_wpm / 175`` times its natural speed. Output is resampled from the engine's
    22050 Hz to ``sample_rate_hz`` mono float32.
    """

    voice: str | None = None
    rate_wpm: int = field(default=175, metadata=bounds(min=80, max=450))  # espeak-ng's range
    volume: float = field(default=1.0, metadata=bounds(min=0.0, max=1.0))
    sample_rate_hz: int = field(default=16000, metadata=bounds(min=8000, max=48000))
    engine: str = "pyttsx3"
    piper_voice: str = DEFAULT_PIPER_VOICE
    threads: int = field(default=1, metadata=bounds(min=0, max=64))

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"tts engine {self.engine!r}: use one of {', '.join(ENGINES)}")


@dataclass(frozen=True)
class EchoOptions:
    """Acoustic echo cancellation of the microphone (``assistant.stages.echo``).

    ``enabled``: ``on`` (fail when the canceller cannot be loaded), ``off``, or ``auto``: on
    where WebRTC's audio processing (the ``livekit`` package) loads. ``delay_hint_ms``: the
    expected delay from the speaker to the microphone beyond the streams' reported latencies
    (WebRTC's AEC3 finds the delay itself; the hint only helps it start). ``max_delay_ms``: the
    longest echo delay the reported estimate looks for. The canceller counts as converged when,
    over the last ``window_ms`` of far-end audio, what is left of the echo is
    ``converged_below_db`` under the far end and it removed at least ``converged_erle_db``
    (ERLE), or there was no echo to speak of (a headset). ``noise_suppression`` and
    ``high_pass_filter`` are WebRTC's own stages. ``residual_gate_db``: output this far under
    the loudest far end of the echo's reach is left-over echo and is silenced (0: off).
    ``probe``: play a soft 0.8 s hiss at
    start so the canceller converges before the first reply (full duplex from the first
    question); without it the first reply is gated until it converges.
    """

    enabled: str = "auto"
    delay_hint_ms: int = field(default=0, metadata=bounds(min=0, max=500))
    max_delay_ms: int = field(default=300, metadata=bounds(min=20, max=1000))
    converged_erle_db: float = field(default=10.0, metadata=bounds(min=0.0, max=60.0))
    converged_below_db: float = field(default=30.0, metadata=bounds(min=0.0, max=90.0))
    residual_gate_db: float = field(default=30.0, metadata=bounds(min=0.0, max=90.0))
    window_ms: int = field(default=500, metadata=bounds(min=100, max=10_000))
    probe: bool = True
    noise_suppression: bool = False
    high_pass_filter: bool = True

    def __post_init__(self) -> None:
        if self.enabled not in ECHO_MODES:
            raise ValueError(f"echo enabled {self.enabled!r}: use one of {', '.join(ECHO_MODES)}")


@dataclass(frozen=True)
class MetricsOptions:
    """``[metrics]``: the Prometheus endpoint. ``port`` 0 (default) serves none.

    ``host`` is the address it binds: loopback unless you want other machines to scrape it
    (a booth's Prometheus on another host); anything else gets a warning at start.
    """

    port: int = field(default=0, metadata=bounds(min=0, max=65535))
    host: str = "127.0.0.1"


@dataclass
class ServeSettings:
    """``[serve]``: where Triton listens and how requests are batched.

    ``host`` is loopback unless told (any other address is reachable from the network, with no
    authentication). ``sequences``: conversations decoded together, each keeping its prefix
    between turns. ``queue_delay_us`` / ``preferred_batch_sizes``: Triton's dynamic batcher.
    ``prefill_chunk``: newcomers' prompt tokens one decode step carries (chunked prefill; 0:
    each joining prompt runs a forward of its own between steps, stalling the running ones).
    """

    host: str = "127.0.0.1"
    port: int = field(default=8001, metadata=bounds(min=1, max=65535))
    sequences: int = field(default=16, metadata=bounds(min=1, max=256))
    queue_delay_us: int = field(default=100, metadata=bounds(min=0, max=1_000_000))
    preferred_batch_sizes: list[int] = field(default_factory=list, metadata=bounds(min=1, max=256))
    prefill_chunk: int = field(default=1024, metadata=bounds(min=0, max=8192))
