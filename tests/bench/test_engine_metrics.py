"""What `bench` records from an engine's /metrics: SGLang by its documented metric names on a fixture
written in SGLang's exposition format (a concurrency-64 level held at 48 running requests by SGLang's
speculative default cap), served over real HTTP to the poller; vLLM's names are tested against a real
vLLM CPU server in tests/engines/test_bench_engines.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web

from draftsmith.bench.engine_metrics import MetricsPoller, cap_warning, parse_prometheus, read_snapshot, summarize
from draftsmith.client.chat import ChatClient

FIXTURES = sorted((Path(__file__).parent / "data").glob("sglang_metrics_*.txt"))


def test_sglang_names_give_the_running_batch_cache_usage_and_acceptance():
    snapshots = [parse_prometheus(path.read_text()) for path in FIXTURES]
    assert snapshots[1]["sglang:num_running_reqs"] == [48.0]
    record = summarize(snapshots, concurrency=64)
    assert record["engine"] == "sglang" and record["polls"] == 3
    assert record["running_max"] == 48 and record["running_mean"] == pytest.approx((31 + 48 + 48) / 3, abs=1e-3)
    assert record["waiting_max"] == 16
    assert record["cache_usage_max"] == pytest.approx(0.654) and record["cache_usage_mean"] == pytest.approx((0.4012 + 0.6127 + 0.654) / 3, abs=1e-4)
    assert record["spec_acceptance"] == pytest.approx((2.58 + 2.71 + 2.69) / 3, abs=1e-4)
    warning = cap_warning(record)
    assert warning.startswith("concurrency 64: the engine ran at most 48 requests at once")
    assert cap_warning(summarize(snapshots, concurrency=48)) is None


def test_vllm_acceptance_is_one_plus_accepted_per_draft_over_the_level():
    before = parse_prometheus('vllm:num_requests_running{model_name="m"} 8\n'
                              'vllm:spec_decode_num_drafts_total{model_name="m"} 100\n'
                              'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 150\n'
                              'vllm:spec_decode_num_accepted_tokens_created{model_name="m"} 1.78e9\n'
                              'vllm:gpu_cache_usage_perc{model_name="m"} 0.25\n')
    after = parse_prometheus('vllm:num_requests_running{model_name="m"} 8\n'
                             'vllm:spec_decode_num_drafts_total{model_name="m"} 300\n'
                             'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 490\n'
                             'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n')
    record = summarize([before, after], concurrency=8)
    assert record["spec_acceptance"] == pytest.approx(1 + 340 / 200)
    assert record["cache_usage_max"] == 0.5  # the older vLLM name
    assert record["engine"] == "vllm" and cap_warning(record) is None


def _vllm_metrics(drafts: int, per_position: list[int]) -> str:
    """vLLM 0.32's exposition of its spec-decode counters (two engines' label sets for position 0)."""
    lines = ['# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.',
             '# TYPE vllm:spec_decode_num_drafts_total counter',
             f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="tiny"}} {drafts}',
             'vllm:num_requests_running{engine="0",model_name="tiny"} 8',
             f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="tiny"}} {sum(per_position)}']
    for position, count in enumerate(per_position):
        lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="tiny",'
                     f'position="{position}"}} {count}')
    return "\n".join(lines) + "\n"


def test_vllm_acceptance_per_position_is_the_level_delta_by_position_label():
    before = read_snapshot(_vllm_metrics(100, [60, 30, 10]))
    # Exposed out of position order: the position label, not the line order, decides.
    after_text = _vllm_metrics(300, [180, 100, 40])
    lines = after_text.splitlines()
    after = read_snapshot("\n".join(lines[:5] + lines[5:][::-1]) + "\n")
    record = summarize([before, after], concurrency=8)
    assert record["spec_drafts"] == 200
    assert record["spec_accepted_per_position"] == [120, 70, 30]
    assert record["spec_acceptance_per_position"] == pytest.approx([0.6, 0.35, 0.15])
    assert record["spec_acceptance"] == pytest.approx(1 + 220 / 200)
    # Without the per-position counter (SGLang, or vLLM without speculation) nothing is recorded.
    plain = [parse_prometheus(path.read_text()) for path in FIXTURES]
    assert "spec_acceptance_per_position" not in summarize(plain, concurrency=64)


def test_the_poller_records_a_level_over_http():
    async def scenario():
        served = iter(path.read_text() for path in FIXTURES)
        last = {"text": FIXTURES[-1].read_text()}

        async def metrics(request):
            last["text"] = next(served, last["text"])
            return web.Response(text=last["text"], content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with ChatClient() as client:
                poller = MetricsPoller(client, f"http://127.0.0.1:{port}", interval_s=0.05)
                assert await poller.probe()
                level = asyncio.ensure_future(asyncio.sleep(0.3))
                return await poller.record(level, 64)
        finally:
            await runner.cleanup()

    record = asyncio.run(scenario())
    assert record["engine"] == "sglang" and record["running_max"] == 48 and record["polls"] >= 3
    assert cap_warning(record) is not None


def test_an_endpoint_without_metrics_records_nothing():
    async def scenario():
        async with ChatClient() as client:
            poller = MetricsPoller(client, "http://127.0.0.1:9")  # nothing listens on the discard port
            assert not await poller.probe()
            return await poller.record(asyncio.ensure_future(asyncio.sleep(0)), 4)

    assert asyncio.run(scenario()) is None
