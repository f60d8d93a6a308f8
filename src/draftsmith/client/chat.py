"""Async OpenAI-compatible chat client (aiohttp).

One ``ChatClient`` holds one HTTP/1.1 keep-alive connection pool sized to the total concurrency and
is reused for every request and endpoint. aiohttp is used rather than httpx because on this
project's echo server httpx's ``AsyncClient`` reached ~200 completions/s where aiohttp reached
~2,600/s on the same machine (measured, see benchmarks/bench_client_overhead.py).

Errors are classified for the retry logic:

* ``EndpointConnectionError``: the endpoint could not be reached / dropped the connection
  (the dispatcher checks its health and requeues the request elsewhere);
* ``HTTPStatusError`` with ``retryable`` True for 408, 409, 425, 429 and 5xx, False otherwise;
* ``RequestTimeout``: no full answer within the request timeout (retryable);
* ``ResponseFormatError``: a 200 answer that is not a chat completion answer (not retryable): not
  JSON, malformed fields, content null (in a turn without tool calls) or not text;
* ``IncompleteResponse``: a 200 answer that never said how it finished (a stream cut off before
  its ``finish_reason`` and ``[DONE]``, or no finish_reason at all): retryable, never an answer.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from draftsmith.core.redact import check_endpoint_url, redact, redact_url
from draftsmith.data.reasoning import extract_reasoning

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
# Resends of a request whose pooled connection the server had already closed (see ChatClient._post).
STALE_CONNECTION_RETRIES = 3


class ClientError(Exception):
    """Base of the errors a chat request can end with."""

    retryable = True


class EndpointConnectionError(ClientError):
    """Connection refused, reset or closed before a full response."""


class AnswerTimeout(EndpointConnectionError):
    """A GET (a health check, /props, /metrics) got no answer within its timeout: the endpoint may
    be hung, or busy and queueing it; unlike a refused connection, not proof that it is gone."""


class RequestTimeout(ClientError):
    """The request took longer than the client's timeout."""


class HTTPStatusError(ClientError):
    def __init__(self, status: int, message: str, retry_after: float | None = None):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.retry_after = retry_after
        self.retryable = status in RETRYABLE_STATUS or status >= 500


class ResponseFormatError(ClientError):
    retryable = False


class IncompleteResponse(ClientError):
    """A 200 answer that ended before the engine said how it finished (a stream cut off before its
    ``finish_reason`` chunk and ``[DONE]``): never an answer, retried like a dropped connection."""


@dataclass
class ChatResult:
    """A parsed chat completion (streamed or not); ``finish_reason`` is always the engine's."""

    content: str
    reasoning: str
    reasoning_source: str
    finish_reason: str
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    prompt_token_ids: list[int] | None
    completion_token_ids: list[int] | None
    model: str | None
    latency_s: float
    ttft_s: float | None = None
    tool_calls: list[dict[str, Any]] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _count(value: Any) -> int | None:
    """A usage count, or None for anything that is not a non-negative integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _usage_fields(usage: Any) -> tuple[int | None, int | None, int | None]:
    if not isinstance(usage, dict):
        return None, None, None
    details = usage.get("completion_tokens_details")
    details = details if isinstance(details, dict) else {}
    return _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")), _count(details.get("reasoning_tokens"))


def _token_ids(value: Any, what: str) -> list[int] | None:
    """Engine token ids as a list of ints (None when absent); anything else is a format error."""
    if value is None or (isinstance(value, list) and not value):
        return None
    if isinstance(value, list) and all(isinstance(item, int) and not isinstance(item, bool) for item in value):
        return list(value)
    raise ResponseFormatError(f"{what} is not a list of token ids: {_shown(value)}")


def _finish_reason(value: Any) -> str:
    if value is None:
        raise IncompleteResponse("the answer ended without a finish_reason (cut off?)")
    if not isinstance(value, str) or not value:
        raise ResponseFormatError(f"finish_reason {_shown(value)} is not a string")
    return value


def _answer(message: dict[str, Any], finish_reason: str) -> tuple[str, str, str, list[dict[str, Any]] | None]:
    """``(reasoning, content, source, tool_calls)`` of an assistant message, which must be an answer
    (`data.generated.incomplete_answer`'s rule): text content, null only in a turn that calls tools
    or carries reasoning (then written as ""), text reasoning, a list of tool calls."""
    calls = message.get("tool_calls") or None
    if calls is not None and not (isinstance(calls, list) and all(isinstance(call, dict) for call in calls)):
        raise ResponseFormatError(f"tool_calls is not a list of objects: {_shown(calls)}")
    for key in ("reasoning_content", "reasoning"):
        if message.get(key) is not None and not isinstance(message[key], str):
            raise ResponseFormatError(f"{key} is a {type(message[key]).__name__}, not text")
    content = message.get("content")
    thought = any((message.get(key) or "").strip() for key in ("reasoning_content", "reasoning"))
    if content is None and not calls and not thought:
        raise ResponseFormatError(f"the answer's content is null (no text, no tool calls, no reasoning; "
                                  f"finish_reason {finish_reason!r})")
    if content is not None and not isinstance(content, str):
        raise ResponseFormatError(f"the answer's content is a {type(content).__name__}, not text: {_shown(content)}")
    reasoning, text, source = extract_reasoning({**message, "content": content or ""})
    return reasoning, text, source, calls


def parse_chat_response(body: Any, latency_s: float) -> ChatResult:
    """Turn a non-streaming ``/v1/chat/completions`` body into a ``ChatResult``.

    Raises ``ResponseFormatError`` for a body that is not a chat completion answer (content null
    or not text, malformed fields) and ``IncompleteResponse`` for one without a finish_reason.
    """
    choices = body.get("choices") if isinstance(body, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise ResponseFormatError(f"not a chat completion: {_shown(body)}")
    finish_reason = _finish_reason(choice.get("finish_reason"))
    reasoning, content, source, calls = _answer(message, finish_reason)
    prompt_tokens, completion_tokens, reasoning_tokens = _usage_fields(body.get("usage"))
    prompt_ids = body.get("prompt_token_ids") or choice.get("prompt_token_ids")
    model = body.get("model")
    return ChatResult(
        content=content,
        reasoning=reasoning,
        reasoning_source=source,
        finish_reason=finish_reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        reasoning_tokens=reasoning_tokens,
        prompt_token_ids=_token_ids(prompt_ids, "prompt_token_ids"),
        completion_token_ids=_token_ids(choice.get("token_ids"), "token_ids"),
        model=model if isinstance(model, str) else None,
        latency_s=latency_s,
        tool_calls=calls,
        raw=body,
    )


def parse_chat_body(raw: bytes, latency_s: float) -> ChatResult:
    """`parse_chat_response` of a raw response body (bytes that may not even be JSON)."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ResponseFormatError(f"response is not JSON: {raw[:200]!r}") from None
    return parse_chat_response(body, latency_s)


class StreamParser:
    """Accumulates the SSE lines of one streamed completion; `result` is the answer once the
    stream said how it finished (a ``finish_reason`` chunk, then ``data: [DONE]``)."""

    def __init__(self, start: float | None = None):
        self.start = time.perf_counter() if start is None else start
        self.content: list[str] = []
        self.saw_content = False
        self.reasoning: dict[str, list[str]] = {"reasoning_content": [], "reasoning": []}
        self.completion_ids: list[int] = []
        self.prompt_ids: list[int] | None = None
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.model: str | None = None
        self.ttft: float | None = None
        self.done = False

    def feed(self, line: bytes) -> bool:
        """Read one SSE line; True once ``[DONE]`` arrived (the caller stops reading)."""
        if not line.startswith(b"data:"):
            return False
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return True
        try:
            chunk = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise ResponseFormatError(f"bad SSE chunk: {data[:200]!r}") from None
        if not isinstance(chunk, dict):
            raise ResponseFormatError(f"bad SSE chunk: {data[:200]!r}")
        if "error" in chunk and "choices" not in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise HTTPStatusError(500, f"error while streaming: {_shown(message)}")
        if isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        if chunk.get("prompt_token_ids"):
            self.prompt_ids = _token_ids(chunk["prompt_token_ids"], "prompt_token_ids")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise ResponseFormatError(f"bad SSE chunk: choices is not a list: {data[:200]!r}")
        for choice in choices:
            self._choice(choice)
        return False

    def _choice(self, choice: Any) -> None:
        if not isinstance(choice, dict):
            raise ResponseFormatError(f"bad SSE chunk: a choice is not an object: {_shown(choice)}")
        delta = choice.get("delta")
        delta = {} if delta is None else delta
        if not isinstance(delta, dict):
            raise ResponseFormatError(f"bad SSE chunk: a choice without a delta object: {_shown(choice)}")
        piece = delta.get("content")
        if piece is not None and not isinstance(piece, str):
            raise ResponseFormatError(f"the answer's content is a {type(piece).__name__}, not text: {_shown(piece)}")
        if piece is not None:
            self.saw_content = True
            self.content.append(piece)
        for key, parts in self.reasoning.items():
            value = delta.get(key)
            if value is not None and not isinstance(value, str):
                raise ResponseFormatError(f"{key} is a {type(value).__name__}, not text")
            if value:
                parts.append(value)
        if self.ttft is None and (piece or delta.get("reasoning_content") or delta.get("reasoning")):
            self.ttft = time.perf_counter() - self.start
        self._tool_call_deltas(delta.get("tool_calls"))
        self.completion_ids.extend(_token_ids(choice.get("token_ids"), "token_ids") or [])
        if choice.get("prompt_token_ids"):
            self.prompt_ids = _token_ids(choice["prompt_token_ids"], "prompt_token_ids")
        if choice.get("finish_reason") is not None:
            self.finish_reason = _finish_reason(choice["finish_reason"])

    def _tool_call_deltas(self, deltas: Any) -> None:
        """Merge streamed tool-call pieces by index (the arguments arrive in pieces)."""
        if deltas is None:
            return
        if not isinstance(deltas, list) or not all(isinstance(item, dict) for item in deltas):
            raise ResponseFormatError(f"tool_calls is not a list of objects: {_shown(deltas)}")
        for item in deltas:
            index = item.get("index", len(self.calls))
            if not isinstance(index, int) or isinstance(index, bool):
                raise ResponseFormatError(f"a tool call's index is not an integer: {_shown(item)}")
            call = self.calls.setdefault(index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
            for key in ("id", "type"):
                if isinstance(item.get(key), str):
                    call[key] = item[key]
            function = item.get("function")
            if function is not None and not isinstance(function, dict):
                raise ResponseFormatError(f"a tool call's function is not an object: {_shown(item)}")
            for key in ("name", "arguments"):
                value = (function or {}).get(key)
                if value is not None and not isinstance(value, str):
                    raise ResponseFormatError(f"a tool call's {key} is not text: {_shown(item)}")
                call["function"][key] += value or ""

    def result(self) -> ChatResult:
        """The answer; ``IncompleteResponse`` when the stream ended before it said how it finished."""
        if self.finish_reason is None or not self.done:
            missing = " and ".join(
                what for what, seen in (("a finish_reason", self.finish_reason), ("[DONE]", self.done)) if not seen
            )
            raise IncompleteResponse(f"the stream ended without {missing} (cut off after {len(self.content)} pieces)")
        calls = [self.calls[index] for index in sorted(self.calls)] or None
        message: dict[str, Any] = {"content": "".join(self.content) if self.saw_content else None, "tool_calls": calls}
        for key, parts in self.reasoning.items():
            if parts:
                message[key] = "".join(parts)
        reasoning, content, source, calls = _answer(message, self.finish_reason)
        prompt_tokens, completion_tokens, reasoning_tokens = _usage_fields(self.usage)
        return ChatResult(
            content=content,
            reasoning=reasoning,
            reasoning_source=source,
            finish_reason=self.finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            reasoning_tokens=reasoning_tokens,
            prompt_token_ids=self.prompt_ids,
            completion_token_ids=self.completion_ids or None,
            model=self.model,
            latency_s=time.perf_counter() - self.start,
            ttft_s=self.ttft,
            tool_calls=calls,
        )


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """A ``Retry-After`` header in seconds, never negative (``inf`` kept: callers cap it): a number
    of seconds or an HTTP date (RFC 9110 allows both; a date is counted from ``now``, default the
    clock); None for anything else (NaN, garbage)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            date = email.utils.parsedate_to_datetime(value.strip())
        except (TypeError, ValueError, IndexError):
            return None
        if date.tzinfo is None:  # an HTTP date is always GMT, whatever its zone text says
            date = date.replace(tzinfo=datetime.timezone.utc)
        seconds = date.timestamp() - (time.time() if now is None else now)
    if math.isnan(seconds):
        return None
    return max(0.0, seconds)


def chat_payload(model: str, max_tokens: int, *, stream: bool = False, temperature: float | None = None,
                 top_p: float | None = None, seed: int | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None, return_token_ids: bool = False,
                 extra_body: dict[str, Any] | None = None) -> dict[str, Any]:
    """The request body shared by every prompt of a run (add ``messages`` per request).

    Streaming asks for ``usage`` in the final chunk; ``return_token_ids`` is vLLM's flag for
    prompt/completion token ids; ``extra_body`` fields are passed through unchanged.
    """
    payload: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": stream}
    for key, value in (("temperature", temperature), ("top_p", top_p), ("seed", seed)):
        if value is not None:
            payload[key] = value
    if chat_template_kwargs:
        payload["chat_template_kwargs"] = dict(chat_template_kwargs)
    if stream:
        payload["stream_options"] = {"include_usage": True}
    if return_token_ids:
        payload["return_token_ids"] = True
    payload.update(extra_body or {})
    return payload


def _nothing() -> None:
    pass


def _json_object(text: str) -> dict[str, Any]:
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return body if isinstance(body, dict) else {}


def _slots_from_props(text: str) -> int | None:
    """llama-server's `/props`: ``total_slots`` (its ``-np``)."""
    return _count(_json_object(text).get("total_slots")) or None


def _max_num_seqs_from_server_info(text: str) -> int | None:
    """vLLM's `/server_info?config_format=json`: ``vllm_config.scheduler_config.max_num_seqs``."""
    config = _json_object(text).get("vllm_config")
    scheduler = config.get("scheduler_config") if isinstance(config, dict) else None
    return _count(scheduler.get("max_num_seqs")) or None if isinstance(scheduler, dict) else None


def max_num_seqs_from_metrics(text: str) -> int | None:
    """vLLM's ``max_num_seqs`` from its Prometheus text, where an info metric carries it as a label
    (e.g. ``vllm:cache_config_info{...,max_num_seqs="256",...} 1.0``); None when none does."""
    match = re.search(r'[{,]\s*max_num_seqs="(\d+)"', text)
    return int(match.group(1)) if match and int(match.group(1)) > 0 else None


def _chat_url(base_url: str) -> str:
    return base_url + "/v1/chat/completions"


def normalize_base_url(url: str) -> str:
    """``http://h:p``, ``http://h:p/`` and ``http://h:p/v1`` all become ``http://h:p``."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return check_endpoint_url(url)  # a malformed URL is one line (its password never shown)


async def _sse_lines(response: aiohttp.ClientResponse):
    """Lines of an SSE body, of any length (aiohttp's line iterator stops at 64 KiB, and a first
    chunk carrying a long prompt's ``prompt_token_ids`` is longer)."""
    buffer = b""
    async for block in response.content.iter_any():
        buffer += block
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            line = line.strip()
            if line:
                yield line
    if buffer.strip():
        yield buffer.strip()


class ChatClient:
    """A pooled async client for OpenAI-compatible servers.

    Use as ``async with ChatClient(connections=256) as client: await client.chat(base, payload)``.
    """

    def __init__(self, connections: int = 256, timeout_s: float = 600.0, api_key: str | None = None):
        self.connections = max(1, connections)
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ChatClient:
        await self.open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def open(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.connections, limit_per_host=0, keepalive_timeout=60, ttl_dns_cache=300
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=10),
                json_serialize=json.dumps,
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _check_credentials(self, url: str) -> None:
        parts = urlsplit(url)  # named as the user gave it: the endpoint, not the request's path
        check_endpoint_url(f"{parts.scheme}://{parts.netloc}", api_key=self.headers.get("Authorization"))

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("ChatClient is not open; use 'async with ChatClient(...)'")
        return self._session

    async def get_text(self, url: str, timeout_s: float = 5.0) -> tuple[int, str]:
        """GET ``url``; returns (status, body text). Raises ``EndpointConnectionError``."""
        self._check_credentials(url)
        try:
            async with self.session.get(url, headers=self.headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
                return response.status, (await response.read()).decode("utf-8", "replace")
        except asyncio.TimeoutError:  # before ClientConnectionError: aiohttp's ServerTimeoutError is both
            raise AnswerTimeout(f"{redact_url(url)}: no answer within {timeout_s:g}s") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError, asyncio.TimeoutError) as error:
            raise EndpointConnectionError(f"{redact_url(url)}: {type(error).__name__}: {redact(str(error))}") from None

    async def get_json(self, url: str, timeout_s: float = 5.0) -> tuple[int, Any]:
        """GET ``url``; returns (status, parsed JSON or None). Raises ``EndpointConnectionError``."""
        status, text = await self.get_text(url, timeout_s)
        try:
            return status, json.loads(text) if text else None
        except json.JSONDecodeError:
            return status, None

    async def chat_template(self, base_url: str) -> str | None:
        """The chat template an endpoint reports: llama-server's `/props`; None where none is told
        (vLLM, SGLang) or the endpoint cannot be reached."""
        try:
            status, body = await self.get_json(base_url.rstrip("/") + "/props")
        except EndpointConnectionError:
            return None
        template = body.get("chat_template") if status == 200 and isinstance(body, dict) else None
        return template if isinstance(template, str) and template else None

    async def _post(self, url: str, data: bytes) -> aiohttp.ClientResponse:
        """POST, resending on a fresh connection when a pooled one turns out to be closed.

        Engines close idle or used-up keep-alive connections on their own schedule (llama-server
        sends `Keep-Alive: timeout=5, max=100`); a request written into such a socket fails before
        any byte of an answer arrives, so sending it again cannot duplicate a completion.
        """
        self._check_credentials(url)
        for attempt in range(STALE_CONNECTION_RETRIES + 1):
            try:
                return await self.session.post(url, data=data, headers=self.headers)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as error:
                if isinstance(error, aiohttp.ClientConnectorError) or attempt == STALE_CONNECTION_RETRIES:
                    raise
        raise AssertionError("unreachable")

    async def engine_slots(self, base_url: str, timeout_s: float = 5.0) -> int | None:
        """How many requests the engine at `base_url` runs at once, where it says: llama-server's
        `/props` ``total_slots``; vLLM's ``max_num_seqs`` from `/metrics` where an info metric carries
        it, else from `/server_info` (served with ``VLLM_SERVER_DEV_MODE=1``); None when none tells."""
        base = base_url.rstrip("/")
        for path, read in (("/props", _slots_from_props), ("/metrics", max_num_seqs_from_metrics),
                           ("/server_info?config_format=json", _max_num_seqs_from_server_info)):  # fmt: skip
            try:
                status, text = await self.get_text(base + path, timeout_s)
            except EndpointConnectionError:
                return None
            slots = read(text) if status == 200 else None
            if slots:
                return slots
        return None

    async def chat(self, base_url: str, payload: dict[str, Any],
                   on_progress: Callable[[], None] | None = None) -> ChatResult:  # fmt: skip
        """POST one chat completion; streams when ``payload["stream"]`` is true.

        ``on_progress()`` is called whenever something of the answer arrives (its status line, each
        streamed line, the whole body): the caller's evidence that the engine is working on it.
        """
        progress = on_progress or _nothing
        start = time.perf_counter()
        data = json.dumps(payload).encode("utf-8")
        try:
            async with await self._post(_chat_url(base_url), data) as response:
                progress()
                if response.status != 200:
                    text = (await response.read()).decode("utf-8", "replace")
                    message = text[:500]
                    try:
                        message = json.loads(text)["error"]["message"]
                    except (ValueError, KeyError, TypeError):
                        pass
                    retry_after = parse_retry_after(response.headers.get("Retry-After"))
                    raise HTTPStatusError(response.status, str(message), retry_after)
                if payload.get("stream"):
                    return await self._read_stream(response, start, progress)
                raw = await response.read()
                progress()
        except asyncio.TimeoutError:  # before ClientConnectionError: aiohttp's ServerTimeoutError is both
            raise RequestTimeout(f"{redact_url(base_url)}: no complete answer within {self.timeout_s:g}s") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError) as error:
            raise EndpointConnectionError(f"{redact_url(base_url)}: {type(error).__name__}: {redact(str(error))}") from None
        try:
            return parse_chat_body(raw, time.perf_counter() - start)
        except ResponseFormatError as error:
            raise ResponseFormatError(f"{redact_url(base_url)}: {error}") from None

    async def _read_stream(self, response: aiohttp.ClientResponse, start: float,
                           progress: Callable[[], None]) -> ChatResult:  # fmt: skip
        parser = StreamParser(start)
        async for line in _sse_lines(response):
            progress()
            if parser.feed(line):
                break
        return parser.result()
