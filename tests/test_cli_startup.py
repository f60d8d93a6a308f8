"""The command line starts without torch or transformers: every command, `--help` included, would
otherwise pay seconds before doing anything (the stages import them when they run)."""

import subprocess
import sys


def test_importing_the_cli_loads_neither_torch_nor_transformers():
    code = "import sys, draftsmith.cli; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
