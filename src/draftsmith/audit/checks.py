"""The audit's vocabulary: every check's name, what it means, which are gated, and their minimum
counts. One table for both audits (conversations and tokenized), so one definition per gate."""

from __future__ import annotations

EXAMPLES = 5

CHECK_DESCRIPTIONS = {
    "empty_response": "no trainable content (empty, whitespace or template tokens only)",
    "empty_thinking": "trained thinking block present but empty (a template's untrained block is not the model's)",
    "missing_end_of_turn": "trainable span does not end with the end-of-turn token / did not stop",
    "truncated": 'stopped at max_tokens (finish_reason "length")',
    "over_context": "longer than the context limit",
    "scaffolding_masked": "loss mask covers role headers / template scaffolding",
    "prompt_masked": "loss mask covers prompt tokens",
    "length_mismatch": "loss_mask and input_ids lengths differ",
    "duplicate_completions": "completion identical to an earlier sample's",
    "duplicate_prompts": "prompt and completion identical to an earlier sample's (another completion of a prompt is a deliberate sample)",
    "repeated_ids": "id already used by an earlier sample (train refuses the set)",
    "no_thinking": "no thinking at all (informational)",
    "unclosed_thinking": "<think> opened but never closed (informational)",
    "trainable_count_mismatch": "num_trainable/num_tokens columns disagree with the arrays (informational)",
}


#: checks gated as a share of samples, in report order (bad_samples and dominant values come first)
GATED_CHECKS = (
    "empty_response",
    "empty_thinking",
    "missing_end_of_turn",
    "truncated",
    "over_context",
    "scaffolding_masked",
    "prompt_masked",
    "length_mismatch",
    "duplicate_completions",
    "duplicate_prompts",
    "repeated_ids",
)
#: gated checks that fail only when at least this threshold's count of samples has them
MIN_COUNTS = {"empty_thinking": "empty_thinking_min_count"}
#: reported without a gate
INFO_CHECKS = ("no_thinking", "unclosed_thinking", "trainable_count_mismatch")
