"""The built-in default: a tiny target model and a synthetic corpus, both made locally."""

from draftsmith.tiny.build import TinyTargetSpec, build_tiny_target, build_tokenizer, chat_template
from draftsmith.tiny.corpus import synthetic_conversations, synthetic_prompts

__all__ = [
    "TinyTargetSpec",
    "build_tiny_target",
    "build_tokenizer",
    "chat_template",
    "synthetic_conversations",
    "synthetic_prompts",
]
