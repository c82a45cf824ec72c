"""The session's latency report (the UI's ``e``): a CSV row and a JSON record per turn, with percentiles."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from assistant.observe.latency import DUPLEX_METRICS, STAGES, TurnRecord, percentiles
from store.files import atomic_write

REPORT_COLUMNS = (
    "turn_id",
    "transcript",
    "reply",
    "cancelled",
    "overlaps",
    "false_barge_ins",
    "continued",
    "backend",
    "llm_model",
    "asr_model",
    "tts_voice",
)


def export_report(records: Sequence[TurnRecord], folder: Path, stem: str) -> tuple[Path, Path]:
    """Write the session's latency report: ``<stem>.csv`` (a row per turn) and ``<stem>.json``.

    The JSON holds every record and the percentiles per stage; missing metrics are empty
    cells in the CSV and ``null`` in the JSON. Returns both paths.
    """
    folder.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = folder / f"{stem}.csv", folder / f"{stem}.json"
    metric_keys = [*STAGES, "queued_ms", "network_ms", "speculated_ms", "tokens_per_s", *DUPLEX_METRICS]
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    writer.writerow([*REPORT_COLUMNS, "tokens", "prompt_tokens", *metric_keys, "overlap_heard"])
    for r in records:
        values = [r.metrics.get(k) for k in metric_keys]
        writer.writerow(
            [*(getattr(r, c) for c in REPORT_COLUMNS), r.tokens, r.prompt_tokens]
            + ["" if v is None else f"{v:.3f}" for v in values]
            + ["; ".join(r.overlap_heard)]
        )
    report = {
        "turns": len(records),
        "percentiles": percentiles(records, metric_keys),
        "records": [asdict(r) for r in records],
    }
    with atomic_write(csv_path) as f:
        f.write(table.getvalue().encode())
    with atomic_write(json_path) as f:
        f.write((json.dumps(report, indent=1) + "\n").encode())
    return csv_path, json_path
