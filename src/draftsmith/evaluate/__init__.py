"""Speculative-decoding evaluation of a DFlash drafter against its target (names import on first use)."""

from draftsmith.core.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    "draftsmith.evaluate",
    {
        "EvalConfig": "config",
        "EndpointReport": "endpoint",
        "evaluate_endpoint": "endpoint",
        "Prompt": "prompts",
        "read_prompts": "prompts",
        "DecodeResult": "speculative",
        "EvalReport": "speculative",
        "LosslessnessError": "speculative",
        "PromptResult": "speculative",
        "evaluate_drafter": "speculative",
        "check_greedy": "speculative",
        "TIE_TOLERANCE": "speculative",
        "accept_probability": "speculative",
        "greedy_decode": "speculative",
        "sample_decode": "speculative",
        "speculative_decode": "speculative",
        "prompt_lookup_decode": "speculative",
        "prompt_lookup_drafts": "speculative",
    },
)
