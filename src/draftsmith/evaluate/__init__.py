"""Speculative-decoding evaluation of a DFlash drafter against its target."""

from draftsmith.evaluate.prompts import Prompt, read_prompts
from draftsmith.evaluate.speculative import (
    DecodeResult,
    EvalReport,
    LosslessnessError,
    PromptResult,
    evaluate_drafter,
    greedy_decode,
    speculative_decode,
)

__all__ = [
    "DecodeResult",
    "EvalReport",
    "LosslessnessError",
    "Prompt",
    "PromptResult",
    "evaluate_drafter",
    "greedy_decode",
    "read_prompts",
    "speculative_decode",
]
