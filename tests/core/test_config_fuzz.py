"""Property-based fuzzing of the config loader: no input, however broken, gives a traceback.

`read_config_file` and `build_config` either return a config or raise the one-line `InputError`.
"""

from __future__ import annotations

import importlib
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftsmith.core.config import build_config, options_of, read_config_file
from draftsmith.core.errors import InputError

STAGE_CONFIGS = [
    ("draftsmith.generate.pipeline", "GenerateConfig"),
    ("draftsmith.tokenize.config", "TokenizeConfig"),
    ("draftsmith.train.config", "TrainConfig"),
    ("draftsmith.train.config", "ExtractConfig"),
    ("draftsmith.evaluate.config", "EvalConfig"),
    ("draftsmith.export.config", "ExportConfig"),
    ("draftsmith.bench.config", "BenchConfig"),
    ("draftsmith.serve.config", "ServeConfig"),
    ("draftsmith.demo.config", "DemoConfig"),
]


def _model(module: str, name: str):
    return getattr(importlib.import_module(module), name)


SUFFIXES = st.sampled_from([".yaml", ".yml", ".toml", ".json"])
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                      max_leaves=12)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _write(suffix: str, data: bytes) -> Path:
    handle = tempfile.NamedTemporaryFile("wb", suffix=suffix, delete=False)
    with handle:
        handle.write(data)
    return Path(handle.name)


@FUZZ
@given(suffix=SUFFIXES, data=st.binary(max_size=300))
def test_any_bytes_as_a_config_file_read_or_refused_in_one_line(suffix, data):
    path = _write(suffix, data)
    try:
        result = read_config_file(path)
        assert isinstance(result, dict)
    except InputError as error:
        assert "\n" not in str(error) and str(path) in str(error)
    finally:
        path.unlink()


@pytest.mark.parametrize("module,name", STAGE_CONFIGS)
def test_any_values_for_a_stages_keys_build_or_are_refused_in_one_line(module, name):
    model = _model(module, name)
    keys = sorted({key for option in options_of(model) for key in option.keys()})

    @FUZZ
    @given(st.dictionaries(st.sampled_from(keys), VALUES, max_size=5), SUFFIXES)
    def check(mapping, suffix):
        text = json.dumps(mapping) if suffix == ".json" else json.dumps(mapping, allow_nan=True)
        path = _write(".json" if suffix == ".toml" else suffix, text.encode())  # JSON is valid YAML
        try:
            build_config(model, {}, path)
        except InputError as error:
            assert "\n" not in str(error)
        finally:
            path.unlink()

    check()
