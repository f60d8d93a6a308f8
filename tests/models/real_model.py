"""Shared by tests/models: a missing real model or engine skips locally and fails in CI."""

from __future__ import annotations

import os

import pytest

FETCH_COMMAND = "draftsmith models fetch smollm2-135m"


def required() -> bool:
    ci = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}
    return ci or os.environ.get("DRAFTSMITH_REQUIRE_ENGINES", "").strip() == "1"


def unavailable(message: str):
    if required():
        pytest.fail(f"{message}\n(required here: CI=true or DRAFTSMITH_REQUIRE_ENGINES=1)", pytrace=False)
    pytest.skip(message)
