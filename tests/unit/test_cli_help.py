"""Each subcommand's ``--help`` lists the settings flags that command reads, and no others."""

from __future__ import annotations

import re

import pytest

from assistant.cli import build_parser, parse_command_line

VOICE_ONLY = [
    "--mic",
    "--speaker",
    "--asr-model",
    "--tts",
    "--voice",
    "--tts-rate",
    "--turn-detection",
    "--end-silence-ms",
    "--pause-ms",
    "--partials",
    "--first-chunk-words",
    "--barge-in",
    "--metrics-port",
]


def flags_in_help(capsys, *argv: str) -> set[str]:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*argv, "--help"])
    assert exited.value.code == 0
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", capsys.readouterr().out))


def test_serve_help_lists_no_voice_flags(capsys):
    shown = flags_in_help(capsys, "serve")
    assert not shown & set(VOICE_ONLY), shown & set(VOICE_ONLY)
    assert not shown & {"--llm-server", "--backend", "--temperature", "--system-prompt"}
    assert {"--model", "--context-tokens", "--device", "--dtype", "--host", "--port", "--sequences"} <= shown


def test_main_and_run_help_keep_every_voice_flag(capsys):
    assert set(VOICE_ONLY) <= flags_in_help(capsys)
    run = flags_in_help(capsys, "run")
    assert set(VOICE_ONLY) <= run
    assert {"--model", "--backend", "--llm-server", "--temperature", "--system-prompt", "--no-tui"} <= run


def test_other_subcommands_list_what_they_read(capsys):
    chat = flags_in_help(capsys, "chat")
    assert not chat & set(VOICE_ONLY)
    assert {"--model", "--backend", "--llm-server", "--temperature", "--system-prompt"} <= chat
    assert flags_in_help(capsys, "devices") == {"--help", "--config", "--store", "--verbose"}
    fetch = flags_in_help(capsys, "models", "fetch")
    assert {"--tts", "--piper-voice"} <= fetch and not fetch & {"--mic", "--barge-in", "--model"}
    build = flags_in_help(capsys, "engine", "build")
    assert {"--model", "--context-tokens", "--system-prompt"} <= build and not build & set(VOICE_ONLY)


def test_a_flag_the_subcommand_ignores_is_refused(capsys):
    """``serve --barge-in`` is an error naming the flag, not silently ignored."""
    with pytest.raises(SystemExit) as exited:
        parse_command_line(build_parser(), ["serve", "--barge-in"])
    assert exited.value.code == 2
    assert "'serve' does not read --barge-in" in capsys.readouterr().err


def test_a_flag_of_another_command_is_named_as_such(capsys):
    """A flag that only other commands read says which ones, not just 'unrecognized'."""
    with pytest.raises(SystemExit) as exited:
        parse_command_line(build_parser(), ["models", "fetch", "--mic", "2"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "'models fetch' does not read --mic: it is a setting of 'assistant', 'assistant run'" in err
    with pytest.raises(SystemExit):
        parse_command_line(build_parser(), ["run", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    args = parse_command_line(build_parser(), ["--mic", "2", "serve", "--port", "9"])
    assert getattr(args, "audio.input_device") == "2"  # before the subcommand: still a setting
