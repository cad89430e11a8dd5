"""The built image, run with podman as `docker run` users run it (`make docker-test`).

`make docker-test` builds the image (docker/build.sh) and runs these tests with
GCLM_DOCKER_IMAGE set to it; without that variable they are skipped. One container serves
the embedded model on the CPU with port 8000 published and a fresh named volume at /cache,
and answers a json_schema request over the published port; its user, volume and health
check are checked, then `podman stop` must end it cleanly, and a second container on the
same volume must start without converting the model again.

Podman runs the containers with runc and explicit --ulimit values: crun, its default
runtime, cannot set rlimits on these machines. Podman has no systemd here to run the health
check on its interval, so the tests run it with `podman healthcheck run`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import jsonschema
import pytest
from test_docker import CACHE_VOLUME, DOCKER_STOP_GRACE_S, _free_port

from gclm.server.engine.model_loader import EMBEDDED_MODEL_ID

IMAGE = os.environ.get("GCLM_DOCKER_IMAGE", "")
PODMAN = ["podman", "--runtime", "runc"]
RUN_OPTIONS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
# A first start converts the embedded model (~30 s alone, minutes on a loaded machine) and
# starts the compile workers.
STARTUP_TIMEOUT_S = 600.0
CONVERTING = "converting embedded GGUF model"

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not IMAGE, reason="GCLM_DOCKER_IMAGE is not set; run `make docker-test`"),
]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def podman(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        pytest.fail(f"podman {' '.join(args)}: exit {result.returncode}\n{result.stderr}")
    return result


@dataclass
class Container:
    name: str
    port: int
    started_s: float  # from `podman run` to a 200 from /health

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        result = podman("logs", self.name, check=False)
        return result.stdout + result.stderr

    def inspect(self, template: str) -> str:
        return podman("inspect", "--format", template, self.name).stdout.strip()


def start(volume: str) -> Container:
    """`docker run -p PORT:8000 -v VOLUME:/cache IMAGE --device cpu`, until /health answers."""
    port = _free_port()
    name = f"gclm-test-{uuid.uuid4().hex[:8]}"
    began = time.monotonic()
    podman(
        "run", "--detach", "--name", name, *RUN_OPTIONS,
        "--publish", f"{port}:8000", "--volume", f"{volume}:{CACHE_VOLUME}",
        IMAGE, "--device", "cpu",
    )  # fmt: skip
    container = Container(name, port, 0.0)
    deadline = began + STARTUP_TIMEOUT_S
    while True:
        if container.inspect("{{.State.Status}}") != "running":
            pytest.fail(f"{name} exited early\n{container.logs()[-4000:]}")
        try:
            if httpx.get(f"{container.base}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"no /health within {STARTUP_TIMEOUT_S:.0f} s\n{container.logs()[-4000:]}")
        time.sleep(1)
    container.started_s = time.monotonic() - began
    return container


def ask_for_a_person(container: Container) -> dict:
    """A json_schema chat request over the published port; its content, parsed and valid."""
    response = httpx.post(
        f"{container.base}/v1/chat/completions",
        json={
            "model": EMBEDDED_MODEL_ID,
            "messages": [{"role": "user", "content": "Describe a person as JSON."}],
            "max_tokens": 64,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON, "strict": True},
            },
        },
        timeout=300,
    )
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    person = json.loads(choice["message"]["content"])
    jsonschema.validate(person, PERSON)
    return person


@pytest.fixture(scope="module")
def volume() -> Iterator[str]:
    name = f"gclm-test-cache-{uuid.uuid4().hex[:8]}"
    podman("volume", "create", name)
    yield name
    # `volume rm --force` removes the containers that use it, running or not.
    podman("volume", "rm", "--force", name, check=False)


@pytest.fixture(scope="module")
def first(volume: str) -> Container:
    """The first container on the new volume; the tests below stop it, in file order."""
    return start(volume)


def test_the_image_declares_its_user_volume_and_health_check() -> None:
    image = json.loads(podman("image", "inspect", IMAGE).stdout)[0]
    config = image["Config"]
    assert config["User"] == "10001:10001"
    assert CACHE_VOLUME in config["Volumes"]
    assert config["Entrypoint"] == ["gclm", "serve", "--host", "0.0.0.0"]
    # Docker's image format keeps it (`podman build --format docker`); OCI's has no field.
    check = image["Healthcheck"]
    assert check["Test"][0] == "CMD" and "/health" in check["Test"][-1]


def test_it_answers_a_json_schema_request_on_the_published_port(first: Container) -> None:
    models = httpx.get(f"{first.base}/v1/models", timeout=10)
    assert [m["id"] for m in models.json()["data"]] == [EMBEDDED_MODEL_ID]
    ask_for_a_person(first)
    assert CONVERTING in first.logs(), "a new volume should hold no converted model"


def test_the_server_runs_as_the_image_user_and_owns_the_cache(first: Container) -> None:
    ids = podman("exec", first.name, "sh", "-c", "id -u; id -g").stdout.split()
    assert ids == ["10001", "10001"]
    mounts = json.loads(first.inspect("{{json .Mounts}}"))
    cache = next(m for m in mounts if m["Destination"] == CACHE_VOLUME)
    assert cache["Type"] == "volume"
    owners = podman("exec", first.name, "stat", "-c", "%u %n", "/cache/gclm/models").stdout
    assert owners.split()[0] == "10001", owners


def test_the_health_check_passes_while_it_serves(first: Container) -> None:
    check = podman("healthcheck", "run", first.name, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert first.inspect("{{.State.Health.Status}}") == "healthy"


def test_stop_ends_it_cleanly_and_the_volume_keeps_the_model(first: Container, volume: str) -> None:
    # `docker stop`'s default: SIGTERM, then SIGKILL after 10 s (exit code 137).
    began = time.monotonic()
    podman("stop", "--time", str(int(DOCKER_STOP_GRACE_S)), first.name, timeout=60)
    stop_s = time.monotonic() - began
    logs = first.logs()
    assert first.inspect("{{.State.ExitCode}}") == "0", logs[-4000:]
    assert "Application shutdown complete" in logs and "Finished server process" in logs
    assert re.search(r"Traceback|ERROR", logs.split("Shutting down")[-1]) is None, logs[-4000:]
    check = podman("healthcheck", "run", first.name, check=False)
    assert check.returncode != 0, "the health check passes on a stopped container"

    # A new container on the same volume serves the model converted by the first one.
    second = start(volume)
    try:
        assert CONVERTING not in second.logs(), second.logs()[-4000:]
        ask_for_a_person(second)
    finally:
        podman("stop", "--time", str(int(DOCKER_STOP_GRACE_S)), second.name, timeout=60)
    print(
        f"first start {first.started_s:.0f} s, stop {stop_s:.1f} s, "
        f"second start {second.started_s:.0f} s"
    )
