"""A decoder on a server (``--llm-server``): the same driver, tokens chosen by ``assistant serve``.

The station keeps the tokenizer, the chat template and stop strings; the server keeps this
conversation's KV prefix (one session id per decoder) and streams token ids over one gRPC
stream per generation (tritonclient). Everything the driver does after a token arrives (end
tokens, stop strings, streaming text, stats) is :class:`~engines.driver.DecoderDriver`'s.

A server that cannot be reached or dies mid-reply raises :class:`ServerUnavailable`; the next
generation connects again (a restarted server re-prefills the conversation: nothing but time
is lost).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from engines.base import Backend, BackendIdentity, ContextOverflow, GenerationOptions, TokenChunk
from engines.driver import DecoderDriver, Detokenizer, StreamingGeneration
from engines.serving.address import check_listening, parse_server_address
from engines.serving.wire import (
    MODEL_NAME,
    OPTIONS,
    PROMPT_IDS,
    REFUSED,
    REUSED,
    SERVER_US,
    SESSION,
    TOKEN,
    encode_options,
    read_parameters,
    utf8,
)

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
TOKEN_TIMEOUT_S = 30.0  # no token for this long: the server is hung


class ServerUnavailable(ConnectionError):
    """The LLM server cannot be reached, or stopped answering; the message names the URL."""


def _message(error: object) -> str:
    """The text of a tritonclient error (its ``message()``), or of any exception."""
    message = getattr(error, "message", None)
    return str(message() if callable(message) else error)


class RemoteStep:
    """What the driver reads of a step (identity, name, capacity); the forward runs on the server."""

    def __init__(self, url: str, capacity_tokens: int) -> None:
        self.identity = BackendIdentity(Backend.REMOTE, address=url)
        self.name = self.identity.describe()
        self.capacity_tokens = capacity_tokens

    def forward(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        """Not available: the server chooses tokens and sends no logits."""
        raise NotImplementedError("a served decoder sends token ids, not logits")

    def close(self) -> None:
        """Nothing here: the connection is the decoder's (:meth:`RemoteDecoder.close`)."""


class _Stream:
    """One generation's gRPC stream: tokens arrive on a queue from tritonclient's thread."""

    def __init__(self, client: Any, url: str) -> None:
        self.client, self.url = client, url
        self.items: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.first_server_us = 0
        self.reused_tokens = 0
        client.start_stream(callback=lambda result, error: self.items.put((result, error)))

    def send(self, session: str, prompt_ids: Sequence[int], options: GenerationOptions) -> None:
        import tritonclient.grpc as grpcclient

        ids = grpcclient.InferInput(PROMPT_IDS, [1, len(prompt_ids)], "INT64")
        ids.set_data_from_numpy(np.asarray([prompt_ids], dtype=np.int64))
        sid, opts = (utf8(session), utf8(encode_options(options)))
        session_input = grpcclient.InferInput(SESSION, list(sid.shape), "UINT8")
        session_input.set_data_from_numpy(sid)
        options_input = grpcclient.InferInput(OPTIONS, list(opts.shape), "UINT8")
        options_input.set_data_from_numpy(opts)
        try:
            self.client.async_stream_infer(
                MODEL_NAME, [ids, session_input, options_input], enable_empty_final_response=True
            )
        except Exception as e:  # the stream broke before the request left (the server is gone)
            detail = e
            if not self.items.empty():
                detail = self.items.get_nowait()[1] or e  # the callback has the reason
            raise ServerUnavailable(f"LLM server {self.url} cannot be reached ({_message(detail)})") from e

    def next_token(self) -> int | None:
        """The next token id, or None when the server ended the generation."""
        try:
            result, error = self.items.get(timeout=TOKEN_TIMEOUT_S)
        except queue.Empty:
            raise ServerUnavailable(
                f"LLM server {self.url} sent nothing for {TOKEN_TIMEOUT_S:.0f} s"
            ) from None
        if error is not None:
            message = _message(error)
            if REFUSED in message:  # our request was wrong: no reconnect will help
                raise ValueError(f"LLM server {self.url} refused the request: {message.split(REFUSED)[-1]}")
            # Gone, reset, or failing inside (a stub that died): the next turn connects again.
            raise ServerUnavailable(f"LLM server {self.url} stopped answering ({message})")
        token = result.as_numpy(TOKEN)
        if token is None:  # the empty final response
            return None
        if not self.first_server_us:
            self.first_server_us = int(result.as_numpy(SERVER_US)[0])
            self.reused_tokens = int(result.as_numpy(REUSED)[0])
        return int(token[0])

    def close(self) -> None:
        """Stop the stream; a generation still running on the server is cancelled there."""
        try:
            self.client.stop_stream(cancel_requests=True)
        except Exception as e:  # the server is gone already
            logger.debug("closing the stream: %s", e)


class RemoteDecoder(DecoderDriver):
    """:class:`~engines.driver.DecoderDriver` whose tokens come from ``assistant serve`` at ``url``.

    Raises:
        ServerUnavailable: (at construction) nothing answers at ``url``.
        ValueError: The server runs a model whose tokenizer differs from ``tokenizer_sha256``.
    """

    def __init__(
        self, url: str, tokenizer: Detokenizer, eos_token_ids: Sequence[int], tokenizer_sha256: str = ""
    ) -> None:
        self.url = parse_server_address(url)
        self.session = uuid.uuid4().hex
        self.lock = threading.Lock()
        self.client: Any = None
        served = self._connect()
        if tokenizer_sha256 and served.tokenizer_sha256 and served.tokenizer_sha256 != tokenizer_sha256:
            raise ValueError(
                f"the LLM server at {url} runs {served.model_dir.name}, whose tokenizer differs from "
                "this station's model; start the station with the server's model (--model)"
            )
        self.served_model = served.model_dir.name
        step = RemoteStep(url, served.context_tokens)
        super().__init__(step, tokenizer, eos_token_ids, cache_status=f"served by {url}")
        self.network_ms: float | None = None  # of the last generation's first token

    def _connect(self) -> Any:
        try:
            import tritonclient.grpc as grpcclient
        except ImportError as e:
            raise ValueError("--llm-server needs tritonclient: run 'scripts/setup.sh --serve'") from e

        try:
            check_listening(self.url, CONNECT_TIMEOUT_S)  # a refusal in a millisecond, not gRPC's 8.7 s
        except ConnectionRefusedError:
            raise ServerUnavailable(
                f"nothing listens at {self.url} (connection refused); start 'assistant serve' there "
                "or check --llm-server"
            ) from None
        except OSError as e:
            raise ServerUnavailable(
                f"no LLM server answers at {self.url} ({e.strerror or e}); check --llm-server"
            ) from None
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                client = grpcclient.InferenceServerClient(self.url)
                if client.is_model_ready(MODEL_NAME):
                    config = client.get_model_config(MODEL_NAME, as_json=True)["config"]
                    if self.client is not None:
                        self.client.close()
                    self.client = client
                    return read_parameters(config)
                last = ConnectionError("the model is not loaded yet")
            except Exception as e:  # refused, reset, DNS: all "not there"
                last = e
            time.sleep(0.2)
        raise ServerUnavailable(
            f"no LLM server answers at {self.url} ({last}); start one with 'assistant serve' "
            "or check --llm-server"
        )

    def reset(self) -> None:
        """Forget the cached prefix: a new session id, so the server starts this one afresh."""
        super().reset()
        self.session = uuid.uuid4().hex

    def prefill(self, prompt_ids: Sequence[int]) -> np.ndarray:
        """Warm-up: the server prefills ``prompt_ids``; returns one-hot "logits" of its choice.

        The server sends token ids, not logits: the array marks the token it chose.
        """
        token = self._one_token(list(prompt_ids))
        logits = np.zeros(self.tokenizer_vocab(token), dtype=np.float32)
        logits[token] = 1.0
        return logits

    def decode(self, token_id: int) -> np.ndarray:
        """Warm-up: append ``token_id`` and return the server's next choice, one-hot."""
        return self.prefill([*self.cached_ids, token_id])

    def tokenizer_vocab(self, token: int) -> int:
        """Size of the one-hot "logits": the tokenizer's vocabulary (at least ``token + 1``)."""
        return max(len(getattr(self.tokenizer, "get_vocab", dict)() or ()), token + 1)

    def _one_token(self, prompt_ids: list[int]) -> int:
        generation = self.generate(prompt_ids, GenerationOptions(max_new_tokens=1))
        for chunk in generation:
            if chunk.token_id >= 0:
                return chunk.token_id
        return next(iter(self.eos_token_ids))

    def generate(
        self, prompt_ids: Sequence[int], options: GenerationOptions, cancel: threading.Event | None = None
    ) -> RemoteGeneration:
        """A lazy generation on the server; iterating it streams the tokens."""
        return RemoteGeneration(self, list(prompt_ids), options, cancel)

    def open_stream(self) -> _Stream:
        """A new stream, reconnecting first when the last one failed."""
        with self.lock:
            if self.client is None:
                self._connect()
            try:
                return _Stream(self.client, self.url)
            except Exception:
                self._connect()
                return _Stream(self.client, self.url)

    def close(self) -> None:
        """Close the gRPC connection (idempotent); the server drops this session's row in time."""
        with self.lock:
            if self.client is not None:
                self.client.close()
                self.client = None

    def lost(self) -> None:
        """The server failed: drop the client (the next generation connects again) and the prefix."""
        with self.lock:
            if self.client is not None:
                try:
                    self.client.close()
                except Exception as e:
                    logger.debug("closing the client: %s", e)
            self.client = None
            self.cached_ids = []


class RemoteGeneration(StreamingGeneration):
    """The driver's generation loop over a server stream; closing it cancels the server's work."""

    driver: RemoteDecoder
    stream: _Stream | None = None

    def __iter__(self) -> Iterator[TokenChunk]:
        """Stream the reply; the server's generation is cancelled when iteration stops early.

        Raises:
            ContextOverflow: The prompt does not fit the server's context.
            ServerUnavailable: The server cannot be reached or stopped answering.
        """
        d = self.driver
        if len(self.prompt_ids) > d.capacity_tokens - 1:
            raise ContextOverflow(
                f"prompt of {len(self.prompt_ids)} tokens exceeds the server's context of "
                f"{d.capacity_tokens}; shorten the conversation"
            )
        try:
            yield from super().__iter__()
        except ServerUnavailable:
            d.lost()
            raise
        finally:
            if self.stream is not None:
                self.stream.close()

    def choosers(self, context: list[int]) -> tuple[Callable[[Sequence[int]], int], Callable[[int], int]]:
        """Tokens from the server's stream: the first one sends the prompt."""
        d = self.driver

        def first(ids: Sequence[int]) -> int:
            self.stream = d.open_stream()
            d.cached_ids = []
            self.stream.send(d.session, ids, self.options)
            token = self._next(self.stream)
            d.cached_ids = list(ids)
            stats, stream = self.stats, self.stream
            stats.reused_tokens = stream.reused_tokens
            stats.prefilled_tokens = len(ids) - stream.reused_tokens
            client_ms = (time.monotonic_ns() - stats.t_submit_ns) / 1e6
            stats.network_ms = max(client_ms - stream.first_server_us / 1000, 0.0)
            return token

        def following(token: int) -> int:
            assert self.stream is not None
            d.cached_ids.append(token)
            return self._next(self.stream)

        return first, following

    def _next(self, stream: _Stream) -> int:
        token = stream.next_token()
        if token is None:  # the server stopped (end token, its max_new_tokens or its context)
            return next(iter(self.driver.eos_token_ids))
        return token
