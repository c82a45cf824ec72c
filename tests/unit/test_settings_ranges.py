"""Settings refused before anything starts: every numeric setting has a range and refuses the rest."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import get_args, get_type_hints

import pytest

from assistant.config import ConfigError, Settings, load_settings


def numeric_fields():
    """``(section, field, type)`` of every int/float setting of every section."""
    for section in dataclasses.fields(Settings):
        cls = type(getattr(Settings(), section.name))
        hints = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kinds = set(get_args(hints[f.name]) or (hints[f.name],)) - {type(None)}
            if kinds & {int, float} and bool not in kinds:
                yield section.name, f, next(iter(kinds))


NUMERIC = list(numeric_fields())


def test_every_numeric_setting_has_a_range():
    from engines.bounds import describe

    missing = [f"[{s}] {f.name}" for s, f, _ in NUMERIC if describe(f.metadata) is None]
    assert not missing, f"no range in the field metadata (engines.bounds) of {missing}"


@pytest.mark.parametrize(("section", "field", "kind"), NUMERIC, ids=[f"{s}.{f.name}" for s, f, _ in NUMERIC])
def test_every_numeric_setting_refuses_values_out_of_range(section, field, kind):
    meta = field.metadata
    if "min" in meta:
        bad = meta["min"] - 1
    elif "above" in meta:
        bad = meta["above"]
    else:
        bad = meta.get("max", -(10**6) - 1) + 1  # (no range at all: a large negative number)
    var = f"ASSISTANT_{section.upper()}_{field.name.upper()}"
    with pytest.raises(ConfigError) as e:
        load_settings(None, env={var: str(kind(bad))})
    assert f"${var}: [{section}] {field.name} = '{kind(bad)}' is out of range: allowed" in str(e.value)


def test_keys_checked_together_see_the_whole_file(tmp_path):
    """pause_ms above the default max_silence_ms is fine when the file raises max_silence_ms too."""
    config = tmp_path / "config.toml"
    config.write_text("[turn]\npause_ms = 1500\nmax_silence_ms = 3000\n")
    assert load_settings(config, env={}).turn.pause_ms == 1500
    config.write_text("[turn]\npause_ms = 1500\n")
    with pytest.raises(
        ConfigError, match=r"config.toml: \[turn\]: .*pause_ms 1500 .*max_silence_ms \(1200\)"
    ):
        load_settings(config, env={})


def test_export_dir_given_before_the_subcommand_is_kept():
    """``assistant --export-dir X run``: the ``run`` subparser's own default must not reset X."""
    from assistant.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["--export-dir", "reports", "run"]).export_dir == Path("reports")
    assert parser.parse_args(["run", "--export-dir", "r2"]).export_dir == Path("r2")
    assert not hasattr(parser.parse_args(["run"]), "export_dir")  # the UI falls back to "."
