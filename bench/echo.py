#!/usr/bin/env python3
"""Compare echo cancellers offline on recordings made through the echo rig.

A reply spoken by espeak-ng (the app's TTS voice) plays on the virtual speaker with the rig's
echo path on (``scripts/virtual-audio.sh echo on``); what was played (``spk.monitor``, the far
end) and what the microphone heard (``virtmic``, the near end) are recorded on one time base.
Each canceller then runs over the pair in 10 ms frames, twice: echo only, and with a user's
question (another espeak-ng voice) mixed on top of the near end from 5 s on (double talk).

    VIRTUAL_AUDIO_RUNTIME=/tmp/pa-echo python -m bench.echo [--delay-ms 60 --gain-db -13]

Prints a markdown table and writes JSON (``--json``). Definitions (docs/voice.md, "Echo
cancellation"): ERLE = 10 log10(near energy / output energy) per 0.5 s window of echo only,
counted where the echo is above -50 dBFS; converged = the start of the first window with ERLE
>= 10 dB; ERLE median over the windows from then on; near end level = the output's energy over
the double talk, less that of the echo-only run, relative to the user's speech (0 dB = as loud
as it was); near end kept = 20 log10 of the least-squares gain of the user's speech in the output
over the double talk, at the lag that fits best (the canceller's own latency, reported too): it
also drops when the speech is distorted, not only when it is quieter (0 dB = intact);
CPU = process CPU time per 10 ms frame (far end and near end), on this machine.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.echo_rig import ROOT, echo_path, estimate_echo, play_and_record
from bench.speech import silence, speak, trim

RATE_HZ = 16000
FRAME = 160  # 10 ms
WINDOW = RATE_HZ // 2  # 0.5 s
REPLY = (
    "Sure. A week has seven days: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and "
    "Sunday. Most calendars start the week on Monday, though some start it on Sunday. "
    "The seven day week goes back to ancient Babylon, where it followed the phases of the moon."
)
USER = "Wait, what is the largest ocean on Earth?"
USER_AT_S = 5.0

AHEAD = 2 * FRAME  # far end written past each frame: the speaker runs ahead (>= the stage's lead)
# (near frame, far end from the frame's start: the frame and AHEAD more) int16 -> int16; the
# frame-by-frame cancellers take the frame (far[:FRAME]), the app's stage all of it.
Canceller = Callable[[np.ndarray, np.ndarray], np.ndarray]


def livekit_canceller(delay_hint_ms: int) -> Canceller:
    """WebRTC AEC3 through the LiveKit SDK's AudioProcessingModule."""
    from livekit import rtc

    apm = rtc.AudioProcessingModule(echo_cancellation=True, high_pass_filter=True)

    def run(near: np.ndarray, far: np.ndarray) -> np.ndarray:
        apm.process_reverse_stream(rtc.AudioFrame(far[:FRAME].tobytes(), RATE_HZ, 1, FRAME))
        frame = rtc.AudioFrame(near.tobytes(), RATE_HZ, 1, FRAME)
        apm.set_stream_delay_ms(delay_hint_ms)
        apm.process_stream(frame)
        return np.frombuffer(frame.data, np.int16).copy()

    return run


def aec_audio_processing_canceller(delay_hint_ms: int) -> Canceller:
    """WebRTC audio processing through the ``aec-audio-processing`` package."""
    from aec_audio_processing import AudioProcessor

    ap = AudioProcessor(enable_aec=True, enable_ns=False, enable_agc=False)
    ap.set_stream_format(RATE_HZ, 1)
    ap.set_reverse_stream_format(RATE_HZ, 1)
    ap.set_stream_delay(delay_hint_ms)

    def run(near: np.ndarray, far: np.ndarray) -> np.ndarray:
        ap.process_reverse_stream(far[:FRAME].tobytes())
        return np.frombuffer(ap.process_stream(near.tobytes()), np.int16).copy()

    return run


def speexdsp_canceller(delay_hint_ms: int, residual: bool = False) -> Canceller:
    """SpeexDSP's MDF echo canceller through Debian's libspeexdsp (ctypes), a 128 ms filter.

    PyPI's ``speexdsp`` 0.1.1 does not install here (its build needs swig). ``residual``: add
    Speex's preprocessor with the echo state, its residual-echo suppressor (denoise off).
    """
    lib = ctypes.CDLL(ctypes.util.find_library("speexdsp") or "libspeexdsp.so.1")
    lib.speex_echo_state_init.restype = ctypes.c_void_p
    lib.speex_preprocess_state_init.restype = ctypes.c_void_p
    echo = ctypes.c_void_p(lib.speex_echo_state_init(FRAME, 2048))
    rate = ctypes.c_int(RATE_HZ)
    lib.speex_echo_ctl(echo, 24, ctypes.byref(rate))  # SPEEX_ECHO_SET_SAMPLING_RATE
    pre = None
    if residual:
        pre = ctypes.c_void_p(lib.speex_preprocess_state_init(FRAME, RATE_HZ))
        lib.speex_preprocess_ctl(pre, 24, echo)  # SPEEX_PREPROCESS_SET_ECHO_STATE
        off = ctypes.c_int(0)
        lib.speex_preprocess_ctl(pre, 0, ctypes.byref(off))  # SPEEX_PREPROCESS_SET_DENOISE
    as_ptr = np.ctypeslib.ndpointer(np.int16, flags="C_CONTIGUOUS")
    lib.speex_echo_cancellation.argtypes = [ctypes.c_void_p, as_ptr, as_ptr, as_ptr]

    def run(near: np.ndarray, far: np.ndarray) -> np.ndarray:
        out = np.empty(FRAME, np.int16)
        lib.speex_echo_cancellation(echo, np.ascontiguousarray(near), np.ascontiguousarray(far[:FRAME]), out)
        if pre is not None:
            lib.speex_preprocess_run(pre, out.ctypes.data_as(ctypes.c_void_p))
        return out

    return run


COLUMNS = {
    "canceller": "canceller",
    "erle_median_db": "ERLE median (dB)",
    "erle_min_db": "ERLE min (dB)",
    "converged_s": "converged (s)",
    "near_end_level_db": "near end level (dB)",
    "near_end_kept_db": "near end kept (dB)",
    "latency_ms": "latency (ms)",
    "cpu_ms_per_frame": "CPU ms / 10 ms frame",
}


def stage_canceller(delay_hint_ms: int) -> Canceller:
    """The app's stage (assistant/stages/echo.py): livekit plus lining up by time and the stats."""
    from assistant.config.sections import EchoOptions
    from assistant.stages.echo import EchoCanceller, load_processor

    options = EchoOptions(enabled="on", delay_hint_ms=delay_hint_ms)
    canceller = EchoCanceller(options, load_processor(options))
    clock = iter(range(10**12, 10**18, 10_000_000))  # one 10 ms frame after another

    def run(near: np.ndarray, far: np.ndarray) -> np.ndarray:
        t_ns = next(clock)
        canceller.play(far, t_ns)
        out = canceller.process(near, t_ns).vad * 32768  # as the app hears it; exact int16 values
        return np.clip(np.round(out), -32768, 32767).astype(np.int16)

    return run


CANCELLERS: dict[str, Callable[[int], Canceller]] = {
    "livekit": livekit_canceller,
    "aec-audio-processing": aec_audio_processing_canceller,
    "speexdsp": speexdsp_canceller,
    "speexdsp+residual": lambda hint: speexdsp_canceller(hint, residual=True),
    "stage": stage_canceller,
}


def to_int16(audio: np.ndarray) -> np.ndarray:
    """Float [-1, 1] -> int16 PCM."""
    return (np.clip(audio, -1, 1) * 32767).astype(np.int16)


def cancel(
    make: Callable[[int], Canceller], far: np.ndarray, near: np.ndarray, delay_hint_ms: int
) -> tuple[np.ndarray, float]:
    """Run one fresh canceller over the whole pair; the output (float) and CPU ms per frame."""
    run = make(delay_hint_ms)
    far16, near16 = to_int16(far), to_int16(near)
    frames = len(near16) // FRAME
    out = np.zeros(frames * FRAME, np.int16)
    start = time.process_time()
    for i in range(frames):
        s = slice(i * FRAME, (i + 1) * FRAME)
        out[s] = run(near16[s], far16[s.start : s.stop + AHEAD])
    cpu_ms = (time.process_time() - start) * 1000 / frames
    return out.astype(np.float32) / 32768, cpu_ms


def erle_windows(near: np.ndarray, out: np.ndarray) -> list[tuple[float, float]]:
    """(window start s, ERLE dB) for each 0.5 s window where the echo is above -50 dBFS."""
    rows = []
    for start in range(0, len(out) - WINDOW + 1, WINDOW):
        e_near = float(np.mean(near[start : start + WINDOW] ** 2))
        e_out = float(np.mean(out[start : start + WINDOW] ** 2))
        if e_near > 1e-5:
            rows.append((start / RATE_HZ, 10 * np.log10(e_near / max(e_out, 1e-12))))
    return rows


def near_end_gain(out: np.ndarray, near: np.ndarray, max_lag: int = 800) -> tuple[float, int]:
    """The least-squares gain of ``near`` in ``out`` at the lag (the canceller's own delay) that fits best."""
    n = len(near)
    lags = [float(np.dot(out[k : k + n], near)) for k in range(max_lag + 1)]
    lag = int(np.argmax(lags))
    return lags[lag] / float(np.dot(near, near)), lag


def measure(name: str, far: np.ndarray, echo: np.ndarray, user: np.ndarray, delay_hint_ms: int) -> dict:
    """ERLE, convergence, near end kept and CPU for one canceller."""
    make = CANCELLERS[name]
    out, cpu_ms = cancel(make, far, echo, delay_hint_ms)
    windows = erle_windows(echo[: len(out)], out)
    converged = next((t for t, erle in windows if erle >= 10), None)
    after = [erle for t, erle in windows if converged is not None and t >= converged]
    out_dt, _ = cancel(make, far, echo + user, delay_hint_ms)
    talk = slice(
        int(USER_AT_S * RATE_HZ), int(USER_AT_S * RATE_HZ) + len(trim(user[int(USER_AT_S * RATE_HZ) :]))
    )
    kept_gain, latency = near_end_gain(out_dt[talk.start : talk.stop + 800], user[talk])
    e_near = float(np.mean(out_dt[talk] ** 2) - np.mean(out[talk] ** 2))  # less the echo left over
    level_db = 10 * np.log10(max(e_near, 1e-12) / float(np.mean(user[talk] ** 2)))
    return {
        "canceller": name,
        "erle_median_db": round(float(np.median(after)), 1) if after else None,
        "erle_min_db": round(min(after), 1) if after else None,
        "converged_s": converged,
        "near_end_level_db": round(level_db, 2),
        "near_end_kept_db": round(20 * np.log10(abs(kept_gain)), 2),
        "cpu_ms_per_frame": round(cpu_ms, 3),
        "latency_ms": latency * 1000 / RATE_HZ,
        "windows": [(t, round(e, 1)) for t, e in windows],
        "double_talk": out_dt,
    }


def transcriber() -> Callable[[np.ndarray], str]:
    """The app's ASR stage with its default model (whisper tiny.en from the model store)."""
    from assistant.config import ModelSettings
    from assistant.config.sections import AsrOptions
    from assistant.stages.asr import Transcriber
    from store.bundled import ModelStore

    asr = Transcriber(AsrOptions(), ModelStore(ModelSettings().store_dir))
    return lambda audio: asr.transcribe(audio.astype(np.float32)).text


def pulse_env() -> dict[str, str]:
    """Start the private PulseAudio (VIRTUAL_AUDIO_RUNTIME picks it) and return its environment."""
    script = str(ROOT / "scripts" / "virtual-audio.sh")
    out = subprocess.run([script, "start"], capture_output=True, text=True, check=True)
    return dict(item.split("=", 1) for item in out.stdout.split()[1:])


def main(argv: list[str] | None = None) -> int:
    """Record through the rig, run each canceller, print the table, write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay-ms", type=int, default=60)
    ap.add_argument("--gain-db", type=float, default=-13)
    ap.add_argument("--reflections", type=int, default=2)
    ap.add_argument("--delay-hint-ms", type=int, default=0, help="set_stream_delay_ms for the WebRTC ones")
    ap.add_argument("--only", nargs="*", default=[name for name in CANCELLERS if name != "stage"])
    ap.add_argument("--asr", action="store_true", help="transcribe the double talk (whisper tiny.en)")
    ap.add_argument("--json", type=Path, default=Path("bench_echo.json"))
    args = ap.parse_args(argv)

    env = pulse_env()
    with tempfile.TemporaryDirectory() as folder:
        reply = np.concatenate([silence(0.3), trim(speak(REPLY, Path(folder), "reply")), silence(0.5)])
        question = trim(speak(USER, Path(folder), "user", voice="en-us+f3"))
    with echo_path(env, args.delay_ms, args.gain_db, args.reflections):
        far, echo = play_and_record(env, reply)
    path = estimate_echo(far[: 3 * RATE_HZ], echo[: 3 * RATE_HZ])  # the loopback drifts ~0.1 ms/s
    user = np.zeros_like(echo)
    at = int(USER_AT_S * RATE_HZ)
    user[at : at + len(question)] = question[: len(user) - at] * 0.5  # the user about as loud as the reply
    rows = []
    for name in args.only:
        try:
            rows.append(measure(name, far, echo, user, args.delay_hint_ms))
        except (ImportError, OSError) as e:
            rows.append({"canceller": name, "error": f"not installed: {e}"})
    print(
        f"echo path: asked {args.delay_ms} ms {args.gain_db} dB (+{args.reflections} reflections); measured "
        f"{path.delay_ms:.1f} ms, direct tap {path.gain_db:.1f} dB, whole echo {path.level_db:.1f} dB; reply "
        f"{len(far) / RATE_HZ:.1f} s, user speech at {USER_AT_S} s for {len(question) / RATE_HZ:.1f} s"
    )
    print("| " + " | ".join(COLUMNS.values()) + " |")
    print("|" + "---|" * len(COLUMNS))
    for r in rows:
        cells = [str(r.get(key, "")) for key in COLUMNS] if "error" not in r else [r["canceller"], r["error"]]
        print("| " + " | ".join(cells + [""] * (len(COLUMNS) - len(cells))) + " |")
    talk = slice(int((USER_AT_S - 0.3) * RATE_HZ), int((USER_AT_S + 0.3) * RATE_HZ) + len(question))
    if args.asr:
        transcribe = transcriber()
        print("\nWhat ASR reads of the double talk (the user's words: " + repr(USER) + "):")
        for label, audio in [("user alone", user), ("microphone (echo + user)", echo + user)]:
            print(f"- {label}: {transcribe(audio[talk])!r}")
        for r in rows:
            if "double_talk" in r:
                r["double_talk_transcript"] = transcribe(r["double_talk"][talk])
                print(f"- {r['canceller']}: {r['double_talk_transcript']!r}")
    for r in rows:
        r.pop("double_talk", None)
    report = {
        "command": " ".join(sys.argv),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "echo_path": {"asked_delay_ms": args.delay_ms, "asked_gain_db": args.gain_db, **path.__dict__},
        "rows": rows,
    }
    args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
