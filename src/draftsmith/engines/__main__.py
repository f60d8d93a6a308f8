"""python -m draftsmith.engines {gguf,start} ...: developer entry points for the real engines."""

from __future__ import annotations

import sys

USAGE = """usage: python -m draftsmith.engines COMMAND [ARGS]

commands:
  gguf [MODEL_DIR] [--out FILE]      convert a HF model dir (default: the tiny target) to GGUF
  start {vllm,llama-server} [--model M] [--name N] [--threads T] [--port P]
                                     serve a model on 127.0.0.1 until Ctrl-C
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "gguf":
        from draftsmith.engines.gguf import main as gguf_main

        return gguf_main(rest)
    if command == "start":
        from draftsmith.engines.launch import main as start_main

        return start_main(rest)
    print(f"unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
