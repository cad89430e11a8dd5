"""Run a real server in a subprocess on a free local port, for benchmarks and e2e tests.

    with GclmServer(max_batch=8) as server:   # waits for /health; terminates on exit
        httpx.get(f"{server.url}/v1/models")

`ServerProcess` is the one launcher: a command on a free port, its log in a directory of
its own, /health polled until it answers, a process group signalled on exit. `GclmServer`
(here) and `VllmServer` (bench/_vllm.py) only say which command and environment.

A GclmServer gets a cache directory of its own (compiled tables start cold) whose `models/`
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
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from typing_extensions import Self

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


class ServerProcess:
    """A server subprocess on 127.0.0.1: `start()` runs `command()` and waits for /health;
    `stop()` (or leaving the `with` block) ends its whole process group.

    Subclasses give `name`, `command()` and `environment()`.
    """

    name = "server"
    poll_s = 0.25  # between /health polls
    stop_timeout_s = 15.0  # after SIGTERM, before SIGKILL
    # SIGTERM the whole group (vLLM's engine processes) or the server alone (gclm's closes
    # its compile workers itself; a SIGTERM of their own would only make noise in its log).
    terminate_group = False

    def __init__(self, *, startup_timeout: float, prefix: str = "gclm-server-") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.startup_timeout = startup_timeout
        self.workdir = Path(tempfile.mkdtemp(prefix=prefix))
        self.log_path = self.workdir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def cwd(self) -> Path:
        return self.workdir

    def start(self) -> Self:
        """Start the server and wait for /health; raises ServerStartError (with its log)."""
        command, env = self.command(), self.environment()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=self.cwd(),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # stop() signals the server's own children too
            )
        try:
            wait_healthy(
                self.process, self.url, self.startup_timeout, self.name, self.log_tail, self.poll_s
            )
        except BaseException:
            self.stop()
            raise
        return self

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM (uvicorn shuts down gracefully), SIGKILL after `stop_timeout_s`, then
        SIGKILL to anything of the server's process group left behind."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            if self.terminate_group:
                _signal_group(proc.pid, signal.SIGTERM)
            else:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if proc is not None:
            _signal_group(proc.pid, signal.SIGKILL)  # e.g. an engine process of a dead server
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class GclmServer(ServerProcess):
    """`python -m gclm.server.cli serve --device cpu` on 127.0.0.1, started by `start()`.

    Args:
        max_batch: the server's --max-batch (None: the server's default, from its memory).
        threads: torch intra-op threads in the server (OMP_NUM_THREADS); None: torch's default.
        extra_args: more `gclm serve` options.
        startup_timeout: seconds to wait for /health.
        python: the interpreter to run it with (default: this one), e.g. vLLM's environment's.
        env: more environment variables for the server.
    """

    name = "gclm serve"

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
        super().__init__(startup_timeout=startup_timeout)
        self.python = python or sys.executable
        self.env = dict(env or {})
        self.max_batch = max_batch
        self.threads = threads
        self.extra_args = extra_args

    def cwd(self) -> Path:
        return ROOT

    def environment(self) -> dict[str, str]:
        # The caller's GCLM_* settings (an API key, another model) would change what is served.
        env = {k: v for k, v in os.environ.items() if not k.startswith("GCLM_")}
        env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
        if self.threads is not None:
            env["OMP_NUM_THREADS"] = str(self.threads)
        env.update(self.env)
        return env

    def command(self) -> list[str]:
        cache_dir = self.workdir / "cache"
        cache_dir.mkdir(exist_ok=True)
        from gclm.paths import default_cache_dir

        models = default_cache_dir() / "models"
        models.mkdir(parents=True, exist_ok=True)
        if not (cache_dir / "models").exists():
            (cache_dir / "models").symlink_to(models, target_is_directory=True)
        command = [
            self.python, "-m", "gclm.server.cli", "serve",
            "--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu",
            "--cache-dir", str(cache_dir), *self.extra_args,
        ]  # fmt: skip
        if self.max_batch is not None:
            command += ["--max-batch", str(self.max_batch)]
        return command


class BaselineServer(GclmServer):
    """gclm served by another checkout's interpreter (`python`: CHECKOUT/.venv/bin/python),
    run in that checkout so that the `gclm` it imports is that checkout's alone: a change
    measured against the code before it, in one run."""

    def cwd(self) -> Path:
        return Path(self.python).absolute().parents[2]
