"""Convert a GGUF file to a Hugging Face model folder with transformers' own GGUF loader.

The folder holds config.json, model.safetensors, the tokenizer with its chat template and
generation_config.json: what every stage reads as a target. Quantised GGUF weights (Q4_1, Q8_0, ...)
are dequantised by the loader; they are written as float32 (`GGUF_DTYPE`), which holds a
dequantised block value (scale * q + min, from float16 scale and min) exactly, so the folder
computes what the GGUF's weights say. bfloat16 would round them again.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from draftsmith.core.errors import InputError
from draftsmith.core.io import publish
from draftsmith.data.turns import generation_eos_ids

GGUF_DTYPE = "float32"
GGUF_MAGIC = b"GGUF"
STAMP = "draftsmith_model.json"  # written last: a folder without it is not a finished conversion


def _check_gguf_file(gguf: Path) -> None:
    if not gguf.is_file():
        raise InputError(f"--gguf {gguf}: no such file")
    with gguf.open("rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise InputError(f"--gguf {gguf}: not a GGUF file (it does not start with the bytes 'GGUF')")


def _load(gguf: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=GGUF_DTYPE)
    except ImportError as error:  # transformers' GGUF loader needs the `gguf` package
        raise InputError(f"--gguf {gguf}: converting needs the gguf package ({error}); pip install gguf") from None
    except (ValueError, KeyError, OSError, RuntimeError) as error:  # unsupported architecture or shapes, truncated data
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputError(f"--gguf {gguf}: transformers cannot load it: {first_line}") from None
    return tokenizer, model


def _drop_gguf_quantization(model) -> None:
    """The loader has already dequantised the weights, but the model still carries a GGUF
    quantization config that makes `save_pretrained` refuse; the saved folder is plain floats."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = ""


def convert_gguf(
    gguf: Path,
    out_dir: Path,
    *,
    provenance: dict | None = None,
    log: Callable[[str], None] = lambda message: None,
) -> Path:
    """Write a Hugging Face folder for `gguf` at `out_dir` and return it.

    The folder appears atomically (built beside `out_dir`, then renamed): an interrupted conversion
    leaves no half folder. `out_dir` must not exist, or be a finished earlier conversion, which is
    replaced. `provenance` (the fetched model's name and hash) goes into draftsmith_model.json.
    """
    gguf, out_dir = Path(gguf), Path(out_dir)
    _check_gguf_file(gguf)
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / STAMP).is_file():
        raise InputError(f"--out {out_dir}: exists and is not an earlier conversion; remove it or choose another")
    log(f"models: converting {gguf} to a Hugging Face folder ({GGUF_DTYPE}) ...")
    tokenizer, model = _load(gguf)
    _drop_gguf_quantization(model)
    context = model.config.max_position_embeddings
    tokenizer.model_max_length = context  # the loader leaves transformers' "unlimited" placeholder
    # Every id that ends a turn, as released models write them (Gemma 3: [1, 106]; SmolLM2: 2): a
    # GGUF carries only its eos, while the template may end turns with another token.
    stops = generation_eos_ids(tokenizer)
    if stops:
        model.generation_config.eos_token_id = stops if len(stops) > 1 else stops[0]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-converting-", dir=out_dir.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the published folder is an ordinary one
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if not (staging / "chat_template.jinja").is_file():
            raise InputError(f"--gguf {gguf}: it carries no chat template (tokenizer.chat_template); "
                             "a target for draftsmith needs one")
        stamp = {"gguf": gguf.name, "dtype": GGUF_DTYPE, "architecture": model.config.model_type,
                 **(provenance or {})}
        (staging / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        publish(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"models: wrote {out_dir}")
    return out_dir
