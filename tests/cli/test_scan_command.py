"""`ckptguard scan` end to end through the installed console script: folders, globs, outputs,
exit codes by severity, usage and internal errors, limits, progress."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import termios
from pathlib import Path

import pytest

from ckptguard.app.exit_codes import exit_status
from tests.cli.conftest import CKPTGUARD, EVIL, UNKNOWN_GLOBAL, run

pytestmark = pytest.mark.e2e

# tests/cli/sarif-schema-2.1.0.json is the official SARIF 2.1.0 JSON schema (errata01 OS,
# "$id" https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json),
# copied unchanged from github.com/oasis-tcs/sarif-spec, sarif-2.1/schema/sarif-schema-2.1.0.json
# (last changed there in commit a560296ca8c921f3bdb8d4a8db57ab83dae968a7, 2024-05-02).


def _table_rows(stdout: str) -> dict[str, str]:
    """file -> verdict from the summary table."""
    lines = stdout[stdout.index("file  "):].splitlines()[1:-1]
    return {line.split()[0]: line.split()[2] for line in lines}


def test_a_folder_is_scanned_by_content_with_a_summary_table(model_dir: Path) -> None:
    out = run("scan", str(model_dir), "-j", "2", "--no-progress", cwd=model_dir.parent)
    assert out.returncode == 2, out.stderr          # the malicious pickle wins
    rows = _table_rows(out.stdout)
    name = lambda rel: str(model_dir / rel)  # noqa: E731
    assert rows[name("nested/evil.bin")] == "unsafe"
    assert rows[name("good.pt")] == "safe" and rows[name("pytorch_model")] == "safe"   # no extension
    assert rows[name("broken.zip")] == "invalid"
    # the HF snapshot's link is reported under its own name; a dangling one is unreadable
    assert rows[name("hub/snapshots/abc123/model.safetensors.bin")] == "safe"
    assert rows[name("hub/snapshots/abc123/dangling.bin")] == "unreadable"
    assert not any("loop" in f or "elsewhere" in f for f in rows)   # folder links never entered
    assert set(rows) == {name(p) for p in ("nested/evil.bin", "good.pt", "pytorch_model", "broken.zip",
                                           "hub/blobs/9f86d081884c7d65", "hub/snapshots/abc123/dangling.bin",
                                           "hub/snapshots/abc123/model.safetensors.bin")}
    assert "2 skipped (not checkpoints)" in out.stdout      # README.md, config.json
    assert "PICKLE_DANGEROUS_GLOBAL (critical)" in out.stdout
    assert "Traceback" not in out.stderr


def test_output_order_is_stable_whatever_finishes_first(model_dir: Path) -> None:
    one = run("scan", str(model_dir), "--format", "jsonl", "-j", "1")
    two = run("scan", str(model_dir), "--format", "jsonl", "-j", "2")
    names = [[json.loads(line)["source"]["name"] for line in o.stdout.splitlines()] for o in (one, two)]
    assert names[0] == names[1] == sorted(names[0])


def test_sarif_validates_against_the_official_schema(model_dir: Path, tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from ckptguard.core.errors import Code

    out_file = tmp_path / "scan.sarif"
    out = run("scan", str(model_dir), "--format", "sarif", "-o", str(out_file), cwd=model_dir)
    assert out.returncode == 2 and out.stdout == ""
    log = json.loads(out_file.read_text())
    schema = json.loads((Path(__file__).parent / "sarif-schema-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(log)
    run_ = log["runs"][0]
    rules = run_["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [c.value for c in Code]       # one rule per code
    by_code = {r["id"]: r for r in rules}
    assert by_code["PICKLE_DANGEROUS_GLOBAL"]["defaultConfiguration"]["level"] == "error"
    assert float(by_code["PICKLE_DANGEROUS_GLOBAL"]["properties"]["security-severity"]) >= 9.0
    assert by_code["PICKLE_DANGEROUS_GLOBAL"]["help"]["text"]
    evil = [r for r in run_["results"]
            if r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("nested/evil.bin")]
    assert {r["ruleId"] for r in evil} >= {"PICKLE_DANGEROUS_GLOBAL", "PICKLE_DANGEROUS_CALL"}
    for result in run_["results"]:
        region = result["locations"][0]["physicalLocation"]["region"]
        assert region["startLine"] == 1
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["partialFingerprints"] and result["properties"]["verdict"]
    dangerous = next(r for r in evil if r["ruleId"] == "PICKLE_DANGEROUS_GLOBAL")
    assert dangerous["locations"][0]["physicalLocation"]["region"]["byteOffset"] == 2
    assert dangerous["properties"]["verdict"] == "unsafe"
    # re-runs deduplicate: the same fingerprints
    again = run("scan", str(model_dir), "--format", "sarif", cwd=model_dir)
    fingerprints = lambda log: sorted(r["partialFingerprints"]["ckptguardFinding/v1"]  # noqa: E731
                                      for r in log["runs"][0]["results"])
    assert fingerprints(json.loads(again.stdout)) == fingerprints(log)


def test_sarif_uris_are_relative_to_where_the_scan_ran(model_dir: Path) -> None:
    out = run("scan", "nested", "--format", "sarif", cwd=model_dir)
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
            for r in json.loads(out.stdout)["runs"][0]["results"]}
    assert uris == {"nested/evil.bin"}


def test_json_is_an_object_for_one_file_and_a_list_for_more(model_dir: Path) -> None:
    one = json.loads(run("scan", str(model_dir / "good.pt"), "--format", "json").stdout)
    assert isinstance(one, dict) and one["verdict"] == "safe"
    folder = json.loads(run("scan", str(model_dir / "nested"), "--json").stdout)
    assert isinstance(folder, list) and [r["verdict"] for r in folder] == ["unsafe"]
    two = json.loads(run("scan", str(model_dir / "good.pt"), str(model_dir / "good.pt"), "--json").stdout)
    assert isinstance(two, list) and len(two) == 2
    glob = json.loads(run("scan", str(model_dir / "*.pt"), "--json").stdout)
    assert isinstance(glob, list) and [Path(r["source"]["name"]).name for r in glob] == ["good.pt"]
    lines = run("scan", str(model_dir), "--format", "jsonl").stdout.splitlines()
    assert len(lines) == 7 and all(json.loads(line)["schema_version"] == 1 for line in lines)


def test_a_recursive_glob_does_not_follow_folder_links(model_dir: Path) -> None:
    out = run("scan", str(model_dir / "**" / "*.bin"), "--format", "jsonl")
    names = [Path(json.loads(line)["source"]["name"]).relative_to(model_dir).as_posix()
             for line in out.stdout.splitlines()]
    assert names == ["hub/snapshots/abc123/dangling.bin", "hub/snapshots/abc123/model.safetensors.bin",
                     "nested/evil.bin"]


def test_json_on_an_unreadable_file_still_prints_what_happened(tmp_path: Path) -> None:
    out = run("scan", str(tmp_path / "missing.pt"), "--json")
    assert out.returncode == 4 and "cannot read" in out.stderr
    report = json.loads(out.stdout)
    assert report["unreadable"] is True and report["findings"][0]["code"] == "SOURCE_IO"
    assert "No such file" in report["findings"][0]["message"]


@pytest.mark.parametrize(("files", "expected"), [
    (("evil", "missing"), 2),            # unsafe over unreadable: a gap never hides an attack
    (("broken", "missing"), 3),          # invalid over unreadable
    (("missing", "unknown_global"), 4),  # unreadable over suspicious
    (("unknown_global", "good"), 1),
    (("good",), 0),
])
def test_exit_code_is_the_most_severe_outcome(model_dir: Path, tmp_path: Path, files: tuple[str, ...],
                                              expected: int) -> None:
    (tmp_path / "unknown_global").write_bytes(UNKNOWN_GLOBAL)
    (tmp_path / "evil").write_bytes(EVIL)
    paths = {"evil": tmp_path / "evil", "missing": tmp_path / "missing", "good": model_dir / "good.pt",
             "broken": model_dir / "broken.zip", "unknown_global": tmp_path / "unknown_global"}
    out = run("scan", *(str(paths[f]) for f in files), "-q")
    assert out.returncode == expected, out.stderr


def test_fail_on_chooses_what_fails_the_build() -> None:
    assert exit_status(["invalid", "suspicious"], "unsafe") == 0
    assert exit_status(["unsafe", "safe"], "unsafe") == 2
    assert exit_status(["suspicious"], "invalid") == 0
    assert exit_status(["unreadable"], "invalid") == 4    # a gap fails a build that asks for invalid
    assert exit_status(["suspicious"], "suspicious") == 1
    assert exit_status([], "suspicious") == 0


def test_fail_on_unsafe_passes_a_folder_without_attacks(model_dir: Path) -> None:
    assert run("scan", str(model_dir / "broken.zip"), "--fail-on", "unsafe", "-q").returncode == 0
    assert run("scan", str(model_dir), "--fail-on", "unsafe", "-q").returncode == 2


def test_quiet_prints_nothing_and_output_goes_to_the_file(model_dir: Path, tmp_path: Path) -> None:
    out = run("scan", str(model_dir / "nested"), "-q")
    assert (out.returncode, out.stdout, out.stderr) == (2, "", "")
    target = tmp_path / "r.jsonl"
    out = run("scan", str(model_dir / "nested"), "-q", "--format", "jsonl", "-o", str(target))
    assert out.stdout == "" and json.loads(target.read_text())["verdict"] == "unsafe"


@pytest.mark.parametrize("args", [
    ("scan", "x.pt", "--header", "Bad"),
    ("scan",),
    ("scan", "x.pt", "--no-such-option"),
    ("scan", "x.pt", "--format", "xml"),
    ("scan", "x.pt", "-j", "0"),
    ("scan", "ftp://example.org/x.pt"),
    ("scan", "hf://just-a-name"),
    ("scan", "x.pt", "-o", "/nonexistent-dir/out.json"),
    ("nothing",),
    (),
])
def test_usage_errors_exit_64_without_a_traceback(args: tuple[str, ...]) -> None:
    out = run(*args)
    assert out.returncode == 64, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr and out.stderr.strip()


def test_an_internal_error_exits_70_and_shows_the_traceback_only_with_debug(
        model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from ckptguard.app import render
    from ckptguard.app.cli import main

    def broken(*args: object, **kwargs: object) -> str:
        raise RuntimeError("a bug")

    monkeypatch.setattr(render, "text", broken)
    assert main(["scan", str(model_dir / "good.pt")]) == 70
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: a bug" in err and "Traceback" not in err
    assert main(["scan", str(model_dir / "good.pt"), "--debug"]) == 70
    assert "Traceback" in capsys.readouterr().err


def test_a_scan_past_its_memory_limit_is_invalid_never_a_crash(tmp_path: Path) -> None:
    # two .npy files (two targets: the sandboxed pool): their reader needs numpy, which does
    # not fit in 100 MiB of address space with the scan (MemoryError, or ENOMEM from a system
    # call inside an import). (A plain pickle and a clean torch zip now fit: neither imports
    # numpy.)
    np = pytest.importorskip("numpy")
    arrays = [tmp_path / "a.npy", tmp_path / "b.npy"]
    for path in arrays:
        np.save(path, np.zeros(4, dtype=np.float32), allow_pickle=False)
    out = run("scan", *map(str, arrays), "--memory-mb", "100", "--format", "jsonl")
    assert out.returncode == 3 and "Traceback" not in out.stderr
    reports = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(reports) == 2
    for report in reports:
        assert report["verdict"] == "invalid"
        assert report["findings"][0]["code"] in {"RESOURCE_LIMIT", "WORKER_CRASHED"}


def test_a_scan_past_its_wall_clock_limit_is_invalid(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    many = tmp_path / "many.pt"
    torch.save({f"layer{i}.weight": torch.zeros(1) for i in range(20000)}, many)
    out = run("scan", str(many), "--timeout", "0.05", "--json")
    assert out.returncode == 3
    assert json.loads(out.stdout)["findings"][0]["code"] == "TIMEOUT"


def _with_a_terminal(*args: str) -> tuple[int, str]:
    """Run with stderr on a pseudo-terminal (stdout a pipe); return (exit, what the terminal got)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))   # a real size
    proc = subprocess.Popen([CKPTGUARD, *args], stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    proc.communicate(timeout=120)
    os.close(master)
    return proc.returncode, seen.decode(errors="replace")


def test_progress_goes_to_a_terminal_stderr_only(model_dir: Path) -> None:
    code, terminal = _with_a_terminal("scan", str(model_dir), "-j", "2")
    assert code == 2 and "0/9 [" in terminal and "file/s" in terminal   # tqdm: "n/9 [..file/s, read, name]"
    code, terminal = _with_a_terminal("scan", str(model_dir), "-q")
    assert "/9 [" not in terminal and "cannot read" in terminal     # -q: errors only
    code, terminal = _with_a_terminal("scan", str(model_dir), "--no-progress")
    assert "/9 [" not in terminal and "cannot read" in terminal   # errors still reach stderr
    piped = run("scan", str(model_dir))    # stderr a pipe: never a progress display
    assert "/9 [" not in piped.stderr and "\r" not in piped.stderr


def test_help_lists_exit_codes_and_examples() -> None:
    for args in (("--help",), ("scan", "--help")):
        out = run(*args)
        assert out.returncode == 0
        for line in ("2  unsafe", "3  invalid", "4  unreadable", "1  suspicious", "0  safe", "64  usage"):
            assert line in out.stdout
        assert out.stdout.count("\n  ckptguard scan ") == 3


def test_serve_help_has_a_line_per_option() -> None:
    out = run("serve", "--help")
    assert out.returncode == 0
    options = [line for line in out.stdout.splitlines() if line.lstrip().startswith("-")]
    assert len(options) >= 3 and all(len(line.split()) > 2 for line in options)
