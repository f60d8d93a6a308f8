"""Whether the serving engines installed here can serve a drafter on its target's model family.

Read from each engine itself, never from a hand-kept list:
- vLLM: its model registry (is the target's architecture known, and does its class implement the
  EAGLE3 interface that hands target hidden states to a DFlash/DSpark drafter; vLLM refuses with
  "Model does not support EAGLE3 interface" otherwise) and whether the drafter's architecture is
  registered. Asked in vLLM's own venv; the answer is cached per vLLM install and architecture,
  since importing vLLM takes ~10-40 s on a CPU.
- llama.cpp: `llama-server --help` (the `--spec-type` values), its converter's registry (can it turn
  the drafter and the target into GGUF) and the target's graph source (does it expose the per-layer
  inputs the drafter reads).
An engine that is not installed here is "unknown", with the command that installs it.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from draftsmith.model.engine_install import (
    BUILD_LLAMA_HINT,
    INSTALL_VLLM_HINT,
    EngineNotInstalled,
    engines_dir,
    llama_convert_script,
    llama_server_binary,
    vllm_python,
)

DRAFTER_ARCHITECTURES = {"dflash": "DFlashDraftModel", "dspark": "Qwen3DSparkModel"}
LLAMA_SPEC_TYPES = {"dflash": "draft-dflash", "dspark": "draft-dspark"}
PROBE_TIMEOUT_S = 300

_VLLM_PROBE = """
import json, sys
from vllm.model_executor.models.registry import ModelRegistry
from vllm.model_executor.models.interfaces import supports_eagle3
import vllm
known = set(ModelRegistry.get_supported_archs())
answer = {"version": vllm.__version__, "archs": {}}
for arch in sys.argv[1:]:
    cls = ModelRegistry._try_load_model_cls(arch) if arch in known else None
    answer["archs"][arch] = {"registered": arch in known, "eagle3": bool(cls is not None and supports_eagle3(cls))}
print("DRAFTSMITH-PROBE " + json.dumps(answer))
"""


@dataclass
class EngineSupport:
    engine: str  # "vLLM 0.32.0", "llama.cpp (llama-server)"
    status: str  # "yes" | "no" | "unknown"
    detail: str

    def line(self) -> str:
        word = {"yes": "can serve it", "no": "cannot serve it", "unknown": "not checked"}[self.status]
        return f"{self.engine}: {word}: {self.detail}"

    def to_dict(self) -> dict:
        return asdict(self)


def _cache_file(engine: str, install: Path) -> Path:
    key = hashlib.sha256(f"{install.resolve()}:{install.stat().st_mtime_ns}".encode()).hexdigest()[:16]
    return engines_dir() / "support-cache" / f"{engine}-{key}.json"


def _read_cache(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(path: Path, value: dict) -> None:
    from draftsmith.core.io import write_json_atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, value)
    except OSError:
        pass  # a cache that cannot be written only costs the next probe's time


def _vllm_registry(archs: list[str]) -> dict:
    """{"version": ..., "archs": {arch: {"registered", "eagle3"}}} from vLLM's own registry."""
    python = vllm_python()
    cache = _cache_file("vllm", python.parent.parent / ".draftsmith-stamp"
                        if (python.parent.parent / ".draftsmith-stamp").exists() else python)
    known = _read_cache(cache)
    missing = [arch for arch in archs if arch not in known.get("archs", {})]
    if missing or "version" not in known:
        done = subprocess.run([str(python), "-c", _VLLM_PROBE, *missing], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, check=False)
        line = next((l for l in done.stdout.splitlines() if l.startswith("DRAFTSMITH-PROBE ")), None)
        if line is None:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"vLLM's registry could not be read ({tail})")
        fresh = json.loads(line.removeprefix("DRAFTSMITH-PROBE "))
        known = {"version": fresh["version"], "archs": {**known.get("archs", {}), **fresh["archs"]}}
        _write_cache(cache, known)
    return known


def vllm_support(target_architectures: list[str], drafter_kind: str) -> EngineSupport:
    drafter_arch = DRAFTER_ARCHITECTURES[drafter_kind]
    try:
        registry = _vllm_registry([*target_architectures, drafter_arch])
    except EngineNotInstalled:
        return EngineSupport("vLLM", "unknown", f"not installed here (`{INSTALL_VLLM_HINT}`)")
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as error:
        return EngineSupport("vLLM", "unknown", f"its model registry could not be read: {error}")
    name, archs = f"vLLM {registry['version']}", registry["archs"]
    if not archs.get(drafter_arch, {}).get("registered"):
        return EngineSupport(name, "no", f"its registry has no {drafter_arch} (the {drafter_kind} drafter's class)")
    if not target_architectures:
        return EngineSupport(name, "unknown", "the drafter does not record its target's architecture (retrain or "
                             "pass --target to check)")
    for arch in target_architectures:
        entry = archs.get(arch, {})
        if entry.get("registered") and entry.get("eagle3"):
            return EngineSupport(name, "yes", f"{arch} implements the EAGLE3 interface the {drafter_kind} drafter "
                                 f"reads target hidden states through; {drafter_arch} is registered")
    arch = target_architectures[0]
    if not any(archs.get(a, {}).get("registered") for a in target_architectures):
        return EngineSupport(name, "no", f"its registry has no {arch}")
    return EngineSupport(name, "no", f"{arch} does not implement the EAGLE3 interface (vLLM refuses: \"Model does "
                         "not support EAGLE3 interface\"); serve the target with another engine or another family")


def _converter_classes(source: Path) -> dict[str, str]:
    """HF architecture -> the GGUF arch name llama.cpp's converter writes for it (MODEL_ARCH.X -> "x"),
    from the `@ModelBase.register(...)` classes of its conversion sources (parsed, not imported)."""
    import ast

    classes: dict[str, tuple[list[str], str | None, list[str]]] = {}  # name -> (registered, arch, bases)
    for path in sorted((source / "conversion").glob("*.py")) + [source / "convert_hf_to_gguf.py"]:
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except (OSError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            registered = [arg.value for deco in node.decorator_list if isinstance(deco, ast.Call)
                          and isinstance(deco.func, ast.Attribute) and deco.func.attr == "register"
                          for arg in deco.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
            arch = next((stmt.value.attr for stmt in node.body if isinstance(stmt, ast.Assign)
                         and any(isinstance(t, ast.Name) and t.id == "model_arch" for t in stmt.targets)
                         and isinstance(stmt.value, ast.Attribute)), None)
            bases = [base.id for base in node.bases if isinstance(base, ast.Name)]
            classes.setdefault(node.name, (registered, arch, bases))

    def arch_of(name: str, seen: frozenset = frozenset()) -> str | None:
        if name not in classes or name in seen:
            return None
        _, arch, bases = classes[name]
        return arch or next((found for base in bases if (found := arch_of(base, seen | {name}))), None)

    found: dict[str, str] = {}
    for name, (registered, _, _) in classes.items():
        arch = arch_of(name)
        for hf_name in registered:
            if arch:
                found.setdefault(hf_name, arch.lower())
    return found


def _llama_graph_exposes_layers(source: Path, gguf_arch: str) -> bool | None:
    """Whether llama.cpp's graph for `gguf_arch` marks each layer's input (what DFlash/EAGLE3 read)."""
    graph = source / "src" / "models" / f"{gguf_arch.replace('_', '-')}.cpp"
    if not graph.is_file():
        graph = source / "src" / "models" / f"{gguf_arch}.cpp"
    if not graph.is_file():
        return None
    return "t_layer_inp" in graph.read_text(errors="replace")


def llama_cpp_support(target_architectures: list[str], drafter_kind: str) -> EngineSupport:
    name = "llama.cpp (llama-server)"
    try:
        binary = llama_server_binary()
        source = llama_convert_script().parent
    except EngineNotInstalled:
        return EngineSupport(name, "unknown", f"not built here (`{BUILD_LLAMA_HINT}`)")
    try:
        help_text = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60,
                                   check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        return EngineSupport(name, "unknown", f"`llama-server --help` failed: {error}")
    spec = LLAMA_SPEC_TYPES[drafter_kind]
    if spec not in help_text:
        return EngineSupport(name, "no", f"its --spec-type has no {spec}")
    converter = _converter_classes(source)
    drafter_arch = DRAFTER_ARCHITECTURES[drafter_kind]
    if drafter_arch not in converter:
        return EngineSupport(name, "no", f"--spec-type {spec} exists, but its GGUF converter has no {drafter_arch} "
                             "(it converts other families' drafters only)")
    if not target_architectures:
        return EngineSupport(name, "unknown", "the drafter does not record its target's architecture")
    arch = next((a for a in target_architectures if a in converter), None)
    if arch is None:
        return EngineSupport(name, "no", f"its GGUF converter has no {target_architectures[0]}")
    exposes = _llama_graph_exposes_layers(source, converter[arch])
    if exposes is None:
        return EngineSupport(name, "unknown", f"no graph source for {converter[arch]} in {source / 'src' / 'models'}")
    if not exposes:
        return EngineSupport(name, "no", f"its {converter[arch]} graph does not expose the layer inputs the drafter "
                             "reads (src/models/*.cpp sets no t_layer_inp)")
    return EngineSupport(name, "yes", f"--spec-type {spec}; the drafter converts with convert_hf_to_gguf.py "
                         f"--target-model-dir TARGET; {arch} ({converter[arch]}) exposes its layer inputs")


def engine_support(target_architectures: list[str], drafter_kind: str = "dflash") -> list[EngineSupport]:
    """What each engine installed here says about serving this drafter on this target family."""
    archs = [str(a) for a in target_architectures or []]
    return [vllm_support(archs, drafter_kind), llama_cpp_support(archs, drafter_kind)]
