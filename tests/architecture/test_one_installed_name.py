"""Installed, ckptguard is one top-level package: `ckptguard` (ckptguard.core, ckptguard.app).

The wheel is built from this checkout and installed next to a dummy distribution that ships
top-level `core` and `app` packages (as some projects in the wild do); the `ckptguard`
command still works, whichever is installed first. In this test run, the engine and the
service load under that one name only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MALICIOUS = b"cos\nsystem\n(S'echo pwned'\ntR."


def _pip(*args: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                   check=True, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # --no-build-isolation: the build runs offline with this environment's setuptools
    _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT), cwd=out)
    (found,) = out.glob("ckptguard-*.whl")
    return found


@pytest.fixture(scope="module")
def dummy_core_app(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A distribution whose top-level packages are named `core` and `app`."""
    src = tmp_path_factory.mktemp("dummy")
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "dummy-core-app"\nversion = "1.0"\n'
        '[tool.setuptools]\npackages = ["core", "app"]\n')
    for name in ("core", "app"):
        (src / name).mkdir()
        (src / name / "__init__.py").write_text(f"WHO = 'dummy {name}'\n")
        (src / name / "scan.py").write_text("raise ImportError('the dummy has no scanner')\n")
    return src


def test_the_wheel_has_one_top_level_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        infos = {i.filename: i for i in zf.infolist()}
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"ckptguard", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    # the links ckptguard/core -> ../core were followed: real files, under the one name
    assert "ckptguard/core/scan.py" in names and "ckptguard/app/cli.py" in names
    assert "ckptguard/app/migrations/versions/0001_scans.py" in names
    assert "ckptguard/app/alembic.ini" in names
    # the web page's files (issue 17): the wheel and the image serve /ui/ from them
    ui = Path(__file__).resolve().parents[2] / "app" / "ui"
    assert {f"ckptguard/app/ui/{p.name}" for p in ui.iterdir() if p.is_file()} <= set(names)
    assert infos["ckptguard/core/scan.py"].file_size > 1000
    with zipfile.ZipFile(wheel) as zf:
        entry = zf.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "ckptguard = ckptguard.app.cli:main" in entry


@pytest.mark.parametrize("dummy_first", [True, False], ids=["dummy-first", "ckptguard-first"])
def test_ckptguard_runs_beside_a_top_level_core_and_app(wheel: Path, dummy_core_app: Path,
                                                       tmp_path: Path, dummy_first: bool) -> None:
    target = tmp_path / "site"
    steps = [[str(dummy_core_app)], [str(wheel)]]
    for what in (steps if dummy_first else steps[::-1]):
        _pip("install", "--no-deps", "--no-build-isolation", "--target", str(target), *what,
             cwd=tmp_path)
    assert {p.name for p in target.iterdir()} >= {"ckptguard", "core", "app"}
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(MALICIOUS)
    # the installed package first; this environment's own packages (fastapi, numpy, ...)
    # after it. The editable ckptguard of this checkout must not be the one that runs.
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = ("import sys, ckptguard, core; "
            "assert ckptguard.__file__.startswith(sys.argv[1]), ckptguard.__file__; "
            "assert core.WHO == 'dummy core'; "
            "from ckptguard.app.cli import main; sys.exit(main(['scan', sys.argv[2]]))")
    run = subprocess.run([sys.executable, "-c", code, str(target), str(bad)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr      # exit 2: unsafe
    assert "unsafe" in run.stdout.lower()
    script = target / "bin" / "ckptguard"
    run = subprocess.run([str(script), "scan", str(bad)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr


def test_no_module_loads_under_a_second_name() -> None:
    """tests/conftest.py refuses top-level `core`/`app`, and nothing loaded them."""
    with pytest.raises(ImportError, match=r"ckptguard\.core installed"):
        __import__("core.scan")
    assert not {m for m in sys.modules if m.partition(".")[0] in ("core", "app")}


def test_import_ckptguard_is_cheap_and_public() -> None:
    """`import ckptguard` loads no engine, numpy or httpx; names resolve on first use."""
    code = ("import sys, ckptguard; heavy = {'numpy', 'httpx', 'ckptguard.core.scan', 'fastapi'}; "
            "print(sorted(heavy & set(sys.modules))); "
            "print(ckptguard.scan_bytes(b\"cos\\nsystem\\n(S'x'\\ntR.\").verdict)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == ["[]", "unsafe"]


def test_the_public_api_examples_run() -> None:
    import doctest

    import ckptguard
    import ckptguard.core.scan

    for module in (ckptguard, ckptguard.core.scan):
        result = doctest.testmod(module)
        assert result.attempted and not result.failed, module.__name__


def test_the_public_verdict_is_a_type() -> None:
    """core keeps its type aliases as strings (core/typenames.py): `ckptguard.Verdict` is the
    Literal type all the same, with the verdicts the reports give."""
    import typing

    import ckptguard
    from ckptguard.core.report import decide_verdict

    assert typing.get_origin(ckptguard.Verdict) is typing.Literal
    assert typing.get_args(ckptguard.Verdict) == ("safe", "suspicious", "unsafe", "invalid")
    assert decide_verdict([], False) in typing.get_args(ckptguard.Verdict)
