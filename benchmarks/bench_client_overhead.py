"""Client overhead: how many completions/s one draftsmith client process can drive.

Starts `draftsmith serve --backend echo` (instant canned completions) as a real subprocess on
127.0.0.1 and measures, in this one process:

1. baseline: the same client, one request at a time (sequential);
2. ``ChatClient`` alone at concurrency C (the transport + JSON + parsing);
3. the full ``generate()`` pipeline at concurrency C (dispatch, reasoning split, rows written
   to disk with periodic fsync, quality guard, accounting);
4. for reference, httpx.AsyncClient at concurrency C (why the client uses aiohttp).

Prints each rate, its ratio against the sequential baseline, and the client's CPU seconds per
1,000 completions (the part that does not depend on how fast the server is). The target is
>= 2,000 completions/s for the full pipeline.

    PYTHONPATH=src python benchmarks/bench_client_overhead.py [--requests 20000] [--concurrency 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from draftsmith.generate import ChatClient, GenerateConfig, GuardConfig, generate  # noqa: E402
from draftsmith.core.asyncrun import loop_factory, run_async  # noqa: E402
from draftsmith.serve.process import ServeProcess  # noqa: E402
from draftsmith.tiny import synthetic_prompts  # noqa: E402

PAYLOAD = {"model": "echo", "max_tokens": 256, "chat_template_kwargs": {"enable_thinking": True},
           "messages": [{"role": "user", "content": "Reverse the word tiger."}]}


def measure(label: str, function) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    count = function()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return count / wall, 1e6 * cpu / count


async def client_run(url: str, requests: int, concurrency: int) -> int:
    async with ChatClient(connections=concurrency) as client:
        remaining = requests

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                result = await client.chat(url, PAYLOAD)
                assert result.content

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return requests


async def httpx_run(url: str, requests: int, concurrency: int) -> int:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        remaining = requests

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                response = await client.post(url + "/v1/chat/completions", json=PAYLOAD)
                assert response.json()["choices"]

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return requests


def write_prompts(directory: Path, requests: int) -> Path:
    prompts = directory / "prompts.jsonl"
    with prompts.open("w") as handle:
        for row in synthetic_prompts(requests, seed=11):
            handle.write(json.dumps(row) + "\n")
    return prompts


def pipeline_run(url: str, prompts: Path, output_dir: Path, requests: int, concurrency: int) -> int:
    """One whole generate() call: reading prompts, health checks, the run, the final rescan."""
    summary = generate(GenerateConfig(inputs=[prompts], output_dir=output_dir, endpoints=[url],
                                      concurrency=concurrency, progress=False, guard=GuardConfig()),
                       log=lambda message: None)
    assert summary.ok and summary.done == requests, summary.problems()
    return requests


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--baseline-requests", type=int, default=1000)
    parser.add_argument("--server-workers", type=int, default=2)
    parser.add_argument("--skip-httpx", action="store_true")
    args = parser.parse_args()

    with ServeProcess(["--backend", "echo", "--workers", str(args.server_workers)]) as server:
        url = server.url
        run_async(client_run(url, 500, args.concurrency))  # warm the server
        rows = []
        base_rate, base_cpu = measure("sequential", lambda: run_async(client_run(url, args.baseline_requests, 1)))
        rows.append(("baseline: ChatClient, 1 in flight", base_rate, base_cpu))
        rate, cpu = measure("client", lambda: run_async(client_run(url, args.requests, args.concurrency)))
        rows.append((f"ChatClient, {args.concurrency} in flight", rate, cpu))
        with tempfile.TemporaryDirectory() as directory:
            prompts = write_prompts(Path(directory), args.requests)
            output_dir = Path(directory) / "out"
            rate, cpu = measure("pipeline", lambda: pipeline_run(url, prompts, output_dir, args.requests,
                                                                 args.concurrency))
        rows.append((f"generate() pipeline, {args.concurrency} in flight", rate, cpu))
        pipeline_rate = rate
        if not args.skip_httpx:
            count = min(args.requests, 3000)
            rate, cpu = measure("httpx", lambda: run_async(httpx_run(url, count, args.concurrency)))
            rows.append((f"reference: httpx.AsyncClient, {args.concurrency} in flight", rate, cpu))

    loop_name = "uvloop" if loop_factory() else "asyncio"
    print(f"echo server: {args.server_workers} worker process(es); client loop: {loop_name}; requests per run: {args.requests}")
    print(f"{'run':<50} {'completions/s':>14} {'x baseline':>11} {'client CPU us/req':>18} {'per CPU-core/s':>15}")
    for label, rate, cpu in rows:
        print(f"{label:<50} {rate:>14,.0f} {rate / base_rate:>10.1f}x {cpu:>18,.0f} {1e6 / cpu:>15,.0f}")
    print("(per CPU-core/s = 1e6 / client CPU us per completion: what the client could drive with one core of its own;"
          " the wall rate also depends on the server and on other load on the machine)")
    verdict = "PASS" if pipeline_rate >= 2000 else "BELOW TARGET"
    print(f"generate() pipeline: {pipeline_rate:,.0f} completions/s (target >= 2,000): {verdict}")


if __name__ == "__main__":
    main()
