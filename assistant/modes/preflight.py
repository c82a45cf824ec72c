"""Checks run before any model loads: the paths flags name, the ``--input`` question, the context.

Everything a user can get wrong on the command line fails here, in a second, not after a
minute of loading. A context that cannot hold the system prompt, a short question and a full reply would
have the question cut to nothing and an unrelated answer; it is refused here instead.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from assistant.config import ConfigError, Settings
from assistant.stages.audio_file import DEFAULT_MAX_INPUT_MINUTES
from assistant.stages.tokenizer import render_chat

if TYPE_CHECKING:
    import numpy as np

    from assistant.stages.vad import VadOptions

MIN_QUESTION_TOKENS = 32  # room a question needs besides the system prompt ("What is ...?": ~10)
# More than a chat template adds around the messages (SmolLM2: 14 tokens with a system
# prompt, 30 without: it then inserts its own).
TEMPLATE_ALLOWANCE_TOKENS = 256


def prompt_overhead_tokens(tokenizer: Any, system_prompt: str) -> int:
    """Tokens of a prompt with an empty question: the chat template and the system prompt.

    Rendered as :class:`assistant.stages.dialogue.Dialogue` renders a first turn.
    """
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": ""})
    text = render_chat(tokenizer, messages)
    return len(tokenizer.encode(text, add_special_tokens=False))


def check_context(
    settings: Settings, load_tokenizer: Callable[[], Any], flags: Mapping[str, str] | None = None
) -> None:
    """Refuse a context that cannot hold the system prompt, a short question and a reply.

    The tokenizer is loaded only when the context is not plainly big enough: a token holds
    at least one byte of text, so the system prompt's length in bytes bounds its tokens.

    Args:
        settings: The loaded settings (``[decoder] context_tokens``, ``[generation]
            max_new_tokens``, ``[dialogue] system_prompt``).
        load_tokenizer: Returns the model's tokenizer (with its chat template).
        flags: ``{"section.key": "--flag"}`` to name the flags in the message.

    Raises:
        ConfigError: Saying how many tokens each part takes and the smallest context that fits.
    """
    flags = flags or {}
    context = settings.decoder.context_tokens
    reply = settings.generation.max_new_tokens
    prompt_bytes = len(settings.dialogue.system_prompt.encode())
    if context >= prompt_bytes + TEMPLATE_ALLOWANCE_TOKENS + MIN_QUESTION_TOKENS + reply:
        return
    overhead = prompt_overhead_tokens(load_tokenizer(), settings.dialogue.system_prompt)
    needed = overhead + MIN_QUESTION_TOKENS + reply
    if context >= needed:
        return
    ctx_flag = flags.get("decoder.context_tokens", "--context-tokens")
    new_flag = flags.get("generation.max_new_tokens", "--max-new-tokens")
    raise ConfigError(
        f"[decoder] context_tokens ({ctx_flag}) = {context} is too small: the chat template and "
        f"system prompt take {overhead} tokens, a question needs room for {MIN_QUESTION_TOKENS} "
        f"and the reply for {reply} ([generation] max_new_tokens, {new_flag}); "
        f"use {ctx_flag} {needed} or more, or a smaller {new_flag} or a shorter system prompt"
    )


def check_output_args(args: argparse.Namespace) -> None:
    """Flags that make sense only together, and every path the app will write.

    Raises:
        UnwritablePath: A file or folder named by a flag cannot be written.
        ValueError: ``--output`` without ``--input``.
    """
    from store.files import check_writable_dir, check_writable_file

    output: Path | None = getattr(args, "output", None)
    if output is not None and getattr(args, "input", None) is None:
        raise ValueError(
            f"--output {output} needs --input: it writes the spoken reply to the question in the "
            "--input WAV file; add --input QUESTION.wav, or drop --output for the live voice loop"
        )
    for flag in ("output", "log", "events"):
        path = getattr(args, flag, None)
        if path is not None:
            check_writable_file(path, f"--{flag}")
    export_dir = getattr(args, "export_dir", None)
    if export_dir is not None:
        check_writable_dir(export_dir, "--export-dir")


def check_question(
    input_wav: Path | None, vad: VadOptions, max_input_minutes: float = DEFAULT_MAX_INPUT_MINUTES
) -> np.ndarray | None:
    """The ``--input`` question's audio (None without one); a bad file or one without speech fails here.

    A file longer than :data:`~assistant.stages.audio_file.LONG_INPUT_S` reports its reading
    on stderr.

    Raises:
        AudioFileError: The file is missing, unreadable, not audio the app reads, has a sample
            rate outside 8-192 kHz, or is longer than ``max_input_minutes``.
        NoSpeechInFile: It holds no speech the VAD accepts.
    """
    from assistant.stages.audio_file import load_wav, stderr_progress
    from assistant.stages.recording import find_utterance

    if input_wav is None:
        return None
    audio = load_wav(input_wav, 60 * max_input_minutes, stderr_progress(input_wav))
    find_utterance(audio, vad, input_wav)
    return audio
