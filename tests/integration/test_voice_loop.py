"""The voice loop end to end with the real models: WAV files, and the virtual PulseAudio devices."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bench.speech import read_wav, speak
from tests.helpers.voice import (
    AFTER_CONTINUATION_WINDOW_S,
    Live,
    assistant,
    sound_bursts,
    transcribe,
    wait_for_answer,
    wait_for_event,
)

ROOT = Path(__file__).resolve().parents[2]
ORDER = [  # the endpoint is not in it: speculative ASR may finish before the end of the turn
    "speech_end",
    "transcript",
    "prompt_submitted",
    "first_token",
    "first_sentence",
    "first_audio",
]
METRICS = [
    "endpointing_ms",
    "asr_ms",
    "ttft_ms",
    "first_sentence_ms",
    "tts_first_audio_ms",
    "voice_to_voice_ms",
]


@pytest.fixture(scope="module")
def whisper(store):
    from faster_whisper import WhisperModel

    folder = store.fetch("whisper-tiny.en", progress=lambda _m: None)
    return WhisperModel(str(folder), device="cpu", compute_type="int8", cpu_threads=2)


@pytest.fixture(scope="module")
def paris_wav(tmp_path_factory):
    """A question tiny.en hears the same on the fitted window and the full one, however much
    silence leads it: live, the lead-in varies, and on the fitted window "What is the capital of
    France?" came out as "... capital and friends?" in 5 of 15 lead-ins (docs/benchmarks.md)."""
    folder = tmp_path_factory.mktemp("paris")
    speak("Tell me about the history of Paris.", folder, "question")
    return folder / "question.wav"


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory):
    folder = tmp_path_factory.mktemp("q")
    speak("What is the capital of France?", folder, "question")
    return folder / "question.wav"


def check_record(rec: dict, words: tuple[str, ...] = ("capital", "france"), answer: str = "Paris") -> None:
    """A complete record of a turn whose transcript has ``words`` and whose reply has ``answer``."""
    heard = re.sub(r"[^a-z ]", "", rec["transcript"].lower()).split()
    assert all(w in heard for w in words), rec["transcript"]
    assert answer in rec["reply"], rec
    stamps = [rec["timestamps_ns"][k] for k in ORDER]
    assert stamps == sorted(stamps), rec["timestamps_ns"]
    ts = rec["timestamps_ns"]
    assert ts["speech_end"] < ts["endpoint"] < ts["first_audio"] <= ts["playback_end"], ts
    for key in METRICS:
        assert rec["metrics"][key] is not None and rec["metrics"][key] >= 0
    assert rec["metrics"]["tokens_per_s"] > 0
    # The default backend is auto: ONNX Runtime on this CPU machine.
    assert rec["backend"].startswith("onnxruntime") and rec["llm_model"] and "whisper" in rec["asr_model"]


def test_wav_in_wav_out_answers_and_logs_every_field(question_wav, tmp_path, whisper):
    out, log = tmp_path / "reply.wav", tmp_path / "turns.jsonl"
    result = assistant("run", "--input", str(question_wav), "--output", str(out), "--log", str(log))
    assert result.returncode == 0, result.stderr
    assert "voice-to-voice" in result.stdout
    (line,) = log.read_text().splitlines()
    check_record(json.loads(line))
    assert "paris" in transcribe(whisper, read_wav(out)).lower()


def test_output_to_a_device_node_a_symlink_and_a_fifo_writes_through_and_keeps_them(question_wav, tmp_path):
    """``--output /dev/null`` (here a copy of it: ``mknod null c 1 3``) used to be renamed over,
    as root turning the device into a WAV file; a symlink became a file; a FIFO hung the start.

    One run writes the reply to a FIFO (a reader thread plays the listener) through a symlink
    to it: the start-up check must not block, the reply must arrive whole, the link and the FIFO
    stay. A second run writes to the device node, which stays a character device (1, 3).
    """
    import stat
    import threading

    fifo = tmp_path / "reply.fifo"
    os.mkfifo(fifo)
    link = tmp_path / "reply.wav"
    link.symlink_to(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = assistant("run", "--input", str(question_wav), "--output", str(link))
    reader.join(timeout=30)
    assert result.returncode == 0, result.stderr[-2000:]
    assert got and got[0][:4] == b"RIFF" and len(got[0]) > 16_000, "no whole WAV came through the FIFO"
    assert link.is_symlink() and stat.S_ISFIFO(fifo.lstat().st_mode)

    null = tmp_path / "null"
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs root (CAP_MKNOD)")
    result = assistant("run", "--input", str(question_wav), "--output", str(null))
    assert result.returncode == 0, result.stderr[-2000:]
    st = null.lstat()
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null", "reply.fifo", "reply.wav"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty|not a readable audio file"),
        (b"RIFF\x00\x00garbage" * 50, "not a readable audio file"),
        (None, "no speech"),
    ],
)
def test_bad_input_files_give_a_clear_error(tmp_path, content, message):
    path = tmp_path / "in.wav"
    if content is None:
        subprocess.run(
            ["sox", "-n", "-r", "16000", "-c", "1", "-b", "16", str(path), "trim", "0", "2"], check=True
        )
    else:
        path.write_bytes(content)
    result = assistant("run", "--input", str(path))
    assert result.returncode == 2
    assert re.search(message, result.stderr, re.I) and "Traceback" not in result.stderr


def speech_part(audio, pad_s: float = 0.2):
    """``audio`` from shortly before its first sound: tiny.en drops words after long silence."""
    loud = np.nonzero(np.abs(audio) > 1e-3)[0]
    assert loud.size, "the recording is silent"
    return audio[max(0, loud[0] - int(pad_s * 16000)) :]


def test_live_turn_through_virtual_mic_and_speaker_then_sigint_during_playback_exits_cleanly(
    pulse, paris_wav, tmp_path, whisper
):
    """The spoken question goes in through the virtual mic; the reply is recorded off the speaker.

    The recording starts seconds before the reply, so it is cut to the reply's audio before
    Whisper transcribes it back (with seconds of leading silence tiny.en drops words). Then the
    question again, and Ctrl-C (SIGINT) while its reply plays: the run stops cleanly (this was
    a test of its own, paying a second start-up for the same first turn).
    """
    log = tmp_path / "turns.jsonl"
    recording = tmp_path / "speaker.wav"
    live = Live(pulse, log, "--max-new-tokens", "30", "--temperature", "0")
    live.wait_for("listening on")
    env = {**os.environ, **pulse}
    recorder = subprocess.Popen(
        [
            "parecord",
            "--device=spk.monitor",
            "--rate=16000",
            "--channels=1",
            "--format=s16le",
            "--file-format=wav",
            str(recording),
        ],
        env=env,
    )
    subprocess.run(["paplay", "--device=micfeed", str(paris_wav)], env=env, check=True)
    live.wait_for(r"turn 1 \| voice-to-voice")
    time.sleep(1.0)
    recorder.send_signal(signal.SIGINT)
    recorder.wait(10)
    (line,) = log.read_text().splitlines()
    # What SmolLM2 makes of it depends on every word tiny.en heard through the live path (on a
    # busy CI machine "Tell me I'm out of history on Paris." got an apology): any reply will do;
    # the file-mode test above checks the answer.
    check_record(json.loads(line), ("history", "paris"), answer="")
    heard = transcribe(whisper, speech_part(read_wav(recording)))
    # Most of the reply's words come back off the speaker (espeak-ng through tiny.en: not all;
    # "Le Grand Paris" came back as "The round part is").
    words = {w for w in re.findall(r"[a-z]{4,}", json.loads(line)["reply"].lower())}
    assert len(words & set(re.findall(r"[a-z]{4,}", heard.lower()))) >= len(words) / 2, (heard, line)

    # SIGINT during playback exits cleanly.
    subprocess.run(["paplay", "--device=micfeed", str(paris_wav)], env=env, check=True)
    live.wait_for(r"\[turn 2\] assistant:")  # the reply's first sentence is playing now
    live.proc.send_signal(signal.SIGINT)
    assert live.proc.wait(30) == 0
    assert "stopped" in live.output()
    assert "Traceback" not in live.proc.stderr.read()


def test_barge_in_stops_the_reply_at_the_speech_onset_and_keeps_only_what_was_heard(pulse, tmp_path):
    """With --barge-in, "Stop. What is the capital of Germany?" over the reply stops it at the
    speech's onset, and the question is answered ("Stop." on its own turn is not; docs/voice.md).

    The virtual speaker does not feed the virtual mic, as with a headset: the canceller must
    leave the voice alone (it took 19 dB off it, and the words were lost). The interruption
    starts past the continuation window (words within it continue the question), so the
    question asks for a reply long enough to be still playing then.
    """
    events_path, recording = tmp_path / "events.jsonl", tmp_path / "speaker.wav"
    question, interruption = tmp_path / "question.wav", tmp_path / "interrupt.wav"
    speak("Tell me about the history of Paris.", tmp_path, "question")
    speak("Stop. What is the capital of Germany?", tmp_path, "interrupt")
    env = {**os.environ, **pulse}
    live = Live(pulse, tmp_path / "turns.jsonl", "--barge-in", "--events", str(events_path))
    live.wait_for("listening on")
    recorder = subprocess.Popen(
        ["parecord", "--device=spk.monitor", "--rate=16000", "--channels=1", "--format=s16le"]
        + ["--file-format=wav", str(recording)],
        env=env,
    )
    try:
        subprocess.run(["paplay", "--device=micfeed", str(question)], env=env, check=True)
        wait_for_event(events_path, live.proc, 1, "AudioReady")  # the first piece is being played now
        time.sleep(AFTER_CONTINUATION_WINDOW_S)
        subprocess.run(["paplay", "--device=micfeed", str(interruption)], env=env, check=True)
        answer = wait_for_answer(events_path, live.proc, "germany")
        time.sleep(0.5)
    finally:  # a recorder left running is a stream on the sound server the next tests count
        recorder.send_signal(signal.SIGINT)
        recorder.wait(10)
    live.proc.send_signal(signal.SIGINT)
    assert live.proc.wait(30) == 0
    output = live.output()

    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    (barge,) = [e for e in events if e["event"] == "BargeIn"]
    onset = next(e for e in events if e["event"] == "SpeechOnset" and e["turn_id"] == 2)
    assert barge["turn_id"] == 1 and barge["onset_t_ns"] == onset["onset_t_ns"]
    heard = next(e for e in events if e["event"] == "TranscriptReady" and e["turn_id"] == answer)
    # Stopped at the speech's onset, before its words were known; how soon (goal: 200 ms) is
    # measured by bench.duplex on a quiet machine, not asserted here.
    assert onset["onset_t_ns"] < barge["t_ns"] < heard["t_ns"], output
    assert "interrupted: reply stopped" in output

    records = {r["turn_id"]: r for r in map(json.loads, (tmp_path / "turns.jsonl").read_text().splitlines())}
    assert records[1]["cancelled"] == "interrupted" and records[answer]["cancelled"] == ""
    assert [t for t in records if t not in (1, answer)] == []  # "Stop." alone got no reply
    generated = " ".join(e["text"] for e in events if e["event"] == "SentenceReady" and e["turn_id"] == 1)
    assert len(records[1]["reply"].split()) < len(generated.split())  # history keeps what was heard

    # What reached the speaker: turn 1's reply broke off early, then the answer played.
    full_s = sum(e["audio_ms"] for e in events if e["event"] == "AudioReady" and e["turn_id"] == 1) / 1000
    bursts = sound_bursts(read_wav(recording))
    assert len(bursts) >= 2, bursts
    first_s = bursts[0][1] - bursts[0][0]
    assert first_s < full_s - 0.5, (first_s, full_s)


def test_synthesizer_speaks_intelligibly_from_several_threads_and_joins_on_close(whisper):
    import threading

    from assistant.stages.tts import Synthesizer, TtsOptions

    synth = Synthesizer(TtsOptions())
    results = {}

    def say(key, text):
        results[key] = synth.synthesize(text)

    threads = [
        threading.Thread(target=say, args=(k, t))
        for k, t in (("a", "The capital of France is Paris."), ("b", "Good morning."))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    audio = results["a"]
    assert audio.dtype.name == "float32" and 0.8 < audio.size / 16000 < 6
    assert float((audio**2).mean()) ** 0.5 > 0.01
    assert "paris" in transcribe(whisper, audio).lower()
    assert "morning" in transcribe(whisper, results["b"]).lower()
    assert synth.synthesize("   ").size == 0
    synth.close()
    assert not synth._thread.is_alive()


def test_without_audio_devices_run_continues_in_text_mode(tmp_path):
    """No sound server and no sound card (this machine without the virtual devices)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSE", "ALSA"))}
    env.update(PULSE_SERVER=f"unix:{tmp_path}/no-such-server", XDG_RUNTIME_DIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-m", "assistant", "run", "--no-tui"],
        input="What is the capital of France?\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "no audio input device" in result.stderr and "text mode" in result.stderr
    assert "Paris" in result.stdout
