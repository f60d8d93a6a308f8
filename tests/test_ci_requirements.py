"""Under CI a reference package the tests need (`pytest.importorskip`) must be there: a real pytest
run with the project's conftest, with and without CI=true."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("ci,outcome", [("true", "1 failed"), ("", "1 skipped")])
def test_importorskip_fails_under_ci_and_skips_elsewhere(tmp_path, ci, outcome):
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_reference.py").write_text(
        "import pytest\n\n\ndef test_needs_it():\n"
        "    pytest.importorskip('draftsmith_no_such_reference', reason='pip install it')\n"
    )
    env = {**os.environ, "CI": ci}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert outcome in result.stdout, result.stdout + result.stderr
    if ci:
        assert "required under CI, but not importable" in result.stdout


def test_the_reference_dflash_tests_reach_it_only_through_a_guard_that_fails_under_ci():
    # The reference comparisons get dflash from the `dflash_reference` fixture, which fails under CI
    # when it is missing (or from importorskip, which the hook above turns into a failure).
    text = (TESTS / "export" / "test_export.py").read_text()
    assert "dflash_reference" in text and "import dflash\n" not in text
    fixture = (TESTS / "export" / "conftest.py").read_text()
    assert "pytest.fail(" in fixture and "required under CI" in fixture
