"""Write the README's screenshots of the page: `python -m tests.ui.screenshots docs/`.

Starts the service on 127.0.0.1 with an empty database, uploads example checkpoints (a
zip with an unreferenced record and appended bytes, 2,000 tensors), and saves the three
views (scan, report with its map, tensor table) with Debian's Chromium.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.e2e.service_server import running_server
from tests.ui.browser import chromium
from tests.ui.test_pages import _checkpoint

VIEWS = ("ui-scan.png", "ui-report.png", "ui-tensors.png")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    names = [f"encoder.layers.{i // 4}.{('q', 'k', 'v', 'o')[i % 4]}_proj.weight" for i in range(2000)]
    with tempfile.TemporaryDirectory() as data, running_server(Path(data)) as server, \
            chromium(1280, 1000) as browser:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            odd = client.post("/scan", files={"file": ("odd-model.pt", _odd_archive())}).json()
            encoder = _checkpoint(names, half_every=3)
            many = client.post("/scan", files={"file": ("encoder.pt", encoder)}).json()
        browser.get(f"{server.url}/ui/")
        time.sleep(1)
        browser.save_screenshot(str(out / VIEWS[0]))
        browser.get(f"{server.url}/ui/scans/{odd['id']}")
        time.sleep(1.5)
        row = next(r for r in browser.find_elements("css selector", "table.findings tbody tr.pickable")
                   if "ZIP_APPENDED_DATA" in r.text)
        row.click()
        time.sleep(0.3)
        browser.execute_script("document.querySelector('#verdict').scrollIntoView()")
        browser.save_screenshot(str(out / VIEWS[1]))
        browser.get(f"{server.url}/ui/scans/{many['id']}/tensors")
        time.sleep(1.5)
        browser.save_screenshot(str(out / VIEWS[2]))
    for name in VIEWS:
        print(f"{out / name}: {(out / name).stat().st_size:,} bytes")


def _odd_archive() -> bytes:
    """A torch zip with a record no storage refers to and bytes after its end."""
    from tests.builders.torchlayout import state_dict, torch_layout, v2

    items = [(f"block{i}.weight", v2(str(i), numel=64, size=(8, 8), stride=(8, 1))) for i in range(6)]
    storages = [(str(i), bytes(256)) for i in range(6)]
    archive = torch_layout("archive", state_dict(*items),
                           [*storages, ("payload", b"import os; os.system('id')\n" * 40)])
    return archive + b"\x00appended bytes that no zip reader looks at" * 20


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs"))
