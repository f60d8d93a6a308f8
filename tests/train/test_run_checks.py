"""What `draftsmith train` refuses or stops on, run as a user runs it (a real subprocess), and what
a run must leave alone: divergence, resume on other weights or data, unfinished data, values outside
the target, the chat-template record, the frozen target and the optimizer's parameters."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftsmith.core.manifest import set_complete
from draftsmith.data.tokenized import load_tokenized, write_tokenized
from draftsmith.model.io import read_safetensors
from draftsmith.tiny import synthetic_conversations

SRC = Path(__file__).resolve().parents[2] / "src"
SMALL = ["--block-size", "8", "--draft-layers", "1", "--batch-size", "2", "--num-anchors", "16", "--dtype", "fp32", "--device", "cpu",
         "--threads", "1", "--no-progress", "--data-workers", "0", "--warmup-ratio", "0"]  # fmt: skip


def draftsmith(*args, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "draftsmith", *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def train(target, data, out, *extra) -> subprocess.CompletedProcess:
    return draftsmith("train", "--target", target, "--data", data, "--out", out, *SMALL, *extra)


def error_lines(completed: subprocess.CompletedProcess) -> list[str]:
    """stderr without transformers' weight-loading progress bar."""
    return [line for line in completed.stderr.splitlines() if line.strip() and not line.startswith("Loading weights")]


def one_error(completed: subprocess.CompletedProcess, code: int = 2) -> str:
    lines = error_lines(completed)
    assert completed.returncode == code, completed.stderr[-3000:]
    errors = [line for line in lines if line.startswith("draftsmith: error: ")]
    assert len(errors) == 1 and "Traceback" not in completed.stderr, completed.stderr[-3000:]
    return errors[0]


def test_divergence_stops_at_the_first_nonfinite_loss_and_keeps_the_last_good_checkpoint(regenerated, tiny_target_dir, tmp_path):
    out = tmp_path / "run"
    completed = train(tiny_target_dir, regenerated, out, "--lr", "1e18", "--grad-clip", "0", "--max-steps", "6", "--save-every", "1",
                      "--log-every", "1")  # fmt: skip
    message = one_error(completed, code=1)
    assert message.startswith("draftsmith: error: training diverged: loss nan at step 2"), message
    assert "the last good checkpoint is checkpoints/step-00000001; no drafter was written" in message
    assert [path.name for path in (out / "checkpoints").iterdir()] == ["step-00000001"]
    assert not (out / "drafter").exists() and not (out / "train_summary.json").exists()
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [record["step"] for record in log] == [1] and math.isfinite(log[0]["loss"])
    weights = read_safetensors(out / "checkpoints" / "step-00000001" / "model.safetensors")
    assert all(bool(torch.isfinite(tensor).all()) for tensor in weights.values())


def test_resume_refuses_other_target_weights_and_data_rewritten_at_the_same_path(regenerated, tiny_target_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    data, out = tmp_path / "data", tmp_path / "run"
    shutil.copytree(regenerated, data)
    assert train(tiny_target_dir, data, out, "--max-steps", "1").returncode == 0
    # A fine-tune of the target: same tokenizer, same tensor names and shapes, other values.
    other = tmp_path / "target"
    shutil.copytree(tiny_target_dir, other)
    weights = load_file(other / "model.safetensors")
    name = sorted(weights)[len(weights) // 2]
    weights[name] = weights[name] * 1.01
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    message = one_error(train(other, data, out, "--max-steps", "2", "--resume"))
    assert "was written with other settings (target_weights: " in message, message
    # Other rows written at the same path (what a re-run tokenize leaves).
    rows = [{"id": s.id, "input_ids": s.input_ids.tolist(), "loss_mask": s.loss_mask.tolist()} for s in load_tokenized(data)[:20]]
    shutil.rmtree(data)
    write_tokenized(rows, data)
    message = one_error(train(tiny_target_dir, data, out, "--max-steps", "2", "--resume"))
    assert "was written with other settings (data: " in message, message


@pytest.fixture(scope="module")
def tokenized_run(tmp_path_factory, tiny_target_dir) -> Path:
    """A real `draftsmith tokenize` output directory (its manifest records the chat template)."""
    root = tmp_path_factory.mktemp("tokenize")
    source = root / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in synthetic_conversations(12, seed=6)))
    completed = draftsmith("tokenize", source, "--tokenizer", tiny_target_dir, "--out", root / "tokenized", "--workers", "1",
                           "--no-audit", "--no-progress")  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    return root / "tokenized"


def test_the_chat_template_record_travels_into_the_drafter_config(tokenized_run, tiny_target_dir, tmp_path):
    template = json.loads((tokenized_run / "manifest.json").read_text())["template"]
    assert set(template) == {"sha256", "kwargs"} and len(template["sha256"]) == 64
    completed = train(tiny_target_dir, tokenized_run, tmp_path / "run", "--max-steps", "1")
    assert completed.returncode == 0, completed.stderr[-3000:]
    config = json.loads((tmp_path / "run" / "drafter" / "config.json").read_text())
    assert config["dflash_config"]["template"] == template


def test_one_shard_of_an_unfinished_tokenize_run_is_refused_like_its_directory(tokenized_run, tiny_target_dir, tmp_path):
    unfinished = tmp_path / "unfinished"
    shutil.copytree(tokenized_run, unfinished)
    set_complete(unfinished, False)  # what a killed or error-stopped tokenize leaves
    for data in (unfinished, unfinished / "part-00000.arrow"):
        message = one_error(train(tiny_target_dir, data, tmp_path / f"run-{data.name}", "--max-steps", "1"))
        assert f"{unfinished}: the tokenized set is incomplete" in message, message


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--betas", "0.9,1.0"], "--betas: Input should be less than 1"),
        (["--betas", "-0.1,0.95"], "--betas: Input should be greater than or equal to 0"),
        (["--target-layer-ids", "0,9"], "target layer ids [9] outside the target's layers 0..3"),
        (["--mask-token-id", "1026"], "--mask-token-id 1026 is outside the target's vocabulary of 1026"),
    ],
)
def test_values_outside_the_target_exit_2_in_one_line(flags, expected, regenerated, tiny_target_dir, tmp_path):
    message = one_error(train(tiny_target_dir, regenerated, tmp_path / "run", "--max-steps", "1", *flags))
    assert expected in message, message


def test_training_leaves_the_target_alone_and_optimizes_exactly_the_drafter(regenerated, tiny_target_dir, tmp_path):
    from draftsmith.train import TrainConfig
    from draftsmith.train.distributed import init_distributed
    from draftsmith.train.loader import StepSampler, StepSource, make_loader, trainable_indices
    from draftsmith.train.state import MetricsAccumulator
    from draftsmith.train.trainer import DrafterTrainer, _train_step, build_optimizer

    config = TrainConfig(target=tiny_target_dir, data=regenerated, out=tmp_path / "x", block_size=8, num_draft_layers=1, lr=5e-2,
                         batch_size=2, num_anchors=16, dtype="fp32", device="cpu", data_workers=0)  # fmt: skip
    dataset = load_tokenized(regenerated)
    trainer = DrafterTrainer(config, init_distributed("cpu"), dataset)
    before = {name: tensor.clone() for name, tensor in trainer.target.state_dict().items()}
    embed, head = trainer.embed_tokens.weight.clone(), trainer.lm_head.weight.clone()
    drafter_before = {name: tensor.clone() for name, tensor in trainer.drafter.state_dict().items()}
    optimizer, _ = build_optimizer(trainer.drafter, config, total_steps=3)

    optimized = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    assert len(optimized) == len({id(parameter) for parameter in optimized})  # none twice
    assert {id(parameter) for parameter in optimized} == {id(parameter) for parameter in trainer.drafter.parameters()}
    target_ids = {id(parameter) for parameter in trainer.target.parameters()}
    assert not target_ids & {id(parameter) for parameter in optimized}

    sampler = StepSampler(trainable_indices(dataset), seed=0, rank=0, world_size=1, batch_size=2, grad_accum=1, epochs=1, total_steps=3)
    metrics = MetricsAccumulator(config.block_size, trainer.device)
    for step_batch in make_loader(trainer.source, sampler, workers=0, device=trainer.device):
        _train_step(trainer, trainer.drafter, optimizer, torch.amp.GradScaler("cpu", enabled=False), metrics, step_batch, 1.0)
    assert isinstance(trainer.source, StepSource)
    for name, tensor in trainer.target.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert torch.equal(trainer.embed_tokens.weight, embed) and torch.equal(trainer.lm_head.weight, head)
    assert all(parameter.grad is None and not parameter.requires_grad for parameter in trainer.target.parameters())
    changed = [name for name, tensor in trainer.drafter.state_dict().items() if not torch.equal(tensor, drafter_before[name])]
    assert changed and len(changed) == len([p for p in trainer.drafter.parameters() if p.requires_grad])


def test_fp16_runs_under_a_grad_scaler_saved_in_the_checkpoint(regenerated, tiny_target_dir, tmp_path):
    completed = train(tiny_target_dir, regenerated, tmp_path / "run", "--dtype", "fp16", "--max-steps", "3", "--save-every", "2")
    assert completed.returncode == 0, completed.stderr[-3000:]
    state = torch.load(tmp_path / "run" / "checkpoints" / "step-00000002" / "trainer_state.pt", weights_only=True)
    assert state["config"]["dtype"] in ("fp16", "float16") and 0 < state["scaler"]["scale"] <= 65536.0
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert all(math.isfinite(loss) for _, loss in summary["losses"])


def corrupt_token(shard: Path, value: int, position: int = 3) -> None:
    """Overwrite one token id in the shard's values buffer on disk (bit rot, a bad copy)."""
    import pyarrow as pa

    with pa.memory_map(str(shard), "r") as source:
        buffer = source.read_buffer()
        batch = pa.ipc.open_file(buffer).get_batch(0)
        offset = batch.column("input_ids").values.buffers()[1].address - buffer.address + 4 * position
    with shard.open("r+b") as handle:
        handle.seek(offset)
        handle.write(int(value).to_bytes(4, "little", signed=True))


def test_a_damaged_tokenized_shard_is_refused_before_training_naming_it(tokenized_run, tiny_target_dir, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(tokenized_run, damaged)
    shard = damaged / "part-00000.arrow"
    corrupt_token(shard, 50_000)  # past the tiny target's vocabulary, as a flipped high bit makes it
    message = one_error(train(tiny_target_dir, damaged, tmp_path / "run", "--max-steps", "2"))
    assert f"{shard}: a damaged tokenized shard" in message and "max_token_id" in message, message
