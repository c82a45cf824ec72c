"""Benchmarks and the soak test: one corpus of questions and voices, the speech helpers, one module each.

Run one with ``python -m bench.NAME ARGS`` or ``assistant bench NAME ARGS`` (``assistant bench
ARGS`` is the decoder benchmark). ``bench`` may import ``assistant``, ``engines``, ``store`` and
``models``; they never import ``bench`` (an import-linter contract).
"""

from __future__ import annotations

import importlib

BENCHMARKS: dict[str, str] = {
    "decoder": "LLM decoder backends: TTFT and decode ms/token (the default)",
    "voice": "voice to voice on held-out spoken questions, through the virtual audio devices",
    "tts": "time to first audio of the TTS engines",
    "serve": "the Triton LLM server: sessions, batching, tokens/s",
    "asr_window": "ASR on 2 CPU cores: 30 s window against fitted ones, beam 1 against 5: WER and ms",
    "first_chunk": "the first spoken chunk of a reply, with and without first-chunk splitting",
    "long_speech": "what ASR keeps of 2 minutes of speech, what a short question costs",
    "turn_gpu": "the turn-taking stages on a GPU, for a stage-by-stage voice-to-voice estimate",
    "ui": "what the terminal UI adds to a typed turn",
    "soak": "a long run of spoken and typed turns: growth of memory, latency and KV cache",
    "gguf_start": "start-up of --model FILE.gguf, first and second start",
    "gpu_voice_turn": "file-mode voice turns many times in one session: the turn records' stages, P50/P95",
    "asr_torch": "the PyTorch Whisper backend stage by stage, 30 s against a trimmed encoder window",
    "asr_cold": "the PyTorch Whisper backend's first decode calls against repeated ones",
    "echo": "the echo cancellers on the echo rig: ERLE, convergence, double talk, CPU per frame",
    "duplex": "full duplex on the echo rig: false barge-ins, barge-in reaction, words kept, ERLE",
    "echo_hardware": "echo cancellation on this machine's own speaker and microphone (a laptop)",
    "startup": "from the command to 'assistant ready' / the first turn, warm caches, two checkouts",
}


def run(argv: list[str]) -> int:
    """Run the benchmark named by ``argv[0]`` (the decoder benchmark when it names none).

    Args:
        argv: ``[NAME, ARGS...]`` or the decoder benchmark's ``[ARGS...]``.

    Returns:
        The benchmark's exit status.
    """
    name = argv[0] if argv and argv[0] in BENCHMARKS else None
    if argv[:1] in (["list"], ["--list"]):
        for key, what in BENCHMARKS.items():
            print(f"{key:12} {what}")
        return 0
    module = importlib.import_module(f"bench.{name or 'decoder'}")
    return int(module.main(argv[1:] if name else argv))
