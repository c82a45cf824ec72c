"""The decoder as a Triton Python-backend model (decoupled: one response per token).

Triton's Python backend imports this inside its stub process (``triton_python_backend_utils``
exists only there). ``execute`` hands each request to the :class:`~engines.serving.batching.BatchScheduler`
and returns at once; one sender thread streams every request's tokens back (the scheduler
announces each in its outbox) and cancels a sequence as soon as Triton says the client is gone
(a cancelled gRPC stream or a dropped connection).

One sender, not a thread per request: with 64 streams, 64 threads woke at every decode step
and took the GIL from the scheduler thread in turn; Python hands the GIL over only every
``SWITCH_INTERVAL_S`` (5 ms by default, shortened here: the stub runs this model alone), so a
~2 ms step waited on them.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sys
import threading
import time
from typing import Any

import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils  # ty: ignore  (only inside Triton's stub)

from engines.serving.batching import BatchScheduler
from engines.serving.batching_graph import load_batched_step
from engines.serving.sequences import BatchedRequest, RequestError
from engines.serving.wire import (
    OPTIONS,
    PROMPT_IDS,
    REFUSED,
    REUSED,
    SERVER_US,
    SESSION,
    TOKEN,
    decode_options,
    read_parameters,
)
from engines.torch_backend import TorchBackendOptions, configure_threads, resolve_device, use_cuda_graph
from models.config import DecoderConfig

logger = logging.getLogger(__name__)


def tensor_input(request: Any, name: str) -> torch.Tensor | None:
    """An input as a flat CPU tensor, through DLPack (None when the optional input is absent).

    Not ``as_numpy()``: under numpy 2 the 2.51 stub's arrays repeat the first element
    (``{{{{...`` for a JSON text, seen on the GPU machine), so ids would arrive as one id
    repeated; DLPack hands over the buffer itself.
    """
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    return torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).reshape(-1).cpu()


def _exit_with_server(server_pid: int) -> None:
    """End this stub once tritonserver is gone.

    Killed with SIGKILL, tritonserver cannot stop us: we would hold the model's memory forever,
    reparented to init.
    """
    while os.getppid() == server_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


PARENT_CHECK_S = 0.5
SWITCH_INTERVAL_S = 0.0005  # how long a thread holds the GIL before another may take it


def output(name: str, value: torch.Tensor) -> Any:
    """An output tensor, through DLPack as the inputs (see :func:`tensor_input`)."""
    return pb_utils.Tensor.from_dlpack(name, torch.utils.dlpack.to_dlpack(value))


def text_input(request: Any, name: str) -> str:
    """A UTF-8 uint8 input as text ('' when the optional input is absent).

    Raises:
        ValueError: The bytes are not UTF-8.
    """
    tensor = tensor_input(request, name)
    return "" if tensor is None else bytes(tensor.to(torch.uint8).tolist()).decode()


class TritonPythonModel:
    """Loads the model once (``initialize``) and serves every request through one scheduler."""

    def initialize(self, args: dict[str, Any]) -> None:
        """Load the weights and start the scheduler thread."""
        options = read_parameters(json.loads(args["model_config"]))
        torch_options = TorchBackendOptions(
            device=options.device, dtype=options.dtype, threads=options.threads, cuda_graph=options.cuda_graph
        )
        configure_threads(options.threads)
        device, dtype = resolve_device(torch_options)
        config = DecoderConfig.from_dir(options.model_dir)
        capacity = min(options.context_tokens, config.max_position_embeddings)
        graphs = use_cuda_graph(torch_options, device)
        step = load_batched_step(
            options.model_dir, options.sequences, capacity, device, dtype, graphs, options.prefill_chunk
        )
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.outbox: queue.Queue[BatchedRequest | None] = queue.Queue()
        self.scheduler = BatchScheduler(step, config.eos_token_ids, self.outbox)
        self.sender = threading.Thread(target=self._send_all, name="token-sender", daemon=True)
        self.sender.start()
        threading.Thread(target=_exit_with_server, args=(os.getppid(),), daemon=True).start()
        chunking = f"prompt chunks of up to {options.prefill_chunk} tokens a step"
        if not step.chunk_shapes:
            chunking = "prompts prefilled between steps" + (" (longrope)" if options.prefill_chunk else "")
        logger.info(
            "serving %s: %s, %d sequences of %d tokens, %s",
            options.model_dir,
            step.name,
            options.sequences,
            capacity,
            chunking,
        )

    def execute(self, requests: list[Any]) -> None:
        """Queue each request; the sender thread streams its tokens as they come."""
        arrived_ns = time.monotonic_ns()
        for request in requests:
            sender = request.get_response_sender()
            try:
                ids = tensor_input(request, PROMPT_IDS)
                assert ids is not None  # not optional: Triton refuses a request without it
                session_id = text_input(request, SESSION)
                options = decode_options(text_input(request, OPTIONS))
                self.scheduler.submit(session_id, ids.tolist(), options, tag=(request, sender, arrived_ns))
            except (RequestError, ValueError, TypeError) as e:  # UnicodeDecodeError is a ValueError
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(REFUSED + str(e))),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
        return None

    def _send_all(self) -> None:
        """Send each token the scheduler announces, in order; ``None`` in the outbox ends it."""
        while (sequence := self.outbox.get()) is not None:
            item = sequence.out.get_nowait()  # one announcement per item
            request, sender, arrived_ns = sequence.tag
            if item is None:
                self._close_stream(sequence, sender)
            elif not sequence.cancelled.is_set():
                self._send_token(sequence, request, sender, item, arrived_ns)

    def _send_token(
        self, sequence: BatchedRequest, request: Any, sender: Any, item: tuple[int, int], arrived_ns: int
    ) -> None:
        if request.is_cancelled():
            sequence.cancel()  # the scheduler ends it at its next step; the rest is dropped
            return
        token, t_ns = item
        outputs = [
            output(TOKEN, torch.tensor([token], dtype=torch.int64)),
            output(SERVER_US, torch.tensor([(t_ns - arrived_ns) // 1000], dtype=torch.int64)),
            output(REUSED, torch.tensor([sequence.reused_tokens], dtype=torch.int32)),
        ]
        try:
            sender.send(pb_utils.InferenceResponse(outputs))
        except Exception:  # the client vanished mid-send: stop generating for it
            sequence.cancel()
            logger.exception("stream of session %s ended", sequence.session)

    def _close_stream(self, sequence: BatchedRequest, sender: Any) -> None:
        if sequence.error:
            sender.send(
                pb_utils.InferenceResponse(error=pb_utils.TritonError(sequence.error)),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
            return
        if sequence.cancelled.is_set():
            # A warning, so Triton's log has it without logging set up (tests read it).
            logger.warning(
                "session %s: cancelled by the client after %d tokens; its row is free",
                sequence.session,
                sequence.generated_tokens,
            )
        try:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # the client is gone: nothing left to tell it
            logger.exception("stream of session %s could not be closed", sequence.session)

    def finalize(self) -> None:
        """Stop the scheduler (running sequences end cancelled); its summary goes to the log."""
        self.scheduler.close()
        self.outbox.put(None)
        self.sender.join()
        logger.warning("served: %s", self.scheduler.summary())
