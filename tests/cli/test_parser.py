"""The command line's parser: built for the command being run only (a cold-start saving,
app/cli.py build_parser), it answers every argument list as the parser of every command does."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

from ckptguard.app import cli

ARGUMENT_LISTS = [
    [], ["-h"], ["--help"], ["--version"], ["-h", "scan"], ["--he", "scan"], ["--help", "get"],
    ["--debug", "-h", "codes"], ["--", "scan", "x"], ["--version", "scan", "x"],
    ["scan", "-h"], ["get", "--help"], ["serve", "-h"], ["worker", "-h"], ["codes", "-h"],
    ["scna", "x"], ["sc", "x"], ["get"], ["scan"], ["codes", "--bogus"],
    ["--debug", "scan", "{tiny}"], ["scan", "{tiny}", "--debug"], ["scan", "--format", "bad", "{tiny}"],
    ["scan", "{tiny}", "--bogus"], ["--bogus", "scan", "{tiny}"], ["scan", "-q", "{missing}"],
    ["scan", "--json", "{tiny}"], ["get", "{tiny}", "t"],
]


def _answer(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[object, ...]:
    try:
        status: object = cli.main(argv)
    except SystemExit as exc:   # argparse's own exits: help and version
        status = ("exit", exc.code)
    out, err = capsys.readouterr()
    return status, *(re.sub(r"\d+\.\d+", "<time>", text) for text in (out, err))


@pytest.mark.parametrize("argv", ARGUMENT_LISTS, ids=" ".join)
def test_the_parser_of_one_command_answers_as_the_parser_of_all(
        argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = tmp_path / "tiny.pkl"
    tiny.write_bytes(pickle.dumps({"a": 1}, protocol=2))
    argv = [word.format(tiny=tiny, missing=tmp_path / "missing.pt") for word in argv]
    monkeypatch.setenv("COLUMNS", "100")
    one = _answer(argv, capsys)
    every_command = cli.build_parser(None)   # the parser of every command, as before
    monkeypatch.setattr(cli, "build_parser", lambda argv=None: every_command)
    assert _answer(argv, capsys) == one


def test_a_scan_builds_the_scan_command_only() -> None:
    parser = cli.build_parser(["--debug", "scan", "model.pt"])
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    assert list(commands.choices) == ["scan"]   # type: ignore[arg-type]
    parser = cli.build_parser(["-h", "scan"])
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    assert list(commands.choices) == list(cli.COMMANDS)   # type: ignore[arg-type]
