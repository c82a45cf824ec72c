"""Shared fixtures: the real bundled SmolLM2 model, fetched into the store if needed."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
import torch

from assistant.config import ModelSettings
from assistant.stages.tokenizer import load_tokenizer
from assistant.stages.tts import Synthesizer, TtsOptions
from bench.corpus import PARITY_PROMPTS
from engines.base import GenerationOptions
from engines.driver import DecoderDriver
from engines.onnx_export import ExportedDecoder, ExportOptions, export_decoder
from store.bundled import DEFAULT_LLM, ModelStore
from tests.helpers.llm import greedy, make_decoder
from tests.helpers.quiet import holding, quiet_lock
from tests.helpers.tts import PARIS

torch.set_num_threads(2)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def pulse() -> dict[str, str]:
    """The private PulseAudio of ``scripts/virtual-audio.sh``: the environment to reach it.

    Play a WAV into sink ``micfeed`` and the app hears it on ``virtmic``; what the app plays
    on ``spk`` can be recorded from ``spk.monitor``. Stopped at the end of the session.
    """
    if shutil.which("pulseaudio") is None:
        pytest.skip("pulseaudio is not installed (scripts/setup.sh --dev)")
    script = str(ROOT / "scripts" / "virtual-audio.sh")
    out = subprocess.run([script, "start"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    env = dict(item.split("=", 1) for item in out.stdout.split()[1:])
    yield env
    subprocess.run([script, "stop"], env={**os.environ, **env})


@pytest.fixture(scope="session")
def store() -> ModelStore:
    """The user's model store (``scripts/setup.sh`` fetched the models into it)."""
    return ModelStore(ModelSettings().store_dir)


@pytest.fixture(scope="session")
def model_dir(store: ModelStore) -> Path:
    """Folder of the real SmolLM2-135M-Instruct, fetched on first use."""
    return store.fetch(DEFAULT_LLM, progress=lambda _msg: None)


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path):
    return load_tokenizer(model_dir)


@pytest.fixture(scope="session")
def decoder(model_dir: Path, tokenizer) -> DecoderDriver:
    return make_decoder(model_dir, tokenizer)


@pytest.fixture(scope="session")
def pytorch_greedy(decoder: DecoderDriver, tokenizer) -> dict[str, tuple[list[int], list[int], list]]:
    """The PyTorch backend's 64 greedy tokens (EOS masked) and logits for each parity prompt, run once.

    ``{prompt: (prompt ids, tokens, logits)}``; the transformers parity test and the ONNX
    Runtime parity tests compare with this one run instead of each generating it again.
    """
    runs = {}
    for prompt in PARITY_PROMPTS:
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        runs[prompt] = (ids, *greedy(decoder, ids))
    return runs


@pytest.fixture(scope="session")
def batch1_reply(decoder: DecoderDriver):
    """``batch1_reply(ids, options)``: the batch-1 PyTorch driver's reply token ids, each generated once.

    The in-flight batching and Triton tests compare many sessions with what each prompt gets
    alone; the same prompts (``bench.corpus.BATCH_QUESTIONS``) come back in both modules.
    """
    done: dict[tuple[tuple[int, ...], GenerationOptions], list[int]] = {}

    def reply(ids: list[int], options: GenerationOptions) -> list[int]:
        key = (tuple(ids), options)
        if key not in done:
            decoder.reset()
            done[key] = [c.token_id for c in decoder.generate(list(ids), options) if c.token_id >= 0]
        return list(done[key])

    return reply


@pytest.fixture
def fresh_decoder(decoder: DecoderDriver) -> DecoderDriver:
    decoder.reset()
    return decoder


def pytest_addoption(parser):
    parser.addoption(
        "--run-tensorrt",
        action="store_true",
        help="run the gpu_tensorrt tests (they fail, not skip, without TensorRT and a supported GPU)",
    )


# The files of the tests that play and record real-time audio on the virtual devices (the
# ``pulse`` session): timing matters to them, and they share one sound server.
REAL_TIME_FILES = frozenset(
    {
        "tests/integration/test_echo_cancelled_through_the_rig.py",
        "tests/integration/test_echo_rig.py",
        "tests/integration/test_full_duplex.py",
        "tests/integration/test_long_speech_live.py",
        "tests/integration/test_metrics_endpoint.py",
        "tests/integration/test_piper_voice.py",
        "tests/integration/test_prometheus_dashboards.py",
        "tests/integration/test_soak_run.py",
        "tests/integration/test_sound_server_lost.py",
        "tests/integration/test_turn_taking.py",
        "tests/integration/test_voice_loop.py",
        "tests/tui/test_ui_sound.py",
        # Off the sound devices (the app's CLI, recorded audio through the canceller), at this
        # worker's priority: the lanes end about together (docs/benchmarks.md "Three workers").
        "tests/integration/test_backend_auto_cli.py",
        "tests/integration/test_cli_faults.py",
        "tests/integration/test_cli_model_errors.py",
        "tests/integration/test_leftovers.py",
        "tests/integration/test_offline_no_network.py",
        "tests/integration/test_stop_over_the_echo.py",
        "tests/integration/test_stop_spotting.py",
    }
)
REAL_TIME_FIXTURES = frozenset({"pulse", "live_session"})
# The second compute lane (a third worker, ``scripts/test.sh``): the benches, serving,
# batching, generation and long-input files and set-up on a fake project; their session
# fixtures (``batch1_reply``) no other lane uses. The first lane keeps the ONNX exports,
# parity and engine builds (``smollm2_export``, ``pytorch_greedy``) and the UI; the unit tests
# go to the first lane done. Both lanes run at the lowest CPU priority, so they fill what the
# real-time worker leaves idle (a third of the machine with two workers: 850 s of CPU in 657 s
# of a 2-core run) without taking its CPU.
SECOND_COMPUTE_FILES = frozenset(
    {
        "tests/integration/test_asr_torch.py",
        "tests/integration/test_benchmarks_run.py",
        "tests/integration/test_foreign_files_cli.py",
        "tests/integration/test_generation.py",
        "tests/integration/test_inflight_batching.py",
        "tests/integration/test_long_conversations.py",
        "tests/integration/test_long_speech_kept.py",
        "tests/integration/test_repetitive_speech.py",
        "tests/integration/test_serve_triton.py",
        "tests/integration/test_setup_on_gpu_machine.py",
    }
)


def group_of(nodeid: str) -> str:
    """``real-time`` (:data:`REAL_TIME_FILES`), ``compute-2`` (:data:`SECOND_COMPUTE_FILES`),
    ``unit`` (tests/unit/) or ``compute`` (the rest)."""
    path = nodeid.split("::")[0]
    if path in REAL_TIME_FILES:
        return "real-time"
    if path in SECOND_COMPUTE_FILES:
        return "compute-2"
    return "unit" if path.startswith("tests/unit/") else "compute"


def pytest_collection_modifyitems(config, items):
    """Skip the TensorRT engine tests unless asked; ``quiet`` tests last; sound tests listed.

    The ``quiet`` tests run last on their worker: by then the compute lanes are done (or nearly),
    so they neither wait for them nor make them wait.

    Raises:
        pytest.UsageError: A test uses the virtual sound devices outside :data:`REAL_TIME_FILES`
            (it would share the sound server with the other worker's tests).
    """
    reason = "gpu_tensorrt: not run; pass --run-tensorrt on a machine with TensorRT and a supported GPU"
    for item in items:
        if "gpu_tensorrt" in item.keywords and not config.getoption("--run-tensorrt"):
            item.add_marker(pytest.mark.skip(reason=reason))
        if (
            REAL_TIME_FIXTURES & set(getattr(item, "fixturenames", ()))
            and group_of(item.nodeid) != "real-time"
        ):
            raise pytest.UsageError(
                f"{item.nodeid} uses the virtual sound devices: add its file to REAL_TIME_FILES"
            )
    items.sort(key=lambda item: item.get_closest_marker("quiet") is not None)  # stable: order kept


def pytest_configure(config):
    """The controller of a pytest-xdist run names the run, so that it knows the workers' lock file."""
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput"):
        if getattr(config.option, "numprocesses", None) and config.option.testrunuid is None:
            config.option.testrunuid = uuid.uuid4().hex


def pytest_sessionfinish(session):
    """The controller removes the run's lock file (:mod:`tests.helpers.quiet`): the workers are done."""
    config = session.config
    if not hasattr(config, "workerinput") and getattr(config.option, "testrunuid", None):
        lock = quiet_lock(config.option.testrunuid)
        if lock is not None:
            lock.unlink(missing_ok=True)


def pytest_xdist_make_scheduler(config, log):
    """The groups of :func:`group_of` for ``scripts/test.sh``'s three workers, each on one worker.

    The ``real-time`` tests (:data:`REAL_TIME_FILES`: audio played and recorded at speed, mostly
    waiting) run on one worker while the two compute lanes (``compute``, ``compute-2``) run on the
    others at the lowest CPU priority (:func:`pytest_runtest_setup`), so the audio tests keep
    the CPU they would have alone. The ``unit`` group goes to the first compute lane done.
    Groups are handed out in the order their first test was collected (real-time and the two
    lanes first: the unit tests come last), not by size. (pytest-xdist's own ``loadgroup``
    does not group under pytest 9: it marks ``Item._nodeid``, which pytest 9 no longer reads.)
    """
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return Groups(config, log)


def pytest_runtest_setup(item):
    """A pytest-xdist worker running anything but the ``real-time`` group lowers its CPU priority (once)."""
    if os.environ.get("PYTEST_XDIST_WORKER") and group_of(item.nodeid) != "real-time" and os.nice(0) < 19:
        os.nice(19 - os.nice(0))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A compute test runs only while no ``quiet`` test runs, and a ``quiet`` test alone.

    Under pytest-xdist every compute test holds the run's lock shared and a test marked
    ``quiet`` holds it exclusively (:mod:`tests.helpers.quiet`). The lock is held around the
    whole protocol, not in a fixture: the set-up of a module- or session-scoped fixture (a
    rig's scenarios played) runs before any function-scoped fixture would take it, and it is
    often the heaviest part of a test. The unit tests hold it too: beside them (lock-free, five
    runs green) the sixth run's echo-only replies began with an underrun and a wrong echo delay
    (111 ms), paused for their own echo and heard it as a turn (docs/benchmarks.md).
    """
    group = group_of(item.nodeid)
    if group != "real-time":
        lock = holding(exclusive=False)
    elif item.get_closest_marker("quiet"):
        lock = holding(exclusive=True)
    else:
        lock = nullcontext()
    with lock:
        return (yield)


@pytest.fixture(scope="session")
def onnx_model_dir(tmp_path_factory, model_dir: Path) -> Path:
    """A store whose SmolLM2 folder links to the real files, so exports and engines land in a tmp dir.

    Session-scoped and shared by the ONNX and TensorRT tests: SmolLM2 is exported once per
    dtype per run (~15 s each).
    """
    root = tmp_path_factory.mktemp("onnx-store")
    folder = root / "models" / DEFAULT_LLM
    folder.mkdir(parents=True)
    for f in model_dir.iterdir():
        if f.is_file():
            (folder / f.name).symlink_to(f)
    return folder


@pytest.fixture(scope="session")
def smollm2_export(onnx_model_dir: Path):
    """``smollm2_export(dtype)``: the (cached) ONNX export of the real SmolLM2 in the tmp store."""
    done: dict[str, ExportedDecoder] = {}

    def get(dtype: str) -> ExportedDecoder:
        if dtype not in done:
            done[dtype] = export_decoder(onnx_model_dir, ExportOptions(dtype=dtype))
        return done[dtype]

    return get


@pytest.fixture(scope="module")
def paris_audio() -> np.ndarray:
    """The espeak-ng voice saying :data:`tests.helpers.tts.PARIS` (16 kHz mono float32)."""
    with Synthesizer(TtsOptions(voice="en-us")) as synth:
        return synth.synthesize(PARIS)
