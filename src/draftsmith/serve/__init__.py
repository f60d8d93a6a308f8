"""`draftsmith serve`: a local OpenAI-compatible server for demos, tests and client benchmarks.

Two backends:

* ``model``: a Hugging Face causal LM directory (e.g. the tiny target) served with dynamic batching
  of concurrent requests, chat templates with ``chat_template_kwargs``, reasoning split into
  ``reasoning_content`` (SGLang / llama-server style) or ``reasoning`` (vLLM style), ``usage`` with
  ``completion_tokens_details.reasoning_tokens``, streaming SSE and optional token ids.
* ``echo``: instant deterministic canned completions, for client-overhead benchmarks and
  fault-injection tests (fail a share of requests with 503/429, drop connections, delay, die).

This is not an inference engine; the engine integration tests use vLLM and llama-server.
"""

from draftsmith.serve.config import FaultConfig, ServeConfig
from draftsmith.serve.server import build_app, run_server

__all__ = ["FaultConfig", "ServeConfig", "build_app", "run_server"]
