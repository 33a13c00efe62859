"""The README's HTTP error table is what the service sends: every `AppError(code, status)`,
`problem(code, status)` and `problem_body(code, status)` in app/ has its row, and every row is
something the service sends."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Raised by Starlette / FastAPI and named by app/problems.py's handlers, not by AppError calls.
FROM_HANDLERS = {("NOT_FOUND", 404), ("METHOD_NOT_ALLOWED", 405), ("VALIDATION_ERROR", 422),
                 ("INTERNAL_ERROR", 500)}
# `AppError(str(exc.code), status)`: a core error code passed through (SOURCE_*, LIMIT_*).
PASSED_THROUGH = re.compile(r"^(SOURCE|LIMIT)_")


def sent_by_the_service() -> tuple[set[tuple[str, int]], set[int]]:
    """(literal code, status) pairs, and the statuses that pass a core error's code through."""
    literal: set[tuple[str, int]] = set()
    passed: set[int] = set()
    for path in (ROOT / "app").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in {"AppError", "problem", "problem_body"} and len(node.args) >= 2):
                continue
            code, status = node.args[0], node.args[1]
            if not isinstance(code, ast.Constant) and isinstance(status, ast.Attribute | ast.Name):
                continue   # a handler or helper forwarding a code and status it was given
            statuses = ([status.value] if isinstance(status, ast.Constant) else
                        [b.value for b in (status.body, status.orelse) if isinstance(b, ast.Constant)]
                        if isinstance(status, ast.IfExp) else [])
            assert statuses, f"{path}:{node.lineno}: a status the table test cannot read"
            for value in statuses:
                if isinstance(code, ast.Constant):
                    literal.add((code.value, value))
                else:
                    passed.add(value)
    return literal, passed


def readme_rows() -> set[tuple[str, int]]:
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| status | `code` | when |"):]
    table = table[: table.index("\n\n")]
    rows: set[tuple[str, int]] = set()
    for line in table.splitlines()[2:]:
        status, codes = line.split("|")[1:3]
        rows |= {(code, int(status)) for code in re.findall(r"`([A-Z_*]+)`", codes)}
    return rows


def test_every_error_the_service_sends_has_its_row() -> None:
    literal, passed = sent_by_the_service()
    rows = readme_rows()
    missing = (literal | FROM_HANDLERS) - rows
    assert not missing, f"add to the README's error table: {sorted(missing)}"
    for status in passed:
        assert any(PASSED_THROUGH.match(code) and s == status for code, s in rows), \
            f"the README's {status} row does not name the SOURCE_*/LIMIT_* codes passed through"


def test_every_row_is_something_the_service_sends() -> None:
    literal, passed = sent_by_the_service()
    stale = {(code, status) for code, status in readme_rows()
             if (code, status) not in literal | FROM_HANDLERS
             and not (PASSED_THROUGH.match(code) and status in passed)}
    assert not stale, f"the service never sends: {sorted(stale)}"
