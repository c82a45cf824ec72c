"""The Prometheus endpoint (``--metrics-port``), scraped over real HTTP from the running app.

The app runs as a user starts it (``assistant run --no-tui``) on the virtual sound devices:
a spoken question goes into the virtual microphone, typed ones go to its standard input.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from assistant.events import (
    AudioStarted,
    BargeIn,
    CancelReason,
    EchoMeasured,
    EchoState,
    Event,
    OverlapHeard,
    OverlapVerdict,
    ReplyPaused,
    ReplyResumed,
    TurnCancelled,
    TurnDone,
)
from assistant.observe.latency import STAGES, build_record
from assistant.observe.metrics import HISTOGRAMS, Metrics, MetricsOptions, MetricsPortError
from bench.corpus import TYPED_PAIR as TYPED
from bench.speech import speak
from tests.helpers.metrics import free_port, listening_addresses, scrape, wait_records


@pytest.mark.slow
def test_a_scrape_after_spoken_and_typed_turns_equals_the_turn_records(pulse, tmp_path):
    port = free_port()
    log, err = tmp_path / "turns.jsonl", (tmp_path / "stderr.txt").open("w")
    question = tmp_path / "question.wav"
    speak("What is the capital of Italy?", tmp_path, "question")
    cmd = [sys.executable, "-m", "assistant", "run", "--no-tui", "--metrics-port", str(port)]
    cmd += ["--log", str(log), "--max-new-tokens", "24"]
    app = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, **pulse}
    )
    try:
        assert app.stdout is not None and app.stdin is not None
        while "listening on" not in (line := app.stdout.readline()):
            assert line, "the app ended before listening"
        subprocess.run(["paplay", "--device=micfeed", str(question)], env={**os.environ, **pulse}, check=True)
        wait_records(log, 1, app, 120)
        for text in TYPED:
            app.stdin.write(text + "\n")
            app.stdin.flush()
        records = wait_records(log, 3, app, 120)
        metrics = scrape(port)

        # the endpoint listens on loopback only: another local address is refused
        assert listening_addresses(port) == {"127.0.0.1"}
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.2", port), timeout=5):
            pass
    finally:
        app.terminate()
        code = app.wait(60)
        err.close()
    stderr = (tmp_path / "stderr.txt").read_text()
    assert code == 0 and "Traceback" not in stderr, stderr

    spoken = [r for r in records if r["metrics"]["voice_to_voice_ms"] is not None]
    # tiny.en on espeak-ng once heard "What is the capital immediately?": the word is its business
    assert len(spoken) == 1 and "capital" in spoken[0]["transcript"].lower(), records
    assert metrics[("assistant_turns_total", (("kind", "spoken"),))] == 1
    assert metrics[("assistant_turns_total", (("kind", "typed"),))] == len(TYPED)
    for key in STAGES:  # the same numbers as the records: count, and sum in seconds
        name = HISTOGRAMS[key][0]
        values = [r["metrics"][key] for r in records if r["metrics"][key] is not None]
        assert metrics[(f"{name}_count", ())] == len(values), key
        assert metrics[(f"{name}_sum", ())] == pytest.approx(sum(values) / 1000, rel=1e-9, abs=1e-12), key
        inf = metrics[(f"{name}_bucket", (("le", "+Inf"),))]
        assert inf == len(values), key
    rates = [r["metrics"]["tokens_per_s"] for r in records if r["metrics"]["tokens_per_s"] is not None]
    assert metrics[("assistant_decode_tokens_per_second_count", ())] == len(rates)
    assert metrics[("assistant_cache_lookups_total", (("cache", "onnx_export"), ("result", "hit")))] == 1
    info = next(labels for (name, labels), _ in metrics.items() if name == "assistant_backend_info")
    assert dict(info)["backend"] == "onnxruntime-cpu" and dict(info)["model"] == "smollm2-135m-instruct"
    assert (
        0 < metrics[("assistant_kv_cache_tokens", ())] <= metrics[("assistant_kv_cache_capacity_tokens", ())]
    )
    assert metrics[("process_resident_memory_bytes", ())] > 100e6


def test_a_port_in_use_is_a_clear_error_before_any_model_loads(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "assistant", "run", "--no-tui", "--metrics-port", str(port)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 2, out
    assert f"error: metrics port {port} on 127.0.0.1 is in use" in out.stderr, out.stderr
    assert "--metrics-port PORT" in out.stderr and "Traceback" not in out.stderr


def test_a_host_other_than_loopback_is_served_with_a_warning(caplog):
    port = free_port()
    metrics = Metrics()
    with caplog.at_level(logging.WARNING, logger="assistant.observe.metrics"):
        server = metrics.serve(MetricsOptions(port=port, host="0.0.0.0"))
    try:
        assert "reachable from the network" in caplog.text
        assert listening_addresses(port) == {"0.0.0.0"}
        assert scrape(port)[("assistant_turns_total", (("kind", "typed"),))] == 0  # no turn yet
    finally:
        server.shutdown()
        server.server_close()


def test_an_address_that_cannot_be_bound_is_named_with_its_flags():
    with pytest.raises(MetricsPortError, match="--metrics-host and --metrics-port"):
        Metrics().serve(MetricsOptions(port=free_port(), host="192.0.2.1"))  # TEST-NET: not ours


def test_a_flood_of_half_open_connections_grows_no_threads_and_scrapes_answer_after():
    """500 connections that never send a byte (a real server on loopback), then a real scrape.

    prometheus-client's own server started a thread per connection, each blocked for ever on
    its silent socket; the bounded server keeps its accept thread and its few workers.
    """
    port = free_port()
    server = Metrics().serve(MetricsOptions(port=port))
    with_server = threading.active_count()
    flood: list[socket.socket] = []
    peak = with_server
    try:
        for _ in range(500):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            flood.append(s)
        deadline = time.monotonic() + 3  # the old server had accepted them all well within this
        while time.monotonic() < deadline:
            peak = max(peak, threading.active_count())
            time.sleep(0.05)
    finally:
        for s in flood:
            s.close()
    try:
        assert peak <= with_server + 2, f"{peak - with_server} threads more during the flood"
        # The flood's connections still queued are drained first; meanwhile a new one is closed
        # at once (as Prometheus meets it, it retries at its next interval): a few tries.
        deadline = time.monotonic() + 10
        while True:
            try:
                answer = scrape(port)
                break
            except (ConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert answer[("assistant_turns_total", (("kind", "typed"),))] == 0
    finally:
        server.shutdown()
        server.server_close()
    assert threading.active_count() <= with_server - 4, "the accept thread and the workers are joined"


@pytest.mark.gpu
def test_the_gpu_gauges_follow_what_the_gpu_holds():
    """NVML's readings over a real scrape; 2 GiB taken with PyTorch show in the used memory."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("pynvml", reason="nvidia-ml-py (the 'gpu' extras) is not installed")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    port = free_port()
    server = Metrics().serve(MetricsOptions(port=port))
    try:
        torch.cuda.init()
        before = scrape(port)
        taken = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        after = scrape(port)
        del taken
    finally:
        server.shutdown()
        server.server_close()
    name = torch.cuda.get_device_name(0).removeprefix("NVIDIA ")
    used = [after[k] - before[k] for k in after if k[0] == "assistant_gpu_memory_used_bytes"]
    (total,) = [v for k, v in after.items() if k[0] == "assistant_gpu_memory_total_bytes"]
    (labels,) = [dict(k[1]) for k in after if k[0] == "assistant_gpu_utilization_ratio"]
    assert labels == {"gpu": name}
    assert used and 2 * 2**30 <= used[0] < 3 * 2**30, used
    assert total == pytest.approx(torch.cuda.mem_get_info()[1], rel=0.01)
    assert 0 <= next(v for k, v in after.items() if k[0] == "assistant_gpu_utilization_ratio") <= 1


def test_full_duplex_is_scraped_with_its_mode_the_speech_over_replies_and_the_records_readings():
    """The live loop's events of two replies, fed to the metrics as the app does, then one real scrape.

    Reply 1 is paused by a backchannel that resumes it, then interrupted (barge-in 120 ms after
    the onset); reply 2 is dropped because the user went on with the question.
    """
    ms = 1_000_000
    reply1: list[Event] = [
        EchoState(0, 1 * ms, False, "half duplex until echo cancellation converges"),
        EchoState(0, 2 * ms, True, "full duplex: echo cancelled (ERLE 24 dB, echo delay 61 ms)", 24.0, 61.0),
        AudioStarted(1, 100 * ms),
        ReplyPaused(1, 1040 * ms, 1000 * ms, 2),
        OverlapHeard(1, 1800 * ms, 2, "Uh-huh.", OverlapVerdict.BACKCHANNEL),
        ReplyResumed(1, 1800 * ms, 760.0),
        ReplyPaused(1, 3120 * ms, 3000 * ms, 2),
        OverlapHeard(1, 3900 * ms, 2, "What about Spain?", OverlapVerdict.BARGE_IN),
        BargeIn(1, 3120 * ms, 3000 * ms),
        TurnCancelled(1, 3950 * ms, CancelReason.INTERRUPTED, "Paris is"),
        EchoMeasured(1, 3960 * ms, 24.0, 61.0),
    ]
    reply2: list[Event] = [
        AudioStarted(2, 5000 * ms),
        ReplyPaused(2, 5530 * ms, 5500 * ms, 3),
        OverlapHeard(2, 6500 * ms, 3, "the largest ocean", OverlapVerdict.CONTINUATION),
        TurnCancelled(2, 6510 * ms, CancelReason.CONTINUED, ""),
        EchoMeasured(2, 6520 * ms, 12.0, 60.0),
    ]
    port = free_port()
    metrics = Metrics()
    server = metrics.serve(MetricsOptions(port=port))
    try:
        assert scrape(port)[("assistant_full_duplex", ())] == 0  # not converged yet: half duplex
        for turn, events in ((1, reply1), (2, reply2)):
            for event in events:
                metrics(event)
            metrics(TurnDone(turn, 7000 * ms, build_record(turn, events)))
        got = scrape(port)
    finally:
        server.shutdown()
        server.server_close()
    assert got[("assistant_full_duplex", ())] == 1
    reason = "full duplex: echo cancelled (ERLE 24 dB, echo delay 61 ms)"
    assert got[("assistant_duplex_info", (("reason", reason),))] == 1
    overlaps = {
        dict(labels)["verdict"]: v for (name, labels), v in got.items() if name == "assistant_overlaps_total"
    }
    assert overlaps == {"no_words": 0, "backchannel": 1, "stop": 0, "continuation": 1, "barge_in": 1}
    assert got[("assistant_false_barge_ins_total", ())] == 1
    assert got[("assistant_continuations_total", ())] == 1
    assert got[("assistant_barge_ins_total", ())] == 1
    assert got[("assistant_barge_in_reaction_seconds_count", ())] == 1
    assert got[("assistant_barge_in_reaction_seconds_sum", ())] == pytest.approx(0.120)
    assert got[("assistant_barge_in_reaction_seconds_bucket", (("le", "0.125"),))] == 1
    assert got[("assistant_barge_in_reaction_seconds_bucket", (("le", "0.1"),))] == 0
    assert got[("assistant_echo_erle_decibels_count", ())] == 2
    assert got[("assistant_echo_erle_decibels_sum", ())] == pytest.approx(36.0)
    assert got[("assistant_echo_erle_decibels_bucket", (("le", "15.0"),))] == 1  # reply 2's 12 dB
    assert got[("assistant_echo_delay_seconds_sum", ())] == pytest.approx(0.121)
