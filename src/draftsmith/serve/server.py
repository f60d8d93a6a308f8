"""An OpenAI-compatible HTTP server (aiohttp) with a Hugging Face backend and an echo backend.

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions`` (streaming and not).

Request fields honoured: ``messages``, ``max_tokens`` / ``max_completion_tokens``, ``temperature``,
``top_p``, ``seed``, ``stream``, ``stream_options.include_usage``, ``chat_template_kwargs`` (e.g.
``{"enable_thinking": false}``), ``return_token_ids``.

Response shape follows the engines the client must handle:

* reasoning goes to ``message.reasoning_content`` (SGLang, llama-server) or ``message.reasoning``
  (vLLM) depending on ``ServeConfig.reasoning_field``; ``"inline"`` leaves ``<think>…</think>`` in
  ``content`` as an engine without a reasoning parser does;
* ``usage = {prompt_tokens, completion_tokens, total_tokens,
  completion_tokens_details: {reasoning_tokens}}``;
* with ``return_token_ids: true`` (vLLM >= 0.10.2 naming): the response carries
  ``prompt_token_ids`` at the top level and each choice carries ``token_ids`` (the completion ids,
  including the final EOS when generation stopped on it). When streaming, the first chunk carries
  ``prompt_token_ids`` and every content chunk's choice carries the ``token_ids`` it added.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import sys
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from draftsmith.core.asyncrun import run_async
from draftsmith.core.signals import interrupted_by
from draftsmith.serve.config import FaultConfig, ServeConfig
from draftsmith.data.reasoning import split_think as split_reasoning

REASONING_FIELDS = ("reasoning_content", "reasoning", "inline")


@dataclass
class Completion:
    """What a backend produced for one request, before reasoning is split into fields."""

    text: str
    completion_token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str
    reasoning_tokens: int


class RequestError(Exception):
    """A client error answered as an OpenAI-style JSON error with HTTP 400."""


# --------------------------------------------------------------------------------------------
# Request parsing and reasoning split


def _message_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        texts = [part.get("text", "") for part in content if isinstance(part, dict)]
        if not all(isinstance(text, str) for text in texts):
            raise RequestError("message content parts must carry a string 'text'")
        return "".join(texts)
    raise RequestError(f"message content must be a string or a list of parts, got {type(content).__name__}")


@dataclass
class ChatRequest:
    messages: list[dict[str, Any]]
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stream: bool
    include_usage: bool
    template_kwargs: dict[str, Any]
    return_token_ids: bool

    @property
    def thinking(self) -> bool:
        return self.template_kwargs.get("enable_thinking", True) is not False

    @classmethod
    def parse(cls, body: Any) -> ChatRequest:
        if not isinstance(body, dict):
            raise RequestError("request body must be a JSON object")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("'messages' must be a non-empty list")
        clean = []
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                raise RequestError(f"messages[{index}] must be an object with a 'role'")
            item = dict(message)
            item["content"] = _message_text(message.get("content"))
            clean.append(item)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None and (not _is_integer(max_tokens) or max_tokens < 1):
            raise RequestError(f"'max_tokens' must be a positive integer, got {_shown(max_tokens)}")
        stream_options = body.get("stream_options") or {}
        if not isinstance(stream_options, dict):
            raise RequestError(f"'stream_options' must be an object, got {_shown(stream_options)}")
        template_kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(template_kwargs, dict):
            raise RequestError("'chat_template_kwargs' must be an object")
        return cls(
            messages=clean,
            max_tokens=max_tokens,
            temperature=_sampling_number(body, "temperature", 1.0, lambda value: value >= 0, ">= 0"),
            top_p=_sampling_number(body, "top_p", 1.0, lambda value: 0 < value <= 1, "in (0, 1]"),
            seed=_seed(body),
            stream=bool(body.get("stream", False)),
            include_usage=bool(stream_options.get("include_usage", False)),
            template_kwargs=template_kwargs,
            return_token_ids=bool(body.get("return_token_ids", False)),
        )


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _sampling_number(body: dict[str, Any], name: str, default: float, allowed, rule: str) -> float:
    """A finite number obeying ``rule`` (each field checked on its own, so one bad request is one 400
    that names the field, and never a NaN or a string reaching the sampler of a shared batch)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or not allowed(value):
        raise RequestError(f"'{name}' must be a finite number {rule}, got {_shown(value)}")
    return float(value)


def _seed(body: dict[str, Any]) -> int | None:
    """An integer a torch generator accepts (int64 or uint64 range)."""
    seed = body.get("seed")
    if seed is None:
        return None
    if not _is_integer(seed) or not -(2**63) <= seed < 2**64:
        raise RequestError(f"'seed' must be an integer in [-2**63, 2**64), got {_shown(seed)}")
    return seed


def _error_response(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


# --------------------------------------------------------------------------------------------
# Backends


class EchoBackend:
    """Instant deterministic completions: one whitespace-separated word = one "token"."""

    vocab_size = 32000

    def __init__(self, config: ServeConfig):
        self.answer_template = config.echo_answer
        self.reasoning_template = config.echo_reasoning

    def _ids(self, words: list[str]) -> list[int]:
        return [zlib.crc32(word.encode()) % self.vocab_size for word in words]

    def complete(self, request: ChatRequest) -> Completion:
        prompt_words = [word for message in request.messages for word in message["content"].split()]
        last_user = next(
            (m["content"] for m in reversed(request.messages) if m["role"] == "user"), ""
        )
        reasoning = self.reasoning_template.format(prompt=last_user) if request.thinking else ""
        answer = self.answer_template.format(prompt=last_user)
        words = (["<think>", *reasoning.split(), "</think>"] if reasoning else []) + answer.split()
        finish = "stop"
        if request.max_tokens is not None and len(words) > request.max_tokens:
            words = words[: request.max_tokens]
            finish = "length"
        reasoning_tokens = 0
        if reasoning:
            reasoning_tokens = words.index("</think>") + 1 if "</think>" in words else len(words)
        text = " ".join(words).replace("<think> ", "<think>\n").replace(" </think> ", "\n</think>\n\n")
        if text.endswith(" </think>"):
            text = text[: -len(" </think>")] + "\n</think>"
        return Completion(text, self._ids(words), self._ids(prompt_words), finish, reasoning_tokens)


@dataclass
class _Job:
    request: ChatRequest
    prompt_ids: list[int]
    max_tokens: int
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    """Receives ("token", id) per generated token, then ("done", finish_reason) or ("error", msg)."""


class ModelBackend:
    """A Hugging Face causal LM with dynamic batching of concurrent requests.

    Requests that arrive while a batch is forming (up to ``max_batch_size``, waiting at most
    ``batch_wait_s``) are left-padded into one batch and decoded together step by step with a KV
    cache; every row has its own ``max_tokens``, temperature, top-p and seed, and stops on EOS.
    Tokens are pushed to each request as they are produced, so streaming TTFT is real.
    """

    def __init__(self, config: ServeConfig):
        import torch
        from transformers import AutoTokenizer

        from draftsmith.model.target import load_target_model

        if config.model_dir is None:
            raise ValueError("the model backend needs a model directory")
        self.torch = torch
        # The one target loader: a truncated download or a bad config.json is one line (exit 2).
        self.model = load_target_model(config.model_dir, "cpu", torch.float32)
        self.tokenizer = AutoTokenizer.from_pretrained(config.model_dir)
        self.max_batch_size = config.max_batch_size
        self.batch_wait_s = config.batch_wait_s
        from draftsmith.model.speculative import default_stop_token_ids

        self.eos_ids = set(default_stop_token_ids(self.model, self.tokenizer))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.max_len = int(getattr(self.model.config, "max_position_embeddings", 2048))
        vocab = self.tokenizer.get_vocab()
        self.think_start_id = vocab.get("<think>")
        self.think_end_id = vocab.get("</think>")
        import inspect

        # transformers 5.x renamed `past_key_values` to `cache`; accept both.
        parameters = inspect.signature(self.model.forward).parameters
        self.cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self.queue: asyncio.Queue[_Job] | None = None
        self.worker: asyncio.Task | None = None

    async def start(self) -> None:
        self.queue = asyncio.Queue()
        self.worker = asyncio.create_task(self._batch_loop())

    async def stop(self) -> None:
        if self.worker is not None:
            self.worker.cancel()

    def prompt_ids(self, request: ChatRequest) -> list[int]:
        try:
            text = self.tokenizer.apply_chat_template(
                request.messages, tokenize=False, add_generation_prompt=True, **request.template_kwargs
            )
        except Exception as error:  # a template error is the request's fault
            raise RequestError(f"chat template failed: {error}") from error
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def submit(self, request: ChatRequest) -> _Job:
        prompt_ids = self.prompt_ids(request)
        room = self.max_len - len(prompt_ids)
        if room < 1:
            raise RequestError(
                f"prompt has {len(prompt_ids)} tokens; the model's context is {self.max_len} tokens"
            )
        max_tokens = min(request.max_tokens or room, room)
        job = _Job(request, prompt_ids, max_tokens, asyncio.get_running_loop())
        assert self.queue is not None
        self.queue.put_nowait(job)
        return job

    async def _batch_loop(self) -> None:
        assert self.queue is not None
        while True:
            jobs = [await self.queue.get()]
            deadline = time.monotonic() + self.batch_wait_s
            while len(jobs) < self.max_batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0 and self.queue.empty():
                    break
                try:
                    jobs.append(await asyncio.wait_for(self.queue.get(), max(remaining, 0)))
                except asyncio.TimeoutError:
                    break
            try:
                await asyncio.to_thread(self._run_batch, jobs)
            except Exception as error:  # report to every waiting request instead of hanging them
                for job in jobs:
                    job.loop.call_soon_threadsafe(job.events.put_nowait, ("error", f"generation failed: {error}"))

    def _sample(self, logits, jobs, generators):
        torch = self.torch
        tokens = []
        for row, job in enumerate(jobs):
            row_logits = logits[row].float()
            temperature = job.request.temperature
            if temperature <= 1e-5:
                tokens.append(int(row_logits.argmax()))
                continue
            probs = torch.softmax(row_logits / temperature, dim=-1)
            if job.request.top_p < 1.0:
                sorted_probs, order = probs.sort(descending=True)
                keep = sorted_probs.cumsum(-1) - sorted_probs < job.request.top_p
                probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
            tokens.append(int(torch.multinomial(probs, 1, generator=generators[row])))
        return tokens

    def _run_batch(self, jobs: list[_Job]) -> None:
        torch = self.torch
        batch = len(jobs)
        longest = max(len(job.prompt_ids) for job in jobs)
        input_ids = torch.full((batch, longest), self.pad_id, dtype=torch.long)
        attention = torch.zeros((batch, longest), dtype=torch.long)
        for row, job in enumerate(jobs):
            ids = job.prompt_ids
            input_ids[row, longest - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attention[row, longest - len(ids):] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        generators = []
        for job in jobs:
            generator = torch.Generator()
            generator.manual_seed(job.request.seed if job.request.seed is not None else random.getrandbits(62))
            generators.append(generator)
        done = [False] * batch
        counts = [0] * batch
        from transformers import DynamicCache

        cache = {self.cache_argument: DynamicCache()}  # updated in place by every forward
        with torch.inference_mode():
            out = self.model(
                input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                logits_to_keep=1, **cache,
            )
            last_positions = positions[:, -1:]
            for _ in range(max(job.max_tokens for job in jobs)):
                tokens = self._sample(out.logits[:, -1, :], jobs, generators)
                for row, job in enumerate(jobs):
                    if done[row]:
                        continue
                    token = tokens[row]
                    counts[row] += 1
                    job.loop.call_soon_threadsafe(job.events.put_nowait, ("token", token))
                    if token in self.eos_ids:
                        done[row] = True
                        job.loop.call_soon_threadsafe(job.events.put_nowait, ("done", "stop"))
                    elif counts[row] >= job.max_tokens:
                        done[row] = True
                        job.loop.call_soon_threadsafe(job.events.put_nowait, ("done", "length"))
                if all(done):
                    break
                step = torch.tensor(tokens, dtype=torch.long).unsqueeze(1)
                attention = torch.cat([attention, torch.ones((batch, 1), dtype=torch.long)], dim=1)
                last_positions = last_positions + 1
                out = self.model(
                    input_ids=step,
                    attention_mask=attention,
                    position_ids=last_positions,
                    use_cache=True,
                    **cache,
                )

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode([i for i in ids if i not in self.eos_ids], skip_special_tokens=True)

    def reasoning_tokens(self, ids: list[int], thinking_started: bool) -> int:
        if self.think_end_id is not None and self.think_end_id in ids:
            return ids.index(self.think_end_id) + 1
        if self.think_start_id is not None and ids and ids[0] == self.think_start_id:
            return len(ids)
        return len(ids) if thinking_started else 0


# --------------------------------------------------------------------------------------------
# HTTP layer


class OpenAIServer:
    def __init__(self, config: ServeConfig):
        if config.reasoning_field not in REASONING_FIELDS:
            raise ValueError(f"reasoning_field must be one of {REASONING_FIELDS}")
        self.config = config
        self.model_name = config.model_name()
        self.faults = config.faults
        self.rng = random.Random(config.faults.seed)
        self.requests_seen = 0
        self.backend: EchoBackend | ModelBackend
        if config.backend == "echo":
            self.backend = EchoBackend(config)
        elif config.backend == "model":
            self.backend = ModelBackend(config)
        else:
            raise ValueError(f"unknown backend {config.backend!r} (expected 'model' or 'echo')")
        self.created = int(time.time())

    # --- helpers ---------------------------------------------------------------------------

    def _message(self, text: str) -> dict[str, Any]:
        if self.config.reasoning_field == "inline":
            return {"role": "assistant", "content": text}
        reasoning, content = split_reasoning(text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        message[self.config.reasoning_field] = reasoning or None
        return message

    def _usage(self, prompt: int, completion: int, reasoning: int) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        }

    def _response(self, request: ChatRequest, completion: Completion) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "message": self._message(completion.text),
            "finish_reason": completion.finish_reason,
            "logprobs": None,
        }
        body: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": self._usage(
                len(completion.prompt_token_ids), len(completion.completion_token_ids), completion.reasoning_tokens
            ),
        }
        if request.return_token_ids:
            body["prompt_token_ids"] = completion.prompt_token_ids
            choice["token_ids"] = completion.completion_token_ids
        return body

    async def _inject_faults(self, request: web.Request) -> web.StreamResponse | None:
        faults = self.faults
        self.requests_seen += 1
        if faults.die_after and self.requests_seen >= faults.die_after:
            sys.stderr.write(f"draftsmith serve: dying on request {self.requests_seen} (--die-after)\n")
            sys.stderr.flush()
            os._exit(17)
        if faults.delay_s:
            await asyncio.sleep(faults.delay_s)
        if self.requests_seen <= faults.fail_first or (faults.fail_rate and self.rng.random() < faults.fail_rate):
            response = _error_response(faults.fail_status, "injected failure", "server_error")
            if faults.retry_after is not None:
                response.headers["Retry-After"] = faults.retry_after
            elif faults.fail_status == 429:
                response.headers["Retry-After"] = "0"
            return response
        if faults.drop_rate and self.rng.random() < faults.drop_rate:
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=500)  # never reaches the client: the connection is gone
        return None

    # --- handlers --------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        if self.faults.unhealthy:
            return _error_response(503, "not ready", "server_error")
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.model_name, "object": "model", "created": self.created, "owned_by": "draftsmith"}],
            }
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        fault = await self._inject_faults(request)
        if fault is not None:
            return fault
        try:
            body = await request.json(loads=json.loads)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            return _error_response(400, f"request body is not valid JSON: {error}")
        try:
            chat = ChatRequest.parse(body)
            if isinstance(self.backend, EchoBackend):
                completion = self.backend.complete(chat)
                if chat.stream:
                    return await self._stream_echo(request, chat, completion)
                return web.json_response(self._bad_content(self._response(chat, completion)))
            job = self.backend.submit(chat)
        except RequestError as error:
            return _error_response(400, str(error))
        if chat.stream:
            return await self._stream_model(request, chat, job)
        ids: list[int] = []
        while True:
            kind, value = await job.events.get()
            if kind == "token":
                ids.append(value)
            elif kind == "error":
                return _error_response(500, value, "server_error")
            else:
                finish = value
                break
        backend = self.backend
        completion = Completion(
            backend.decode(ids), ids, job.prompt_ids, finish, backend.reasoning_tokens(ids, False)
        )
        return web.json_response(self._bad_content(self._response(chat, completion)))

    def _bad_content(self, body: dict[str, Any]) -> dict[str, Any]:
        """The --bad-content fault: an answer whose content is null or a number, with no reasoning."""
        if self.faults.bad_content_rate and self.rng.random() < self.faults.bad_content_rate:
            content = None if self.faults.bad_content == "null" else 42
            body["choices"][0]["message"] = {"role": "assistant", "content": content}
        return body

    async def _sse_start(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        return response

    def _chunk(self, chunk_id: str, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        if "token_ids" in extra:
            choice["token_ids"] = extra.pop("token_ids")
        body = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            **extra,
        }
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    def _usage_chunk(self, chunk_id: str, usage: dict[str, Any]) -> bytes:
        body = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [],
            "usage": usage,
        }
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    async def _open_stream(self, request: web.Request, chat: ChatRequest, prompt_ids: list[int]) -> tuple[web.StreamResponse, str]:
        """The SSE response and its id, after the first chunk (the assistant role, and the prompt's ids if asked)."""
        response = await self._sse_start(request)
        chunk_id = f"chatcmpl-{uuid.uuid4().hex}"
        first: dict[str, Any] = {"prompt_token_ids": prompt_ids} if chat.return_token_ids else {}
        await response.write(self._chunk(chunk_id, {"role": "assistant", "content": ""}, **first))
        return response, chunk_id

    async def _stream_echo(self, request: web.Request, chat: ChatRequest, completion: Completion) -> web.StreamResponse:
        response, chunk_id = await self._open_stream(request, chat, completion.prompt_token_ids)
        message = self._message(completion.text)
        field_name = self.config.reasoning_field
        reasoning = message.get(field_name) if field_name != "inline" else None
        pieces: list[tuple[str, str]] = []
        if reasoning:
            pieces += [(field_name, word + " ") for word in reasoning.split(" ")]
        pieces += [("content", word + " ") for word in (message.get("content") or "").split(" ")]
        if self.faults.cut_stream_rate and self.rng.random() < self.faults.cut_stream_rate:
            for key, text in pieces[: len(pieces) // 2]:  # the --cut-stream-rate fault: no finish, no [DONE]
                await response.write(self._chunk(chunk_id, {key: text}))
            return response
        for index, (key, text) in enumerate(pieces):
            extra: dict[str, Any] = {}
            if chat.return_token_ids and index == len(pieces) - 1:
                extra["token_ids"] = completion.completion_token_ids
            await response.write(self._chunk(chunk_id, {key: text}, **extra))
        await response.write(self._chunk(chunk_id, {}, completion.finish_reason))
        if chat.include_usage:
            usage = self._usage(
                len(completion.prompt_token_ids), len(completion.completion_token_ids), completion.reasoning_tokens
            )
            await response.write(self._usage_chunk(chunk_id, usage))
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _stream_model(self, request: web.Request, chat: ChatRequest, job: _Job) -> web.StreamResponse:
        backend = self.backend
        assert isinstance(backend, ModelBackend)
        response, chunk_id = await self._open_stream(request, chat, job.prompt_ids)
        ids: list[int] = []
        emitted = ""
        in_reasoning = False
        finish = "stop"
        field_name = self.config.reasoning_field
        while True:
            kind, value = await job.events.get()
            if kind == "error":
                await response.write(b"data: " + json.dumps({"error": {"message": value}}).encode() + b"\n\n")
                return response
            if kind == "done":
                finish = value
                break
            ids.append(value)
            extra: dict[str, Any] = {"token_ids": [value]} if chat.return_token_ids else {}
            if field_name != "inline" and value == backend.think_start_id and not emitted.strip():
                in_reasoning = True
                emitted = backend.decode(ids)
                if extra:
                    await response.write(self._chunk(chunk_id, {field_name: ""}, **extra))
                continue
            if field_name != "inline" and value == backend.think_end_id:
                in_reasoning = False
                emitted = backend.decode(ids)
                if extra:
                    await response.write(self._chunk(chunk_id, {field_name: ""}, **extra))
                continue
            text = backend.decode(ids)
            if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
                if extra:
                    await response.write(self._chunk(chunk_id, {"content": ""}, **extra))
                continue
            delta, emitted = text[len(emitted):], text
            key = field_name if in_reasoning else "content"
            await response.write(self._chunk(chunk_id, {key: delta}, **extra))
        await response.write(self._chunk(chunk_id, {}, finish))
        if chat.include_usage:
            usage = self._usage(len(job.prompt_ids), len(ids), backend.reasoning_tokens(ids, False))
            await response.write(self._usage_chunk(chunk_id, usage))
        await response.write(b"data: [DONE]\n\n")
        return response


@web.middleware
async def _one_line_errors(request: web.Request, handler) -> web.StreamResponse:
    """An unexpected error in one request is a 500 for that request and one line in the server
    log (no traceback), like every other draftsmith error; the server keeps serving the rest."""
    try:
        return await handler(request)
    except (web.HTTPException, asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as error:  # noqa: BLE001 - the request's own failure, reported to it
        sys.stderr.write(f"draftsmith serve: {request.method} {request.path} failed: {type(error).__name__}: {error}\n")
        return _error_response(500, f"internal error: {type(error).__name__}: {error}", "server_error")


def build_app(config: ServeConfig) -> web.Application:
    """The aiohttp application for ``config`` (the backend starts with the app)."""
    server = OpenAIServer(config)
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[_one_line_errors])
    app["server"] = server
    app.router.add_get("/health", server.health)
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/v1/chat/completions", server.chat)

    async def on_startup(_: web.Application) -> None:
        if isinstance(server.backend, ModelBackend):
            await server.backend.start()

    async def on_cleanup(_: web.Application) -> None:
        if isinstance(server.backend, ModelBackend):
            await server.backend.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


async def _serve(config: ServeConfig, sock=None, ready_message: bool = True) -> None:
    app = build_app(config)
    # No signal handlers of aiohttp's own (its GracefulExit is a silent exit 1): Ctrl-C and SIGTERM
    # stop the server like every stage (core.signals), with a message and exit 130/143.
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    if sock is not None:
        site: web.BaseSite = web.SockSite(runner, sock)
    else:
        site = web.TCPSite(runner, config.host, config.port, backlog=1024, reuse_address=True)
    await site.start()
    port = config.port
    server = getattr(site, "_server", None)
    if server is not None and server.sockets:
        port = server.sockets[0].getsockname()[1]
    if ready_message:
        print(f"draftsmith serve: listening on http://{config.host}:{port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def _run_workers(config: ServeConfig, workers: int) -> None:
    """Pre-fork ``workers`` echo processes sharing one listening socket (the kernel spreads
    connections), so a client benchmark is not limited by one server process's CPU."""
    import signal
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    sock.listen(2048)
    port = sock.getsockname()[1]
    children = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            try:
                run_async(_serve(config, sock=sock, ready_message=False))
            except (KeyboardInterrupt, SystemExit):
                pass
            finally:
                os._exit(0)
        children.append(pid)
    print(f"draftsmith serve: listening on http://{config.host}:{port} ({workers} workers)", flush=True)

    def stop(signum, frame) -> None:
        for child in children:
            try:
                os.kill(child, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for child in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child, 0)
        interrupted_by(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # One worker dying (e.g. --die-after) takes the whole server down, like a crashed engine.
    _, status = os.wait()
    for child in children:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(os.waitstatus_to_exitcode(status) if status else 1)


def run_server(config: ServeConfig, workers: int = 1) -> None:
    """Serve until interrupted. Prints ``draftsmith serve: listening on http://HOST:PORT`` on
    stdout once the socket is bound (``port=0`` picks a free port; tests read it from that line).

    ``workers > 1`` (echo backend only) pre-forks processes sharing the socket; fault-injection
    counters are then per worker.
    """
    if workers > 1:
        if config.backend != "echo":
            raise ValueError("--workers > 1 is only for the echo backend (the model backend batches in one process)")
        _run_workers(config, workers)
        return
    run_async(_serve(config))  # until Ctrl-C/SIGTERM: the CLI says so and exits 130/143
