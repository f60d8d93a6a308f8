"""`draftsmith generate`: regenerate completions for every prompt through OpenAI-compatible engines.

Public API:

* ``GenerateConfig``, ``GenerateSummary``, ``generate(config)`` (blocking, notebook-safe),
  ``agenerate(config)`` (async);
* ``GuardConfig`` (quality-guard thresholds), ``QualityGuardTripped`` (CLI exit code 3);
* ``ChatClient`` / ``ChatResult`` (the pooled async client), ``extract_reasoning``;
* ``load_prompts`` / ``PromptSample`` (prompt reading with stable ids), ``scan_done_ids``.
"""

from draftsmith.client.chat import ChatClient, ChatResult, normalize_base_url
from draftsmith.generate.config import GenerateConfig, GenerateSummary, GuardConfig
from draftsmith.generate.guard import QualityGuard
from draftsmith.data.conversation import content_hash_id
from draftsmith.data.prompts import PromptSample, load_prompts
from draftsmith.generate.inputs import shard_of
from draftsmith.generate.pipeline import QualityGuardTripped, agenerate, generate
from draftsmith.data.reasoning import extract_reasoning, split_think
from draftsmith.generate.store import OutputStore, scan_done_ids

__all__ = [
    "ChatClient",
    "ChatResult",
    "GenerateConfig",
    "GenerateSummary",
    "GuardConfig",
    "OutputStore",
    "PromptSample",
    "QualityGuard",
    "QualityGuardTripped",
    "agenerate",
    "content_hash_id",
    "extract_reasoning",
    "generate",
    "load_prompts",
    "normalize_base_url",
    "scan_done_ids",
    "shard_of",
    "split_think",
]
