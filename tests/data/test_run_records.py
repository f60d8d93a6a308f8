"""The progress record a generate shard keeps (`draftsmith.data.run_records`): a damaged one is
ignored in one line (the rows are then read in full), and lengths read off its histogram never
exceed what the run's cap allows."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from draftsmith.data.run_records import RowStats, histogram_quantile, length_bucket, read_progress

GOOD = {
    "kind": "generate-progress", "version": 1, "shard": "s0of1", "started_at": 1_700_000_000.0,
    "first_started_at": 1_700_000_000.0, "last_row_at": 1_700_000_010.0, "input": 10, "skipped_failed": 0,
    "rows_at_start": 0, "output_tokens_at_start": 0, "failures_start": 0, "settings": {"endpoints": ["http://x"]},
    "history": [[1_700_000_005.0, 2, 20]],
    "parts": {"generated-s0of1-0.jsonl": {"bytes": 10, "rows": 1, "output_tokens": 5, "reasoning_tokens": 0,
                                          "length_finish": 0, "histogram": {"82": 1}}},
}  # fmt: skip

# Nine kinds of wrong-typed field, each a traceback in `status` before (issue 34 item 8).
WRONG = [
    ("started_at", "yesterday"), ("input", "ten"), ("skipped_failed", [1]), ("rows_at_start", None),
    ("history", [[1.0, "2", 3]]), ("failures_start", -4), ("parts", {"generated-s0of1-0.jsonl": {"bytes": "10"}}),
    ("parts", {"generated-s0of1-0.jsonl": {"bytes": 10, "histogram": {"x": 1}}}), ("settings", {"endpoints": "http://x"}),
]  # fmt: skip


def test_a_sound_record_is_read(tmp_path):
    (tmp_path / "progress-s0of1.json").write_text(json.dumps(GOOD))
    assert read_progress(tmp_path / "progress-s0of1.json") == GOOD


@pytest.mark.parametrize(("field", "value"), WRONG)
def test_a_wrong_typed_field_is_one_line_and_the_record_is_not_used(tmp_path, field, value):
    path = tmp_path / "progress-s0of1.json"
    path.write_text(json.dumps({**GOOD, field: value}))
    said: list[str] = []
    assert read_progress(path, warn=said.append) is None
    assert len(said) == 1 and str(path) in said[0] and field in said[0] and "\n" not in said[0]


def test_a_quantile_never_reads_past_the_cap_the_rows_stopped_at():
    """512-token rows fall in the 2% bucket of 512..521 tokens: its middle read 517 (issue 32 item 7)."""
    stats = RowStats()
    for tokens in [512] * 60 + [300] * 40:
        stats.add({"completion_tokens": tokens, "finish_reason": "length" if tokens == 512 else "stop"})
    assert histogram_quantile(stats.histogram, 0.5, cap=512) == 512
    assert histogram_quantile(stats.histogram, 0.9, cap=512) == 512
    assert histogram_quantile(stats.histogram, 0.3, cap=512) == pytest.approx(300, rel=0.01)
    # Without a known cap the middle of the bucket's whole token counts: within 1% of every count in it.
    for tokens in (1, 2, 7, 99, 512, 4096, 31_999):
        middle = histogram_quantile(Counter({str(length_bucket(tokens)): 1}), 0.5)
        assert abs(middle - tokens) <= max(0.5, 0.01 * tokens)
