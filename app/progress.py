"""Progress on stderr for long runs: files done, bytes read, the file last finished.

Shown only when stderr is a terminal and the work is long (several files, or a remote
target): a pipeline's logs and stdout never see it. tqdm is imported on first use, so
`import ckptguard` and short scans never load it.
"""

from __future__ import annotations

import sys

from ckptguard.app.runner import ItemResult

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any


def wanted(*, quiet: bool, disabled: bool, items: int, remote: bool) -> bool:
    return not quiet and not disabled and sys.stderr.isatty() and (items > 1 or remote)


class Progress:
    """A tqdm bar over the items; `update` is the runner's on_result callback."""

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self._bar: Any = tqdm(total=total, file=sys.stderr, unit="file", dynamic_ncols=True,
                              leave=False)
        self._bytes = 0

    def update(self, result: ItemResult) -> None:
        self._bytes += int(result.report.get("io", {}).get("bytes_read", 0)) if result.report else 0
        self._bar.set_postfix_str(f"{_human(self._bytes)} read, {result.item.name[-60:]}", refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


def _human(nbytes: int) -> str:
    size = float(nbytes)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"
