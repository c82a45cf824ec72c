"""Faults a user meets: "everything runs offline" must mean no network connection at all.

Each turn runs as the user runs it (``python -m assistant ...``) under ``strace -f -e
trace=%network,openat``, inside a network namespace with no route when we may make one (root:
``unshare -n``), and the trace must hold no socket other than local (AF_UNIX) ones and no
DNS lookup. ONNX Runtime's telemetry looked ``mobile.events.data.microsoft.com`` up about
9 s after its first session, from a background thread, so the process stays alive
``LINGER_S`` after the turn (as a user's session would) to give such a thread its chance.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.speech import speak

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LINGER_S = 12
# `python -m assistant ARGS`, then stay alive LINGER_S (the exit status is kept).
LINGERING_MAIN = (
    "import runpy, time\n"
    "try:\n"
    "    runpy.run_module('assistant', run_name='__main__', alter_sys=True)\n"
    "finally:\n"
    f"    time.sleep({LINGER_S})\n"
)
NETWORK_CALL = re.compile(r"\b(socket|connect|sendto|sendmsg|sendmmsg)\(")
# DNS that no AF_INET socket shows: systemd-resolved's local socket, and the resolver reading
# its configuration (glibc reads it only to ask a name server; "localhost" is answered from
# /etc/hosts). nscd is not listed: its socket also answers user lookups (getpwuid).
DNS_SOCKETS = ("/systemd/resolve/",)
DNS_CONFIG = re.compile(r'\bopenat\(.*"/etc/resolv\.conf"')


def _no_network_prefix() -> list[str]:
    """``unshare -n`` when this user may create a network namespace (a second check), else nothing."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return [unshare, "-n"]
    return []


class Traced:
    """The assistant with ``args`` under strace, started now; :meth:`result` waits for it."""

    def __init__(self, args: list[str], folder: Path, stdin: str = "") -> None:
        if shutil.which("strace") is None:
            pytest.skip("strace is not installed (apt-get install strace)")
        self.folder, self.trace = folder, folder / "network.strace"
        (folder / "stdin.txt").write_text(stdin)
        cmd = [
            *_no_network_prefix(),
            "strace", "-f", "--seccomp-bpf", "-qq", "-e", "trace=%network,openat", "-o", str(self.trace),
            sys.executable, "-c", LINGERING_MAIN, *args,
        ]  # fmt: skip
        with (
            (folder / "stdin.txt").open() as stdin_file,
            (folder / "stdout.txt").open("w") as out,
            (folder / "stderr.txt").open("w") as err,
        ):
            self.proc = subprocess.Popen(cmd, stdin=stdin_file, stdout=out, stderr=err, text=True, cwd=ROOT)

    def result(self) -> tuple[subprocess.CompletedProcess, list[str]]:
        """The output and every outbound network call (after the process and its linger ended)."""
        code = self.proc.wait(600)
        stdout, stderr = ((self.folder / f"{n}.txt").read_text() for n in ("stdout", "stderr"))
        out = subprocess.CompletedProcess(self.proc.args, code, stdout, stderr)
        return out, outbound_calls(self.trace.read_text())


@pytest.fixture(scope="module")
def turns(tmp_path_factory):
    """The three traced turns (file, Piper voice, typed chat), started together.

    Each stays alive ``LINGER_S`` after its turn; run one after the other they spent three
    lingers in a row, started together the lingers overlap (the checks are the same).
    """
    started: dict[str, Traced] = {}

    def start(name: str, make) -> None:
        folder = tmp_path_factory.mktemp(name)
        try:
            started[name] = make(folder)
        except pytest.skip.Exception as e:  # that test skips with the reason; the others run
            started[name] = e

    start("file", file_turn)
    start("piper", piper_turn)
    start("chat", lambda folder: Traced(["chat", "--max-new-tokens", "16"], folder, QUESTION))
    yield started
    for run in started.values():
        if isinstance(run, Traced) and run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait(30)


def result_of(turns: dict, name: str) -> tuple[Traced, subprocess.CompletedProcess, list[str]]:
    run = turns[name]
    if not isinstance(run, Traced):
        pytest.skip(str(run))
    return run, *run.result()


QUESTION = "What is the capital of France?\n"


def file_turn(folder: Path) -> Traced:
    speak("What is the capital of France?", folder, "q")
    reply = folder / "r.wav"
    args = ["run", "--input", str(folder / "q.wav"), "--output", str(reply), "--max-new-tokens", "16"]
    return Traced(args, folder)


def piper_turn(folder: Path) -> Traced:
    from tests.helpers.piper_voice import onnx_of, piper_voice_folder

    voice = onnx_of(piper_voice_folder(folder / "store"))
    speak("What is the capital of France?", folder, "q")
    reply, log = folder / "r.wav", folder / "turns.jsonl"
    args = ["run", "--input", str(folder / "q.wav"), "--output", str(reply), "--max-new-tokens", "16"]
    args += ["--tts", "piper", "--piper-voice", str(voice), "--log", str(log)]
    return Traced(args, folder)


def outbound_calls(trace: str) -> list[str]:
    """Lines of an strace network trace that reach past this machine, or ask DNS."""
    found = []
    for line in trace.splitlines():
        if DNS_CONFIG.search(line):
            found.append(line)
            continue
        if not NETWORK_CALL.search(line) or "resumed>" in line or "AF_NETLINK" in line:
            continue  # netlink talks to the kernel only
        if "AF_UNIX" in line and not any(path in line for path in DNS_SOCKETS):
            continue
        if "AF_" in line:  # a socket of another family (AF_INET...), or a call to a remote address
            found.append(line)
    return found


def test_a_spoken_question_answered_from_a_file_opens_no_network_connection(turns):
    run, out, calls = result_of(turns, "file")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "assistant:" in out.stdout and (run.folder / "r.wav").stat().st_size > 10_000, out.stdout
    assert calls == [], "network calls during a file-mode turn:\n" + "\n".join(calls[:10])


def test_a_spoken_reply_in_the_piper_voice_opens_no_network_connection(turns):
    """piper-tts runs its voice on ONNX Runtime and its own espeak-ng: nothing may go online."""
    import json

    run, out, calls = result_of(turns, "piper")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "notice: Piper" not in out.stderr and (run.folder / "r.wav").stat().st_size > 10_000, out.stderr
    assert json.loads((run.folder / "turns.jsonl").read_text())["tts_voice"] == "piper en_US-joe-medium"
    assert calls == [], "network calls during a Piper turn:\n" + "\n".join(calls[:10])


def test_a_typed_chat_turn_opens_no_network_connection(turns):
    _, out, calls = result_of(turns, "chat")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "[ttft" in out.stdout, out.stdout  # the reply and its latency line came
    assert calls == [], "network calls during a chat turn:\n" + "\n".join(calls[:10])


def test_only_a_download_the_user_named_leaves_the_hub_reachable(tmp_path, monkeypatch):
    from assistant.config import ModelSettings, Settings
    from assistant.modes.offline import TELEMETRY_OFF, hub_requested, stay_offline
    from assistant.stages.asr import AsrOptions

    for key in [*TELEMETRY_OFF, "HF_HUB_OFFLINE"]:
        monkeypatch.setenv(key, "restored after the test")
        monkeypatch.delenv(key)
    stored = Settings(models=ModelSettings(store_dir=tmp_path))  # bundled names, a local folder
    folder = Settings(models=ModelSettings(store_dir=tmp_path, llm=str(tmp_path)))
    assert not hub_requested(stored) and not hub_requested(folder)
    stay_offline(hub=hub_requested(stored))
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["ORT_DISABLE_TELEMETRY"] == "1"

    monkeypatch.delenv("HF_HUB_OFFLINE")
    named = Settings(models=ModelSettings(store_dir=tmp_path, llm="hf:someorg/somemodel"))
    size_name = Settings(models=ModelSettings(store_dir=tmp_path), asr=AsrOptions(model="base.en"))
    assert hub_requested(named) and hub_requested(size_name)
    stay_offline(hub=True)
    assert "HF_HUB_OFFLINE" not in os.environ and os.environ["ORT_DISABLE_TELEMETRY"] == "1"


def test_models_fetch_still_downloads_what_the_user_asked_for(tmp_path):
    """Kept behaviour (passes on the old code too): the offline settings leave pip's fetch alone."""
    out = subprocess.run(
        [sys.executable, "-m", "assistant", "models", "fetch", "smart-turn-v3.2", "--store", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "models" / "smart-turn-v3.2" / "smart-turn-v3.2-cpu.onnx").stat().st_size > 1e6
