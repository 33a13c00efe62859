"""The README's two commands are the ones CI runs and the ones the code supports."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```\n(python3 -m venv[^\n]+)\n```", text)


def test_readme_has_serve_and_test_commands() -> None:
    commands = _readme_commands()
    assert any(c.endswith("ckptguard serve") for c in commands)
    assert any("pytest" in c for c in commands)


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    test_cmd = next(c for c in _readme_commands() if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_cmd in ci


def test_readme_codes_table_equals_the_code_enum() -> None:
    from ckptguard.app.cli import codes_markdown

    text = (ROOT / "README.md").read_text()
    assert codes_markdown() in text, "regenerate with: ckptguard codes"


def test_readme_python_examples_run(tmp_path: Path) -> None:
    """Every ```python block of the README that uses ckptguard runs, on a real checkpoint in
    place of its paths."""
    import pytest

    torch = pytest.importorskip("torch")
    ckpt = tmp_path / "model.pt"
    names = {"encoder.layer0.weight": torch.ones(2, 3)}
    names.update({f"encoder.layer{i}.bias": torch.zeros(3) for i in range(1, 12)})
    torch.save(names, ckpt)
    blocks = [b for b in re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
              if "from ckptguard import" in b]
    assert len(blocks) >= 2
    for block in blocks:
        code = block.replace('"https://example.org/model.pt"', repr(str(ckpt)))
        code = code.replace('"model.pt"', repr(str(ckpt)))
        exec(compile(code, "README.md", "exec"), {})
