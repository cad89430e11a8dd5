"""Run a real `gclm serve` in a subprocess on a free local port, for benchmarks and e2e tests.

    with GclmServer(max_batch=8) as server:   # waits for /health; terminates on exit
        httpx.get(f"{server.url}/v1/models")

The server gets a cache directory of its own (compiled tables start cold) whose `models/`
links to the shared model cache, so the embedded model is not converted again.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import httpx

ROOT = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 180.0  # a cold start converts the embedded model (~30 s) on a busy CPU


class ServerStartError(RuntimeError):
    """The server exited or did not answer /health in time; the message ends with its log."""


def wait_healthy(
    process: subprocess.Popen[bytes],
    url: str,
    timeout: float,
    name: str,
    log_tail: Callable[[], str],
    poll_s: float = 0.25,
) -> None:
    """Return once `url`/health answers 200; raise ServerStartError (with the log's tail)
    if `process` exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerStartError(f"{name} exited with status {process.returncode}:\n{log_tail()}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    raise ServerStartError(f"{name} did not answer /health within {timeout:.0f} s:\n{log_tail()}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GclmServer:
    """`python -m server.cli serve --device cpu` on 127.0.0.1, started by `start()`.

    Args:
        max_batch: the server's --max-batch (None: the server's default, from its memory).
        threads: torch intra-op threads in the server (OMP_NUM_THREADS); None: torch's default.
        extra_args: more `gclm serve` options.
        startup_timeout: seconds to wait for /health.
        python: the interpreter to run it with (default: this one), e.g. vLLM's environment's.
        env: more environment variables for the server.
    """

    def __init__(
        self,
        *,
        max_batch: int | None = 8,
        threads: int | None = None,
        extra_args: tuple[str, ...] = (),
        startup_timeout: float = STARTUP_TIMEOUT_S,
        python: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.python = python or sys.executable
        self.env = dict(env or {})
        self.url = f"http://127.0.0.1:{self.port}"
        self.max_batch = max_batch
        self.threads = threads
        self.extra_args = extra_args
        self.startup_timeout = startup_timeout
        self.workdir = Path(tempfile.mkdtemp(prefix="gclm-server-"))
        self.log_path = self.workdir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> GclmServer:
        cache_dir = self.workdir / "cache"
        cache_dir.mkdir()
        from gclm.server.settings import default_cache_dir

        models = default_cache_dir() / "models"
        models.mkdir(parents=True, exist_ok=True)
        (cache_dir / "models").symlink_to(models, target_is_directory=True)
        # The caller's GCLM_* settings (an API key, another model) would change what is served.
        env = {k: v for k, v in os.environ.items() if not k.startswith("GCLM_")}
        env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
        if self.threads is not None:
            env["OMP_NUM_THREADS"] = str(self.threads)
        env.update(self.env)
        command = [
            self.python, "-m", "gclm.server.cli", "serve",
            "--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu",
            "--cache-dir", str(cache_dir), *self.extra_args,
        ]  # fmt: skip
        if self.max_batch is not None:
            command += ["--max-batch", str(self.max_batch)]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        assert self.process is not None
        wait_healthy(self.process, self.url, self.startup_timeout, "gclm serve", self.log_tail)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM (uvicorn shuts down gracefully), then SIGKILL after 15 s."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> GclmServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
