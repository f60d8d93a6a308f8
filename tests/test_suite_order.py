"""The suite's own scheduling list names files that exist (a renamed test file would silently drop
out of the slowest-first order and the CI run would end on it alone)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import SLOWEST_FIRST

ROOT = Path(__file__).resolve().parents[1]


def test_every_slowest_first_file_exists_once():
    assert len(set(SLOWEST_FIRST)) == len(SLOWEST_FIRST)
    missing = [name for name in SLOWEST_FIRST if not (ROOT / name).is_file()]
    assert not missing, missing
