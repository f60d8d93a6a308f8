from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    # Tiny models on a shared 2-core machine: multi-threaded GEMMs stall on oversubscription.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def dflash_reference():
    """The reference `dflash` package; under CI (CI=true) its absence fails instead of skipping."""
    import os

    from draftsmith.check.parity import reference_available

    available, why = reference_available()
    if not available:
        message = f"reference dflash not importable ({why}); install it: pip install --no-deps dflash==0.1.0"
        if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
            pytest.fail(message + " (required under CI=true)", pytrace=False)
        pytest.skip(message)
    import dflash

    return dflash
