"""Run llama.cpp's vendored `convert_hf_to_gguf.py` with one run-time adjustment.

Usage: python -m draftsmith.engines._convert_gguf <convert_hf_to_gguf.py> <args for it...>

The converter identifies a BPE pre-tokenizer by hashing how it splits a probe text and refuses any
tokenizer it has not seen. A tokenizer trained locally (the tiny target's) is byte-level BPE with
GPT-2's split regex, so for an unknown hash we answer "gpt-2" instead of failing. Known tokenizers
keep their own answer. Their code is imported and patched in this process, never copied.

Qwen converters try a SentencePiece vocab first and fall back to GPT-2 BPE on FileNotFoundError,
but they import `sentencepiece` before looking for `tokenizer.model`; without that package (which
a BPE tokenizer does not need) we raise the FileNotFoundError they expect.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

FALLBACK_PRE_TOKENIZER = "gpt-2"


def _patch_pre_tokenizer_lookup(text_model_class) -> None:
    original = text_model_class.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            logging.getLogger("draftsmith.gguf").warning(
                "unknown BPE pre-tokenizer; using %r (byte-level BPE with GPT-2's split regex)",
                FALLBACK_PRE_TOKENIZER,
            )
            return FALLBACK_PRE_TOKENIZER

    text_model_class.get_vocab_base_pre = get_vocab_base_pre


def _patch_sentencepiece_probe(text_model_class) -> None:
    original = text_model_class._set_vocab_sentencepiece

    def _set_vocab_sentencepiece(self, *args, **kwargs):
        if not (Path(self.dir_model) / "tokenizer.model").is_file():
            raise FileNotFoundError(f"no tokenizer.model in {self.dir_model}")
        return original(self, *args, **kwargs)

    text_model_class._set_vocab_sentencepiece = _set_vocab_sentencepiece


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m draftsmith.engines._convert_gguf CONVERT_SCRIPT [ARGS...]")
    script = Path(argv[0]).resolve()
    vendor = script.parent
    # The script puts its own gguf-py first on sys.path; we need `conversion` importable before it runs.
    sys.path.insert(0, str(vendor))
    sys.path.insert(1, str(vendor / "gguf-py"))

    spec = importlib.util.spec_from_file_location("convert_hf_to_gguf", script)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {script}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["convert_hf_to_gguf"] = module
    spec.loader.exec_module(module)

    # Newer llama.cpp keeps the model classes in the `conversion` package; older ones in the script.
    text_model_class = getattr(module, "TextModel", None)
    if text_model_class is None:
        from conversion import base  # type: ignore[import-not-found]

        text_model_class = base.TextModel
    _patch_pre_tokenizer_lookup(text_model_class)
    _patch_sentencepiece_probe(text_model_class)

    sys.argv = [str(script), *argv[1:]]
    module.main()


if __name__ == "__main__":
    main(sys.argv[1:])
