"""The GPU check: what only a CUDA device shows, in one table, in under 5 minutes on one H100/H200.

    bash benchmarks/gpu_check.sh              # on a machine with a CUDA GPU
    bash benchmarks/gpu_check.sh --cpu-smoke  # the same steps, small, on the CPU: checks the script itself

Rows:
  attention    dense vs sparse vs flex forward+backward of one drafter attention layer at the paper's
               shape (T 3072, 512 blocks of 16, 32 query / 8 kv heads x 128, bf16): time, peak memory,
               and the largest difference of outputs and gradients against dense;
  train bf16   `draftsmith train` online on the tiny target in bf16 (sparse attention): steps, tokens/s,
               first and last loss, finite;
  train fsdp   the same under `torchrun --nproc-per-node 1 ... --sharding fsdp`;
  eval cuda    `draftsmith eval` of that drafter on CUDA: tau and the greedy losslessness check;
  dspark engine `train --drafter dspark` + `export`, served by vLLM's own DSpark speculator
               (`{"method": "dspark"}`: its GPU model runner; vLLM's CPU runner does not serve DSpark):
               engine tau (/metrics) against draftsmith's in-process tau on the same prompts.
Each row says ok / FAIL / skipped and why; the exit code is 1 when a row failed. Without a CUDA
device (and without --cpu-smoke) it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_attention import paper_layout  # noqa: E402
from bench_scale import write_set  # noqa: E402

from draftsmith.model.block_attention import block_attention  # noqa: E402


@dataclass
class Row:
    check: str
    status: str  # ok, FAIL, skipped
    result: str
    seconds: float


def _draftsmith(*args: str, timeout: float, torchrun: bool = False) -> subprocess.CompletedProcess:
    # Keep what PYTHONPATH already holds (a GPU image may carry missing packages there).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--standalone", "-m", "draftsmith"]
    command = (launcher if torchrun else [sys.executable, "-m", "draftsmith"]) + list(args)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def _last_line(result: subprocess.CompletedProcess) -> str:
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1][:160] if lines else f"exit {result.returncode}"


# ---- attention ------------------------------------------------------------------------------------


def _attention_inputs(layout, heads: int, kv_heads: int, head_dim: int, device, dtype):
    generator = torch.Generator().manual_seed(0)
    keys = layout.context_length + layout.num_queries
    shapes = [(1, heads, layout.num_queries, head_dim), (1, kv_heads, keys, head_dim), (1, kv_heads, keys, head_dim)]
    return [torch.randn(shape, generator=generator).to(device, dtype).requires_grad_(True) for shape in shapes]


def _timed_step(layout, inputs, scale: float, device) -> tuple[list[torch.Tensor], float, float]:
    """(output and the three gradients, seconds, peak GiB) of one forward+backward (after one warm-up)."""
    from dataclasses import replace

    def once():
        for tensor in inputs:
            tensor.grad = None
        out = block_attention(*inputs, replace(layout, _cache={}), scale)
        out.float().square().mean().backward()
        return out

    once()  # warm-up: kernel selection, flex compilation
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    out = once()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    return [out.detach().float(), *(tensor.grad.detach().float() for tensor in inputs)], seconds, peak


def attention_rows(device, smoke: bool) -> list[Row]:
    context, anchors, heads, kv_heads, head_dim = (256, 32, 4, 1, 32) if smoke else (3072, 512, 32, 8, 128)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    layout = paper_layout(context, anchors, 16, seed=0)
    inputs = _attention_inputs(layout, heads, kv_heads, head_dim, device, dtype)
    scale = head_dim**-0.5
    reference, dense_s, _ = _timed_step(layout.with_mode("dense"), inputs, scale, device)
    rows = []
    for mode in ("dense", "sparse", "flex"):
        started = time.perf_counter()
        if mode == "flex" and device.type != "cuda":
            rows.append(Row(f"attention {mode}", "skipped", "FlexAttention has no CPU backward in torch", 0.0))
            continue
        try:
            outputs, seconds, peak = _timed_step(layout.with_mode(mode), inputs, scale, device)
        except Exception as error:  # a kernel that does not run here is a finding, not a crash of the check
            rows.append(Row(f"attention {mode}", "FAIL", f"{type(error).__name__}: {str(error)[:120]}", time.perf_counter() - started))
            continue
        diff = max(float((got - want).abs().max()) for got, want in zip(outputs, reference))
        memory = "" if peak != peak else f", peak {peak:.2f} GiB"
        ratio = "" if mode == "dense" else f" (dense/this {dense_s / seconds:.2f}x)"
        rows.append(Row(
            f"attention {mode}", "ok" if diff <= tolerance else "FAIL",
            f"T {context}, {anchors}x16, {heads}/{kv_heads}x{head_dim} {str(dtype).removeprefix('torch.')}: "
            f"fwd+bwd {seconds * 1e3:.1f} ms{ratio}{memory}, max |diff| vs dense {diff:.1e}",
            seconds,
        ))  # fmt: skip
    return rows


# ---- training and eval ---------------------------------------------------------------------------


def _train_args(target: Path, data: Path, out: Path, device: str, dtype: str, steps: int) -> list[str]:
    return ["train", "--target", str(target), "--data", str(data), "--out", str(out), "--device", device, "--dtype", dtype,
            "--max-steps", str(steps), "--log-every", "5", "--no-progress", "--attention", "sparse"]  # fmt: skip


def _train_row(name: str, result: subprocess.CompletedProcess, out: Path, seconds: float) -> Row:
    if result.returncode != 0:
        return Row(name, "FAIL", _last_line(result), seconds)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines() if line.strip()]
    losses = [record["loss"] for record in log]
    finite = all(loss == loss and abs(loss) != float("inf") for loss in losses)
    rate = log[-1].get("tokens_per_s", 0.0) if log else 0.0
    status = "ok" if finite and (out / "drafter").is_dir() else "FAIL"
    return Row(name, status, f"{log[-1]['step'] if log else 0} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
               f"{rate:,.0f} tok/s, drafter {'written' if (out / 'drafter').is_dir() else 'missing'}", seconds)  # fmt: skip


def training_rows(work: Path, device: str, smoke: bool) -> list[Row]:
    started = time.perf_counter()
    built = _draftsmith("tiny", "build", timeout=1800)
    if built.returncode != 0 or not built.stdout.strip():
        return [Row("tiny target build", "FAIL", _last_line(built), time.perf_counter() - started)]
    target = Path(built.stdout.strip().splitlines()[-1])
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    data = write_set(work / "data", samples=32 if smoke else 256, mean_tokens=300 if smoke else 1500, vocab=vocab)
    dtype = "fp32" if device == "cpu" else "bf16"
    steps = 4 if smoke else 40
    rows = []
    started = time.perf_counter()
    result = _draftsmith(*_train_args(target, data, work / "train", device, dtype, steps), timeout=900)
    rows.append(_train_row(f"train {dtype} online", result, work / "train", time.perf_counter() - started))

    if "--sharding" not in _draftsmith("train", "--help", timeout=120).stdout:
        rows.append(Row("train fsdp (1 rank)", "skipped", "this draftsmith has no train --sharding", 0.0))
    else:
        started = time.perf_counter()
        args = [*_train_args(target, data, work / "fsdp", device, dtype, steps), "--sharding", "fsdp"]
        result = _draftsmith(*args, timeout=900, torchrun=True)
        rows.append(_train_row("train fsdp (1 rank)", result, work / "fsdp", time.perf_counter() - started))

    prompts = work / "prompts.jsonl"
    _draftsmith("tiny", "prompts", str(prompts), "--count", "8", timeout=300)
    started = time.perf_counter()
    if not (work / "train" / "drafter").is_dir():
        rows.append(Row(f"eval {device}", "skipped", "no drafter: the training row failed", 0.0))
        return rows
    result = _draftsmith("eval", "--target", str(target), "--drafter", str(work / "train" / "drafter"), "--prompts", str(prompts),
                         "--device", device, "--dtype", dtype, "--max-new-tokens", "64", "--json", timeout=900)  # fmt: skip
    seconds = time.perf_counter() - started
    if result.returncode not in (0, 1):
        rows.append(Row(f"eval {device}", "FAIL", _last_line(result), seconds))
        return rows
    report = json.loads(result.stdout)
    lossless = report.get("lossless", report.get("greedy_identical"))
    rows.append(Row(f"eval {device}", "ok" if result.returncode == 0 else "FAIL",
                    f"tau {report.get('tau', float('nan')):.2f} (drafter trained {steps} steps on random tokens), "
                    f"lossless {lossless}, near-ties {report.get('near_ties', 0)}", seconds))  # fmt: skip
    rows.append(dspark_engine_row(work, target, data, prompts, device, dtype, steps))
    return rows


def dspark_engine_row(work: Path, target: Path, data: Path, prompts: Path, device: str, dtype: str, steps: int) -> Row:
    """A DSpark drafter served by vLLM's DSpark speculator: its tau against draftsmith's in-process tau."""
    import importlib.util

    started = time.perf_counter()
    if device == "cpu":
        return Row("dspark engine", "skipped", "vLLM's CPU runner does not serve DSpark (its speculator runs on the "
                   "GPU model runner); this row needs a CUDA device", 0.0)  # fmt: skip
    if importlib.util.find_spec("vllm") is None:
        return Row("dspark engine", "skipped", "vLLM (>= 0.32, CUDA build) is not installed in this Python", 0.0)
    out = work / "dspark"
    trained = _draftsmith(*_train_args(target, data, out, device, dtype, steps), "--drafter", "dspark", "--markov-rank", "32",
                          "--block-size", "8", timeout=900)  # fmt: skip
    if trained.returncode != 0:
        return Row("dspark engine", "FAIL", "train: " + _last_line(trained), time.perf_counter() - started)
    exported = _draftsmith("export", str(out / "drafter"), "--out", str(work / "dspark-export"), timeout=300)
    if exported.returncode != 0:
        return Row("dspark engine", "FAIL", "export: " + _last_line(exported), time.perf_counter() - started)
    ours = _draftsmith("eval", "--target", str(target), "--drafter", str(work / "dspark-export"), "--prompts", str(prompts),
                       "--device", device, "--dtype", "fp32", "--max-new-tokens", "64", "--json", timeout=900)  # fmt: skip
    if ours.returncode not in (0, 1):
        return Row("dspark engine", "FAIL", "eval: " + _last_line(ours), time.perf_counter() - started)
    ours_tau = json.loads(ours.stdout)["tau"]
    from draftsmith.engines import vllm_server

    spec = json.dumps({"method": "dspark", "model": str(work / "dspark-export"), "num_speculative_tokens": 8})
    server = vllm_server(target, python=sys.executable, extra_args=["--speculative-config", spec, "--gpu-memory-utilization", "0.3"],
                         log_path=work / "dspark-vllm.log", startup_timeout_s=600)  # fmt: skip
    try:
        server.start()
    except Exception as error:  # the engine's own refusal is the row's result
        return Row("dspark engine", "FAIL", f"vLLM did not start: {str(error).splitlines()[0][:120]}",
                   time.perf_counter() - started)
    try:
        engine = _draftsmith("eval", "--endpoint", server.base_url, "--prompts", str(prompts), "--max-new-tokens", "64",
                             "--json", timeout=900)  # fmt: skip
    finally:
        server.stop()
    if engine.returncode != 0:
        return Row("dspark engine", "FAIL", "eval --endpoint: " + _last_line(engine), time.perf_counter() - started)
    engine_tau = json.loads(engine.stdout)["tau"]
    close = abs(engine_tau - ours_tau) <= 0.05 * ours_tau
    return Row("dspark engine", "ok" if close else "FAIL",
               f"vLLM DSpark tau {engine_tau:.2f} vs in-process {ours_tau:.2f} (block 8, {steps} steps)",
               time.perf_counter() - started)


def print_table(rows: list[Row], device_name: str) -> None:
    width = max(len(row.check) for row in rows)
    print(f"gpu_check on {device_name}, torch {torch.__version__}")
    print(f"{'check':<{width}}  {'status':<7}  {'s':>6}  result")
    for row in rows:
        print(f"{row.check:<{width}}  {row.status:<7}  {row.seconds:6.1f}  {row.result}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="run every step small on the CPU (checks the script)")
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); run it on a GPU machine, "
              "or pass --cpu-smoke to check the script on the CPU", file=sys.stderr)  # fmt: skip
        return 2
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    name = "cpu (smoke)" if args.cpu_smoke else torch.cuda.get_device_name(0)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="draftsmith-gpu-check-"))
    rows = attention_rows(device, args.cpu_smoke) + training_rows(work, device.type, args.cpu_smoke)
    print_table(rows, name)
    faster = {row.check: row for row in rows if row.check.startswith("attention") and row.status == "ok"}
    if "attention flex" in faster and "attention sparse" in faster:
        quicker = "flex" if faster["attention flex"].seconds < faster["attention sparse"].seconds else "sparse"
        print(f"measured here: {quicker} attention is the faster training path (auto picks sparse until flex is measured faster)")
    return 1 if any(row.status == "FAIL" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
