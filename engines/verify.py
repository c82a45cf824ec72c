"""Accuracy gate: a decoder under test against the PyTorch reference on a fixed dialogue set.

Per prompt (chat-templated, greedy), three measures:

- token agreement: the reference's greedy continuation is fed to the candidate (teacher
  forcing) and the share of steps where the candidate picks the same top-1 token;
- logits error: relative L2 error of the candidate's logits at those steps;
- ROUGE-L (F1 over words) between the reply the candidate generates on its own and the
  reference reply: what a listener would notice.

The gate is engine-agnostic: it takes two :class:`~engines.driver.DecoderDriver`. In CI it is
tested with ONNX Runtime as the decoder under test (the graph TensorRT builds from) because no
TensorRT engine can run on the machines here; ``assistant engine verify`` runs it on a TensorRT
engine where one runs, and only then marks the engine as verified.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from engines.bounds import bounds, check_bounds
from engines.driver import DecoderDriver

DIALOGUE = (
    "What is the capital of France?",
    "Give me one tip for sleeping better.",
    "How many days are in a leap year?",
    "Say hello to my friend Sam.",
    "What colour is the sky on a clear day?",
    "Name a fruit that is yellow.",
)
SYSTEM_PROMPT = "You are a friendly voice assistant. Answer in one to three short spoken sentences."


@dataclass(frozen=True)
class Thresholds:
    """What an engine must reach to be marked good (defaults suit fp16/bf16; int8 may need looser)."""

    min_token_agreement: float = 0.90
    max_logits_rel_err: float = 0.10
    min_rouge_l: float = 0.80


@dataclass(frozen=True)
class GateOptions:
    """The accuracy gate a TensorRT engine passes before its first use (the ``[gate]`` settings).

    Attributes:
        startup: Check an engine ``--backend auto`` picked at its first start, before the first
            turn (the verdict is kept in the engine's record, so later starts skip it). An
            explicit ``--backend tensorrt``/``tensorrt-rtx`` runs no start-up gate.
        prompts: How many of the fixed dialogues (:data:`DIALOGUE`) the start-up gate runs
            (``assistant engine verify`` runs all of them).
        max_new_tokens: Reply length per dialogue at start-up (``engine verify``: 32).
        min_token_agreement: Share of teacher-forced steps whose top-1 token must match.
        max_logits_rel_err: Largest relative L2 error of the logits allowed at any step.
        min_rouge_l: Mean ROUGE-L of the candidate's own replies against the reference's.
    """

    startup: bool = True
    prompts: int = field(default=3, metadata=bounds(min=1, max=len(DIALOGUE)))
    max_new_tokens: int = field(default=16, metadata=bounds(min=1, max=256))
    min_token_agreement: float = field(default=0.90, metadata=bounds(min=0.0, max=1.0))
    max_logits_rel_err: float = field(default=0.10, metadata=bounds(above=0.0))
    min_rouge_l: float = field(default=0.80, metadata=bounds(min=0.0, max=1.0))

    def __post_init__(self) -> None:
        check_bounds(self)

    def thresholds(self) -> Thresholds:
        """The thresholds these settings set."""
        return Thresholds(self.min_token_agreement, self.max_logits_rel_err, self.min_rouge_l)


@dataclass(frozen=True)
class PromptResult:
    """The measures of one prompt."""

    prompt: str
    reference_reply: str
    candidate_reply: str
    steps: int
    token_agreement: float
    max_logits_rel_err: float
    rouge_l: float


@dataclass(frozen=True)
class VerifyReport:
    """The gate's verdict; ``failures`` names each threshold missed."""

    candidate: str
    reference: str
    results: tuple[PromptResult, ...]
    thresholds: Thresholds
    token_agreement: float
    max_logits_rel_err: float
    mean_logits_rel_err: float
    rouge_l: float
    failures: tuple[str, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        """Every threshold met."""
        return not self.failures

    def to_record(self) -> dict[str, Any]:
        """JSON-able summary stored with a verified engine."""
        out = asdict(self)
        out["passed"] = self.passed
        return out


def rouge_l(reference: str, candidate: str) -> float:
    """ROUGE-L F1 over lower-cased whitespace words (1.0 for two empty texts)."""
    a, b = reference.lower().split(), candidate.lower().split()
    if not a and not b:
        return 1.0
    if not a or not b:
        return 0.0
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], prev + 1 if x == y else max(row[j], row[j - 1])
    lcs = row[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(b), lcs / len(a)
    return 2 * precision * recall / (precision + recall)


def _greedy(driver: DecoderDriver, ids: list[int], max_new_tokens: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens until EOS (included) or ``max_new_tokens``, and the logits each came from."""
    driver.reset()
    logits = driver.prefill(ids)
    tokens, seen = [], []
    for _ in range(max_new_tokens):
        seen.append(logits)
        token = int(np.argmax(logits))
        tokens.append(token)
        if token in driver.eos_token_ids:
            break
        logits = driver.decode(token)
    return tokens, seen


def _text(driver: DecoderDriver, tokens: list[int]) -> str:
    return driver.tokenizer.decode(
        [t for t in tokens if t not in driver.eos_token_ids], skip_special_tokens=True
    )


def verify_decoder(
    candidate: DecoderDriver,
    reference: DecoderDriver,
    tokenizer: Any,
    *,
    prompts: Sequence[str] = DIALOGUE,
    max_new_tokens: int = 32,
    thresholds: Thresholds | None = None,
    system_prompt: str = SYSTEM_PROMPT,
    on_prompt: Callable[[int, int], None] | None = None,
) -> VerifyReport:
    """Compare ``candidate`` with ``reference`` on ``prompts`` and judge it against ``thresholds``.

    Each prompt is one user turn after ``system_prompt`` (pass the product's own), greedy.
    ``on_prompt(done, total)`` hears of each prompt before it runs (``done`` from 1).
    """
    thresholds = thresholds or Thresholds()
    results, errors = [], []
    agree_total = steps_total = 0
    for done, prompt in enumerate(prompts, 1):
        if on_prompt is not None:
            on_prompt(done, len(prompts))
        messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        ref_tokens, ref_logits = _greedy(reference, ids, max_new_tokens)
        candidate.reset()
        got = [candidate.prefill(ids)] + [candidate.decode(t) for t in ref_tokens[:-1]]
        rel = [float(np.linalg.norm(g - e) / np.linalg.norm(e)) for g, e in zip(got, ref_logits, strict=True)]
        agree = sum(int(np.argmax(g)) == t for g, t in zip(got, ref_tokens, strict=True))
        own_tokens, _ = _greedy(candidate, ids, max_new_tokens)
        ref_text, own_text = _text(reference, ref_tokens), _text(candidate, own_tokens)
        results.append(
            PromptResult(
                prompt,
                ref_text,
                own_text,
                len(ref_tokens),
                agree / len(ref_tokens),
                max(rel),
                rouge_l(ref_text, own_text),
            )
        )
        errors += rel
        agree_total += agree
        steps_total += len(ref_tokens)
    candidate.reset()
    reference.reset()
    agreement = agree_total / steps_total
    score = float(np.mean([r.rouge_l for r in results]))
    failures = []
    if agreement < thresholds.min_token_agreement:
        failures.append(f"token agreement {agreement:.1%} < {thresholds.min_token_agreement:.0%}")
    if max(errors) > thresholds.max_logits_rel_err:
        failures.append(f"logits relative error {max(errors):.3g} > {thresholds.max_logits_rel_err:g}")
    if score < thresholds.min_rouge_l:
        failures.append(f"ROUGE-L {score:.3f} < {thresholds.min_rouge_l:g}")
    return VerifyReport(
        candidate.name,
        reference.name,
        tuple(results),
        thresholds,
        agreement,
        max(errors),
        float(np.mean(errors)),
        score,
        tuple(failures),
    )
