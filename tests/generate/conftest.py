from __future__ import annotations

import json
from collections import Counter
from pathlib import Path


def read_rows(directory: Path) -> list[dict]:
    rows = []
    for path in sorted(Path(directory).glob("generated-*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def assert_exactly_once(directory: Path, prompts: Path) -> list[dict]:
    rows = read_rows(directory)
    expected = [json.loads(line)["id"] for line in prompts.read_text().splitlines()]
    counts = Counter(row["id"] for row in rows)
    assert [i for i, n in counts.items() if n > 1] == [], "duplicated samples"
    assert set(counts) == set(expected), f"missing {len(set(expected) - set(counts))} samples"
    return rows
