"""A row's `tools` reach the engine request and the generated row."""

from __future__ import annotations

import asyncio
import json
import threading

from aiohttp import web

from draftsmith.generate import GenerateConfig, generate

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


class RecordingEngine:
    """A real OpenAI-style server on 127.0.0.1 that keeps every chat request body it gets."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()

    async def _chat(self, request):
        body = await request.json()
        self.bodies.append(body)
        return web.json_response({
            "id": "c", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Sunny."}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        })

    async def _ok(self, request):
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    def _run(self):
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._ok)
        app.router.add_get("/health", self._ok)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        self.started.set()
        self.loop.run_forever()

    def __enter__(self):
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.started.wait(10)
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_row_tools_are_sent_to_the_engine_and_kept_in_the_row(tmp_path):
    rows = [
        {"id": "with", "tools": [TOOL], "messages": [{"role": "user", "content": "Weather in Rome?"}]},
        {"id": "without", "messages": [{"role": "user", "content": "Hi"}]},
    ]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with RecordingEngine() as engine:
        config = GenerateConfig(inputs=[prompts], output_dir=tmp_path / "out", endpoints=[engine.url],
                                model="m", progress=False, concurrency=2, endpoint_wait_s=10)
        summary = generate(config)
    assert summary.done == 2
    sent = {body["messages"][-1]["content"]: body for body in engine.bodies}
    assert sent["Weather in Rome?"]["tools"] == [TOOL] and "tools" not in sent["Hi"]
    written = {}
    for path in (tmp_path / "out").glob("generated-*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            written[row["id"]] = row
    assert written["with"]["tools"] == [TOOL] and "tools" not in written["without"]
