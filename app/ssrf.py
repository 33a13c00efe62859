"""The service's URL guard, built from settings (the policy itself is core.io.urlguard).

Settings fields (env `CKPTGUARD_URL_ALLOW_PRIVATE`, `CKPTGUARD_URL_ALLOWLIST`):
`url_allow_private: bool` and `url_allowlist: list[str]` (CIDRs or host names,
comma-separated in the environment). Read with getattr so this module works with any
settings object that has them, and refuses private targets when it has not.
"""

from __future__ import annotations

from collections.abc import Iterable

from ckptguard.core.io.urlguard import UrlGuard


def _entries(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, Iterable):
        return tuple(str(part).strip() for part in value if str(part).strip())
    return ()


def guard_from_settings(settings: object | None) -> UrlGuard:
    """The SSRF guard POST /scan/url hands to the HTTP byte source."""
    return UrlGuard(allow_private=bool(getattr(settings, "url_allow_private", False)),
                    allowlist=_entries(getattr(settings, "url_allowlist", ())))
