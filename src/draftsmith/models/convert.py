"""Convert a GGUF file to a Hugging Face model folder with transformers' own GGUF loader.

The folder holds config.json, model.safetensors, the tokenizer with its chat template and
generation_config.json: what every stage reads as a target. Quantised GGUF weights (Q4_1, Q8_0, ...)
are dequantised by the loader; they are written as float32 (`GGUF_DTYPE`), which holds a
dequantised block value (scale * q + min, from float16 scale and min) exactly, so the folder
computes what the GGUF's weights say. bfloat16 would round them again.

The folder is an output directory like any other: one writer at a time (a lock beside it), built
under a unique hidden staging name and renamed into place, with what a killed conversion left swept
by the next one. Its stamp (`STAMP`, written last) records the size and sha256 of every file, so a
reader can tell an intact conversion from one whose files were cut, changed or deleted since.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftsmith.core.errors import InputError
from draftsmith.core.io import (
    discard_path,
    disk_full_as_one_line,
    publish,
    refuse_replaced_link,
    write_json_atomic,
)
from draftsmith.core.lock import lock_directory
from draftsmith.core.paths import require_output_dir
from draftsmith.data.turns import generation_eos_ids

GGUF_DTYPE = "float32"
GGUF_MAGIC = b"GGUF"
STAMP = "draftsmith_model.json"  # written last: a folder without it is not a finished conversion
# Tensors llama.cpp computes from the config for its own kernels; transformers derives the same
# values from the metadata, so a file that carries them holds no weight the folder lacks.
DERIVED_TENSORS = frozenset({"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"})
BASE_MODEL_NOTE = ("a base model regenerates poorly under any template: it continues the prompt instead of "
                   "answering, so prompt lookup wins; an instruct model's GGUF carries its template")
_SHOWN = 6  # tensor names quoted in one error line


@dataclass(frozen=True)
class GGUFHeader:
    """What `convert_gguf` needs to know before the long conversion starts."""

    architecture: str
    chat_template: str | None
    tensor_names: tuple[str, ...]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _shown(names: list[str]) -> str:
    more = len(names) - _SHOWN
    return ", ".join(names[:_SHOWN]) + (f" and {more} more" if more > 0 else "")


def _check_gguf_file(gguf: Path) -> None:
    try:
        mode = gguf.stat().st_mode
    except FileNotFoundError:
        raise InputError(f"--gguf {gguf}: no such file") from None
    except OSError as error:
        raise InputError(f"--gguf {gguf}: cannot be read ({error.strerror or error})") from None
    if stat.S_ISDIR(mode):
        raise InputError(f"--gguf {gguf}: is a directory; --gguf names the .gguf file itself")
    if not stat.S_ISREG(mode):  # a FIFO would block the read below forever; a device never ends
        raise InputError(f"--gguf {gguf}: is not a regular file (a pipe or a device); --gguf names a .gguf file")
    with gguf.open("rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise InputError(f"--gguf {gguf}: not a GGUF file (it does not start with the bytes 'GGUF')")


def read_gguf_header(gguf: Path) -> GGUFHeader:
    """The file's architecture, chat template and tensor names (no tensor data is read), or one
    `InputError` for a file that is not a readable GGUF (missing, a directory or pipe, cut inside
    its header)."""
    gguf = Path(gguf)
    _check_gguf_file(gguf)
    try:
        from gguf import GGUFReader
    except ImportError as error:
        raise InputError(f"--gguf {gguf}: converting needs the gguf package ({error}); pip install gguf") from None
    try:
        reader = GGUFReader(gguf)
        fields = reader.fields
        architecture = fields["general.architecture"].contents() if "general.architecture" in fields else None
        template = fields["tokenizer.chat_template"].contents() if "tokenizer.chat_template" in fields else None
        names = tuple(str(tensor.name) for tensor in reader.tensors)
    except (ValueError, struct.error, IndexError, KeyError, TypeError, OverflowError, UnicodeDecodeError,
            MemoryError) as error:
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputError(f"--gguf {gguf}: cannot be read as a GGUF, the file is cut off or damaged ({detail})") from None
    if not isinstance(architecture, str) or not architecture:
        raise InputError(f"--gguf {gguf}: has no general.architecture in its header, so no model family to build")
    return GGUFHeader(architecture=architecture,
                      chat_template=template if isinstance(template, str) and template.strip() else None,
                      tensor_names=names)


# The largest chat template file taken: released templates are a few KB, the longest about 20 KB.
MAX_TEMPLATE_BYTES = 1 << 20


def read_chat_template(path: Path) -> str:
    """The Jinja chat template in file `path` (`--chat-template`), checked to parse."""
    from draftsmith.core.readers import read_regular_bytes

    path = Path(path)
    try:  # a plain file only: a directory, FIFO or device is named as what it is
        data = read_regular_bytes(path, MAX_TEMPLATE_BYTES)
    except FileNotFoundError:
        raise InputError(f"--chat-template {path}: no such file") from None
    except InputError as error:
        raise InputError(f"--chat-template {error}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"--chat-template {path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    if not text.strip():
        raise InputError(f"--chat-template {path}: is empty; it must hold a Jinja chat template")
    import jinja2

    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as error:
        raise InputError(f"--chat-template {path}: line {error.lineno}: not a Jinja template ({error.message})") from None
    return text


def _no_template(gguf: Path) -> InputError:
    return InputError(f"--gguf {gguf}: it carries no chat template (tokenizer.chat_template), which every stage needs "
                      f"to render prompts; give one with --chat-template FILE. Note: {BASE_MODEL_NOTE}")


def _weights_map(model, architecture: str) -> dict[str, str]:
    """GGUF tensor name -> the model's weight name, as transformers' GGUF loader maps them."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config={})
    return get_gguf_hf_weights_map(model, processor)


def _check_every_weight_loaded(gguf: Path, header: GGUFHeader, model, loading_info: dict) -> None:
    """Refuse a conversion in which transformers initialised any weight itself (a tensor missing from
    the file, or a file of another family than its general.architecture says): the folder would hold
    random values and still compute, which nothing downstream could tell from a real model."""
    try:
        to_model = _weights_map(model, header.architecture)
    except Exception:  # noqa: BLE001 - transformers loaded it, so its map exists; without it, name the weights
        to_model = {}
    to_file = {weight: tensor for tensor, weight in to_model.items()}
    missing = sorted(loading_info.get("missing_keys") or ()) + sorted(loading_info.get("mismatched_keys") or ())
    missing_named = [f"{to_file[name]} ({name})" if name in to_file else name for name in missing]
    used = set(to_model) | {name.rsplit(".", 1)[0] for name in to_model}
    unexpected = [name for name in header.tensor_names
                  if to_model and name not in used and name not in DERIVED_TENSORS and name.rsplit(".", 1)[0] not in used]
    if not missing_named and not unexpected:
        return
    parts = []
    if missing_named:
        parts.append(f"{len(missing_named)} weight(s) of a '{header.architecture}' model are not in the file: "
                     f"{_shown(missing_named)}")
    if unexpected:
        parts.append(f"{len(unexpected)} tensor(s) in the file fit no weight of a '{header.architecture}' model: "
                     f"{_shown(unexpected)}")
    raise InputError(f"--gguf {gguf}: refusing a conversion whose weights would not all come from the file "
                     f"(transformers would fill the rest with random values): {'; '.join(parts)}; check that "
                     f"general.architecture ('{header.architecture}') names the family of these tensors and "
                     "that the file is complete")


def _load(gguf: Path, header: GGUFHeader):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # transformers reads tokenizer_config.json and other files from the GGUF's directory, where they
    # belong to some other model; a private directory holding only a link to the GGUF makes the
    # file's own metadata the only source.
    with tempfile.TemporaryDirectory(prefix="draftsmith-gguf-") as view:
        os.symlink(gguf.resolve(), Path(view) / gguf.name)
        try:
            tokenizer = AutoTokenizer.from_pretrained(view, gguf_file=gguf.name)
            model, loading_info = AutoModelForCausalLM.from_pretrained(
                view, gguf_file=gguf.name, dtype=GGUF_DTYPE, output_loading_info=True)
        except ImportError as error:  # transformers' GGUF loader needs the `gguf` package
            raise InputError(f"--gguf {gguf}: converting needs the gguf package ({error}); pip install gguf") from None
        except (ValueError, KeyError, OSError, RuntimeError, NotImplementedError, struct.error) as error:
            # unsupported architecture or shapes, truncated data
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise InputError(f"--gguf {gguf}: transformers cannot load it: {first_line}") from None
    _check_every_weight_loaded(gguf, header, model, loading_info)
    return tokenizer, model


def _drop_gguf_quantization(model) -> None:
    """The loader has already dequantised the weights, but the model still carries a GGUF
    quantization config that makes `save_pretrained` refuse; the saved folder is plain floats."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = ""


def _file_records(folder: Path) -> dict[str, dict]:
    return {path.name: {"size": path.stat().st_size, "sha256": sha256_file(path)}
            for path in sorted(folder.iterdir()) if path.is_file() and path.name != STAMP}


def conversion_problem(folder: Path, sha256: str | None = None) -> str | None:
    """Why `folder` is not an intact finished conversion (of the GGUF with `sha256`, if given), or
    None when every file its stamp records is there with its recorded size and sha256."""
    folder = Path(folder)
    if folder.is_symlink():
        return "is a symbolic link, not a folder draftsmith wrote"
    stamp_path = folder / STAMP
    if stamp_path.is_symlink() or not stamp_path.is_file():
        return f"has no {STAMP}, so it is not a finished conversion"
    try:
        stamp = json.loads(stamp_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return f"its {STAMP} is unreadable"
    if not isinstance(stamp, dict):
        return f"its {STAMP} is not a draftsmith stamp"
    if sha256 is not None and stamp.get("sha256") != sha256:
        return "was converted from another GGUF"
    files = stamp.get("files")
    if not isinstance(files, dict) or not files:
        return f"its {STAMP} records no file sizes and hashes (an older draftsmith wrote it)"
    for name, record in sorted(files.items()):
        path = folder / name
        if not isinstance(record, dict) or Path(name).name != name or name.startswith("."):
            return f"its {STAMP} is not a draftsmith stamp (entry {name!r})"
        if path.is_symlink() or not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != record.get("size"):
            return f"{name} is {size} bytes, {record.get('size')} when it was converted (cut or changed since)"
        if sha256_file(path) != record.get("sha256"):
            return f"{name} does not match the sha256 it had when it was converted (changed since)"
    return None


def _replace(out_dir: Path, staging: Path) -> None:
    """`staging` in place of `out_dir` (an earlier conversion, or nothing). The old folder is renamed
    to a hidden name first, so a kill in between leaves no half folder under `out_dir`, and the
    next conversion sweeps the hidden one."""
    if not out_dir.exists():
        publish(staging, out_dir)
        return
    old = out_dir.with_name(f".{out_dir.name}-replaced-{os.getpid()}")
    discard_path(old)
    os.rename(out_dir, old)
    publish(staging, out_dir)
    discard_path(old)


def _sweep(out_dir: Path, log: Callable[[str], None]) -> None:
    """Remove what a killed conversion into `out_dir` left (called under its lock, so no live
    conversion owns any of them)."""
    for pattern in (f".{out_dir.name}-converting-*", f".{out_dir.name}-replaced-*"):
        for stale in sorted(out_dir.parent.glob(pattern)):
            log(f"models: removing {stale}, left by a conversion that was stopped")
            discard_path(stale)


def _conversion_lock(out_dir: Path, log: Callable[[str], None]):
    # `out_dir` is replaced by a rename at the end, so its lock lives beside it; a model folder is not
    # claimed by a stage (no owner record inside the folder a target is read from).
    return lock_directory(out_dir, "models convert", lock_file=out_dir.parent / f".{out_dir.name}.draftsmith.lock",
                          own=False, log=log)


def sweep_stopped_conversions(out_dir: Path, log: Callable[[str], None] = lambda message: None) -> None:
    """Remove the staging a killed conversion into `out_dir` left, under the conversion's lock."""
    out_dir = Path(out_dir)
    with _conversion_lock(out_dir, log):
        _sweep(out_dir, log)


def _refuse_foreign(out_dir: Path, label: str) -> None:
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / STAMP).is_file():
        raise InputError(f"{label}: exists and is not an earlier conversion; remove it or choose another")


def convert_gguf(
    gguf: Path,
    out_dir: Path,
    *,
    chat_template: Path | None = None,
    provenance: dict | None = None,
    log: Callable[[str], None] = lambda message: None,
    out_flag: str | None = "--out",
) -> Path:
    """Write a Hugging Face folder for `gguf` at `out_dir` and return it.

    The folder appears atomically (built beside `out_dir`, then renamed): an interrupted conversion
    leaves no half folder. `out_dir` must not exist, or be a finished earlier conversion, which is
    replaced. `chat_template` (a Jinja file) is the template for a GGUF that carries none, or replaces
    the one it carries. `provenance` (the fetched model's name and hash) goes into draftsmith_model.json.
    Everything that can be refused is refused before the conversion starts.
    """
    gguf, out_dir = Path(gguf), Path(out_dir)
    label = f"{out_flag} {out_dir}" if out_flag else str(out_dir)
    header = read_gguf_header(gguf)
    template = read_chat_template(chat_template) if chat_template is not None else None
    if template is None and header.chat_template is None:
        raise _no_template(gguf)
    from draftsmith.data.template_probe import PLACEHOLDER_TOKENS, probe_chat_template

    # Rendered once on probe conversations before anything is written: a template that never
    # finishes (or raises on a plain conversation) is refused here, not met by tokenize later.
    probe_chat_template(template or header.chat_template,
                        f"--chat-template {chat_template}" if template is not None else f"--gguf {gguf}",
                        PLACEHOLDER_TOKENS)
    if out_flag:
        refuse_replaced_link(out_dir, out_flag, "models convert")
    elif out_dir.is_symlink():
        raise InputError(f"{out_dir}: is a symbolic link; draftsmith replaces this folder as a whole: move the link away")
    require_output_dir(out_dir, out_flag or "output folder")
    _refuse_foreign(out_dir, label)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with _conversion_lock(out_dir, log):
        _refuse_foreign(out_dir, label)
        _sweep(out_dir, log)
        _convert(gguf, header, out_dir, template, chat_template, provenance, log)
    log(f"models: wrote {out_dir}")
    return out_dir


def _convert(gguf: Path, header: GGUFHeader, out_dir: Path, template: str | None, template_file: Path | None,
             provenance: dict | None, log: Callable[[str], None]) -> None:
    log(f"models: converting {gguf} to a Hugging Face folder ({GGUF_DTYPE}) ...")
    tokenizer, model = _load(gguf, header)
    _drop_gguf_quantization(model)
    if template is not None:
        if header.chat_template is None:
            log(f"models: {gguf} carries no chat template; using {template_file}. Note: {BASE_MODEL_NOTE}")
        tokenizer.chat_template = template
    context = model.config.max_position_embeddings
    tokenizer.model_max_length = context  # the loader leaves transformers' "unlimited" placeholder
    # Every id that ends a turn, as released models write them (Gemma 3: [1, 106]; SmolLM2: 2): a
    # GGUF carries only its eos, while the template may end turns with another token.
    stops = generation_eos_ids(tokenizer)
    if stops:
        model.generation_config.eos_token_id = stops if len(stops) > 1 else stops[0]
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-converting-", dir=out_dir.parent))
    try:
        with disk_full_as_one_line(out_dir):
            model.save_pretrained(staging, safe_serialization=True)
            tokenizer.save_pretrained(staging)
            if not (staging / "chat_template.jinja").is_file():
                raise _no_template(gguf)
            stamp = {"gguf": gguf.name, "dtype": GGUF_DTYPE, "architecture": model.config.model_type,
                     "chat_template": str(template_file) if template is not None else "from the GGUF",
                     **(provenance or {}), "files": _file_records(staging)}
            write_json_atomic(staging / STAMP, stamp)
            _replace(out_dir, staging)
    finally:
        discard_path(staging)
