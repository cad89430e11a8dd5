"""The Docker image and compose file, checked without a Docker engine.

The Dockerfile, .dockerignore and docker/compose.yaml are read as data and held to the
facts the deployment docs promise (a GPU reservation, port 8000, a /cache volume, a
non-root user, a health check). The e2e test then runs the image's own command line,
ENTRYPOINT + CMD with the image's environment, against this checkout's venv on the CPU, so
a Dockerfile whose command cannot start the server fails here rather than on a GPU host.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath

import httpx
import pytest
import yaml  # a dependency of transformers and huggingface_hub
from packaging.specifiers import SpecifierSet

from gclm.server.engine.model_loader import EMBEDDED_MODEL_ID
from gclm.server.settings import default_cache_dir

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker" / "compose.yaml"
CACHE_VOLUME = "/cache"
STARTUP_TIMEOUT_S = 120.0
# `docker stop` sends SIGTERM, then SIGKILL after this many seconds.
DOCKER_STOP_GRACE_S = 10.0


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # a comment may sit between continuation lines, too
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, args = (pending + stripped).partition(" ")
        result.append((keyword.upper(), args.strip()))
        pending = ""
    return result


class Dockerfile:
    """The facts of the Dockerfile that the image's users rely on."""

    def __init__(self, path: Path) -> None:
        self.instructions = _instructions(path.read_text())

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str:
        found = self.all(keyword)
        assert found, f"the Dockerfile has no {keyword}"
        return found[-1]

    def exec_form(self, keyword: str) -> list[str]:
        args = self.last(keyword)
        assert args.startswith("["), f"{keyword} must be in exec form (a JSON array): {args}"
        return json.loads(args)

    @property
    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for args in self.all("ENV"):
            for item in shlex.split(args):
                name, sep, value = item.partition("=")
                assert sep, f"ENV {args!r}: use the NAME=value form"
                values[name] = value
        return values

    @property
    def base_image(self) -> str:
        image = self.last("FROM").split()[0]
        for args in self.all("ARG"):  # FROM ${NAME} takes the ARG's default
            name, _, default = args.partition("=")
            image = image.replace("${" + name + "}", default).replace("$" + name, default)
        return image

    @property
    def healthcheck(self) -> tuple[list[str], list[str]]:
        """(options, command) of the HEALTHCHECK, the command in exec form."""
        options, sep, command = self.last("HEALTHCHECK").partition("CMD ")
        assert sep and command.startswith("["), "HEALTHCHECK must be `CMD [...]` in exec form"
        return shlex.split(options), json.loads(command)


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return Dockerfile(DOCKERFILE)


@pytest.fixture(scope="module")
def compose_service() -> dict:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert list(services) == ["gclm"], "docker/compose.yaml should define one service, gclm"
    return services["gclm"]


def test_dockerfile_runs_gclm_serve_as_a_user_with_a_cache_volume(dockerfile) -> None:
    assert dockerfile.exec_form("ENTRYPOINT") == ["gclm", "serve", "--host", "0.0.0.0"]
    assert dockerfile.exec_form("CMD") == [], "flags after the image name go to gclm serve"
    assert dockerfile.last("EXPOSE") == "8000"
    assert dockerfile.last("USER").split(":")[0] not in ("root", "0")
    assert dockerfile.last("VOLUME") in (CACHE_VOLUME, json.dumps([CACHE_VOLUME]))
    env = dockerfile.env
    for name in ("HF_HOME", "GCLM_CACHE_DIR", "NUMBA_CACHE_DIR"):
        assert env.get(name, "").startswith(CACHE_VOLUME + "/"), f"{name} must be under /cache"


def test_base_image_bundles_a_torch_the_project_accepts(dockerfile) -> None:
    spec = re.search(r'"torch([<>=!~][^"]*)"', (ROOT / "pyproject.toml").read_text())
    assert spec, "pyproject.toml should name the torch versions gclm takes"
    accepted = SpecifierSet(spec.group(1))
    image, _, tag = dockerfile.base_image.partition(":")
    assert image == "pytorch/pytorch"
    match = re.fullmatch(r"(\d+\.\d+\.\d+)-cuda[\d.]+-cudnn\d+-runtime", tag)
    assert match, f"the base image's tag {tag!r} should be pytorch's VERSION-cudaX-cudnnY-runtime"
    assert match.group(1) in accepted, (
        f"the base image's torch {match.group(1)} must be one pyproject accepts ({accepted}), "
        "so that pip keeps the image's CUDA build instead of installing another torch"
    )


def test_healthcheck_probes_health_on_the_served_port(dockerfile) -> None:
    options, command = dockerfile.healthcheck
    assert any(o.startswith("--start-period=") for o in options), "first start may download"
    assert command[0] == "python"
    assert "/health" in command[-1] and "GCLM_PORT" in command[-1]


def _dockerignored(rules: list[str], path: str) -> bool:
    """Whether .dockerignore's `rules` leave `path` out of the build context.

    As Docker does: the last matching rule wins, `!` re-includes, and a rule that matches a
    directory matches everything below it.
    """
    ignored = False
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for rule in rules:
        negate = rule.startswith("!")
        pattern = os.path.normpath(rule.lstrip("!")).replace("**/", "*")
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_what_the_image_copies_and_nothing_heavy(dockerfile) -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    rules = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    copied = [
        src
        for args in dockerfile.all("COPY")
        for src in shlex.split(args)[:-1]
        if not src.startswith("--")
    ]
    assert copied, "the Dockerfile copies nothing"
    for src in copied:
        assert (ROOT / src).exists(), f"COPY {src}: no such file in the repository"
        assert not _dockerignored(rules, src), f"COPY {src} is excluded by .dockerignore"
    assert not _dockerignored(rules, "server/app.py")
    for heavy in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", "server/__pycache__/x.pyc"):
        assert _dockerignored(rules, heavy), f"{heavy} should stay out of the build context"


def test_compose_reserves_a_gpu_and_persists_the_cache(compose_service, dockerfile) -> None:
    context = (COMPOSE.parent / compose_service["build"]["context"]).resolve()
    assert context == ROOT
    assert (context / compose_service["build"].get("dockerfile", "Dockerfile")).is_file()
    devices = compose_service["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert "8000:8000" in [str(p) for p in compose_service["ports"]]
    volume = next(v for v in compose_service["volumes"] if v.endswith(":" + CACHE_VOLUME))
    top_level = yaml.safe_load(COMPOSE.read_text()).get("volumes") or {}
    assert volume.split(":")[0] in top_level, "the cache should be a named volume"
    _, command = dockerfile.healthcheck
    assert compose_service["healthcheck"]["test"] == ["CMD", *command]
    assert compose_service["environment"]["GCLM_API_KEY"] == "${GCLM_API_KEY:-}"


def _compose_environment(service: dict) -> dict[str, str]:
    """The service's environment as compose resolves it for a user who sets nothing."""
    substitution = re.compile(r"\$\{\w+:?-([^}]*)\}")
    environment = service["environment"].items()
    return {k: substitution.sub(r"\1", str(v)) for k, v in environment if v is not None}


def _image_environment(dockerfile: Dockerfile, compose_service: dict, tmp: Path) -> dict[str, str]:
    """The container's environment, its /cache paths moved to this machine.

    GCLM_CACHE_DIR points at the cache that already holds the converted embedded model, so
    the test does not convert it again; the other caches start empty, as in a new volume.
    """
    cache_dir = str(default_cache_dir())
    env = {k: v for k, v in os.environ.items() if not k.startswith("GCLM_")}
    for name, value in dockerfile.env.items():
        if name == "GCLM_CACHE_DIR":
            value = cache_dir
        elif value.startswith(CACHE_VOLUME + "/"):
            value = str(tmp / value.removeprefix(CACHE_VOLUME + "/"))
        env[name] = value
    env.update(_compose_environment(compose_service))  # empty GCLM_API_KEY, GCLM_MODEL, ...
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local(executable: str) -> str:
    """The venv's own copy of an executable the image runs by name."""
    if executable == "python":
        return sys.executable
    found = shutil.which(executable, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail(f"{executable} is not in {Path(sys.executable).parent}; run `make install`")
    return found


def _run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [_local(command[0]), *command[1:]]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.e2e
def test_image_command_line_serves_the_embedded_model(
    dockerfile, compose_service, tmp_path
) -> None:
    port = _free_port()
    entrypoint = dockerfile.exec_form("ENTRYPOINT") + dockerfile.exec_form("CMD")
    argv = [_local(entrypoint[0]), *entrypoint[1:], "--port", str(port), "--device", "cpu"]
    env = _image_environment(dockerfile, compose_service, tmp_path)
    log_path = tmp_path / "server.log"

    def log_tail() -> str:
        return "\n--- server output (tail) ---\n" + log_path.read_text(errors="replace")[-4000:]

    base = f"http://127.0.0.1:{port}"
    with log_path.open("w") as log:
        # Its own process group, so that the compile worker it spawns is cleaned up too.
        server = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            assert server.poll() is None, f"{shlex.join(argv)} exited early" + log_tail()
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "no /health within 120 s" + log_tail()
            time.sleep(0.5)

        # No Authorization header: compose's empty GCLM_API_KEY must mean "no key".
        models = httpx.get(f"{base}/v1/models", timeout=10)
        assert models.status_code == 200, models.text + log_tail()
        assert [m["id"] for m in models.json()["data"]] == [EMBEDDED_MODEL_ID]

        _, check = dockerfile.healthcheck
        check_env = {**env, "GCLM_PORT": str(port)}
        probe = _run(check, check_env)
        assert probe.returncode == 0, f"HEALTHCHECK fails on a healthy server: {probe.stderr}"

        started = time.monotonic()
        server.send_signal(signal.SIGTERM)  # what `docker stop` sends first
        try:
            code: int | None = server.wait(timeout=DOCKER_STOP_GRACE_S + 20)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - started
        # uvicorn shuts down gracefully, then re-raises SIGTERM to die by it; as PID 1 in a
        # container that re-raised signal is ignored and the process exits 0.
        assert code in (0, -signal.SIGTERM) and took < DOCKER_STOP_GRACE_S, (
            f"SIGTERM: exit {code} after {took:.1f} s; docker stop kills after 10 s" + log_tail()
        )
        assert _run(check, check_env).returncode != 0, "HEALTHCHECK passes with no server"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        try:  # whatever the server left behind in its group (see the SIGTERM note above)
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
