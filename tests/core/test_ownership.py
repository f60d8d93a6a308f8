"""One stage per output directory, one writer per stage: real `draftsmith` subprocesses.

Each stage that writes a directory is started (as a user would) on a directory another stage owns,
and on a directory a second run of the same stage holds; both are refused with exit 2 and one line,
before any work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.cli import main
from draftsmith.core.errors import InputError
from draftsmith.core.lock import OWNER_NAME, claim_directory, directory_owner, lock_directory

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENV = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1"}

HOLDER = """
import sys, time
from draftsmith.core.lock import DirectoryLock
lock = DirectoryLock(sys.argv[1], sys.argv[2], lock_file=sys.argv[3], own=sys.argv[4] == "own").acquire()
print("locked", flush=True)
time.sleep(120)
"""


def draftsmith(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "draftsmith", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=120)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def work(tmp_path) -> Path:
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"id": "p0", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    for name in ("target", "data", "drafter"):
        (tmp_path / name).mkdir()
    return tmp_path


def own(directory: Path, stage: str) -> Path:
    """`directory` as `stage` leaves it: claimed through the stage's own lock."""
    with lock_directory(directory, stage):
        pass
    return directory


# What each stage's command line looks like with OUT as its output directory.
STAGE_COMMANDS = {
    "generate": ["generate", "prompts.jsonl", "-o", "{out}", "-e", "http://127.0.0.1:9", "--no-progress"],
    "tokenize": ["tokenize", "prompts.jsonl", "--tokenizer", "target", "--out", "{out}"],
    "extract": ["extract", "--target", "target", "--data", "data", "--out", "{out}"],
    "train": ["train", "--target", "target", "--data", "data", "--out", "{out}"],
    "export": ["export", "--drafter", "drafter", "--out", "{out}"],
    "demo": ["demo", "--workdir", "{out}"],
}


def command(stage: str, out: Path) -> list[str]:
    return [part.replace("{out}", str(out)) for part in STAGE_COMMANDS[stage]]


@pytest.mark.parametrize("stage,owner", [
    ("tokenize", "generate"),  # tokenize into a generate directory
    ("train", "tokenize"),     # train --out onto a tokenize directory
    ("train", "generate"),
    ("generate", "tokenize"),
    ("extract", "train"),
    ("export", "train"),       # export --force would have replaced the training run
    ("demo", "generate"),
])
def test_a_stage_is_refused_another_stages_directory(work, stage, owner):
    out = own(work / "out", owner)
    before = sorted(p.name for p in out.iterdir())
    line = one_error_line(draftsmith(*command(stage, out), *(["--force"] if stage == "export" else []), cwd=work))
    assert line == (f"draftsmith: error: {out}: belongs to `{owner}` (it is that stage's output directory); "
                    f"`{stage}` writes only a directory of its own: give {stage} a new output directory")
    assert sorted(p.name for p in out.iterdir()) == before  # nothing written, nothing replaced
    assert directory_owner(out) == owner


def test_train_data_and_out_on_one_directory_is_refused(work):
    tokenized = own(work / "tokenized", "tokenize")
    line = one_error_line(draftsmith("train", "--target", "target", "--data", str(tokenized), "--out", str(tokenized), cwd=work))
    assert f"{tokenized}: belongs to `tokenize`" in line and "give train a new output directory" in line


@pytest.mark.parametrize("stage,files", [
    ("generate", {"manifest.json": json.dumps({"stage": "generate", "settings": {}})}),
    ("tokenize", {"manifest.json": json.dumps({"stage": "tokenize", "settings": {}})}),
    ("tokenize", {"tokenize_summary.json": "{}"}),
    ("generate", {"generated-s0of1-00000.jsonl": ""}),
    ("train", {"train_log.jsonl": ""}),
    ("extract", {"features-00000.safetensors": ""}),
])
def test_a_directory_written_before_owner_records_still_knows_its_stage(work, stage, files, capsys, monkeypatch):
    old = work / "old"
    old.mkdir()
    for name, text in files.items():
        (old / name).write_text(text)
    assert directory_owner(old) == stage
    other = "train" if stage != "train" else "tokenize"
    monkeypatch.chdir(work)
    assert main(command(other, old)) == 2
    assert f"{old}: belongs to `{stage}`" in capsys.readouterr().err
    with lock_directory(old, stage):  # its own stage resumes it, and records itself from now on
        pass
    assert json.loads((old / OWNER_NAME).read_text()) == {"stage": stage}


def test_a_directory_without_any_stage_hint_is_taken_by_the_first_stage(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("mine")
    assert directory_owner(plain) is None
    with lock_directory(plain, "generate shard 0/2"):
        assert directory_owner(plain) == "generate"
    with lock_directory(plain, "generate shard 1/2"):  # the same stage, another writer of its own
        pass
    with pytest.raises(InputError, match="belongs to `generate`"):
        claim_directory(plain, "tokenize")


def test_the_owner_record_is_one_line_of_json_and_a_broken_one_is_an_error(tmp_path):
    own(tmp_path / "d", "tokenize")
    assert (tmp_path / "d" / OWNER_NAME).read_text() == '{"stage": "tokenize"}\n'
    (tmp_path / "d" / OWNER_NAME).write_bytes(b"\xff\xfe")
    with pytest.raises(InputError, match="unreadable owner record"):
        directory_owner(tmp_path / "d")


def _hold(directory: Path, what: str, lock_file: Path, owned: bool = True) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory), what, str(lock_file),
                                "own" if owned else "file"], stdout=subprocess.PIPE, env=ENV, text=True)
    assert process.stdout.readline().strip() == "locked"
    return process


# Where each stage keeps its lock (generate: one per shard; export and demo replace --out whole, so
# theirs lives beside it; bench writes one file).
LOCK_FILES = {
    "generate": lambda out: out / ".draftsmith.s0of1.lock",
    "tokenize": lambda out: out / ".draftsmith.lock",
    "extract": lambda out: out / ".draftsmith.lock",
    "train": lambda out: out / ".draftsmith.lock",
    "export": lambda out: out.parent / f".{out.name}.draftsmith.lock",
    "demo": lambda out: out.parent / f".{out.name}.draftsmith.lock",
}


@pytest.mark.parametrize("stage", sorted(LOCK_FILES))
def test_every_stage_refuses_a_second_writer_of_its_directory(work, stage):
    out = work / "out"
    holder = _hold(out, f"{stage} (first run)", LOCK_FILES[stage](out))
    try:
        line = one_error_line(draftsmith(*command(stage, out), cwd=work))
        assert f"{out}: already being written by pid {holder.pid} on" in line and f"{stage} (first run)" in line
    finally:
        holder.kill()
        holder.wait()


def test_bench_refuses_a_second_writer_of_its_file_and_a_directory_before_the_sweep(work):
    out = work / "bench.json"
    holder = _hold(work, "bench", work / ".bench.json.draftsmith.lock", owned=False)
    try:
        line = one_error_line(draftsmith("bench", "prompts.jsonl", "-o", str(out), "-e", "http://127.0.0.1:9", cwd=work))
        assert f"already being written by pid {holder.pid}" in line
    finally:
        holder.kill()
        holder.wait()
    # -o on a directory: refused at once (the endpoint is never asked), not after the sweep
    (work / "results").mkdir()
    line = one_error_line(draftsmith("bench", "prompts.jsonl", "-o", "results", "-e", "http://127.0.0.1:9", cwd=work))
    assert line == "draftsmith: error: --out results: is a directory; --out names the file to write (e.g. results/bench.json)"
    assert directory_owner(work) is None  # writing one file claims no directory
