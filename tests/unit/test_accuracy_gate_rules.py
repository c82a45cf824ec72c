"""The accuracy gate's parts (``engines/verify.py``): ROUGE-L, and the verdict stored with the engine."""

from __future__ import annotations

import pytest

from engines.tensorrt import cache
from engines.verify import rouge_l


def test_rouge_l():
    assert rouge_l("the cat sat on the mat", "the cat sat on the mat") == 1.0
    assert rouge_l("the cat sat", "") == 0.0 and rouge_l("", "") == 1.0
    # LCS "the cat the mat" (4) of 6 and 5 words
    assert rouge_l("the cat sat on the mat", "The cat lay the mat") == pytest.approx(
        2 * (4 / 5) * (4 / 6) / (4 / 5 + 4 / 6)
    )


def test_verdict_is_stored_with_the_engine(tmp_path):
    folder = tmp_path / "entry"
    record = cache.write_entry(folder, b"engine bytes", {"key": "k"})
    assert record["engine"]["size"] == 12
    cache.update_record(folder, verified={"passed": False, "failures": ["ROUGE-L 0.1 < 0.8"]})
    entry = cache.list_entries(tmp_path)[0]
    assert entry.problem is None and entry.record["verified"]["passed"] is False
    assert entry.describe().endswith("accuracy gate FAILED: ROUGE-L 0.1 < 0.8")
