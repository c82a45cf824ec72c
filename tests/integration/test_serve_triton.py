"""``assistant serve``: a real tritonserver (nvidia-pytriton's) on loopback, the real SmolLM2 on the CPU.

Concurrent sessions get their batch-1 replies; a client that vanishes frees its row; bad
requests get reasons; a server killed mid-reply gives the client's notice and the next turn
works against a restarted server with the conversation intact.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from assistant.modes.serve import ServeSettings, TritonProcess, serve_options
from bench.corpus import BATCH_QUESTIONS as QUESTIONS
from engines.base import GenerationOptions
from engines.serving.remote import RemoteDecoder
from engines.serving.wire import MODEL_NAME, PROMPT_IDS, SESSION, utf8

pytest.importorskip("pytriton", reason="Triton comes with the serve extra (scripts/setup.sh --dev)")
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
GREEDY = GenerationOptions(max_new_tokens=24)


class CpuDecoder:
    context_tokens = 512
    device = "cpu"
    dtype = "fp32"
    threads = 2
    cuda_graph = "off"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(model_dir: Path, port: int, sequences: int = 8) -> TritonProcess:
    settings = ServeSettings(port=port, sequences=sequences)
    server = TritonProcess(serve_options(model_dir, CpuDecoder(), settings), settings)
    server.wait_ready(180)
    return server


@pytest.fixture(scope="module")
def server(model_dir: Path):
    server = start(model_dir, free_port())
    yield server
    server.stop()


def prompt(tokenizer, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    )


def remote(server: TritonProcess, model_dir: Path, tokenizer) -> RemoteDecoder:
    from models.config import DecoderConfig

    return RemoteDecoder(server.url, tokenizer, DecoderConfig.from_dir(model_dir).eos_token_ids)


def token_ids(generation) -> list[int]:
    return [c.token_id for c in generation if c.token_id >= 0]


@pytest.mark.parametrize("sessions", [2, 8])
def test_concurrent_sessions_get_their_batch1_replies(
    server, model_dir, batch1_reply, tokenizer, sessions
) -> None:
    prompts = [prompt(tokenizer, q) for q in QUESTIONS[:sessions]]
    expected = [batch1_reply(p, GREEDY) for p in prompts]  # conftest: each generated once per run
    clients = [remote(server, model_dir, tokenizer) for _ in prompts]
    got: list[list[int]] = [[] for _ in prompts]
    start_line = threading.Barrier(sessions)

    def ask(i: int) -> None:
        start_line.wait()
        got[i] = token_ids(clients[i].generate(prompts[i], GREEDY))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == expected


def test_a_session_keeps_its_prefix_on_the_server(server, model_dir, tokenizer) -> None:
    client = remote(server, model_dir, tokenizer)
    first = prompt(tokenizer, QUESTIONS[0])
    generation = client.generate(first, GREEDY)
    reply = token_ids(generation)
    follow = client.generate([*first, *reply, *prompt(tokenizer, "And of Italy?")[1:]], GREEDY)
    token_ids(follow)
    assert follow.stats.reused_tokens >= len(first)
    assert follow.stats.network_ms is not None and follow.stats.network_ms >= 0


CLIENT = """
import sys, numpy as np, tritonclient.grpc as g, queue, os
c = g.InferenceServerClient(sys.argv[1]); q = queue.Queue()
c.start_stream(callback=lambda result, error: q.put((result, error)))
ids = g.InferInput("PROMPT_IDS", [1, 3], "INT64")
ids.set_data_from_numpy(np.array([[1, 9690, 198]], np.int64))
sid = g.InferInput("SESSION", [1, 6], "UINT8")
sid.set_data_from_numpy(np.frombuffer(b"leaver", np.uint8).reshape(1, -1))
opt = g.InferInput("OPTIONS", [1, 23], "UINT8")
opt.set_data_from_numpy(np.frombuffer(b'{"max_new_tokens": 400}', np.uint8).reshape(1, -1))
c.async_stream_infer("assistant_llm", [ids, sid, opt])
for _ in range(3):
    q.get()
print("3 tokens", flush=True)
os._exit(0)  # gone without a word: no cancel sent
"""


def test_a_client_that_vanishes_mid_stream_frees_its_row(server) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, server.url], capture_output=True, text=True, timeout=60
    )
    assert "3 tokens" in out.stdout, out.stderr
    deadline = time.monotonic() + 20
    while not (
        found := re.search(
            r"session leaver: cancelled by the client after (\d+) tokens", server.log_tail(400)
        )
    ):
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.2)
    assert int(found.group(1)) < 60  # of 400: it stopped soon after the client left


def raw_error(url: str, ids: np.ndarray) -> str:
    """The error the server sends for one request of ``ids`` (tritonclient, no checks of ours)."""
    import tritonclient.grpc as grpcclient

    raw = grpcclient.InferenceServerClient(url)
    errors: list[str] = []
    raw.start_stream(callback=lambda result, error: errors.append(str(error)))
    prompt_ids = grpcclient.InferInput(PROMPT_IDS, [1, ids.size], "INT64")
    prompt_ids.set_data_from_numpy(ids.reshape(1, -1).astype(np.int64))
    sid = grpcclient.InferInput(SESSION, [1, 3], "UINT8")
    sid.set_data_from_numpy(utf8("bad"))
    try:
        raw.async_stream_infer(MODEL_NAME, [prompt_ids, sid])
        deadline = time.monotonic() + 10
        while not errors and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        raw.stop_stream()
    return errors[0] if errors else ""


def test_empty_and_over_context_requests_get_their_reason(server, model_dir, tokenizer) -> None:
    client = remote(server, model_dir, tokenizer)
    with pytest.raises(ValueError, match="prompt of 595 tokens exceeds the server's context of 512"):
        token_ids(client.generate(list(range(5, 600)), GREEDY))
    assert "empty prompt" in raw_error(server.url, np.zeros(0))
    assert "prompt of 600 tokens does not fit the server's context of 512" in raw_error(
        server.url, np.arange(600)
    )


def test_a_station_connects_with_the_address_serves_banner_prints(server) -> None:
    """``grpc://HOST:PORT``, as the banner prints it: gRPC's client said "Misformatted domain name"."""
    cmd = [
        sys.executable,
        "-m",
        "assistant",
        "chat",
        "--llm-server",
        f"grpc://{server.url}",
        "--max-new-tokens",
        "8",
    ]
    out = subprocess.run(
        cmd, input="What is the capital of France?\n", capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert f"decoding on the LLM server {server.url}" in out.stderr and "Paris" in out.stdout, out


def test_a_server_killed_mid_reply_cuts_the_turn_with_a_notice_and_the_next_turn_works(
    server, model_dir
) -> None:
    """Through the app's own session (load_llm with --llm-server, warm-up, the pipeline).

    The module's server is the one killed (this is the last test to use it), so the module
    starts one server less; the restarted ones are this test's own.
    """
    from assistant.app import build_session
    from assistant.config import DecoderSettings, GenerationSettings, Settings
    from assistant.events import CancelReason, TokenGenerated

    port = server.settings.port
    state = {"server": server}

    def kill_at_third_token(event) -> None:
        if isinstance(event, TokenGenerated) and event.turn_id == 1 and event.index == 2:
            state["server"].process.kill()

    settings = Settings(
        decoder=DecoderSettings(server=f"127.0.0.1:{port}"), generation=GenerationSettings(max_new_tokens=120)
    )
    session = build_session(settings, devices=False, asr=False, tts=False, emit=kill_at_third_token)
    try:
        decoder = session.pipeline.dialogue.decoder
        assert (decoder.name, decoder.served_model) == (f"server 127.0.0.1:{port}", "smollm2-135m-instruct")
        story = "Tell me a long story about a dragon."
        first = session.pipeline.run_text_turn(1, story, None, threading.Event())
        assert first.cancelled == CancelReason.LLM_SERVER_LOST
        work = server.work.name  # the model's process (Triton's stub) must not outlive the server
        deadline = time.monotonic() + 10
        while subprocess.run(["pgrep", "-f", work], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, f"a process of {work} outlived its killed server"
            time.sleep(0.2)
        assert first.tokens >= 3 and first.metrics["network_ms"] is not None
        server.stop()
        state["server"] = server = start(model_dir, port, sequences=2)
        second = session.pipeline.run_text_turn(2, "What is the capital of France?", None, threading.Event())
        assert not second.cancelled and "Paris" in second.reply
        assert second.prompt_tokens > first.prompt_tokens  # the story's turn is in the prompt
        server.stop()  # gone between two turns: the connection looks fine until it is used
        gone = session.pipeline.run_text_turn(3, "Are you there?", None, threading.Event())
        assert gone.cancelled == CancelReason.LLM_SERVER_LOST and gone.tokens == 0
        turns = session.pipeline.dialogue.turns
        assert [t.user for t in turns] == [story, "What is the capital of France?", "Are you there?"]
    finally:
        session.close()
        state["server"].stop()


def test_a_refused_or_impossible_llm_server_address_is_one_line_naming_the_flag() -> None:
    """Nothing listening: said at the first refusal (gRPC's client retried 8.7 s, then failed)."""
    port = free_port()
    cases = {
        f"grpc://127.0.0.1:{port}": f"error: nothing listens at 127.0.0.1:{port} (connection refused); "
        "start 'assistant serve' there or check --llm-server",
        "127.0.0.1:99999": "server (--llm-server) '127.0.0.1:99999': port 99999 is out of range (1 to 65535)",
        "http://127.0.0.1:8001": "'assistant serve' speaks gRPC, not HTTP; write HOST:PORT or grpc://HOST:PORT",
    }
    for address, says in cases.items():
        cmd = [sys.executable, "-m", "assistant", "chat", "--llm-server", address]
        out = subprocess.run(cmd, input="hi\n", capture_output=True, text=True, timeout=300)
        assert out.returncode == 2 and says in out.stderr, (address, out.stderr)
        assert "Traceback" not in out.stderr


STDERR: dict[int, list[str]] = {}  # what each serve_until_ready process wrote after "ready"


def serve_until_ready(port: int, env: dict[str, str]) -> subprocess.Popen:
    """``assistant serve`` once it says it is ready; its stderr is read on, so a full pipe never blocks it."""
    cmd = [sys.executable, "-m", "assistant", "serve", "--port", str(port), "--sequences", "2"]
    proc = subprocess.Popen(
        [*cmd, "--context-tokens", "512"], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    while "stations connect with" not in (line := proc.stderr.readline()):
        assert line, "serve ended before it was ready"
    STDERR[proc.pid] = []
    threading.Thread(target=STDERR[proc.pid].extend, args=(proc.stderr,), daemon=True).start()
    return proc


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie that nobody reaps does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_tritonserver_is_started_without_forking_this_process(model_dir) -> None:
    """No fork handler runs: the server is vforked (no ``preexec_fn``); setpriv sets its death signal.

    A ``preexec_fn`` makes Python fork, and gRPC's fork handlers (tritonclient is loaded in the
    app) then restart its event-engine threads in the child (7 threads were counted there); the
    descriptors closed before exec pulled their epoll descriptor from under them and tritonserver
    "exited (-6)" at start, once in CI. The race itself is too rare to wait for; Python's own
    after-fork hooks run in exactly the children that gRPC's do, so one marks them.
    """
    forked = []
    os.register_at_fork(after_in_child=lambda: forked and os.write(forked[0], b"forked"))
    reader, writer = os.pipe()
    forked.append(writer)
    try:
        settings = ServeSettings(port=free_port(), sequences=2)
        TritonProcess(serve_options(model_dir, CpuDecoder(), settings), settings).stop()
    finally:
        forked.clear()
        os.close(writer)
    with os.fdopen(reader, "rb") as marks:
        assert marks.read() == b"", "tritonserver was started from a fork of this process"


def test_what_a_serve_killed_with_sigkill_left_is_removed_by_the_next_start(tmp_path) -> None:
    """Its /dev/shm/assistant<pid>... regions and its temporary model repository stayed for good."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    killed = serve_until_ready(free_port(), env)
    children = subprocess.run(["pgrep", "-P", str(killed.pid)], capture_output=True, text=True).stdout
    triton = int(children.split()[0])
    killed.kill()  # SIGKILL: no clean-up; tritonserver gets SIGTERM (setpriv --pdeathsig) and goes
    killed.wait(30)
    deadline = time.monotonic() + 30  # tritonserver's --exit-timeout-secs is 5
    while running(triton):
        assert time.monotonic() < deadline, "tritonserver outlived its killed serve by 30 s"
        time.sleep(0.2)
    time.sleep(1)
    regions = list(Path("/dev/shm").glob(f"assistant{killed.pid}*"))
    work = list(tmp.glob("assistant-serve-*"))
    assert work, "the killed serve left no workspace (nothing to test)"
    alive = Path("/dev/shm") / f"assistant{os.getpid()}12345678-1234-1234-1234-123456789abc"
    alive.write_bytes(b"\0" * 4096)  # a region of a server that still runs (this process)
    # and one as a kill -9 of the whole job (tritonserver and its stubs too) leaves it
    regions.append(Path("/dev/shm") / f"assistant{killed.pid}0aa1b2c3-1234-4321-8765-0123456789ab")
    regions[-1].write_bytes(b"\0" * 4096)
    try:
        again = serve_until_ready(free_port(), {**env, "PYTHONFAULTHANDLER": "1"})
        again.send_signal(signal.SIGTERM)
        try:
            again.wait(120)  # a SIGTERM taken by a gRPC thread once kept it waiting for good
        except subprocess.TimeoutExpired:
            # Still running (how wait_for_exit was found): SIGABRT makes faulthandler print
            # every thread's stack to its stderr, which the failure then shows.
            again.send_signal(signal.SIGABRT)
            again.wait(30)
            time.sleep(1)
            pytest.fail(f"serve still ran 120 s after SIGTERM; its threads:\n{''.join(STDERR[again.pid])}")
        assert alive.exists()
    finally:
        alive.unlink(missing_ok=True)
    assert not any(p.exists() for p in regions + work), [p for p in regions + work if p.exists()]
    assert not list(tmp.glob("assistant-serve-*"))  # and the second one removed its own


def test_serve_names_a_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "assistant", "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
    assert out.returncode == 2
    assert f"port {port} on 127.0.0.1 is in use; pick another with --port" in out.stderr
