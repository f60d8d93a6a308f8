"""Speculative-decoding evaluation of a DFlash drafter against its target."""

from draftsmith.evaluate.config import EvalConfig
from draftsmith.evaluate.endpoint import EndpointReport, evaluate_endpoint
from draftsmith.evaluate.prompts import Prompt, read_prompts
from draftsmith.evaluate.speculative import (
    DecodeResult,
    EvalReport,
    LosslessnessError,
    PromptResult,
    evaluate_drafter,
    accept_probability,
    greedy_decode,
    sample_decode,
    speculative_decode,
)

__all__ = [
    "DecodeResult",
    "EndpointReport",
    "EvalConfig",
    "accept_probability",
    "evaluate_endpoint",
    "sample_decode",
    "EvalReport",
    "LosslessnessError",
    "Prompt",
    "PromptResult",
    "evaluate_drafter",
    "greedy_decode",
    "read_prompts",
    "speculative_decode",
]
