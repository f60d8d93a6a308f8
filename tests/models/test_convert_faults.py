"""`models convert` on faulty GGUF files and outputs (issue 34 items 1, 8, 9; issue 32 item 3), on
tiny GGUF files written here: nothing is published as finished that is not, and every refusal is one
line, exit 2, before the long conversion where it can be."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.core.errors import InputError
from draftsmith.models.convert import STAMP, convert_gguf
from tiny_gguf import write_tiny_gguf


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "draftsmith", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": "src", **(env or {})}, timeout=600)


def _one_line_error(result: subprocess.CompletedProcess, *texts: str) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == "", result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("draftsmith: error:"), result.stderr
    for text in texts:
        assert text in last, last
    return last


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ggufs")
    return {
        "whole": write_tiny_gguf(root / "whole.gguf"),
        "missing": write_tiny_gguf(root / "missing.gguf", drop=("blk.1.ffn_down.weight",)),
        "mamba": write_tiny_gguf(root / "mamba.gguf", architecture="mamba"),
        "extra": write_tiny_gguf(root / "extra.gguf", extra={"blk.0.ffn_extra.weight": (4,)}),
        "base": write_tiny_gguf(root / "base.gguf", template=None),
    }


@pytest.mark.parametrize("fault,named", [
    ("missing", "blk.1.ffn_down.weight (model.layers.1.mlp.down_proj.weight)"),
    ("mamba", "tensor(s) in the file fit no weight of a 'mamba' model: blk.0.attn_q.weight"),
    ("extra", "1 tensor(s) in the file fit no weight of a 'llama' model: blk.0.ffn_extra.weight"),
])
def test_a_conversion_whose_weights_are_not_all_in_the_file_is_refused_and_not_stamped(ggufs, tmp_path, fault, named):
    """Issue 34.1: transformers initialised what it did not find and the folder was stamped, exit 0."""
    out = tmp_path / "hf"
    with pytest.raises(InputError) as refused:
        convert_gguf(ggufs[fault], out)
    assert "refusing a conversion whose weights would not all come from the file" in str(refused.value)
    assert named in str(refused.value)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == [".hf.draftsmith.lock"]  # no staging folder left


def test_a_whole_gguf_converts_with_every_file_recorded_and_readable_by_others(ggufs, tmp_path):
    from draftsmith.models.convert import conversion_problem

    out = convert_gguf(ggufs["whole"], tmp_path / "hf")
    stamp = json.loads((out / STAMP).read_text())
    assert set(stamp["files"]) >= {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"}
    assert conversion_problem(out) is None
    # Issue 32.6: safetensors writes through a private temporary file (0600).
    mask = os.umask(0)
    os.umask(mask)
    for path in out.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask, path
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask


def test_a_gguf_without_a_chat_template_is_refused_before_converting_and_takes_one_from_a_file(ggufs, tmp_path):
    """Issue 32.3: the refusal came after the whole conversion; now first, with the way out."""
    out = tmp_path / "hf"
    result = _run("models", "convert", "--gguf", str(ggufs["base"]), "--out", str(out))
    _one_line_error(result, "carries no chat template", "--chat-template FILE", "a base model regenerates poorly")
    assert "converting" not in result.stderr and not out.exists()

    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    result = _run("models", "convert", "--gguf", str(ggufs["base"]), "--out", str(out),
                  "--chat-template", str(template))
    assert result.returncode == 0, result.stderr
    assert (out / "chat_template.jinja").read_text() == template.read_text()
    assert "a base model regenerates poorly" in result.stderr
    assert json.loads((out / STAMP).read_text())["chat_template"] == str(template)

    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    result = _run("models", "convert", "--gguf", str(ggufs["base"]), "--out", str(tmp_path / "other"),
                  "--chat-template", str(broken))
    _one_line_error(result, f"--chat-template {broken}: line 1: not a Jinja template")


def test_a_gguf_next_to_another_models_tokenizer_config_keeps_its_own_template(ggufs, tmp_path):
    """Issue 34.9: the tokenizer_config.json in the GGUF's folder was read as the GGUF's own."""
    folder = tmp_path / "downloads"
    folder.mkdir()
    gguf = folder / "model.gguf"
    gguf.write_bytes(ggufs["whole"].read_bytes())
    from tokenizers import Tokenizer, models

    # Another model's tokenizer, as a downloads folder holds it: transformers took it over the GGUF's own.
    Tokenizer(models.WordLevel({"[UNK]": 0, "x": 1}, unk_token="[UNK]")).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                              "model_max_length": 100}))
    out = convert_gguf(gguf, tmp_path / "hf")
    assert "<|im_start|>" in (out / "chat_template.jinja").read_text()
    vocabulary = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocabulary) == 260 and "he" in vocabulary


def test_a_gguf_cut_inside_its_header_is_one_line(ggufs, tmp_path):
    """Issue 34.8: struct.error from transformers' header reader."""
    for size in (8, 300):
        cut = tmp_path / f"cut-{size}.gguf"
        cut.write_bytes(ggufs["whole"].read_bytes()[:size])
        result = _run("models", "convert", "--gguf", str(cut), "--out", str(tmp_path / "hf"))
        _one_line_error(result, f"--gguf {cut}: cannot be read as a GGUF, the file is cut off or damaged")
        assert not (tmp_path / "hf").exists()


def test_gguf_given_a_directory_or_a_fifo_says_what_it_is(tmp_path):
    """Issue 34.9: both were "no such file" (and a FIFO must not be opened: that blocks)."""
    result = _run("models", "convert", "--gguf", str(tmp_path), "--out", str(tmp_path / "hf"))
    _one_line_error(result, f"--gguf {tmp_path}: is a directory")
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    result = _run("models", "convert", "--gguf", str(fifo), "--out", str(tmp_path / "hf"))
    _one_line_error(result, f"--gguf {fifo}: is not a regular file")


def test_out_or_demo_workdir_as_a_link_is_refused_and_its_target_kept(ggufs, tmp_path):
    """Issue 34.8: rmtree on a link (a traceback), after replacing what the link pointed at."""
    elsewhere = tmp_path / "elsewhere"
    convert_gguf(ggufs["whole"], elsewhere)
    before = sorted(p.name for p in elsewhere.iterdir())
    link = tmp_path / "link"
    link.symlink_to(elsewhere)
    result = _run("models", "convert", "--gguf", str(ggufs["whole"]), "--out", str(link))
    _one_line_error(result, f"--out {link}: is a symbolic link (to {elsewhere})")
    assert sorted(p.name for p in elsewhere.iterdir()) == before

    demo_dir = tmp_path / "demo-run"
    demo_dir.mkdir()
    (demo_dir / ".draftsmith-demo").write_text("made by `draftsmith demo`\n")
    (demo_dir / "keep.txt").write_text("keep")
    demo_link = tmp_path / "demo-link"
    demo_link.symlink_to(demo_dir)
    result = _run("demo", "--workdir", str(demo_link))
    _one_line_error(result, f"--workdir {demo_link}: is a symbolic link (to {demo_dir})")
    assert (demo_dir / "keep.txt").read_text() == "keep"


def test_a_stopped_conversion_leaves_nothing_the_next_one_does_not_sweep(ggufs, tmp_path):
    """Issue 34.2(d): a conversion killed while saving left its hidden staging folder forever."""
    dead = [tmp_path / ".hf-converting-abc123", tmp_path / ".hf-replaced-999"]
    for folder in dead:
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"\0" * 1000)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("mine")
    (tmp_path / ".hf-converting-link").symlink_to(outside)
    convert_gguf(ggufs["whole"], tmp_path / "hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hf.draftsmith.lock", "hf", "outside"]
    assert (outside / "precious").read_text() == "mine"


@pytest.fixture
def small_disk(tmp_path):
    path = tmp_path / "disk"
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(path)], capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root; tests/core/test_io.py covers the mechanism without one")
    yield path
    subprocess.run(["umount", str(path)], check=False)


def test_a_full_disk_during_convert_is_one_line_and_leaves_no_folder(ggufs, small_disk):
    """Issue 34.8: safetensors' own error text came out as a traceback."""
    out = small_disk / "hf"
    result = _run("models", "convert", "--gguf", str(ggufs["whole"]), "--out", str(out))
    _one_line_error(result, "the disk is full (no space left on device)", "draftsmith models convert")
    assert sorted(p.name for p in small_disk.iterdir()) == [".hf.draftsmith.lock"]
