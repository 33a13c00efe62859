"""Settings come from CKPTGUARD_* variables; every one is documented in the README draft."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from ckptguard.app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def documented() -> set[str]:
    homes = [ROOT / "README.md"]
    text = "\n".join(p.read_text() for p in homes if p.exists())
    return set(re.findall(r"^\| `(CKPTGUARD_[A-Z_]+)` \|", text, flags=re.M))


def test_every_setting_is_documented() -> None:
    expected = {f"CKPTGUARD_{name.upper()}" for name in Settings.model_fields}
    assert documented() >= expected


def test_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CKPTGUARD_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CKPTGUARD_API_KEYS", " " + "a" * 16 + " ,," + "b" * 20)
    monkeypatch.setenv("CKPTGUARD_ALLOW_GLOBALS", "collections.OrderedDict")
    monkeypatch.setenv("CKPTGUARD_WORKERS", "3")
    s = Settings()
    assert s.api_keys == ["a" * 16, "b" * 20]
    assert s.allow_globals == ["collections.OrderedDict"] and s.workers == 3
    assert s.resolved_database_url == f"sqlite:///{tmp_path.resolve()}/ckptguard.db"
    assert s.resolved_upload_dir == (tmp_path / "uploads").resolve()
    monkeypatch.setenv("CKPTGUARD_DATABASE_URL", "postgresql+psycopg://u:p@h/db")
    assert Settings().resolved_database_url == "postgresql+psycopg://u:p@h/db"


@pytest.mark.parametrize("var,value", [("CKPTGUARD_WORKERS", "0"), ("CKPTGUARD_PORT", "70000"),
                                       ("CKPTGUARD_MAX_UPLOAD_BYTES", "-1"),
                                       ("CKPTGUARD_WORKER_MEMORY_MB", "lots")])
def test_invalid_values_refused(monkeypatch: pytest.MonkeyPatch, var: str, value: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ValidationError):
        Settings()
