"""Build the Dockerfile with podman, run the image, scan through it (the recipe: README, "Deployment").

Skips with the reason when podman/runc are missing; CI (.ci/run) installs them. Without a
registry the base image is built locally with debootstrap (Debian bookworm + python3).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.components import missing
from tests.e2e.service_server import free_port
from tests.service.payloads import benign_pickle, malicious_pickle, nonce

pytestmark = [pytest.mark.container, pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
BASE = os.environ.get("CKPTGUARD_TEST_CONTAINER_BASE", "localhost/bookworm-python:local")
IMAGE = "localhost/ckptguard:test"
CONF = "/etc/containers/ckptguard.conf"


def podman_cmd() -> list[str]:
    return ["podman", "--runtime", shutil.which("runc") or "/usr/sbin/runc",
            "--cgroup-manager=cgroupfs"]


def run(args: list[str], *, check: bool = True, timeout: float = 1800,
        stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "CONTAINERS_CONF": CONF}
    proc = subprocess.run(args, env=env, capture_output=True, timeout=timeout, input=stdin)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} -> {proc.returncode}\n"
                             f"{proc.stdout.decode(errors='replace')[-3000:]}\n"
                             f"{proc.stderr.decode(errors='replace')[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def podman() -> list[str]:
    absent = [tool for tool in ("podman", "runc") if shutil.which(tool) is None
              and not Path(f"/usr/sbin/{tool}").exists()]
    if absent:
        missing(f"{' and '.join(absent)} not installed (apt-get install podman runc debootstrap; "
                ".ci/run does this)")
    if not Path(CONF).exists():
        # Without it podman fails with `setrlimit RLIMIT_NOFILE` here (CONTAINERS.md).
        try:
            Path(CONF).write_text("[containers]\ndefault_ulimits = []\n")
        except OSError as exc:
            missing(f"cannot write {CONF}: {exc}")
    return podman_cmd()


@pytest.fixture(scope="module")
def base_image(podman: list[str]) -> str:
    if run([*podman, "image", "exists", BASE], check=False).returncode == 0:
        return BASE
    if shutil.which("debootstrap") is None or os.geteuid() != 0:
        missing(f"base image {BASE} is missing and debootstrap (as root) is not available")
    with tempfile.TemporaryDirectory(prefix="ckptguard-rootfs-") as rootfs:
        run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
             "bookworm", rootfs])
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        env = {**os.environ, "CONTAINERS_CONF": CONF}
        subprocess.run([*podman, "import", "-", BASE], stdin=tar.stdout, env=env, check=True,
                       capture_output=True, timeout=1800)
        tar.wait()
    return BASE


@pytest.fixture(scope="module")
def image(podman: list[str], base_image: str) -> str:
    mounts = ["-v", "/etc/ssl/certs:/etc/ssl/certs:ro"]
    for conf in ("/etc/xdg/pip", "/etc/pip.conf"):   # the host's pip index/CA configuration
        if Path(conf).exists():
            mounts += ["-v", f"{conf}:{conf}:ro"]
    run([*podman, "build", "--format", "docker", "--isolation=chroot", "--network=host", *mounts,
         "--build-arg", f"BASE={base_image}", "-t", IMAGE, str(ROOT)])
    return IMAGE


@pytest.fixture
def container(podman: list[str], image: str) -> Iterator[tuple[str, str]]:
    name = f"ckptguard-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    run([*podman, "run", "-d", "--network=host", "--name", name,
         "-e", "CKPTGUARD_HOST=127.0.0.1", "-e", f"CKPTGUARD_PORT={port}", image])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                logs = run([*podman, "logs", name], check=False)
                raise AssertionError(f"container did not become healthy:\n{logs.stdout!r}{logs.stderr!r}")
            time.sleep(0.5)
        yield name, url
    finally:
        run([*podman, "rm", "-f", "-t", "5", name], check=False)


def test_image_builds_runs_and_scans(podman: list[str], image: str, container: tuple[str, str]) -> None:
    name, url = container
    evil = httpx.post(f"{url}/scan", files={"file": ("evil.pkl", malicious_pickle(nonce()))}, timeout=60)
    assert evil.status_code == 200 and evil.json()["verdict"] == "unsafe"
    good = httpx.post(f"{url}/scan", files={"file": ("ok.pkl", benign_pickle(nonce()))}, timeout=60)
    assert good.json()["verdict"] == "safe"
    assert httpx.get(f"{url}/scans/{evil.json()['id']}").json()["verdict"] == "unsafe"
    # The image's own HEALTHCHECK passes (podman runs it on demand without systemd).
    assert run([*podman, "healthcheck", "run", name], check=False).returncode == 0
    # Non-root, and no compilers in the final image.
    assert run([*podman, "exec", name, "id", "-u"]).stdout.strip() != b"0"
    tools = run([*podman, "exec", name, "sh", "-c",
                 "for t in gcc cc c++ make ld; do command -v $t; done; true"]).stdout
    assert tools.strip() == b"", tools
    config = json.loads(run([*podman, "image", "inspect", image]).stdout)[0]
    assert "Healthcheck" in json.dumps(config)


_ENGINE_PROBE = r"""
import importlib.util, json, sys
import ckptguard.app.cli as cli
from ckptguard.core.io.source import BytesSource
from ckptguard.core.lane import torch_zip
from ckptguard.core.state import Analysis
an = Analysis()
took = torch_zip.try_torch_zip(BytesSource(sys.stdin.buffer.read()), an)
print(json.dumps({"lane": took, "tensors": len(an.tensors), "python": sys.version.split()[0],
                  "dont_write_bytecode": sys.flags.dont_write_bytecode,
                  "bytecode_shipped": importlib.util.cache_from_source(cli.__file__)}))
"""


def test_the_image_runs_the_fast_lane_from_shipped_bytecode(podman: list[str], image: str) -> None:
    """The image's Python (Debian 12's 3.11.2 in CI: the one whose `re` mis-walks possessive
    repeats) takes a torch-writer checkpoint through the column lane and its opcode walk, and
    imports ckptguard from bytecode compiled at build: with PYTHONDONTWRITEBYTECODE set and the
    code read-only, a process that had to compile would do so on every start."""
    from tests.builders.torchlayout import state_dict, torch_layout, v2

    count = 300
    pickled = state_dict(*((f"layer.{i}.weight", v2(str(i))) for i in range(count)))
    checkpoint = torch_layout("probe", pickled, [(str(i), bytes(8)) for i in range(count)])
    out = run([*podman, "run", "--rm", "-i", "--network=none", image, "python3", "-c", _ENGINE_PROBE],
              stdin=checkpoint)
    probe = json.loads(out.stdout.decode().splitlines()[-1])
    assert probe["lane"] is True and probe["tensors"] == count, probe
    assert probe["dont_write_bytecode"] == 1, probe
    exists = run([*podman, "run", "--rm", "--network=none", image, "test", "-f",
                  probe["bytecode_shipped"]], check=False)
    assert exists.returncode == 0, f"no bytecode for ckptguard.app.cli in the image ({probe})"
