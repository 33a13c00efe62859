"""`ckptguard.scan(target)`: the Python API's answer for a file, folder, URL or hf:// target.

In-process and sequential (a library call must not start processes behind its caller's
back; the command line adds the sandboxed pool). Targets expand as on the command line
(app/targets.py): files found by walking are chosen by content and non-checkpoints are
left out; a file that cannot be read gives an `invalid` report whose SOURCE_* finding says
why, so one missing blob never hides the rest of a folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ckptguard.core.report import Finding, Report, SourceInfo
from ckptguard.core.state import ScanOptions


def scan(target: str | os.PathLike[str], *, options: ScanOptions | None = None,
         headers: Mapping[str, str] | None = None) -> list[Report]:
    """Scan a file, a folder (recursively), an http(s) URL or `hf://owner/name[@rev][/path]`.

    Returns one Report per checkpoint, in path order. `headers` go with URL reads; hub
    targets use HF_TOKEN (or the huggingface token file) and HF_ENDPOINT.

        >>> [r.verdict for r in scan("model_dir")]          # doctest: +SKIP
        ['safe', 'unsafe']
    """
    from ckptguard.app.itemscan import Skipped, scan_local, scan_remote
    from ckptguard.app.targets import expand
    from ckptguard.core import __version__
    from ckptguard.core.errors import CkptError

    opts = options or ScanOptions()
    reports: list[Report] = []
    for item in expand([os.fspath(target)], headers=dict(headers or {})).items:
        info = SourceInfo(kind=item.kind, name=item.name, url=item.url, sha256=item.sha256)
        try:
            if item.error is not None:
                raise item.error
            result = (scan_remote(item.url, item.headers, info, opts, sniff_first=item.from_listing)
                      if item.url is not None else
                      scan_local(item.path or item.name, info, opts, sniff_first=item.from_listing))
        except CkptError as exc:
            result = Report(source=info, verdict="invalid", findings=[Finding(exc.code, exc.message)],
                            scanner_version=__version__)
        if not isinstance(result, Skipped):
            reports.append(result)
    return reports
