#!/usr/bin/env python
"""Voice turns in file mode, many times over several WAVs, with one loaded session.

Builds the session as ``assistant run --input Q.wav --output R.wav`` does
(:func:`assistant.app.build_session`: no audio devices, ASR and TTS on) and answers each
WAV as :func:`assistant.modes.run.run_file` does (the same endpointing replay and pipeline call,
a new turn id a turn), ``--repeats`` times in turn; the dialogue keeps its history, as live.
Each turn record goes to ``--log`` (JSON lines, as ``--log`` of ``assistant run``);
the JSON has every record's stages, their P50/P95 (:func:`assistant.observe.latency.percentiles`),
the session (models, backends, warm-up) and the machine. Settings are ``section.key=value``
overrides, as the command line's flags set them:

    python bench/gpu_voice_turn.py --wavs q1.wav,q2.wav --repeats 4 --json out.json \\
        models.store_dir=/tmp/store models.llm=/tmp/model.gguf decoder.backend=pytorch
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
from pathlib import Path


def machine() -> dict[str, str]:
    """Python, torch, transformers and the GPU this ran on."""
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gpu": gpu,
        "cpu_count": str(len(__import__("os").sched_getaffinity(0))),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the turns; print one summary line a turn and the percentiles."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--wavs", required=True, help="comma-separated question WAVs")
    parser.add_argument("--repeats", type=int, default=4, help="times each WAV is answered")
    parser.add_argument("--out-dir", type=Path, default=Path("."), help="reply WAVs go here")
    parser.add_argument("--log", type=Path, default=Path("turns.jsonl"), help="turn records, JSON lines")
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--no-tts", action="store_true", help="no TTS (where no speech engine runs)")
    parser.add_argument("settings", nargs="*", help="section.key=value overrides")
    args = parser.parse_args(argv)

    from assistant.app import build_session
    from assistant.config import load_settings
    from assistant.events import SpeechEnded
    from assistant.modes.run import write_wav
    from assistant.observe.latency import TurnRecord, percentiles
    from assistant.stages.audio import FileSink
    from assistant.stages.audio_file import load_wav
    from assistant.stages.recording import find_utterance

    overrides = dict(s.split("=", 1) for s in args.settings)
    settings = load_settings(None, env={}, overrides=overrides)
    start = time.monotonic()
    session = build_session(settings, devices=False, asr=True, tts=not args.no_tts, log_path=args.log)
    info = session.info()
    print(f"session built in {time.monotonic() - start:.1f} s: {info}", flush=True)
    records: list[tuple[str, TurnRecord]] = []
    try:
        wavs = [Path(w) for w in args.wavs.split(",")]
        audio = {w: load_wav(w) for w in wavs}
        args.out_dir.mkdir(parents=True, exist_ok=True)
        for repeat in range(args.repeats):
            for wav in wavs:
                # As assistant.modes.run.run_file, with a new turn id each turn (run_file answers one
                # file a process, always as turn 1; a reused id mixes up the pipeline's events).
                speech, delay_ms = find_utterance(audio[wav], settings.vad, wav, session.turn_policy)
                now = time.monotonic_ns()
                turn_id = len(records) + 1
                utterance = SpeechEnded(turn_id, now, speech_end_t_ns=now - int(delay_ms * 1e6), audio=speech)
                sink = FileSink()
                record = session.pipeline.run_turn(utterance, sink, threading.Event())
                assert record is not None
                write_wav(args.out_dir / f"{wav.stem}-reply-{repeat}.wav", sink.audio())
                records.append((wav.name, record))
                print(
                    f"{wav.name}: {record.summary()} | {record.transcript!r} -> {record.reply!r}", flush=True
                )
    finally:
        session.close()
    stats = percentiles([r for _, r in records])
    for key, s in stats.items():
        print(f"{key:22} p50 {s['p50']:8.1f}  p95 {s['p95']:8.1f}  max {s['max']:8.1f}  n {s['n']:.0f}")
    if args.json:
        summary = {
            "command": " ".join(sys.argv),
            "machine": machine(),
            "session": {k: v for k, v in info.__dict__.items()},
            "percentiles": stats,
            "turns": [
                {"wav": name, "transcript": r.transcript, "reply": r.reply, "turn_detector": r.turn_detector}
                | {"turn_probability": r.turn_probability, "metrics": r.metrics}
                for name, r in records
            ],
        }
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
