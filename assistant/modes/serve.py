"""``assistant serve``: the decoder behind NVIDIA Triton Inference Server, for many stations.

Triton comes from the ``nvidia-pytriton`` wheel (extra ``serve``), which bundles
``tritonserver`` with its Python backend. The served model is :mod:`engines.serving.triton_model`
(in-flight batching over one KV cache, a row per session), configured by ``[serve]`` and the
``[decoder]`` device/precision/context. The Python backend's stub embeds libpython: unless
told, it loads the system's ``libpython3.X``, which is not this interpreter's build (it crashed
in ``_thread.RLock`` here); so the interpreter's own library directory leads
``LD_LIBRARY_PATH``, and a Python without a shared libpython gets an error saying so.
"""

from __future__ import annotations

import errno
import functools
import importlib.util
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from assistant.config.sections import ServeSettings
from engines.serving.wire import MODEL_NAME, ServeOptions, tokenizer_sha256, write_repository
from store.leftovers import sweep_dead_pid_folders

if TYPE_CHECKING:  # assistant.config imports this module for [serve]
    from assistant.config import DecoderSettings, Settings

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 600.0  # loading a large model (or capturing CUDA graphs) can take minutes


class ServeError(RuntimeError):
    """The server cannot start; the message names the fix."""


@dataclass(frozen=True)
class TritonInstall:
    """The ``tritonserver`` of the nvidia-pytriton wheel and what its Python backend needs."""

    server: Path
    backend: Path  # backends/python of the wheel
    stub: Path  # the stub built for this Python version
    libs: Path  # the wheel's bundled shared libraries
    libpython_dir: Path  # where this interpreter's libpython3.X.so lives


def find_triton() -> TritonInstall:
    """Locate Triton in the installed nvidia-pytriton wheel.

    Raises:
        ServeError: The wheel is missing, has no stub for this Python, or this Python has no
            shared libpython.
    """
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise ServeError(
            "Triton is not installed: run 'scripts/setup.sh --serve' (the nvidia-pytriton wheel)"
        )
    root = Path(spec.origin).parent
    dist = root / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServeError(f"nvidia-pytriton has no Python backend for Python {version}; use Python 3.8-3.13")
    libdir = Path(sysconfig.get_config_var("LIBDIR") or "")
    library = f"libpython{version}.so"
    if not (libdir / library).exists() and not (libdir / f"{library}.1.0").exists():
        raise ServeError(
            f"this Python ({sys.executable}) has no shared {library}, which Triton's Python "
            "backend loads; use a Python built with --enable-shared (e.g. pyenv with "
            "PYTHON_CONFIGURE_OPTS=--enable-shared, or the system's python3)"
        )
    return TritonInstall(
        dist / "bin" / "tritonserver",
        dist / "backends" / "python",
        stub,
        root.parent / "nvidia_pytriton.libs",
        libdir,
    )


def check_port_free(host: str, port: int) -> None:
    """Raise :class:`ServeError` when ``host:port`` cannot be bound (taken, or no such address)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            # As gRPC binds: a closed connection's TIME_WAIT does not count, a listener does.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise ServeError(f"port {port} on {host} is in use; pick another with --port") from e
        raise ServeError(f"cannot listen on {host}:{port} ({e.strerror}); check --host") from e


def backend_directory(install: TritonInstall, work: Path) -> Path:
    """A backends folder whose ``python`` backend has this Python's stub (links, no copies)."""
    python = work / "backends" / "python"
    python.mkdir(parents=True)
    for item in install.backend.iterdir():
        if item.is_file():
            (python / item.name).symlink_to(item)
    (python / "triton_python_backend_stub").symlink_to(install.stub)
    return python.parent


def server_environment(install: TritonInstall) -> dict[str, str]:
    """The server's environment: this interpreter's libpython first, our packages importable."""
    env = dict(os.environ)
    libraries = [str(install.libpython_dir), str(install.libs)]
    if env.get("LD_LIBRARY_PATH"):
        libraries.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(libraries)
    # The stub finds this venv's site-packages from the python3 first on PATH.
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    source = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = ":".join(p for p in (source, env.get("PYTHONPATH", "")) if p)
    return env


def server_command(
    install: TritonInstall, repository: Path, backends: Path, settings: ServeSettings
) -> list[str]:
    """The ``tritonserver`` command line: gRPC only (streaming), on ``settings.host:port``."""
    return [
        str(install.server),
        f"--model-repository={repository}",
        f"--backend-directory={backends}",
        f"--grpc-address={settings.host}",
        f"--grpc-port={settings.port}",
        "--allow-http=false",
        "--allow-metrics=false",
        "--model-control-mode=explicit",
        f"--load-model={MODEL_NAME}",
        f"--backend-config=python,shm-region-prefix-name=assistant{os.getpid()}",
        "--exit-timeout-secs=5",
    ]


# Triton's Python backend names its shared memory <prefix><uuid4> in /dev/shm; the prefix holds our pid.
SHM_DIR = Path("/dev/shm")
SHM_REGION = re.compile(r"assistant(\d+)[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
WORK_PREFIX = "assistant-serve-"  # + our pid: $TMPDIR/assistant-serve-<pid>-<random>/ (the repository)


def sweep_dead_servers(shm_dir: Path = SHM_DIR) -> list[Path]:
    """Remove what an ``assistant serve`` killed with SIGKILL left: its shared memory and workspace.

    Only of processes that are gone: a server running beside this one keeps its regions.
    """
    removed = sweep_dead_pid_folders(Path(tempfile.gettempdir()), WORK_PREFIX)
    if shm_dir.is_dir():
        removed += sweep_dead_pid_folders(shm_dir, "assistant", SHM_REGION)
    return removed


@functools.cache
def parent_death_guard() -> tuple[str, ...]:
    """``setpriv --pdeathsig TERM --``: the server gets SIGTERM when this process dies, even by SIGKILL.

    Not a ``preexec_fn`` calling prctl: with one, Python forks instead of vforking, and gRPC's
    fork handlers (tritonclient is loaded here) restart its event-engine threads in the child;
    closing the inherited descriptors before exec then pulled their epoll descriptor from under
    them: tritonserver "exited (-6)" at start with "epoll_wait error: Bad file descriptor" (once
    in CI). Without setpriv (or one too old for --pdeathsig) a server whose parent was killed
    runs on until stopped; the next start still sweeps what it leaves (:func:`sweep_dead_servers`).
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return ()
    guard = (setpriv, "--pdeathsig", "TERM", "--")
    probe = subprocess.run([*guard, "true"], capture_output=True)
    return guard if probe.returncode == 0 else ()


class TritonProcess:
    """A running ``tritonserver`` serving our decoder; ``stop()`` ends it (idempotent)."""

    def __init__(self, options: ServeOptions, settings: ServeSettings, log_path: Path | None = None) -> None:
        self.install = find_triton()
        check_port_free(settings.host, settings.port)
        self.settings = settings
        self.url = f"{'[' + settings.host + ']' if ':' in settings.host else settings.host}:{settings.port}"
        sweep_dead_servers()
        self.work = tempfile.TemporaryDirectory(prefix=f"{WORK_PREFIX}{os.getpid()}-")
        work = Path(self.work.name)
        repository = work / "repository"
        write_repository(repository, options)
        self.log_path = log_path or work / "tritonserver.log"
        command = server_command(self.install, repository, backend_directory(self.install, work), settings)
        self.log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [*parent_death_guard(), *command],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=server_environment(self.install),
        )

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Block until the model answers; raise :class:`ServeError` with the log's tail if it never does."""
        import tritonclient.grpc as grpcclient

        deadline = time.monotonic() + timeout_s
        client = grpcclient.InferenceServerClient(self.url)
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise ServeError(f"tritonserver exited ({self.process.returncode}):\n{self.log_tail()}")
                try:
                    if client.is_model_ready(MODEL_NAME):
                        return
                except Exception:  # not listening yet
                    pass
                time.sleep(0.2)
        finally:
            client.close()
        self.stop()
        raise ServeError(f"the model was not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of the server's log (errors of the model's load end up there)."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Terminate the server (its models' ``finalize`` run) and remove the workspace."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        self.work.cleanup()


def serve_options(model_dir: Path, decoder: DecoderSettings, settings: ServeSettings) -> ServeOptions:
    """The served model's options from ``[decoder]`` (device, precision, context) and ``[serve]``."""
    return ServeOptions(
        model_dir=model_dir.resolve(),
        sequences=settings.sequences,
        context_tokens=decoder.context_tokens,
        device=decoder.device,
        dtype=decoder.dtype,
        threads=decoder.threads,
        cuda_graph=decoder.cuda_graph,
        queue_delay_us=settings.queue_delay_us,
        preferred_batch_sizes=tuple(settings.preferred_batch_sizes),
        prefill_chunk=settings.prefill_chunk,
        tokenizer_sha256=tokenizer_sha256(model_dir),
    )


def wait_for_exit(process: subprocess.Popen[bytes], poll_s: float = 0.2) -> int:
    """``process.wait()`` that wakes every ``poll_s`` so that a SIGTERM is acted on.

    The kernel may hand the signal to any thread that does not block it (gRPC's, here); Python
    then runs its handler only when the main thread next runs bytecode, and a plain ``wait()``
    sits in ``waitpid`` until the server exits: ``assistant serve`` ignored SIGTERM for good
    (in CI, and in 2 of 9 runs of its test alone).
    """
    while True:
        try:
            return process.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            continue


def run_server(options: ServeOptions, settings: ServeSettings, out: TextIO = sys.stderr) -> int:
    """Start Triton, say where it listens, serve until Ctrl-C or SIGTERM; returns the exit status."""
    if settings.host not in ("127.0.0.1", "::1", "localhost"):
        print(
            f"warning: serving on {settings.host}: reachable from the network, without authentication",
            file=out,
        )
    server = TritonProcess(options, settings)
    try:
        print(
            f"starting Triton ({options.model_dir.name}, {options.sequences} sequences)...",
            file=out,
            flush=True,
        )
        server.wait_ready()
        print(
            f"serving {options.model_dir.name} on grpc://{server.url} (model {MODEL_NAME}); "
            f"stations connect with --llm-server {server.url}",
            file=out,
            flush=True,
        )
        code = wait_for_exit(server.process)
        if code:
            print(f"error: tritonserver exited ({code}):\n{server.log_tail()}", file=out)
            return 1
        return 0
    finally:
        server.stop()


def serve_command(settings: Settings) -> int:
    """``assistant serve``: the configured model behind Triton until Ctrl-C; returns the exit status."""
    from assistant.stages.llm import resolve_llm_config
    from store.records import repair_hints

    model_dir = resolve_llm_config(settings.models).path  # a config that does not fit its weights: named
    with repair_hints(model_dir):  # a damaged model's error names the fix (models/ does not)
        return run_server(serve_options(model_dir, settings.decoder, settings.serve), settings.serve)


__all__ = [
    "ServeError",
    "ServeSettings",
    "TritonProcess",
    "run_server",
    "serve_command",
    "serve_options",
    "wait_for_exit",
]
