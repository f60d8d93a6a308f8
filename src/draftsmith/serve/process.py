"""Run `draftsmith serve` as a real subprocess (for tests, demos and benchmarks).

    with ServeProcess(["--backend", "echo"]) as server:
        ...  # server.url == "http://127.0.0.1:<port>"
        server.kill()      # SIGKILL, like a crashed engine
        server.restart()   # same port, same arguments (or new ones)

The port is chosen by the server (``--port 0``) and read from its "listening on" line, so parallel
tests never race for a port; a restart reuses that port so clients see the same endpoint come back.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import draftsmith

READY_PREFIX = "draftsmith serve: listening on "


class ServeProcess:
    def __init__(self, args: list[str] | None = None, host: str = "127.0.0.1", port: int = 0,
                 startup_timeout_s: float = 180.0, env: dict[str, str] | None = None):
        self.args = list(args or [])
        self.host = host
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.env = env
        self.process: subprocess.Popen | None = None
        self._group_alive = False
        self.url: str | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="draftsmith-serve-", suffix=".log", delete=False)
        self.log_path = Path(self._log.name)

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        source_root = str(Path(draftsmith.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = source_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("OMP_NUM_THREADS", "1")
        if self.env:
            env.update(self.env)
        return env

    def start(self, args: list[str] | None = None) -> ServeProcess:
        if args is not None:
            self.args = list(args)
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("server already running")
        command = [sys.executable, "-m", "draftsmith", "serve", "--host", self.host, "--port", str(self.port), *self.args]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=self._log, text=True, env=self._environment(),
            start_new_session=True,  # its own process group: kill() also reaches pre-forked workers
        )
        self._group_alive = True
        lines: queue.Queue[str | None] = queue.Queue()

        def pump(stream) -> None:
            for line in stream:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, args=(self.process.stdout,), daemon=True).start()
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise RuntimeError(f"draftsmith serve did not start within {self.startup_timeout_s:g}s: {self.log_tail()}")
            try:
                line = lines.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            if line is None:
                self.process.wait()
                raise RuntimeError(f"draftsmith serve exited with {self.process.returncode}: {self.log_tail()}")
            if line.startswith(READY_PREFIX):
                self.url = line[len(READY_PREFIX):].split()[0]
                self.port = int(self.url.rsplit(":", 1)[1])
                return self

    def log_tail(self, chars: int = 2000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL (a crash: no graceful shutdown, in-flight connections reset)."""
        if self.process is not None and self._group_alive:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._group_alive = False
            self.process.wait(timeout=30)

    def pause(self) -> None:
        """SIGSTOP the server (a hung engine: connections stay open, nothing answers)."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.running:
            assert self.process is not None
            if self._group_alive:
                os.killpg(self.process.pid, signal.SIGCONT)  # a paused server cannot handle SIGTERM
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        self.kill()  # whatever is left of its process group

    def restart(self, args: list[str] | None = None) -> ServeProcess:
        self.kill()
        return self.start(args)

    def __enter__(self) -> ServeProcess:
        return self.start() if not self.running else self

    def __exit__(self, *exc) -> None:
        self.stop()
        self._log.close()
        try:
            self.log_path.unlink()
        except OSError:
            pass
