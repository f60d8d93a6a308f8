"""The progress record a generate shard keeps for `draftsmith status` (`progress-s{i}of{N}.json`):
what it says matches the rows on disk, it carries earlier runs' parts, and it holds no secret."""

from __future__ import annotations

import json
from collections import Counter

from draftsmith.data.run_records import histogram_quantile
from draftsmith.generate import generate
from draftsmith.serve.process import ServeProcess

from .conftest import read_rows
from .test_generate_echo import config


def test_the_record_matches_the_rows_on_disk_across_resumed_runs(tmp_path, prompts_file):
    prompts, out = prompts_file(70), tmp_path / "out"
    with ServeProcess(["--fail-rate", "0.1", "--fail-status", "400", "--seed", "1"]) as server:
        url = server.url.replace("http://", "http://user:secret@")
        first = generate(config(prompts, out, [url], limit=40))
        second = generate(config(prompts, out, [url]))
    text = (out / "progress-s0of1.json").read_text()
    assert "secret" not in text
    record = json.loads(text)
    parts = sorted(out.glob("generated-*.jsonl"))
    assert sorted(record["parts"]) == [part.name for part in parts]  # the first run's part is carried over
    for part in parts:
        lines = part.read_text().splitlines()
        entry = record["parts"][part.name]
        assert (entry["bytes"], entry["rows"], sum(entry["histogram"].values())) == (part.stat().st_size, len(lines), len(lines))
        assert entry["output_tokens"] == sum(json.loads(line)["completion_tokens"] for line in lines)
    rows = read_rows(out)
    assert (record["input"], record["already_done"], record["rows_at_start"]) == (70, first.done, first.done)
    assert second.already_done == first.done and record["history"][-1][1:] == [len(rows), sum(r["completion_tokens"] for r in rows)]
    assert record["settings"]["endpoints"] == [server.url.replace("http://", "http://user:***@")]
    failures_before = (out / "failures-s0of1.jsonl").read_bytes()[: record["failures_start"]]
    assert len(failures_before.splitlines()) == first.failed  # this run's failures start after the first run's
    histogram = Counter()
    for entry in record["parts"].values():
        histogram.update(entry["histogram"])
    lengths = sorted(r["completion_tokens"] for r in rows)
    for share in (0.5, 0.9):  # 2%-wide buckets: a quantile within about 2% of the exact one
        exact = lengths[min(len(lengths) - 1, int(share * len(lengths)))]
        assert abs(histogram_quantile(histogram, share) - exact) <= max(1, 0.03 * exact)
