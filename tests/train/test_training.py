"""Training on the tiny target: regenerated data, online == offline, exact resume, torchrun, learning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from draftsmith.cli import main
from draftsmith.core.errors import InputError
from draftsmith.tiny import synthetic_prompts
from draftsmith.train import FeatureStore, TrainConfig, extract_features, load_tokenized, train_drafter
from draftsmith.train.distributed import init_distributed
from draftsmith.train.trainer import DrafterTrainer
from two_ranks import torchrun_train



def small_config(target: Path, data: Path, out: Path, **overrides) -> TrainConfig:
    settings = dict(
        target=target,
        data=data,
        out=out,
        block_size=8,
        num_draft_layers=1,
        epochs=1,
        lr=2e-3,
        warmup_ratio=0.0,
        batch_size=4,
        dtype="fp32",
        device="cpu",
        num_threads=1,
        progress=False,
        log_every=1,
        num_anchors=24,
    )
    settings.update(overrides)
    return TrainConfig(**settings)


def test_regenerated_data_masks_prompt_and_marks_generated_tokens(regenerated, tiny_tokenizer):
    dataset = load_tokenized(regenerated)
    assert len(dataset) == 24
    for sample in dataset.samples:
        mask = sample.loss_mask.tolist()
        first = mask.index(1)
        assert mask == [0] * first + [1] * (len(mask) - first)
        prompt = tiny_tokenizer.decode(sample.input_ids[:first].tolist())
        assert prompt.endswith("<|im_start|>assistant\n")
        assert sample.num_trainable > 10
    stopped = [s for s in dataset.samples if tiny_tokenizer.decode(s.input_ids[-1:].tolist()) == "<|im_end|>"]
    assert len(stopped) >= 20


def test_offline_features_equal_online_and_give_the_same_losses(regenerated, tiny_target_dir, tmp_path, capsys):
    features_dir = tmp_path / "features"
    result = extract_features(
        tiny_target_dir, regenerated, features_dir, dtype="float32", samples_per_shard=10, batch_size=5, progress=False
    )
    printed = capsys.readouterr().out
    assert "Offline hidden states" in printed  # the plan's storage estimate comes first
    assert result.shards == 3 and result.num_samples == 24
    store = FeatureStore(features_dir)
    assert store.layer_ids == [0, 1, 2]

    online = small_config(tiny_target_dir, regenerated, tmp_path / "online", max_steps=3)
    offline = online.model_copy(update={"out": tmp_path / "offline", "offline_features": features_dir})
    context = init_distributed("cpu")
    dataset = load_tokenized(regenerated)
    online_trainer = DrafterTrainer(online, context, dataset)
    offline_trainer = DrafterTrainer(offline, context, dataset)
    assert offline_trainer.target is None  # offline never loads the target's decoder
    batch = online_trainer.make_batch([0, 5, 17], epoch=0)
    torch.testing.assert_close(
        online_trainer.context_features(batch, [0, 5, 17]), offline_trainer.context_features(batch, [0, 5, 17]), rtol=0, atol=1e-5
    )
    online_loss, _ = online_trainer.forward_loss(online_trainer.drafter, [0, 5, 17], 0)
    offline_loss, _ = offline_trainer.forward_loss(offline_trainer.drafter, [0, 5, 17], 0)
    assert online_loss.loss.item() == pytest.approx(offline_loss.loss.item(), rel=1e-5)

    online_run = train_drafter(online)
    offline_run = train_drafter(offline)
    assert [step for step, _ in online_run.losses] == [1, 2, 3]
    for (_, a), (_, b) in zip(online_run.losses, offline_run.losses, strict=True):
        assert a == pytest.approx(b, rel=1e-4)

    # Rerunning extract keeps every finished shard and writes nothing again.
    again = extract_features(tiny_target_dir, regenerated, features_dir, dtype="float32", samples_per_shard=10, progress=False)
    assert again.skipped_shards == 3 and again.bytes_written == 0
    with pytest.raises(InputError, match=r'other settings \(dtype: "float32" -> "bfloat16"\)'):
        extract_features(tiny_target_dir, regenerated, features_dir, dtype="bfloat16", samples_per_shard=10, progress=False)
    with pytest.raises(InputError, match="do not match the training data"):
        train_drafter(offline.model_copy(update={"out": tmp_path / "x", "max_length": 40}))


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_resume_from_a_checkpoint_reproduces_the_same_losses(regenerated, tiny_target_dir, tmp_path, optimizer):
    config = small_config(tiny_target_dir, regenerated, tmp_path / "full", epochs=2, save_every=2, keep_checkpoints=5, batch_size=3,
                          optimizer=optimizer)
    full = train_drafter(config)
    assert full.steps == 16
    checkpoints = sorted((tmp_path / "full" / "checkpoints").glob("step-*"))
    assert [path.name for path in checkpoints][-2:] == ["step-00000014", "step-00000016"]

    # A run that stopped after its step-10 checkpoint (mid-epoch 2): resume must replay steps 11..16.
    shutil.copytree(tmp_path / "full", tmp_path / "cut")
    for path in sorted((tmp_path / "cut" / "checkpoints").glob("step-*")):
        if int(path.name.split("-")[1]) > 10:
            shutil.rmtree(path)
    shutil.rmtree(tmp_path / "cut" / "drafter")
    resumed = train_drafter(config.model_copy(update={"out": tmp_path / "cut", "resume": True}))
    assert resumed.resumed_from_step == 10
    assert resumed.steps == 16
    assert [step for step, _ in resumed.losses] == list(range(1, 17))
    for (step, a), (_, b) in zip(full.losses[10:], resumed.losses[10:], strict=True):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-7), step
    assert resumed.rank_checksums[0] == pytest.approx(full.rank_checksums[0], rel=1e-9)
    # Loader workers build the same micro-batches as the loop itself (anchors owned by (seed, epoch, sample)).
    assert config.data_workers == 2
    in_loop = train_drafter(config.model_copy(update={"out": tmp_path / "in-loop", "data_workers": 0}))
    for (step, a), (_, b) in zip(full.losses, in_loop.losses, strict=True):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-7), step

    with pytest.raises(InputError, match="pass --resume"):
        train_drafter(config)
    with pytest.raises(InputError, match="cannot resume with different block_size"):
        train_drafter(config.model_copy(update={"resume": True, "block_size": 4}))


def test_training_loss_drops_on_the_tiny_target(regenerated, tiny_target_dir, tmp_path):
    result = train_drafter(
        small_config(tiny_target_dir, regenerated, tmp_path / "run", epochs=10, lr=5e-3, warmup_ratio=0.1, batch_size=2, grad_accum=2)
    )
    assert result.steps == 60
    first = sum(loss for _, loss in result.losses[:3]) / 3
    assert result.final_loss < 0.6 * first, result.losses
    assert result.accuracy_by_offset[0] > 0.3
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 60 and {"loss", "lr", "grad_norm", "tokens_per_s", "acc_by_offset"} <= set(log[0])
    assert (tmp_path / "run" / "drafter" / "config.json").exists()
    from draftsmith.model import load_drafter

    drafter = load_drafter(tmp_path / "run" / "drafter")
    assert drafter.block_size == 8 and drafter.config.num_hidden_layers == 1

    # Real speculative decoding on prompts it never saw: the trained drafter gets drafts accepted,
    # an untrained one of the same shape (same seed, as training starts from) hardly ever does.
    from draftsmith.evaluate import evaluate_drafter
    from draftsmith.model import DFlashDraftModel

    prompts = list(synthetic_prompts(4, seed=123))
    trained = evaluate_drafter(tiny_target_dir, drafter, prompts, max_new_tokens=64)
    torch.manual_seed(0)
    untrained = evaluate_drafter(tiny_target_dir, DFlashDraftModel(drafter.config), prompts, max_new_tokens=64)
    assert trained.lossless and untrained.lossless
    assert trained.tau > 1.25 and trained.tau > untrained.tau + 0.25, (trained.verdict, untrained.verdict)


def test_torchrun_two_processes_stay_in_sync(regenerated, tiny_target_dir, tmp_path):
    out = tmp_path / "ddp"
    completed = torchrun_train([
        "--target", str(tiny_target_dir), "--data", str(regenerated), "--out", str(out),
        "--block-size", "8", "--draft-layers", "1", "--epochs", "1", "--max-steps", "3", "--batch-size", "2",
        "--grad-accum", "2", "--dtype", "fp32", "--device", "cpu", "--threads", "1", "--no-progress", "--num-anchors", "16",
    ], timeout=240)  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 3
    first, second = summary["rank_checksums"]
    assert first == second
    # Each optimizer step saw 2 ranks x 2 micro-batches x 2 sequences.
    assert all(loss == loss for _, loss in summary["losses"])
    assert "trained 3 steps" in completed.stdout


def test_cli_extract_then_offline_train_and_errors(regenerated, tiny_target_dir, tmp_path, capsys):
    features = tmp_path / "features"
    # The last layer (3) too, though no default takes it: the old-feature refusal below needs it.
    layers = ["--target-layer-ids", "0,1,2,3"]
    assert main(["extract", "--target", str(tiny_target_dir), "--data", str(regenerated), "--out", str(features), "--no-progress", *layers]) == 0
    out = capsys.readouterr().out
    assert out.index("Offline hidden states") < out.index("extracted 24 samples")
    assert json.loads((features / "index.json").read_text())["dtype"] == "bfloat16"
    code = main(
        ["train", "--target", str(tiny_target_dir), "--data", str(regenerated), "--out", str(tmp_path / "run"),
         "--offline", str(features), "--block-size", "4", "--draft-layers", "1", "--max-steps", "2",
         "--batch-size", "4", "--threads", "1", "--no-progress", *layers]
    )  # fmt: skip
    assert code == 0
    assert "trained 2 steps" in capsys.readouterr().out
    code = main(
        ["train", "--target", str(tiny_target_dir), "--data", str(regenerated), "--out", str(tmp_path / "bf16"),
         "--block-size", "4", "--draft-layers", "1", "--max-steps", "2", "--batch-size", "4", "--threads", "1",
         "--no-progress", "--dtype", "bf16"]
    )  # fmt: skip
    assert code == 0
    assert "bf16" in capsys.readouterr().out
    assert main(["train", "--target", str(tiny_target_dir), "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "tokenized dataset not found" in capsys.readouterr().err
    assert main(["train", "--target", str(tiny_target_dir), "--data", str(regenerated), "--out", str(tmp_path / "o"), "--offline", str(tmp_path)]) == 2
    assert "no index.json" in capsys.readouterr().err
    # Features extracted before the pre-norm definition hold the post-norm last layer: refused.
    index = json.loads((features / "index.json").read_text())
    assert index["feature_definition"] == "decoder_layer_output_pre_norm" and 3 in index["layer_ids"]
    del index["feature_definition"]
    (features / "index.json").write_text(json.dumps(index))
    assert main(["train", "--target", str(tiny_target_dir), "--data", str(regenerated), "--out", str(tmp_path / "old"),
                 "--offline", str(features), "--block-size", "4", "--draft-layers", "1", "--max-steps", "1", *layers]) == 2
    assert "re-run `draftsmith extract`" in capsys.readouterr().err


def test_extract_refuses_an_incomplete_set_and_a_resume_with_other_settings(regenerated, tiny_target_dir, tmp_path):
    from draftsmith.core.manifest import check_manifest, read_manifest, set_complete

    features = tmp_path / "features"
    extract_features(tiny_target_dir, regenerated, features, dtype="fp32", samples_per_shard=12, progress=False, echo=lambda _: None)
    assert read_manifest(features)["settings"]["dtype"] == "float32"
    with pytest.raises(InputError, match=r'other settings \(dtype: "float32" -> "bfloat16"\); .*use a new output directory$'):
        extract_features(tiny_target_dir, regenerated, features, dtype="bf16", progress=False, echo=lambda _: None)

    # What a killed tokenize leaves: shards and a manifest that says the run never finished.
    partial = tmp_path / "partial"
    shutil.copytree(regenerated, partial)
    check_manifest(partial, "tokenize", {"tokenizer": "x"})
    set_complete(partial, False)
    with pytest.raises(InputError, match="the tokenized set is incomplete"):
        extract_features(tiny_target_dir, partial, tmp_path / "f2", progress=False, echo=lambda _: None)


def test_gradient_checkpointing_gives_the_same_loss_and_gradients(regenerated, tiny_target_dir, tmp_path):
    dataset = load_tokenized(regenerated)
    context = init_distributed("cpu")
    plain = DrafterTrainer(small_config(tiny_target_dir, regenerated, tmp_path / "a", num_draft_layers=2), context, dataset)
    checkpointed = DrafterTrainer(
        small_config(tiny_target_dir, regenerated, tmp_path / "b", num_draft_layers=2, gradient_checkpointing=True), context, dataset
    )
    assert checkpointed.drafter.layers[0].gradient_checkpointing
    losses = []
    for trainer in (plain, checkpointed):
        output, _ = trainer.forward_loss(trainer.drafter, [1, 2, 3], epoch=0)
        output.loss.backward()
        losses.append(output.loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    for (name, a), (_, b) in zip(plain.drafter.named_parameters(), checkpointed.drafter.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7, msg=name)


class _RunsCode:
    """Unpickling this would touch a file: what a hostile trainer_state.pt could do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_resume_skips_broken_checkpoints_cuts_the_log_and_extends_max_steps(regenerated, tiny_target_dir, tmp_path, capsys):
    out = tmp_path / "run"
    config = small_config(tiny_target_dir, regenerated, out, max_steps=3, save_every=1, keep_checkpoints=4)
    assert train_drafter(config).steps == 3
    steps_logged = lambda: [json.loads(line)["step"] for line in (out / "train_log.jsonl").read_text().splitlines()]  # noqa: E731
    assert steps_logged() == [1, 2, 3]
    checkpoints = sorted((out / "checkpoints").glob("step-*"))
    assert [path.name for path in checkpoints] == ["step-00000001", "step-00000002", "step-00000003"]
    # The newest is cut short (a copy interrupted mid-file); the one before it would run code if unpickled.
    newest = checkpoints[2] / "trainer_state.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    marker = tmp_path / "code-ran"
    torch.save({"step": 2, "payload": _RunsCode(marker)}, checkpoints[1] / "trainer_state.pt")
    capsys.readouterr()

    resumed = train_drafter(config.model_copy(update={"resume": True, "max_steps": 5}))
    err = capsys.readouterr().err
    assert not marker.exists()
    assert resumed.resumed_from_step == 1 and resumed.steps == 5
    assert "skipping checkpoint" in err and "step-00000003/trainer_state.pt: cannot be loaded safely" in err
    assert "step-00000002/trainer_state.pt: cannot be loaded safely" in err and "resuming from step-00000001" in err
    assert steps_logged() == [1, 2, 3, 4, 5]  # steps 2 and 3 of the first run are gone, not repeated

    for path in (out / "checkpoints").glob("step-*"):
        (path / "trainer_state.pt").write_bytes(b"PK\x03\x04 not a checkpoint")
    with pytest.raises(InputError, match="no intact checkpoint to resume from"):
        train_drafter(config.model_copy(update={"resume": True, "max_steps": 6}))


def test_train_manifest_fingerprints_data_content_and_target_weights(regenerated, tiny_target_dir, tmp_path):
    from draftsmith.data.tokenized import write_tokenized
    from safetensors.torch import load_file, save_file

    out = tmp_path / "run"
    data = tmp_path / "data"
    shutil.copytree(regenerated, data)
    config = small_config(tiny_target_dir, data, out, max_steps=1)
    train_drafter(config)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "train" and manifest["settings"]["block_size"] == 8
    assert manifest["settings"]["target_weights"].startswith("sha256:")
    # The same rows at another path are the same data: the resume goes on.
    moved = tmp_path / "moved"
    shutil.copytree(data, moved)
    assert train_drafter(config.model_copy(update={"resume": True, "max_steps": 2, "data": moved})).steps == 2
    # Other rows written at the same path (what a re-run tokenize leaves) are refused...
    rows = [{"id": s.id, "input_ids": s.input_ids.tolist(), "loss_mask": s.loss_mask.tolist()} for s in load_tokenized(data).samples[:20]]
    shutil.rmtree(data)
    write_tokenized(rows, data)
    with pytest.raises(InputError, match="was written with other settings \\(data: "):
        train_drafter(config.model_copy(update={"resume": True, "max_steps": 3}))
    # ...and so is another target with the same tokenizer (other weights).
    other_target = tmp_path / "target"
    shutil.copytree(tiny_target_dir, other_target)
    weights = load_file(other_target / "model.safetensors")
    name = sorted(weights)[-1]
    weights[name] = weights[name] + 1e-3
    save_file(weights, other_target / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(InputError, match="other settings \\(target_weights: "):
        train_drafter(config.model_copy(update={"resume": True, "max_steps": 3, "data": moved, "target": other_target}))
    assert train_drafter(config.model_copy(update={"resume": True, "max_steps": 3, "data": data, "force_resume": True})).steps == 3


@pytest.mark.parametrize("damage", ["rows cut", "other tokens"])
def test_a_features_shard_that_does_not_hold_what_its_index_says_is_refused(regenerated, tiny_target_dir, tmp_path, capsys, damage):
    """Offline features are re-checked where training reads them: a shard whose rows were cut short
    (it used to train on zero-padded features) or extracted from other tokens exits 2 naming it."""
    from safetensors.torch import load_file, save_file

    features = tmp_path / "features"
    assert main(["extract", "--target", str(tiny_target_dir), "--data", str(regenerated), "--out", str(features),
                 "--no-progress", "--dtype", "fp32"]) == 0  # fmt: skip
    shard = features / json.loads((features / "index.json").read_text())["shards"][0]["file"]
    tensors = load_file(str(shard))
    if damage == "rows cut":
        tensors["features"] = tensors["features"][:-7].clone()
    else:
        tensors["input_ids"] = (tensors["input_ids"] + 1).contiguous()
    save_file(tensors, str(shard))
    capsys.readouterr()
    code = main(["train", "--target", str(tiny_target_dir), "--data", str(regenerated), "--out", str(tmp_path / "run"),
                 "--offline", str(features), "--block-size", "4", "--draft-layers", "1", "--max-steps", "2",
                 "--batch-size", "4", "--threads", "1", "--no-progress", "--dtype", "fp32"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert f"{shard}: " in err and ("damaged features shard" if damage == "rows cut" else "other tokens") in err, err[-2000:]


class _Killed(BaseException):
    """A kill -9 at this point of the run: nothing after it runs."""


def test_resume_falls_back_over_broken_weights_and_a_killed_prune_leaves_no_step_folder(
    regenerated, tiny_target_dir, tmp_path, capsys, monkeypatch
):
    """Issue 27.5: the README promises `--resume` falls back to the newest intact checkpoint; with the
    newest weights missing or cut short it stopped (a traceback, or one line) instead. And a kill
    while old checkpoints were pruned left a step folder without its files behind."""
    import draftsmith.train.checkpoints as checkpoints

    out = tmp_path / "run"
    config = small_config(tiny_target_dir, regenerated, out, max_steps=3, save_every=1, keep_checkpoints=4)
    train_drafter(config)
    steps = sorted((out / "checkpoints").glob("step-*"))
    (steps[2] / "model.safetensors").unlink()
    weights = steps[1] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    capsys.readouterr()
    resumed = train_drafter(config.model_copy(update={"resume": True, "max_steps": 4}))
    err = capsys.readouterr().err
    assert resumed.resumed_from_step == 1 and resumed.steps == 4
    assert "skipping checkpoint" in err and "step-00000003/model.safetensors: missing" in err, err
    assert "step-00000002/model.safetensors: not a readable safetensors file" in err and "resuming from step-00000001" in err

    real_rmtree = shutil.rmtree

    def killed_after_the_files(path, *args, **kwargs):  # rmtree unlinks every file, then the kill comes
        path = Path(path)
        if "step-" in path.name and not path.name.endswith(".partial") and path.is_dir():
            for child in path.iterdir():
                real_rmtree(child) if child.is_dir() else child.unlink()
            raise _Killed
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(checkpoints.shutil, "rmtree", killed_after_the_files)
    with pytest.raises(_Killed):  # saving step 5 with keep 1 prunes steps 1-4
        train_drafter(config.model_copy(update={"resume": True, "max_steps": 5, "keep_checkpoints": 1}))
    monkeypatch.undo()
    for step in (out / "checkpoints").glob("step-*"):
        assert {"config.json", "model.safetensors", "trainer_state.pt"} <= {p.name for p in step.iterdir()}, step
    assert train_drafter(config.model_copy(update={"resume": True, "max_steps": 6, "keep_checkpoints": 1})).steps == 6
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000006"]  # the leftovers swept


def test_max_minutes_stops_at_the_first_log_step_past_it_publishes_that_drafter_and_resume_goes_on(
    regenerated, tiny_target_dir, tmp_path, capsys
):
    """A wall-clock budget: the benchmark's 30-minute run planned its steps from a timing run and
    overran by 5 minutes; --max-minutes stops at a log step (every rank together) with a drafter."""
    out = tmp_path / "run"
    # 1.2 ms: past after the first step, whatever the machine; the log step is every 2nd.
    config = small_config(tiny_target_dir, regenerated, out, epochs=10, max_steps=12, log_every=2, max_minutes=2e-5)
    result = train_drafter(config)
    err = capsys.readouterr().err
    assert result.steps == 2, err
    assert "stopped by --max-minutes 2e-05 at step 2 of 12" in err
    assert "projects to" not in err  # the small run is no long one
    assert result.extra["stopped_by_max_minutes"] is True
    assert json.loads((out / "train_summary.json").read_text())["extra"]["stopped_by_max_minutes"] is True
    assert (result.drafter_dir / "config.json").is_file()
    assert [path.name for path in (out / "checkpoints").glob("step-*")] == ["step-00000002"]
    resumed = train_drafter(config.model_copy(update={"resume": True, "max_minutes": None}))
    assert resumed.resumed_from_step == 2 and resumed.steps == 12
    assert "stopped_by_max_minutes" not in resumed.extra
    with pytest.raises(ValueError, match="max_minutes"):
        small_config(tiny_target_dir, regenerated, out, max_minutes=0)


def test_a_cpu_run_of_hours_warns_with_its_projection_and_the_flags_that_cut_it(regenerated, tiny_target_dir, tmp_path,
                                                                                 capsys):
    config = small_config(tiny_target_dir, regenerated, tmp_path / "run", epochs=200_000, log_every=4, max_minutes=2e-5)
    result = train_drafter(config)
    err = capsys.readouterr().err
    assert result.steps == 4, err
    warning = next(line for line in err.splitlines() if "projects to" in line)
    assert warning.startswith("draftsmith train: warning: this CPU run projects to ")
    for cut in ("--block-size (now 8", "--num-anchors", "--draft-layers (now 1)", "--offline FEATURES"):
        assert cut in warning, warning


def test_anchor_coverage_is_logged_and_summarised_and_an_older_run_resumes_saying_what_it_did(
    regenerated, tiny_target_dir, tmp_path, capsys
):
    from draftsmith.train.loader import StepSampler, StepSource, trainable_indices

    config = small_config(tiny_target_dir, regenerated, tmp_path / "run", max_steps=3, num_anchors=2, save_every=2,
                          data_workers=0)  # fmt: skip
    result = train_drafter(config)
    # The same numbers from the step's own batches: trainable tokens some block predicts / trainable tokens.
    dataset = load_tokenized(regenerated)
    source = StepSource(dataset, seed=0, num_anchors=2, block_size=8, mask_token_id=0)
    sampler = StepSampler(trainable_indices(dataset), seed=0, rank=0, world_size=1, batch_size=4, grad_accum=1, epochs=1,
                          total_steps=3)  # fmt: skip
    counts = [source[step].coverage_counts for step in sampler]
    covered, trainable = sum(c for c, _ in counts), sum(t for _, t in counts)
    assert 0 < covered < trainable
    assert result.anchor_coverage == pytest.approx(covered / trainable)
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["anchor_coverage"] == pytest.approx(covered / trainable)
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [round(record["anchor_coverage"], 4) for record in log] == [round(c / t, 4) for c, t in counts]
    # More anchors per sample (document) cover more of it.
    wider = train_drafter(config.model_copy(update={"out": tmp_path / "wider", "num_anchors": 24}))
    assert wider.anchor_coverage > result.anchor_coverage
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["settings"]["anchors_per"] == "document" and manifest["settings"]["loss_weights"] == "decay"

    # A run written before draftsmith recorded these settings resumes, saying what it did and recording it.
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "run", old)
    shutil.rmtree(old / "checkpoints" / "step-00000003", ignore_errors=True)
    for key in ("anchors_per", "loss_weights", "dpace_alpha", "draft_sliding_window"):
        del manifest["settings"][key]
    (old / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    resumed = train_drafter(config.model_copy(update={"out": old, "resume": True}))
    assert resumed.resumed_from_step == 2
    said = capsys.readouterr().err
    assert "predates the record of how --num-anchors counts" in said and "anchors_per document" in said
    assert json.loads((old / "manifest.json").read_text())["settings"]["anchors_per"] == "document"
    for (step, a), (_, b) in zip(result.losses, resumed.losses, strict=True):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-7), step
    # Another loss weighting on resume is named, like any other changed setting.
    with pytest.raises(InputError, match='loss_weights: "decay" -> "dpace"'):
        train_drafter(config.model_copy(update={"out": old, "resume": True, "max_steps": 4, "loss_weights": "dpace"}))


@pytest.mark.parametrize("flags, named", [
    (("--draft-sliding-window", "0"), "--draft-sliding-window"),
    (("--draft-sliding-window", "-4"), "--draft-sliding-window"),
    (("--draft-sliding-window", "4", "--block-size", "8"), "--draft-sliding-window 4: smaller than --block-size 8"),
    (("--loss-weights", "dpace", "--dpace-alpha", "0"), "--dpace-alpha"),
    (("--loss-weights", "dpace", "--dpace-alpha", "1.5"), "--dpace-alpha"),
    (("--loss-weights", "dpac"), "--loss-weights"),
])
def test_bad_recipe_flags_are_one_line_and_exit_2(flags, named, regenerated, tiny_target_dir, tmp_path, capsys):
    code = main(["train", "--target", str(tiny_target_dir), "--data", str(regenerated), "--out", str(tmp_path / "o"), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and named in err[0], err
    assert not (tmp_path / "o" / "checkpoints").exists()
