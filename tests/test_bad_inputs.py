"""Every stage against bad input, as a user meets it: `python -m draftsmith ...` as a real process.

Each case must exit 2 with exactly one stderr line, `draftsmith: error: ...`, that names the file
(and line or sample where there is one) and the problem; never a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

SRC = Path(__file__).resolve().parents[1] / "src"


def run_cli(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="200", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "draftsmith", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)  # fmt: skip


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    err = result.stderr
    assert "Traceback" not in err, err
    assert result.returncode == 2, (result.returncode, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("draftsmith: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def _prompt_row(text: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": text}]}) + "\n"


def _conversation_row(text: str) -> str:
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": "an answer to " + text}]
    return json.dumps({"id": text, "messages": messages}) + "\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_target_dir) -> dict[str, Path]:
    """One of each bad input, plus the good parts the stages need around it."""
    from draftsmith.model import DFlashDraftModel, build_drafter_config, save_drafter
    from draftsmith.model.target import load_target_config

    root = tmp_path_factory.mktemp("bad")
    paths = {"root": root, "target": tiny_target_dir}
    paths["empty"] = root / "empty.jsonl"
    paths["empty"].write_text("")
    paths["a_file"] = root / "a_file"
    paths["a_file"].write_text("not a directory\n")
    paths["prompts"] = root / "prompts.jsonl"
    paths["prompts"].write_text(_prompt_row("one") + _prompt_row("two"))
    paths["conversations"] = root / "conversations.jsonl"
    paths["conversations"].write_text(_conversation_row("one") + _conversation_row("two"))

    torch.manual_seed(0)
    config = build_drafter_config(load_target_config(tiny_target_dir), num_draft_layers=1, block_size=4, mask_token_id=3)
    paths["drafter"] = save_drafter(DFlashDraftModel(config), root / "drafter")
    truncated = root / "truncated-drafter"
    truncated.mkdir()
    (truncated / "config.json").write_bytes((paths["drafter"] / "config.json").read_bytes())
    weights = (paths["drafter"] / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    paths["truncated_drafter"] = truncated

    # Invalid UTF-8 on line 2 of an otherwise good file, for every reader of JSONL.
    paths["bad_utf8_prompts"] = root / "bad-utf8-prompts.jsonl"
    paths["bad_utf8_prompts"].write_bytes(_prompt_row("one").encode() + b'{"messages": [{"role": "user", "content": "caf\xe9"}]}\n')
    paths["bad_utf8_conversations"] = root / "bad-utf8-conversations.jsonl"
    paths["bad_utf8_conversations"].write_bytes(_conversation_row("one").encode() + b'{"id": "x\xff", "messages": []}\n')
    paths["bad_utf8_lengths"] = root / "bad-utf8-lengths.jsonl"
    paths["bad_utf8_lengths"].write_bytes(b'{"completion_tokens": 10}\n{"completion_tokens": 12, "note": "\xc3("}\n')
    paths["messages_number"] = root / "messages-number.jsonl"
    paths["messages_number"].write_text(_prompt_row("one") + json.dumps({"id": "n", "messages": 3}) + "\n")

    from draftsmith.data.tokenized import write_tokenized

    generator = torch.Generator().manual_seed(0)
    rows = []
    for index in range(8):
        input_ids = torch.randint(10, 200, (24,), generator=generator).tolist()
        rows.append({"id": f"s{index}", "input_ids": input_ids, "loss_mask": [0] * 8 + [1] * 16, "finish_reason": "stop"})
    paths["tokenized"] = root / "tokenized"
    write_tokenized(rows, paths["tokenized"])
    return paths


@pytest.fixture(scope="module")
def broken_run(files) -> Path:
    """A training run whose every checkpoint is cut short (a copy that stopped half-way)."""
    from draftsmith.train import TrainConfig, train_drafter

    out = files["root"] / "broken-run"
    train_drafter(TrainConfig(target=files["target"], data=files["tokenized"], out=out, block_size=4, num_draft_layers=1,
                              max_steps=1, batch_size=4, device="cpu", dtype="fp32", num_threads=1, progress=False,
                              num_anchors=4))  # fmt: skip
    for state in out.glob("checkpoints/step-*/trainer_state.pt"):
        state.write_bytes(state.read_bytes()[:1000])
    return out


def _cases() -> list[tuple[str, list[str], tuple[str, ...]]]:
    # Arguments name fixture files as "{key}"; the expected fragments may too.
    return [
        ("plan: a decimal comma", ["plan", "--samples", "914000", "--output-mean", "2500", "--throughput", "1,5k tok/s"],
         ("'1,5' is ambiguous", "decimal point or a thousands separator")),
        ("generate: empty input", ["generate", "{empty}", "-o", "{root}/gen-empty", "--no-progress"],
         ("{empty}: no prompts",)),
        ("tokenize: missing --tokenizer dir", ["tokenize", "{conversations}", "-t", "{root}/no-such-tokenizer", "-o", "{root}/tok-x"],
         ("--tokenizer {root}/no-such-tokenizer: no such directory",)),
        ("eval: missing --target dir", ["eval", "--target", "{root}/no-such-target", "--drafter", "{drafter}", "--prompts", "{prompts}"],
         ("--target {root}/no-such-target: no such directory",)),
        ("export: truncated model.safetensors", ["export", "--drafter", "{truncated_drafter}", "--out", "{root}/export-x"],
         ("{truncated_drafter}/model.safetensors: not a readable safetensors file",)),
        ("eval: truncated model.safetensors", ["eval", "--target", "{target}", "--drafter", "{truncated_drafter}", "--prompts", "{prompts}"],
         ("{truncated_drafter}/model.safetensors: not a readable safetensors file",)),
        # Invalid UTF-8 in JSONL, for every stage that reads it.
        ("generate: invalid UTF-8", ["generate", "{bad_utf8_prompts}", "-o", "{root}/gen-utf8", "--no-progress"],
         ("{bad_utf8_prompts}:2", "UTF-8")),
        ("tokenize: invalid UTF-8", ["tokenize", "{bad_utf8_conversations}", "-t", "{target}", "-o", "{root}/tok-utf8"],
         ("{bad_utf8_conversations}:2", "UTF-8")),
        ("bench: invalid UTF-8", ["bench", "{bad_utf8_prompts}", "-e", "http://127.0.0.1:9", "-o", "{root}/bench.json"],
         ("{bad_utf8_prompts}:2", "UTF-8")),
        ("eval: invalid UTF-8", ["eval", "--target", "{target}", "--drafter", "{drafter}", "--prompts", "{bad_utf8_prompts}"],
         ("{bad_utf8_prompts}:2", "UTF-8")),
        ("plan: invalid UTF-8 in --output-lengths",
         ["plan", "--samples", "1000", "--throughput", "100 tok/s", "--output-lengths", "{bad_utf8_lengths}:completion_tokens"],
         ("{bad_utf8_lengths}:2", "UTF-8")),
        ("eval: messages is a number", ["eval", "--target", "{target}", "--drafter", "{drafter}", "--prompts", "{messages_number}"],
         ("{messages_number}:2", "messages")),
        # An output path that is an existing file.
        ("generate: output is a file", ["generate", "{prompts}", "-o", "{a_file}", "--no-progress"],
         ("{a_file}", "not a directory")),
        ("tokenize: output is a file", ["tokenize", "{conversations}", "-t", "{target}", "-o", "{a_file}"],
         ("{a_file}", "not a directory")),
        ("train: output is a file", ["train", "--target", "{target}", "--data", "{tokenized}", "--out", "{a_file}"],
         ("{a_file}", "not a directory")),
        ("export: output is a file", ["export", "--drafter", "{drafter}", "--out", "{a_file}"],
         ("{a_file}", "not a directory")),
        # Empty inputs.
        ("tokenize: empty input", ["tokenize", "{empty}", "-t", "{target}", "-o", "{root}/tok-empty"], ("{empty}",)),
        ("eval: empty prompts", ["eval", "--target", "{target}", "--drafter", "{drafter}", "--prompts", "{empty}"],
         ("{empty}: no prompts",)),
    ]  # fmt: skip


CASES = _cases()


@pytest.mark.parametrize("name, args, fragments", CASES, ids=[case[0] for case in CASES])
def test_bad_input_is_one_line_and_exit_2(files, name, args, fragments):
    fill = {key: str(value) for key, value in files.items()}
    result = run_cli([arg.format(**fill) for arg in args])
    assert_one_line_error(result, *(fragment.format(**fill) for fragment in fragments))


def test_ctrl_c_says_interrupted(tmp_path, files):
    env = dict(os.environ, PYTHONPATH=str(SRC))
    process = subprocess.Popen(
        [sys.executable, "-m", "draftsmith", "generate", str(files["prompts"]), "-o", str(tmp_path / "out"),
         "-e", "http://127.0.0.1:9", "--no-progress"],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    # The run reports its (closed) endpoint down and waits for it; interrupt it there.
    first = process.stderr.readline()
    assert "http://127.0.0.1:9" in first, first
    process.send_signal(signal.SIGINT)
    rest = process.communicate(timeout=60)[1]
    assert process.returncode == 130
    assert rest.strip().splitlines()[-1] == "draftsmith: interrupted" and "Traceback" not in rest


def test_resume_with_only_truncated_checkpoints(files, broken_run):
    result = run_cli(["train", "--target", str(files["target"]), "--data", str(files["tokenized"]), "--out", str(broken_run),
                      "--block-size", "4", "--draft-layers", "1", "--max-steps", "2", "--batch-size", "4",
                      "--num-anchors", "4", "--dtype", "fp32", "--resume"])  # fmt: skip
    assert_one_line_error(result, f"{broken_run}: no intact checkpoint to resume from",
                          "step-00000001/trainer_state.pt: cannot be loaded safely")


def test_a_link_planted_in_an_output_dir_is_never_followed(files, tmp_path):
    """Issue 27.1: tokenize and train emptied the file a planted `.draftsmith.lock` (or log) link
    points to; export --force --out LINK ended in rmtree's traceback. Each is now one line, and what
    the link points to is untouched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    tokenize_out, train_out = tmp_path / "tok", tmp_path / "run"
    for out, planted in ((tokenize_out, ".draftsmith.lock"), (train_out, ".draftsmith.lock"), (tmp_path / "run2", "train_log.jsonl")):
        out.mkdir()
        (out / planted).symlink_to(victim)
    train = ["train", "--target", str(files["target"]), "--data", str(files["tokenized"]), "--block-size", "4",
             "--draft-layers", "1", "--max-steps", "1", "--batch-size", "4", "--num-anchors", "4", "--dtype", "fp32"]
    for args, link in (
        (["tokenize", str(files["conversations"]), "-t", str(files["target"]), "-o", str(tokenize_out), "--workers", "1"],
         tokenize_out / ".draftsmith.lock"),
        ([*train, "--out", str(train_out)], train_out / ".draftsmith.lock"),
        ([*train, "--out", str(tmp_path / "run2")], tmp_path / "run2" / "train_log.jsonl"),
    ):
        result = run_cli(args)  # the log is opened after the model loads: its progress lines come first
        assert "Traceback" not in result.stderr and result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith(f"draftsmith: error: {link}: is a symbolic link (to {victim})")
        assert victim.read_text() == "precious\n"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep\n")
    (tmp_path / "export-link").symlink_to(elsewhere, target_is_directory=True)
    result = run_cli(["export", "--drafter", str(files["drafter"]), "--out", str(tmp_path / "export-link"), "--force"])
    assert_one_line_error(result, f"--out {tmp_path / 'export-link'}: is a symbolic link")
    assert (elsewhere / "keep.txt").read_text() == "keep\n"


_WRITER = """
import sys, time
from pathlib import Path
from draftsmith.core.lock import DirectoryLock
DirectoryLock(sys.argv[1], sys.argv[2], lock_file=Path(sys.argv[1]) / sys.argv[3]).acquire()
print("locked", flush=True)
time.sleep(120)
"""


def _live_writer(directory: Path, what: str, lock_name: str) -> subprocess.Popen:
    """A real second process holding `directory`'s writer lock, as a running generate or tokenize does."""
    env = dict(os.environ, PYTHONPATH=str(SRC))
    process = subprocess.Popen([sys.executable, "-c", _WRITER, str(directory), what, lock_name], stdout=subprocess.PIPE,
                               text=True, env=env)  # fmt: skip
    assert process.stdout.readline().strip() == "locked"
    return process


def test_an_input_still_being_written_is_refused_unless_allow_partial(files, tmp_path):
    """Issue 27.2: tokenize of a generate directory whose writer is still running wrote the rows so far
    and marked the set complete (and train trained on a tokenized set still being written). Now one
    line naming the pid; --allow-partial uses it and the output's manifest records that."""
    generated = tmp_path / "gen"
    generated.mkdir()
    (generated / "generated-s0of1-00000.jsonl").write_text(_conversation_row("one") + _conversation_row("two"))
    writer = _live_writer(generated, "generate shard 0/1", ".draftsmith.s0of1.lock")
    try:
        tokenize = ["tokenize", str(generated), "-t", str(files["target"]), "--workers", "1", "--no-progress"]
        result = run_cli([*tokenize, "-o", str(tmp_path / "tok")])
        assert_one_line_error(result, f"{generated}: still being written by pid {writer.pid}", "--allow-partial")
        assert not (tmp_path / "tok" / "tokenize_summary.json").exists()
        audit = run_cli(["audit", str(generated)])
        assert_one_line_error(audit, f"{generated}: still being written by pid {writer.pid}")

        result = run_cli([*tokenize, "-o", str(tmp_path / "tok"), "--allow-partial"])
        assert "Traceback" not in result.stderr and result.returncode in (0, 1), result.stderr
        manifest = json.loads((tmp_path / "tok" / "manifest.json").read_text())
        assert any(f"{generated}: still being written by pid {writer.pid}" in note for note in manifest["partial_inputs"])
    finally:
        writer.kill()
        writer.wait()

    tokenized = Path(shutil.copytree(files["tokenized"], tmp_path / "tokenized"))
    writer = _live_writer(tokenized, "tokenize", ".draftsmith.lock")
    try:
        result = run_cli(["train", "--target", str(files["target"]), "--data", str(tokenized), "--out",
                          str(tmp_path / "run"), "--block-size", "4", "--draft-layers", "1", "--max-steps", "1"])
        assert_one_line_error(result, f"{tokenized}: still being written by pid {writer.pid}")
    finally:
        writer.kill()
        writer.wait()


@pytest.fixture
def small_disk(tmp_path):
    """Mount a tmpfs of a given size (root only, as tests/core/test_bad_values.py's full disk does)."""
    mounts: list[Path] = []

    def mount(name: str, size: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True).returncode:
            pytest.skip("mounting a small tmpfs needs root; tests/core/test_io.py covers the mechanism without one")
        mounts.append(path)
        return path

    yield mount
    for path in mounts:
        subprocess.run(["umount", str(path)], check=False)


def test_a_full_disk_during_a_checkpoint_or_an_export_is_one_line_with_the_resume_command(files, small_disk):
    """Issue 27.4: torch.save (RuntimeError) and safetensors (SafetensorError) do not raise OSError on a
    full disk, so a checkpoint or an export ended in a traceback. Now the one "disk is full" line,
    exit 2, naming the exact command that continues (train needs --resume), with nothing half-written
    left to be taken as intact."""
    disk = small_disk("train-disk", "1m")  # the run's small files fit; a checkpoint (weights + AdamW) does not
    train = ["train", "--target", str(files["target"]), "--data", str(files["tokenized"]), "--out", str(disk / "run"),
             "--block-size", "4", "--draft-layers", "1", "--max-steps", "1", "--batch-size", "4", "--num-anchors", "4",
             "--dtype", "fp32"]
    result = run_cli(train)
    assert "Traceback" not in result.stderr and result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "the disk is full (no space left on device)" in last, last
    assert last.split("resume with: ")[1].startswith(" ".join(["draftsmith", *train, "--resume"])), last
    assert not list((disk / "run" / "checkpoints").iterdir())  # neither a step folder nor its partial

    disk = small_disk("export-disk", "512k")  # less than the drafter's weights
    result = run_cli(["export", "--drafter", str(files["drafter"]), "--out", str(disk / "exported")])
    line = assert_one_line_error(result, "the disk is full (no space left on device)", "resume with: draftsmith export")
    assert not (disk / "exported").exists() and not (disk / ".exported.partial").exists(), line


def _with_header(source: Path, destination: Path, change) -> Path:
    """A copy of the model directory `source` whose model.safetensors header is rewritten by `change`."""
    import struct

    shutil.copytree(source, destination)
    raw = (destination / "model.safetensors").read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    header = change(json.loads(raw[8 : 8 + length]))
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    (destination / "model.safetensors").write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + length :])
    return destination


def _offsets_past_the_end(header: dict) -> dict:
    name = next(key for key in header if key != "__metadata__")
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin, end + 10**12]
    return header


def test_a_safetensors_header_with_bad_offsets_is_one_line_on_every_path_that_reads_it(files, tmp_path):
    """Issue 27.6: a target whose safetensors header does not hold (offsets past the end, not an
    object) ended in a traceback where the resume fingerprint reads it (train); every reader now
    checks it the same way and names the file."""
    targets = {
        "offsets": _with_header(files["target"], tmp_path / "target-offsets", _offsets_past_the_end),
        "not an object": _with_header(files["target"], tmp_path / "target-list", lambda header: [1, 2]),
    }
    for problem, target in targets.items():
        weights = target / "model.safetensors"
        for args in (
            ["train", "--target", str(target), "--data", str(files["tokenized"]), "--out", str(tmp_path / f"run-{target.name}"),
             "--block-size", "4", "--draft-layers", "1", "--max-steps", "1"],
            ["extract", "--target", str(target), "--data", str(files["tokenized"]), "--out", str(tmp_path / f"ext-{target.name}")],
            ["eval", "--target", str(target), "--drafter", str(files["drafter"]), "--prompts", str(files["prompts"])],
            ["check", str(files["drafter"]), "--target", str(target)],
        ):
            result = run_cli(args)
            assert "Traceback" not in result.stderr and result.returncode == 2, (problem, args[0], result.stderr)
            last = result.stderr.strip().splitlines()[-1]
            assert last.startswith(f"draftsmith: error: {weights}: not a readable safetensors file"), (problem, args[0], last)
    drafter = _with_header(files["drafter"], tmp_path / "drafter-offsets", _offsets_past_the_end)
    result = run_cli(["export", "--drafter", str(drafter), "--out", str(tmp_path / "exported")])
    assert_one_line_error(result, f"{drafter / 'model.safetensors'}: not a readable safetensors file")
