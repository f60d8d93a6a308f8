"""Convert a Hugging Face model directory to GGUF for llama-server, cached by content.

From a shell (what `engines/convert_tiny_gguf.sh` does for the built-in tiny target):
    python -m draftsmith.engines gguf [MODEL_DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from draftsmith.model.engine_install import engines_dir, llama_convert_script
from draftsmith.core.errors import DraftsmithError
from draftsmith.core.io import publish

# Files whose content decides the GGUF: weights, config, tokenizer and chat template.
_KEY_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


class GGUFConversionError(DraftsmithError):
    pass


def _content_key(model_dir: Path, convert_script: Path, outtype: str) -> str:
    digest = hashlib.sha256()
    digest.update(outtype.encode())
    digest.update(convert_script.read_bytes())
    for name in _KEY_FILES:
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode())
            with path.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()[:16]


def convert_to_gguf(
    model_dir: str | Path,
    out_path: str | Path | None = None,
    *,
    outtype: str = "f32",
    python: str | Path | None = None,
    timeout_s: float = 600.0,
) -> Path:
    """Return a GGUF file of `model_dir`, converting only when no cached one matches its content.

    The conversion runs llama.cpp's own converter in a subprocess (with the pre-tokenizer fallback
    of `draftsmith.engines._convert_gguf`); it needs torch, transformers and numpy, which the
    project's environment has. The file appears atomically.
    """
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise GGUFConversionError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    script = llama_convert_script()
    if out_path is None:
        key = _content_key(model_dir, script, outtype)
        out_path = engines_dir() / "gguf" / f"{model_dir.name}-{key}-{outtype}.gguf"
        if out_path.is_file():
            return out_path
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=".converting-", suffix=".gguf", dir=out_path.parent)
    os.close(fd)
    src_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src_root, env.get("PYTHONPATH")]))
    command = [
        str(python or sys.executable), "-m", "draftsmith.engines._convert_gguf", str(script),
        str(model_dir), "--outfile", partial, "--outtype", outtype,
    ]
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-25:])
            raise GGUFConversionError(
                f"converting {model_dir} to GGUF failed (exit {result.returncode}):\n{tail}"
            )
        publish(partial, out_path)  # with the umask's permissions, not mkstemp's 0600
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return out_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m draftsmith.engines gguf",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", nargs="?", help="HF model dir (default: the built-in tiny target)")
    parser.add_argument("--out", help="output file (default: a content-keyed file in the engines cache)")
    parser.add_argument("--outtype", default="f32")
    args = parser.parse_args(argv)
    if args.model_dir:
        model_dir = Path(args.model_dir)
    else:
        from draftsmith.tiny import build_tiny_target

        model_dir = build_tiny_target(log=lambda message: print(message, file=sys.stderr))
    try:
        path = convert_to_gguf(model_dir, args.out, outtype=args.outtype)
    except DraftsmithError as error:
        print(f"draftsmith: error: {error}", file=sys.stderr)
        return error.exit_code
    print(path)
    return 0

