"""Whisper's token search in PyTorch: greedy and beam, as openai-whisper decodes.

Used by :class:`~assistant.stages.asr_torch.TorchTranscriber` on the encoder's output: the
start-of-transcript prompt (language and task tokens on multilingual models, no timestamps),
Whisper's suppressed tokens, the no-speech probability after the first step, a KV cache
(transformers' ``EncoderDecoderCache``) and at most :data:`MAX_TOKENS` tokens.
"""

from __future__ import annotations

import inspect
from typing import Any

from assistant.stages.asr import AsrLoadError

MAX_TOKENS = 224  # faster-whisper's limit: half of Whisper's 448 positions


class WhisperSearch:
    """Decodes text tokens from Whisper ``model``'s encoder output on ``device``."""

    def __init__(self, model: Any, tokenizer: Any, device: str, language: str | None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self._setup_tokens(model.config, language or "en")
        params = inspect.signature(model.model.decoder.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.2x

    def _setup_tokens(self, config: Any, language: str) -> None:
        import torch

        def token(text: str) -> int:
            found = self.tokenizer.token_to_id(text)
            if found is None:
                raise AsrLoadError(f"the Whisper tokenizer has no {text} token")
            return int(found)

        self.eot = token("<|endoftext|>")
        prompt = [token("<|startoftranscript|>")]
        if config.vocab_size >= 51865:  # multilingual: language and task tokens
            prompt += [token(f"<|{language}|>"), token("<|transcribe|>")]
        self.prompt = prompt + [token("<|notimestamps|>")]
        no_speech = self.tokenizer.token_to_id("<|nospeech|>") or self.tokenizer.token_to_id("<|nocaptions|>")
        self.no_speech = int(no_speech) if no_speech is not None else None
        vocab = int(config.vocab_size)
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[self.eot + 1 :] = True  # every special token after end-of-text, timestamps included
        mask[[i for i in (config.suppress_tokens or []) if 0 <= i < vocab]] = True
        self.suppress = mask.to(self.device)
        self.suppress_begin = [i for i in (config.begin_suppress_tokens or []) if 0 <= i < vocab]

    def decode(self, features: Any, beam_size: int = 1, min_tokens: int = 0) -> tuple[list[int], float]:
        """Text tokens for one window of features, and the no-speech probability.

        ``min_tokens`` forbids the end token before that many (warm-up: a real length).
        """
        encoded = self.model.model.encoder(features).last_hidden_state
        if beam_size <= 1:
            return self.greedy(encoded, min_tokens)
        return self.beam(encoded, beam_size, min_tokens)

    def _step(self, ids: Any, encoded: Any, cache: Any, step: int, min_tokens: int = 0) -> tuple[Any, float]:
        """Suppressed float logits of each row's last position (and the no-speech probability)."""
        import torch

        model = self.model
        kwargs = {self._cache_arg: cache}
        hidden = model.model.decoder(input_ids=ids, encoder_hidden_states=encoded, use_cache=True, **kwargs)
        hidden = hidden.last_hidden_state
        no_speech = 0.0
        if step == 0 and self.no_speech is not None:  # after start-of-transcript, as Whisper does
            no_speech = float(model.proj_out(hidden[0, 0]).float().softmax(-1)[self.no_speech])
        logits = model.proj_out(hidden[:, -1]).float().masked_fill(self.suppress, -torch.inf)
        if step == 0:
            logits[:, self.suppress_begin] = -torch.inf
        if step < min_tokens:
            logits[:, self.eot] = -torch.inf
        return logits, no_speech

    def beam(self, encoded: Any, beam_size: int, min_tokens: int = 0) -> tuple[list[int], float]:
        """Beam search as openai-whisper's (patience 1), and the no-speech probability.

        Returns the finished hypothesis of the best mean log-probability per token once
        ``beam_size`` have finished (or the best alive one at the token limit).
        """
        import torch
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        prompt = torch.tensor([self.prompt], device=self.device)
        logits, no_speech = self._step(prompt, encoded, cache, 0, min_tokens)
        cache.batch_repeat_interleave(beam_size)
        encoded = encoded.expand(beam_size, -1, -1)
        alive: list[tuple[list[int], float]] = [([], 0.0)]  # one row until the first split
        finished: list[tuple[list[int], float]] = []
        for step in range(MAX_TOKENS - len(self.prompt)):
            logprobs = logits[: len(alive)].log_softmax(-1)
            top = logprobs.topk(beam_size + 1, dim=-1)
            candidates = sorted(
                (
                    (alive[row][1] + float(lp), row, int(tok))
                    for row in range(len(alive))
                    for lp, tok in zip(top.values[row].tolist(), top.indices[row].tolist(), strict=True)
                ),
                reverse=True,
            )
            nxt: list[tuple[list[int], float]] = []
            rows: list[int] = []
            for score, row, tok in candidates:
                if tok == self.eot:
                    if len(finished) < beam_size:
                        finished.append((alive[row][0], score))
                elif len(nxt) < beam_size:
                    nxt.append((alive[row][0] + [tok], score))
                    rows.append(row)
            if len(finished) >= beam_size or step == MAX_TOKENS - len(self.prompt) - 1:
                break
            alive = nxt
            order: Any = torch.tensor(rows + [rows[0]] * (beam_size - len(rows)), device=self.device)
            cache.reorder_cache(order)
            ids = torch.tensor([[seq[-1]] for seq, _ in alive], device=self.device)
            logits, _ = self._step(ids, encoded[: len(ids)], cache, step + 1, min_tokens)
        pool = finished or alive
        best = max(pool, key=lambda h: h[1] / max(len(h[0]) + 1, 1))  # + 1: the end token's
        return best[0], no_speech

    def greedy(self, encoded: Any, min_tokens: int = 0) -> tuple[list[int], float]:
        """Greedy text tokens after the encoder's output ``encoded``, and the no-speech probability."""
        import torch
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        ids = torch.tensor([self.prompt], device=self.device)
        tokens: list[int] = []
        no_speech = 0.0
        for step in range(MAX_TOKENS - len(self.prompt)):
            logits, doubt = self._step(ids, encoded, cache, step, min_tokens)
            no_speech = doubt if step == 0 else no_speech
            token = int(logits[0].argmax())
            if token == self.eot:
                break
            tokens.append(token)
            ids = torch.tensor([[token]], device=self.device)
        return tokens, no_speech

    def phrase_logprobs(self, features: Any, phrases: list[list[int]]) -> list[float]:
        """Mean log-probability a token of each token list as the transcript of one window (forced)."""
        import torch

        encoded = self.model.model.encoder(features).last_hidden_state
        scores = []
        for tokens in phrases:
            if not tokens:  # no text: nothing to score
                scores.append(-float("inf"))
                continue
            ids = torch.tensor([self.prompt + tokens], device=self.device)
            hidden = self.model.model.decoder(input_ids=ids, encoder_hidden_states=encoded).last_hidden_state
            logprobs = self.model.proj_out(hidden[0, len(self.prompt) - 1 : -1]).float().log_softmax(-1)
            picked = logprobs.gather(1, torch.tensor(tokens, device=self.device)[:, None])
            scores.append(float(picked.mean()))
        return scores
