"""`plan speculation` against a real engine here: vLLM CPU serves the tiny target plainly, with the
demo's trained DFlash drafter at several K, and with n-gram (prompt lookup); `draftsmith bench`
measures output tok/s and vLLM's own per-position acceptance at each concurrency; `plan speculation`
predicts the same from this machine's measured device and that acceptance. Prints predicted against
measured tok/s and the best K of each.

    PYTHONPATH=src python benchmarks/bench_speculation.py                       # K 1,2,4,7 x concurrency 1,8
    PYTHONPATH=src python benchmarks/bench_speculation.py --ks 3 --concurrency 1,4 --requests 8 \\
        --max-tokens 48 --export DIR --json out.json --check                    # the CI-sized run, checked
    PYTHONPATH=src python benchmarks/bench_speculation.py --target smollm2 --export DRAFTER_DIR
        # SmolLM2-135M (models fetch smollm2-135m) with a drafter trained on it (bench_real_target.py or
        # bench_recipes.py), on 48 of the hand-written prompts of benchmarks/data/real_target_prompts.jsonl

The roofline alone sees bytes and FLOPs; a CPU engine serving a 0.2M-parameter model spends its step
on fixed costs (scheduling, Python, sampling, the API server) that GPUs hide behind CUDA graphs and
larger models. So the device entry carries the engine's overhead per step, fixed and per running
request, calibrated on plain decode at the lowest and highest concurrency (measured step time minus
the roofline's), a speculative step's extra overhead (fixed and per request), calibrated on the
smallest K at the same two concurrencies, and (with two K or more) the drafter's forward's cost per
request and drafted token, calibrated on the largest K at the highest concurrency. Every other point
(the K between, the largest K at the other concurrencies, n-gram at every concurrency) is a
prediction; the table marks the calibration points and shows the roofline-only prediction beside it.
The device is measured with the threads vLLM CPU computes on (it keeps one CPU for itself).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def log(message: str) -> None:
    print(f"[bench_speculation {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def serve_and_bench(target: Path, spec: dict | None, prompts: Path, concurrency: list[int], requests: int,
                    max_tokens: int, out: Path, logs: Path) -> dict:
    """Start vLLM (with `spec` as its --speculative-config), bench it, stop it; the bench JSON."""
    from draftsmith.bench import run_bench
    from draftsmith.bench.config import BenchConfig
    from draftsmith.engines import vllm_server

    name = "plain" if spec is None else f"{spec['method']}-k{spec['num_speculative_tokens']}"
    extra = [] if spec is None else ["--speculative-config", json.dumps(spec)]
    # A shared 2-core machine can take minutes to start vLLM (240 s was not enough under load).
    server = vllm_server(target, extra_args=extra, log_path=logs / f"vllm-{name}.log", startup_timeout_s=900)
    began = time.monotonic()
    with server:
        log(f"{name}: vLLM ready in {time.monotonic() - began:.0f} s; benching concurrency {concurrency}")
        result = run_bench(BenchConfig(prompts=[str(prompts)], endpoint=server.api_url, concurrencies=tuple(concurrency),
                                       requests_per_level=requests, max_tokens=max_tokens, temperature=0.0, top_p=None,
                                       target=target, stream=False, metrics_interval_s=0.1))
    result.save(out)
    return json.loads(out.read_text())


def _level(bench: dict, concurrency: int) -> dict:
    return next(row for row in bench["results"] if row["concurrency"] == concurrency)


REAL_PROMPTS = Path(__file__).resolve().parent / "data" / "real_target_prompts.jsonl"


def mean_prompt_tokens(target: Path, rows: list[dict]) -> float:
    """Mean prompt length in tokens as the engine sees it: the target's chat template, generation prompt on."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target))
    texts = [tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False) for row in rows]
    lengths = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
    return sum(lengths) / max(len(lengths), 1)


def engine_threads(log_path: Path) -> int:
    """The torch threads vLLM CPU computed with, from its log; else its rule: every CPU but the one it
    reserves (VLLM_CPU_NUM_OF_RESERVED_CPU, 1 by default) for the API server and scheduler."""
    import os
    import re

    text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    found = re.findall(r"Reducing Torch threads from \d+ to (\d+)", text)
    if found:
        return int(found[-1])
    cores = re.findall(r"core ids=\[([\d, ]*)\]", text)
    if cores and cores[-1].strip():
        return len(cores[-1].split(","))
    reserved = int(os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "1") or 1)
    return max(1, (os.cpu_count() or 1) - reserved)


def fit_fixed_and_per_request(extra: dict[int, float], low: int, high: int) -> tuple[float, float]:
    """(fixed, per request) seconds through the unexplained step time at the lowest and highest
    concurrency (a straight line in the running requests), neither below 0."""
    per_request = max((extra[high] - extra[low]) / (high - low), 0.0) if high > low else 0.0
    return max(extra[low] - low * per_request, 0.0), per_request


def predict(target: Path, export: str, device_file: Path, acceptance: Path, ngram: Path | None, ks: list[int],
            concurrency: list[int], prompt_mean: float, output_mean: float, overhead: str | None = None):
    from draftsmith.plan.speculation import SpeculationPlanConfig, make_speculation_plan

    return make_speculation_plan(SpeculationPlanConfig(
        model_config_path=str(target), drafter=export, gpu=str(device_file), acceptance_from=str(acceptance),
        ngram_from=str(ngram) if ngram else None, draft_tokens=",".join(map(str, ks)),
        concurrency=",".join(map(str, concurrency)), prompt_mean=f"{prompt_mean:.0f}", output_mean=f"{output_mean:.0f}",
        weights="fp32", engine="vllm", step_overhead=overhead))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", default="1,2,4,7", help="num_speculative_tokens to serve the drafter at")
    parser.add_argument("--ngram-k", type=int, default=None, help="n-gram num_speculative_tokens (the largest --ks)")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--requests", type=int, default=24, help="requests per level")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--target", choices=("tiny", "smollm2"), default="tiny",
                        help="tiny: the built-in tiny target; smollm2: SmolLM2-135M from `models fetch`")
    parser.add_argument("--prompts", type=int, default=48,
                        help="prompts (tiny: synthetic tasks; smollm2: bench_real_target's hand-written ones)")
    parser.add_argument("--export", default=None,
                        help="a DFlash drafter of the target (tiny's default: run a small demo; smollm2 needs one)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the numbers here")
    parser.add_argument("--reuse", action="store_true", help="reuse the bench JSONs already in --workdir")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 unless vLLM's per-position acceptance was stored by bench and read back by "
                             "plan speculation, and every predicted point is within 2x of the measured one")
    args = parser.parse_args(argv)

    from draftsmith.plan.device import device_dict, measure_device
    from draftsmith.tiny import build_tiny_target, synthetic_prompts

    ks, concurrency = _ints(args.ks), _ints(args.concurrency)
    ngram_k = args.ngram_k or max(ks)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-speculation-"))
    work.mkdir(parents=True, exist_ok=True)
    export = args.export
    if args.target == "smollm2":
        if export is None:
            raise SystemExit("--target smollm2 needs --export: a drafter trained on SmolLM2-135M "
                             "(benchmarks/bench_real_target.py or bench_recipes.py write one)")
        from draftsmith.models import fetch_model

        target = Path(fetch_model("smollm2-135m").hf_dir)
    else:
        target = build_tiny_target(log=log)
    if export is None:
        from draftsmith.demo import DemoConfig, run_demo

        log("training the demo's drafter (the small demo of tests/conftest.py)")
        export = run_demo(DemoConfig(workdir=work / "demo", train_prompts=160, eval_prompts=6, train_steps=120,
                                     eval_max_new_tokens=96, threads=1), log=lambda message: None).export_dir
    block = json.loads((Path(export) / "config.json").read_text())["block_size"]
    if max(ks) > block - 1:
        raise SystemExit(f"--ks {max(ks)} is beyond the drafter's block ({block})")

    prompts = work / "prompts.jsonl"
    if args.target == "smollm2":
        # Every 7th prompt first, so that any --prompts count spans the four domains (chat, code, math, explanation).
        rows = [json.loads(line) for line in REAL_PROMPTS.read_text().splitlines() if line.strip()]
        rows = (rows[::7] + [row for index, row in enumerate(rows) if index % 7])[: args.prompts]
    else:
        rows = list(synthetic_prompts(args.prompts, seed=11))
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    prompt_mean = mean_prompt_tokens(target, rows)
    log(f"{len(rows)} prompts, {prompt_mean:.0f} tokens each on average under the chat template")

    runs: list[tuple[str, int, dict | None]] = [("none", 0, None)]
    runs += [("dflash", k, {"method": "dflash", "model": str(export), "num_speculative_tokens": k}) for k in ks]
    runs.append(("ngram", ngram_k, {"method": "ngram", "num_speculative_tokens": ngram_k, "prompt_lookup_max": 3,
                                    "prompt_lookup_min": 1}))
    benches: dict[tuple[str, int], dict] = {}
    files: dict[tuple[str, int], Path] = {}
    for method, k, spec in runs:
        files[(method, k)] = work / f"bench-{method}-k{k}.json"
        if args.reuse and files[(method, k)].is_file():
            log(f"{method} K={k}: reusing {files[(method, k)]}")
            benches[(method, k)] = json.loads(files[(method, k)].read_text())
            continue
        benches[(method, k)] = serve_and_bench(target, spec, prompts, concurrency, args.requests, args.max_tokens,
                                               files[(method, k)], work)

    # The device as the engine computes on it: vLLM CPU keeps one CPU for its API server and scheduler
    # and runs the model on the rest (here 1 of 2), so a device measured on every CPU would price its
    # FLOPs at twice the rate it gets.
    threads = engine_threads(work / "vllm-plain.log")
    log(f"measuring this machine as a device entry with the engine's {threads} thread(s)")
    device = measure_device("cpu", threads=threads)
    log(f"device: copy {device.bandwidth_bytes_per_s / 1e9:.1f} GB/s, fp32 {device.fp32_flops / 1e9:.1f} GFLOP/s, "
        f"bf16 {device.bf16_flops / 1e9:.1f} GFLOP/s")
    # Lengths the plan's live context comes from: the prompts as templated, the answers as plain decode gave.
    plain = benches[("none", 0)]
    output_mean = sum(_level(plain, c)["mean_output_tokens"] for c in concurrency) / len(concurrency)
    # The profile a user has: vLLM's own, from the largest K served (its first positions cover every smaller K).
    acceptance, ngram = files[("dflash", max(ks))], files[("ngram", ngram_k)]
    device_file = work / "device.json"
    device_file.write_text(json.dumps(device_dict(device)))
    roofline = predict(target, export, device_file, acceptance, ngram, ks, concurrency, prompt_mean, output_mean, "0s")
    low, high = min(concurrency), max(concurrency)

    def plain_step(c: int) -> float:
        return 1 / _level(plain, c)["output_tokens_per_s"] * c

    # The engine's own cost per step, beside the roofline: a fixed part and a part per running request,
    # fitted on plain decode at the lowest and highest concurrency.
    bare = {entry.concurrency: entry.no_speculation.step_time_s for entry in roofline.plans}
    overhead, per_request_plain = fit_fixed_and_per_request(
        {c: plain_step(c) - bare[c] for c in (low, high)}, low, high)
    calibrated = device.model_copy(update={"step_overhead_s": overhead, "request_overhead_s": per_request_plain})
    device_file.write_text(json.dumps(device_dict(calibrated)))
    log(f"engine overhead calibrated on plain decode at concurrency {low} and {high}: {overhead * 1e3:.3f} ms + "
        f"{per_request_plain * 1e3:.3f} ms per request (measured step {plain_step(low) * 1e3:.3f} ms at {low}, "
        f"roofline {bare[low] * 1e3:.4f} ms)")
    # A speculative step costs more than a plain one on vLLM CPU (the drafter's forward launch, the
    # proposer's and the rejection sampler's Python): a fixed part and a part per running request,
    # calibrated on the smallest K at the lowest and highest concurrency; with two K or more, the
    # drafter's forward's cost per request and drafted token too, on the largest K at the highest
    # concurrency. Every other K, and n-gram (which pays the same machinery, not the drafter's
    # forward), stay predictions.
    first = predict(target, export, device_file, acceptance, ngram, ks, concurrency, prompt_mean, output_mean)
    k_low, k_high = min(ks), max(ks)

    def unexplained(entry, k: int) -> float:
        level = _level(benches[("dflash", k)], entry.concurrency)
        option = next(option for option in entry.drafter if option.draft_tokens == k)
        tau = (level.get("engine_metrics") or {}).get("spec_acceptance") or option.tau
        return entry.concurrency * tau / level["output_tokens_per_s"] - option.step_time_s

    by_concurrency = {entry.concurrency: entry for entry in first.plans}
    extra = {c: unexplained(by_concurrency[c], k_low) for c in (low, high)}
    per_token = 0.0
    if k_high > k_low:
        per_token = max((unexplained(by_concurrency[high], k_high) - extra[high]) / (high * (k_high - k_low)), 0.0)
    # The smallest K's points hold K_low * per_token per request; what is left is fixed and per request.
    fixed, per_request = fit_fixed_and_per_request({c: extra[c] - c * k_low * per_token for c in (low, high)}, low, high)
    calibrated = calibrated.model_copy(update={"draft_step_overhead_s": fixed, "draft_request_overhead_s": per_request,
                                               "draft_token_overhead_s": per_token})
    device_file.write_text(json.dumps(device_dict(calibrated)))
    log(f"speculative step overhead calibrated on K={k_low}: {fixed * 1e3:.3f} ms + {per_request * 1e3:.3f} ms per "
        f"request; the drafter's {per_token * 1e3:.4f} ms per request and drafted token (K={k_high} at {high})")
    plan = predict(target, export, device_file, acceptance, ngram, ks, concurrency, prompt_mean, output_mean)
    calibration = {("none", 0, low), ("none", 0, high), ("dflash", k_low, low), ("dflash", k_low, high)}
    if k_high > k_low:
        calibration.add(("dflash", k_high, high))

    rows = []
    for with_overhead, bare in zip(plan.plans, roofline.plans):
        c = with_overhead.concurrency
        options = [(with_overhead.no_speculation, bare.no_speculation)]
        options += list(zip(with_overhead.drafter, bare.drafter))
        options += [(a, b) for a, b in zip(with_overhead.ngram, bare.ngram) if a.draft_tokens == ngram_k]
        for option, bare_option in options:
            level = _level(benches[(option.method if option.method != "none" else "none", option.draft_tokens)], c)
            metrics = level.get("engine_metrics") or {}
            measured_tau = metrics.get("spec_acceptance") or 1.0
            rows.append({
                "concurrency": c, "method": option.method, "k": option.draft_tokens,
                "measured_tokens_per_s": level["output_tokens_per_s"], "measured_tau": measured_tau,
                "running_mean": metrics.get("running_mean"),
                "measured_step_ms": 1e3 * c * measured_tau / level["output_tokens_per_s"],
                "predicted_tau": option.tau, "predicted_tokens_per_s": option.tokens_per_s,
                "predicted_step_ms": 1e3 * option.step_time_s,
                "roofline_tokens_per_s": bare_option.tokens_per_s,
                "ratio": option.tokens_per_s / level["output_tokens_per_s"],
                "calibration": (option.method, option.draft_tokens, c) in calibration,
                "acceptance_per_position": metrics.get("spec_acceptance_per_position"),
            })
    best = []
    for c in concurrency:
        mine = [row for row in rows if row["concurrency"] == c and row["method"] == "dflash"]
        measured_best = max(mine, key=lambda row: row["measured_tokens_per_s"])["k"]
        predicted_best = max(mine, key=lambda row: row["predicted_tokens_per_s"])["k"]
        measured_at = {row["k"]: row["measured_tokens_per_s"] for row in mine}
        best.append({"concurrency": c, "measured_best_k": measured_best, "predicted_best_k": predicted_best,
                     "neighbours": abs(ks.index(measured_best) - ks.index(predicted_best)) <= 1,
                     # What serving the predicted K loses against the best K measured.
                     "regret": 1 - measured_at[predicted_best] / measured_at[measured_best]})

    print(f"target: {args.target} ({target}); drafter: {export}; prompts {prompt_mean:.0f} tokens, answers "
          f"{output_mean:.0f} tokens on average")
    print(f"device: {device.title}; copy {device.bandwidth_bytes_per_s / 1e9:.1f} GB/s, fp32 matmul "
          f"{device.fp32_flops / 1e9:.1f} GFLOP/s; engine overhead {overhead * 1e3:.3f} ms + "
          f"{per_request_plain * 1e3:.3f} ms per request (calibrated on plain decode at concurrency {low} and {high}); "
          f"a speculative step adds {fixed * 1e3:.3f} ms + {per_request * 1e3:.3f} ms per request "
          f"(calibrated on K={k_low} at concurrency {low} and {high}), the drafter's {per_token * 1e3:.4f} ms per request "
          f"and drafted token (K={k_high} at {high}); device measured with the engine's {threads} thread(s)")
    print(f"drafter acceptance per position (vLLM, K={max(ks)}): "
          + ", ".join(f"{value:.2f}" for value in plan.acceptance.per_position))
    header = ("conc", "method", "K", "fit", "tau meas", "tau pred", "step ms meas", "step ms pred", "tok/s meas",
              "tok/s pred", "pred/meas", "roofline-only tok/s")
    print(" | ".join(header))
    for row in rows:
        print(" | ".join([str(row["concurrency"]), row["method"], str(row["k"]), "*" if row["calibration"] else "",
                          f"{row['measured_tau']:.2f}",
                          f"{row['predicted_tau']:.2f}", f"{row['measured_step_ms']:.2f}", f"{row['predicted_step_ms']:.2f}",
                          f"{row['measured_tokens_per_s']:.0f}", f"{row['predicted_tokens_per_s']:.0f}",
                          f"{row['ratio']:.2f}", f"{row['roofline_tokens_per_s']:,.0f}"]))
    for entry in best:
        print(f"concurrency {entry['concurrency']}: best K measured {entry['measured_best_k']}, predicted "
              f"{entry['predicted_best_k']}" + ("" if entry["neighbours"] else "  (NOT neighbours)")
              + f"; serving the predicted K loses {entry['regret']:.1%} against the measured best")
    print("fit *: the point the engine's overheads were calibrated on; every other row is a prediction")
    if args.json:
        args.json.write_text(json.dumps({"device": device_dict(calibrated), "step_overhead_s": overhead,
                                         "request_overhead_s": per_request_plain,
                                         "draft_step_overhead_s": fixed, "draft_request_overhead_s": per_request,
                                         "draft_token_overhead_s": per_token, "acceptance": plan.acceptance.per_position, "rows": rows, "best": best,
                                         "output_mean": output_mean, "prompt_mean": prompt_mean,
                                         "target": args.target, "export": str(export),
                                         "engine_threads": threads}, indent=2) + "\n")
    if not args.check:
        return 0
    failures = check(rows, plan.acceptance.per_position, files, target, export, device_file, ks, concurrency,
                     output_mean, overhead, threads, device.title)
    for failure in failures:
        print(f"check: FAIL: {failure}")
    print("check: PASS" if not failures else f"check: {len(failures)} failure(s)")
    return 1 if failures else 0


def check(rows, profile, files, target, export, device_file, ks, concurrency, output_mean, overhead, threads,
          device_title) -> list[str]:
    """What the CI-sized run must show (--check): the failures, none when it holds."""
    import os

    from draftsmith.cli import main as draftsmith

    failures = []
    k = max(ks)
    # bench stored vLLM's per-position acceptance: K positions, never rising, the trained drafter accepted.
    if not (len(profile) == k and all(a >= b for a, b in zip(profile, profile[1:])) and profile[0] > 0.1):
        failures.append(f"vLLM's acceptance per position {profile}: not K={k} positions, never rising, the first above 0.1")
    level = json.loads(files[("dflash", k)].read_text())["results"][0]["engine_metrics"]
    if len(level["spec_acceptance_per_position"]) != k or level["spec_drafts"] <= 0:
        failures.append(f"bench-dflash-k{k}.json: {level['spec_acceptance_per_position']} per position, {level['spec_drafts']} drafts")
    elif abs(level["spec_acceptance"] - (1 + sum(level["spec_accepted_per_position"]) / level["spec_drafts"])) > 1e-3:
        failures.append(f"bench's spec_acceptance {level['spec_acceptance']} is not 1 + accepted per draft")
    # The device is measured with the threads vLLM CPU computes on: every CPU but the one it reserves.
    if threads != max(1, (os.cpu_count() or 1) - 1) or not device_title.endswith(f"{threads} threads (measured)"):
        failures.append(f"device measured with {threads} thread(s) ({device_title}); vLLM computes on all CPUs but one")
    expected = {(method, kk, c) for method, kk in (("none", 0), *(("dflash", kk) for kk in ks), ("ngram", k)) for c in concurrency}
    got = {(row["method"], row["k"], row["concurrency"]) for row in rows}
    if got != expected:
        failures.append(f"rows {sorted(got)} are not {sorted(expected)}")
    for row in rows:
        if row["measured_tokens_per_s"] <= 0 or (not row["calibration"] and not 0.5 <= row["ratio"] <= 2.0):
            failures.append(f"{row['method']} K={row['k']} at concurrency {row['concurrency']}: predicted/measured {row['ratio']:.2f}")
        if row["method"] == "dflash" and row["k"] == k and abs(row["predicted_tau"] - (1 + sum(profile))) > 1e-6:
            failures.append(f"the plan's tau {row['predicted_tau']} is not vLLM's counted tau {1 + sum(profile)}")
    # The same bench file through the command line, as a user runs it.
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = draftsmith(["plan", "speculation", "--model-config", str(target), "--drafter", str(export),
                           "--gpu", str(device_file), "--weights", "fp32", "--engine", "vllm",
                           "--acceptance-from", str(files[("dflash", k)]), "--output-mean", f"{output_mean:.0f}",
                           "--concurrency", ",".join(map(str, concurrency)), "--json"])  # fmt: skip
    if code != 0:
        failures.append(f"plan speculation --acceptance-from exited {code}")
    else:
        plan = json.loads(out.getvalue())
        if any(abs(a - b) > 1e-6 for a, b in zip(plan["acceptance"]["per_position"], profile, strict=True)):
            failures.append(f"plan speculation read {plan['acceptance']['per_position']}, bench stored {profile}")
        if not plan["plans"] or abs(plan["step_overhead_s"] - overhead) > 1e-9 * max(1.0, overhead):
            failures.append(f"plan speculation's step overhead {plan['step_overhead_s']} is not the calibrated {overhead}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
