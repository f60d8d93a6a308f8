"""What `check` reads: the export's config and tensor shapes, the target's config, tokenizer and heads.

Everything here is read without building a model: shapes come from the safetensors headers, and
only the few target tensors a comparison needs are loaded.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from draftsmith.core.errors import InputError
from draftsmith.core.readers import read_json
from draftsmith.model.safetensors_file import read_safetensors_header


def _read_config(path: Path, what: str) -> dict[str, Any]:
    config_path = path / "config.json"
    if not path.is_dir():
        raise InputError(f"{path}: {what} directory not found")
    if not config_path.is_file():
        raise InputError(f"{config_path}: not found ({what} directories hold a config.json)")
    raw = read_json(config_path, "config")  # the one JSON reader: a plain file, bounded in size and depth
    if not isinstance(raw, dict):
        raise InputError(f"{config_path}: expected a JSON object")
    return raw


def _tensor_layout(files: list[Path]) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """(shape, safetensors dtype) of every tensor, read from the checked headers alone."""
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    for file in files:
        for name, entry in read_safetensors_header(file).tensors.items():
            shapes[name] = tuple(entry["shape"])
            dtypes[name] = entry["dtype"]
    return shapes, dtypes


def _load_tensor(files: list[Path], names: tuple[str, ...]):
    from safetensors import safe_open

    for file in files:
        read_safetensors_header(file)
        with safe_open(str(file), framework="pt") as handle:
            keys = set(handle.keys())
            for name in names:
                if name in keys:
                    return handle.get_tensor(name)
    return None


HEAD_NAMES = ("lm_head.weight", "model.lm_head.weight")
EMBED_NAMES = ("model.embed_tokens.weight", "embed_tokens.weight", "model.language_model.embed_tokens.weight")


@dataclass
class ExportView:
    path: Path
    raw: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]
    files: list[Path]
    readme: str | None = None
    dtypes: dict[str, str] = field(default_factory=dict)  # tensor name -> safetensors dtype ("BF16", "I64", ...)

    @classmethod
    def read(cls, path: str | Path) -> ExportView:
        path = Path(path)
        raw = _read_config(path, "export")
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise InputError(f"{path}: no *.safetensors weights next to config.json")
        readme = path / "README.md"
        shapes, dtypes = _tensor_layout(files)
        return cls(path, raw, shapes, files, readme.read_text(errors="replace") if readme.is_file() else None, dtypes)

    @property
    def flash(self) -> dict[str, Any]:
        value = self.raw.get("dflash_config")
        return value if isinstance(value, dict) else {}

    @property
    def architectures(self) -> list[str]:
        """config.json's `architectures` as engines read it: a list of class names (a bare string is one)."""
        value = self.raw.get("architectures")
        if isinstance(value, str):
            return [value]
        return [str(a) for a in value] if isinstance(value, list) else []

    @property
    def variant(self) -> str | None:
        """The drafter variant engines serve this export as, decided by `architectures` alone (that is what
        picks the engine's model class): "dspark", "dflash", or None when it names neither."""
        from draftsmith.model.config import DSPARK_ARCHITECTURE

        if DSPARK_ARCHITECTURE in self.architectures:
            return "dspark"
        return "dflash" if "DFlashDraftModel" in self.architectures else None

    def value(self, name: str, default: Any = None) -> Any:
        """A DFlash field the way the reference and engines read it: dflash_config first, then top level."""
        return self.flash.get(name, self.raw.get(name, default))

    @cached_property
    def parsed(self):
        """The config as transformers (and so the reference and SGLang) parse it."""
        from transformers import Qwen3Config

        # transformers standardises RoPE in the dict it is given (a llama3 `rope_scaling` gains
        # `rope_theta`): parse a copy so the legacy keys are checked as the file has them.
        return Qwen3Config.from_dict(copy.deepcopy(self.raw))

    def tensor(self, names: tuple[str, ...]):
        return _load_tensor(self.files, names)


@dataclass
class TargetView:
    path: Path
    raw: dict[str, Any]
    files: list[Path] = field(default_factory=list)

    @classmethod
    def read(cls, path: str | Path) -> TargetView:
        path = Path(path)
        raw = _read_config(path, "target")
        return cls(path, raw, sorted(path.glob("*.safetensors")))

    @cached_property
    def config(self):
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(str(self.path))
        except Exception as error:  # an unknown model_type or a malformed field
            raise InputError(f"{self.path / 'config.json'}: transformers cannot read it ({error})") from None
        return config.get_text_config() if hasattr(config, "get_text_config") else config

    @cached_property
    def tokenizer(self):
        """The target's tokenizer, or None when the directory has none."""
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(str(self.path))
        except Exception:
            return None

    @property
    def tied(self) -> bool:
        return bool(getattr(self.config, "tie_word_embeddings", False))

    def embeddings(self):
        return _load_tensor(self.files, EMBED_NAMES)

    def lm_head(self):
        """The target's output head as engines build it: the embedding table when tied."""
        if self.tied:
            return self.embeddings()
        return _load_tensor(self.files, HEAD_NAMES)
