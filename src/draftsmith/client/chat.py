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
* ``ResponseFormatError``: a 200 answer that is not a chat completion (not retryable).
"""

from __future__ import annotations

import asyncio
import json
import time
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


@dataclass
class ChatResult:
    """A parsed chat completion (streamed or not)."""

    content: str
    reasoning: str
    reasoning_source: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    prompt_token_ids: list[int] | None
    completion_token_ids: list[int] | None
    model: str | None
    latency_s: float
    ttft_s: float | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def _usage_fields(usage: dict[str, Any] | None) -> tuple[int | None, int | None, int | None]:
    if not usage:
        return None, None, None
    details = usage.get("completion_tokens_details") or {}
    return usage.get("prompt_tokens"), usage.get("completion_tokens"), details.get("reasoning_tokens")


def parse_chat_response(body: Any, latency_s: float) -> ChatResult:
    """Turn a non-streaming ``/v1/chat/completions`` body into a ``ChatResult``."""
    try:
        choice = body["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise ResponseFormatError(f"not a chat completion: {str(body)[:200]}") from None
    reasoning, content, source = extract_reasoning(message)
    prompt_tokens, completion_tokens, reasoning_tokens = _usage_fields(body.get("usage"))
    prompt_ids = body.get("prompt_token_ids") or choice.get("prompt_token_ids")
    return ChatResult(
        content=content,
        reasoning=reasoning,
        reasoning_source=source,
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        reasoning_tokens=reasoning_tokens,
        prompt_token_ids=list(prompt_ids) if prompt_ids else None,
        completion_token_ids=list(choice["token_ids"]) if choice.get("token_ids") else None,
        model=body.get("model"),
        latency_s=latency_s,
        raw=body,
    )


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
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError, asyncio.TimeoutError) as error:
            raise EndpointConnectionError(f"{redact_url(url)}: {type(error).__name__}: {redact(str(error))}") from None

    async def get_json(self, url: str, timeout_s: float = 5.0) -> tuple[int, Any]:
        """GET ``url``; returns (status, parsed JSON or None). Raises ``EndpointConnectionError``."""
        status, text = await self.get_text(url, timeout_s)
        try:
            return status, json.loads(text) if text else None
        except json.JSONDecodeError:
            return status, None

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

    async def chat(self, base_url: str, payload: dict[str, Any]) -> ChatResult:
        """POST one chat completion; streams when ``payload["stream"]`` is true."""
        start = time.perf_counter()
        data = json.dumps(payload).encode("utf-8")
        try:
            async with await self._post(_chat_url(base_url), data) as response:
                if response.status != 200:
                    text = (await response.read()).decode("utf-8", "replace")
                    message = text[:500]
                    try:
                        message = json.loads(text)["error"]["message"]
                    except (ValueError, KeyError, TypeError):
                        pass
                    retry_after = None
                    if "Retry-After" in response.headers:
                        try:
                            retry_after = float(response.headers["Retry-After"])
                        except ValueError:
                            pass
                    raise HTTPStatusError(response.status, str(message), retry_after)
                if payload.get("stream"):
                    return await self._read_stream(response, start)
                raw = await response.read()
        except asyncio.TimeoutError:  # before ClientConnectionError: aiohttp's ServerTimeoutError is both
            raise RequestTimeout(f"{redact_url(base_url)}: no complete answer within {self.timeout_s:g}s") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError) as error:
            raise EndpointConnectionError(f"{redact_url(base_url)}: {type(error).__name__}: {redact(str(error))}") from None
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            raise ResponseFormatError(f"{redact_url(base_url)}: response is not JSON: {raw[:200]!r}") from None
        return parse_chat_response(body, time.perf_counter() - start)

    async def _read_stream(self, response: aiohttp.ClientResponse, start: float) -> ChatResult:
        content: list[str] = []
        reasoning: dict[str, list[str]] = {"reasoning_content": [], "reasoning": []}
        completion_ids: list[int] = []
        prompt_ids: list[int] | None = None
        finish_reason = None
        usage = None
        model = None
        ttft = None
        async for line in _sse_lines(response):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError:
                raise ResponseFormatError(f"bad SSE chunk: {data[:200]!r}") from None
            if "error" in chunk and "choices" not in chunk:
                message = chunk["error"].get("message") if isinstance(chunk["error"], dict) else chunk["error"]
                raise HTTPStatusError(500, f"error while streaming: {message}")
            model = chunk.get("model", model)
            if chunk.get("prompt_token_ids"):
                prompt_ids = list(chunk["prompt_token_ids"])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = delta.get("content")
                if piece:
                    content.append(piece)
                for key in reasoning:
                    if delta.get(key):
                        reasoning[key].append(delta[key])
                if ttft is None and (piece or delta.get("reasoning_content") or delta.get("reasoning")):
                    ttft = time.perf_counter() - start
                if choice.get("token_ids"):
                    completion_ids.extend(choice["token_ids"])
                if choice.get("prompt_token_ids"):
                    prompt_ids = list(choice["prompt_token_ids"])
                if choice.get("finish_reason"):
                    finish_reason = choice["finish_reason"]
        message = {"content": "".join(content)}
        for key, parts in reasoning.items():
            if parts:
                message[key] = "".join(parts)
        text_reasoning, text_content, source = extract_reasoning(message)
        prompt_tokens, completion_tokens, reasoning_tokens = _usage_fields(usage)
        return ChatResult(
            content=text_content,
            reasoning=text_reasoning,
            reasoning_source=source,
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            reasoning_tokens=reasoning_tokens,
            prompt_token_ids=prompt_ids,
            completion_token_ids=completion_ids or None,
            model=model,
            latency_s=time.perf_counter() - start,
            ttft_s=ttft,
        )
