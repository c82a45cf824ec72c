"""Fast unit tests: sampling, sentence splitting, settings precedence and errors, stderr to the log."""

from __future__ import annotations

import numpy as np
import pytest

from assistant.config import ConfigError, load_settings
from engines.base import GenerationOptions
from engines.driver import common_prefix_len
from engines.sampling import Sampler


def test_greedy_picks_argmax_and_top_k_1_is_greedy_at_any_temperature():
    logits = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    assert Sampler(GenerationOptions())(logits, []) == 1
    hot = Sampler(GenerationOptions(temperature=5.0, top_k=1, seed=3))
    assert {hot(logits, []) for _ in range(50)} == {1}


def test_top_p_keeps_only_the_nucleus():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    s = Sampler(GenerationOptions(temperature=1.0, top_p=0.7, seed=0))
    assert {s(logits, []) for _ in range(300)} == {0, 1}


def test_temperature_sampling_covers_the_distribution_and_respects_seed():
    logits = np.zeros(4)
    draws = [Sampler(GenerationOptions(temperature=1.0, seed=11))(logits, []) for _ in range(3)]
    assert len(set(draws)) == 1  # same seed, same first draw
    s = Sampler(GenerationOptions(temperature=1.0, seed=11))
    assert {s(logits, []) for _ in range(200)} == {0, 1, 2, 3}


def test_repetition_penalty_moves_greedy_off_a_seen_token():
    logits = np.array([2.0, 1.9, -5.0])
    assert Sampler(GenerationOptions(repetition_penalty=1.2))(logits, [0]) == 1
    assert Sampler(GenerationOptions())(logits, [0]) == 0


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([1, 2], [1, 2]) == 2


def test_settings_precedence_file_then_env_then_flags(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text('[decoder]\nbackend = "pytorch"\nthreads = 3\n[generation]\ntemperature = 0.5\n')
    env = {"ASSISTANT_DECODER_THREADS": "1", "ASSISTANT_GENERATION_STOP_STRINGS": "a,b"}
    s = load_settings(cfg, env=env, overrides={"generation.temperature": 0.0, "models.llm": None})
    assert s.decoder.threads == 1
    assert s.generation.temperature == 0.0
    assert s.generation.stop_strings == ["a", "b"]
    assert s.models.llm == "smollm2-135m-instruct"


def test_settings_errors_name_the_source(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text("[decoder]\nbackendd = 'x'\n")
    with pytest.raises(ConfigError, match=r"config.toml.*unknown key 'backendd'.*known: backend"):
        load_settings(cfg, env={})
    with pytest.raises(ConfigError, match=r"\$ASSISTANT_DECODER_THREADS.*int"):
        load_settings(env={"ASSISTANT_DECODER_THREADS": "many"})


SPLIT_CASES = [
    (
        "The capital of France is Paris. It is famous for the Eiffel Tower! Dr. Smith lives on Main St. "
        "in the U.S. today. Pi is 3.14 roughly.",
        [
            "The capital of France is Paris.",
            "It is famous for the Eiffel Tower!",
            "Dr. Smith lives on Main St. in the U.S. today.",
            "Pi is 3.14 roughly.",
        ],
    ),
    (
        "You need:\n1. Eggs\n2. Milk\n3. **Flour** and more",
        ["You need:", "1. Eggs", "2. Milk", "3. Flour and more"],
    ),
    ("Meet J. Smith at 5 p.m. tomorrow. Okay?", ["Meet J. Smith at 5 p.m. tomorrow.", "Okay?"]),
    ("- first point\n- second point", ["first point", "second point"]),
]


@pytest.mark.parametrize(("text", "expected"), SPLIT_CASES)
def test_sentence_splitter_whole_and_streamed_agree(text, expected):
    import random

    from assistant.stages.splitter import SentenceSplitter, SplitterOptions

    sentences = SplitterOptions(first_chunk_words=0)  # sentence ends, not the first chunk's word cut
    whole = SentenceSplitter(sentences)
    assert whole.push(text) + whole.flush() == expected
    rng, streamed, out, i = random.Random(0), SentenceSplitter(sentences), [], 0
    while i < len(text):
        n = rng.randint(1, 5)
        out += streamed.push(text[i : i + n])
        i += n
    assert out + streamed.flush() == expected


def test_sentence_splitter_releases_a_sentence_as_soon_as_the_next_one_starts():
    from assistant.stages.splitter import SentenceSplitter

    s = SentenceSplitter()
    assert s.push("Paris is the capital.") == []  # could still be "capital.ist"; wait for more
    assert s.push(" It") == ["Paris is the capital."]


def test_sentence_splitter_cuts_a_run_on_sentence_for_early_speech():
    from assistant.stages.splitter import SentenceSplitter, SplitterOptions

    s = SentenceSplitter(SplitterOptions(max_chars=40))
    parts = s.push("one two three four five six seven eight nine ten eleven twelve thirteen") + s.flush()
    assert len(parts) >= 2 and all(len(p) <= 40 for p in parts)
    assert (
        " ".join(parts).split()
        == "one two three four five six seven eight nine ten eleven twelve thirteen".split()
    )


def test_stderr_to_log_sends_fd2_lines_to_the_callback_and_keeps_the_terminal_for_textual(tmp_path):
    """What C libraries write to fd 2 reaches the callback; sys.__stderr__ still reaches the terminal.

    A file stands in for the terminal on fd 2 (pytest owns the real one).
    """
    import os
    import sys

    from assistant.tui.stderr import StderrToLog

    terminal = tmp_path / "terminal"
    saved = os.dup(2)
    fd = os.open(terminal, os.O_WRONLY | os.O_CREAT)
    os.dup2(fd, 2)
    os.close(fd)
    seen: list[str] = []
    try:
        with StderrToLog(seen.append) as capture:
            os.write(2, b"ALSA lib pcm.c:8570:(snd_pcm_recover) underrun occurred\n")
            sys.__stderr__.write("frame drawn by textual\n")
        capture_lines = list(capture.lines)
        os.write(2, b"after the UI\n")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    assert seen == ["ALSA lib pcm.c:8570:(snd_pcm_recover) underrun occurred"] == capture_lines
    assert terminal.read_text() == "frame drawn by textual\nafter the UI\n"
