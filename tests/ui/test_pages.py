"""The reviewers' page in a real headless Chromium against the real service on 127.0.0.1.

One server (with an API key, so the page's key dialog is exercised) and one browser for the
module. Every checkpoint is uploaded once; the views are checked through the DOM the page
built, and a screenshot of each view goes to the test's temporary folder.
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.builders.torchlayout import state_dict, torch_layout, v2
from tests.e2e.service_server import Server, running_server
from tests.ui.browser import chromium

pytestmark = pytest.mark.e2e

KEY = "ui-test-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
MALICIOUS = b"cos\nsystem\n(S'echo pwned'\ntR."
# Markup that would run if any of it were parsed as HTML: each sets window.__pwned.
PAYLOADS = ('<img src=x onerror="window.__pwned=1">', "<script>window.__pwned=2</script>",
            "<svg onload=window.__pwned=3>")
FILENAME = "<img src=x onerror=window.__pwned=4>.pt"   # no quote: multipart would escape it


def _checkpoint(names: list[str], *, half_every: int = 0, extra: tuple[object, ...] = ()) -> bytes:
    items, storages = [], []
    for i, name in enumerate(names):
        half = bool(half_every) and i % half_every == 1
        items.append((name, v2(str(i), storage="HalfStorage" if half else "FloatStorage")))
        storages.append((str(i), struct.pack("<2e", i, -i) if half else struct.pack("<2f", i, -i)))
    return torch_layout("archive", state_dict(*items, extra=extra), storages)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("ui-service"), CKPTGUARD_API_KEYS=KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(server: Server) -> Iterator[Any]:
    with chromium() as driver:
        driver.set_script_timeout(30)
        yield driver


@pytest.fixture(scope="module")
def scans(server: Server) -> dict[str, str]:
    """Report ids of the checkpoints the tests look at (uploaded once, through the API)."""
    files = {
        "many": ("many.pt", _checkpoint([f"layer{i}.weight" for i in range(10_000)], half_every=2)),
        "appended": ("appended.pt", _checkpoint(["w", "b"]) + b"PAYLOAD!" * 64),
        "hostile": (FILENAME, _checkpoint(list(PAYLOADS), extra=(
            ("GLOBAL", PAYLOADS[0], "x"), "POP"))),
    }
    ids = {}
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as client:
        for label, (name, data) in files.items():
            r = client.post("/scan", files={"file": (name, data)})
            assert r.status_code == 200, r.text
            ids[label] = r.json()["id"]
    return ids


def wait(driver: Any, predicate: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        answer_key(driver)
        try:
            value = predicate()
        except Exception:   # the element is not there yet
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; page: {text(driver)[:2000]}")
        time.sleep(0.1)


def answer_key(driver: Any) -> None:
    """The page asks for the key once per session: answer its dialog when it is open."""
    if driver.execute_script("return !!document.querySelector('#key-dialog[open]')"):
        field = driver.find_element("css selector", "#key-input")
        field.send_keys(KEY)
        driver.find_element("css selector", "#key-form button[type=submit]").click()


def text(driver: Any) -> str:
    return str(driver.execute_script("return document.body.innerText"))


def css(driver: Any, selector: str) -> Any:
    return driver.find_element("css selector", selector)


def open_page(driver: Any, url: str, ready: str) -> None:
    driver.get(url)
    wait(driver, lambda: driver.find_elements("css selector", ready), ready)


def shot(driver: Any, path: Path) -> None:
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 1000


def test_upload_of_a_malicious_pickle_shows_unsafe_and_names_the_call(
        server: Server, browser: Any, tmp_path: Path) -> None:
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(MALICIOUS)
    open_page(browser, f"{server.url}/", "#dropzone")
    assert browser.current_url == f"{server.url}/ui/"            # / redirects to the page
    shot(browser, tmp_path / "scan.png")
    css(browser, "#file-input").send_keys(str(evil))
    wait(browser, lambda: re.search(r"/ui/scans/[0-9a-f]{32}$", browser.current_url), "the report")
    banner = wait(browser, lambda: css(browser, "#verdict"), "the verdict banner")
    assert "UNSAFE" in banner.text
    assert "os.system" in banner.text and "echo pwned" in banner.text
    assert "torch.load(weights_only=True) would refuse this file" in banner.text
    assert KEY not in browser.current_url
    assert browser.execute_script("return sessionStorage.getItem('ckptguard.apiKey')") == KEY
    findings = [r.text for r in browser.find_elements("css selector", "table.findings tbody tr")]
    assert findings[0].startswith("critical")          # sorted by severity
    shot(browser, tmp_path / "report.png")


def test_tensor_table_pages_and_filters_10000_tensors(
        server: Server, browser: Any, scans: dict[str, str], tmp_path: Path) -> None:
    probe = httpx.get(f"{server.url}/scans/{scans['many']}/tensors", headers=AUTH, params={"limit": 1})
    if probe.status_code == 404 and probe.json().get("code") == "NOT_FOUND":
        pytest.xfail("GET /scans/{id}/tensors is not on this branch yet (the store work, issue 16)")
    open_page(browser, f"{server.url}/ui/scans/{scans['many']}/tensors", "#tensor-table tbody tr")
    info = lambda: css(browser, "#tensor-info").text   # noqa: E731
    wait(browser, lambda: info() == "Rows 1–100 of 10,000", "the first page")
    assert len(browser.find_elements("css selector", "#tensor-table tbody tr")) == 100
    css(browser, "#tensor-next").click()
    wait(browser, lambda: info() == "Rows 101–200 of 10,000", "the second page")
    first = css(browser, "#tensor-table tbody tr td:nth-child(2)").text
    assert first == "layer100.weight"
    css(browser, "#tensor-prev").click()
    wait(browser, lambda: info() == "Rows 1–100 of 10,000", "back to the first page")
    css(browser, "#tensor-name").send_keys("LAYER999")   # substring, case-insensitive
    wait(browser, lambda: info() == "Rows 1–11 of 11", "the name filter")  # 999, 9990..9999
    css(browser, "#tensor-name").clear()
    css(browser, "#tensor-name").send_keys("layer")
    browser.execute_script("const s = document.querySelector('#tensor-dtype'); s.value = 'float16';"
                           "s.dispatchEvent(new Event('change'))")
    wait(browser, lambda: info() == "Rows 1–100 of 5,000", "the dtype filter")
    dtypes = {td.text for td in browser.find_elements("css selector", "#tensor-table tbody td:nth-child(3)")}
    assert dtypes == {"float16"}
    totals = css(browser, "#dtype-totals").text
    assert "float16" in totals and "float32" in totals and "5,000" in totals
    shot(browser, tmp_path / "tensors.png")


def test_map_shows_appended_bytes_and_a_finding_highlights_them(
        server: Server, browser: Any, scans: dict[str, str], tmp_path: Path) -> None:
    report = httpx.get(f"{server.url}/scans/{scans['appended']}", headers=AUTH).json()
    size = report["source"]["size"]
    [appended] = [r for r in report["regions"] if r["kind"] == "appended"]
    open_page(browser, f"{server.url}/ui/scans/{scans['appended']}", "#map-bar .region")
    box = css(browser, "#map-bar .region.kind-appended")
    assert f"{appended['length']} bytes" in box.get_attribute("aria-label")
    left = float(browser.execute_script("return parseFloat(arguments[0].style.left)", box))
    assert abs(left - appended["offset"] / size * 100) < 0.01
    # keyboard: focus the finding's row and press Enter
    row = next(r for r in browser.find_elements("css selector", "table.findings tbody tr.pickable")
               if "ZIP_APPENDED_DATA" in r.text)
    browser.execute_script("arguments[0].focus()", row)
    from selenium.webdriver.common.keys import Keys

    browser.switch_to.active_element.send_keys(Keys.ENTER)
    mark = wait(browser, lambda: css(browser, "#map-hl").is_displayed() and css(browser, "#map-hl"),
                "the highlight")
    mark_left = float(browser.execute_script("return parseFloat(arguments[0].style.left)", mark))
    mark_width = float(browser.execute_script("return parseFloat(arguments[0].style.width)", mark))
    assert abs(mark_left - appended["offset"] / size * 100) < 0.01
    assert abs(mark_width - appended["length"] / size * 100) < 0.01
    assert "selected" in box.get_attribute("class")
    # clicking the region lists its finding
    box.click()
    wait(browser, lambda: "ZIP_APPENDED_DATA" in css(browser, "#map-detail").text, "the region's findings")
    shot(browser, tmp_path / "map.png")


def test_hostile_names_are_shown_as_text_and_nothing_runs(
        server: Server, browser: Any, scans: dict[str, str], tmp_path: Path) -> None:
    pages = [(f"/ui/scans/{scans['hostile']}", "#verdict"), ("/ui/history", "table tbody tr")]
    for path, ready in pages:
        open_page(browser, server.url + path, ready)
        time.sleep(0.5)   # an onerror/onload would have fired by now
        shown = text(browser)
        assert browser.execute_script("return window.__pwned") is None, path
        assert not browser.find_elements("css selector", "main img, main svg, main script"), path
        if path.startswith("/ui/scans"):
            assert PAYLOADS[0] in shown        # the global's module, in the globals table
            # the tensor names, listed from the region of the map that holds their data
            tensor_box = browser.find_elements("css selector", "#map-bar .region.kind-tensor_data")[0]
            tensor_box.click()
            wait(browser, lambda: PAYLOADS[0] in css(browser, "#map-detail").text, "the tensors")
            assert FILENAME in text(browser)
        else:
            assert FILENAME in shown
        shot(browser, tmp_path / f"hostile-{len(path)}.png")
    assert browser.execute_script("return window.__pwned") is None
    probe = httpx.get(f"{server.url}/scans/{scans['hostile']}/tensors", headers=AUTH)
    if probe.status_code == 200:
        open_page(browser, f"{server.url}/ui/scans/{scans['hostile']}/tensors", "#tensor-table tbody tr")
        time.sleep(0.5)
        assert all(p in text(browser) for p in PAYLOADS)
        assert browser.execute_script("return window.__pwned") is None


def test_no_request_leaves_the_origin_and_the_policy_is_strict(
        server: Server, browser: Any, scans: dict[str, str]) -> None:
    for path, ready in [("/ui/", "#dropzone"), (f"/ui/scans/{scans['appended']}", "#map-bar"),
                        ("/ui/history", "table"), ("/ui/hub", "h1"), ("/docs", ".opblock")]:
        open_page(browser, server.url + path, ready)
        urls = browser.execute_script(
            "return [location.href, ...performance.getEntriesByType('resource').map(e => e.name)]")
        assert urls and all(u.startswith(server.url + "/") for u in urls), (path, urls)
        refs = browser.execute_script(
            "return [...document.querySelectorAll('[src],[href]')].map(e => e.src || e.href)")
        assert all(r.startswith(server.url + "/") for r in refs if r), (path, refs)
    logs = [e["message"] for e in browser.get_log("browser")]
    assert not [m for m in logs if "Content Security Policy" in m], logs
    page = httpx.get(f"{server.url}/ui/")
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    # no inline script, style or event handler in the shell
    assert not re.search(r"<script(?![^>]*\ssrc=)|<style|\sstyle=|\son[a-z]+\s*=", page.text, re.I)


CONTRAST = """
function lum(c) {
  const [r, g, b] = c.match(/[\\d.]+/g).slice(0, 3).map(Number).map(v => {
    v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}
function background(el) {
  for (; el; el = el.parentElement) {
    const c = getComputedStyle(el).backgroundColor;
    if (c && !c.startsWith('rgba(0, 0, 0, 0') && c !== 'transparent') return c;
  }
  return 'rgb(255, 255, 255)';
}
return [...document.querySelectorAll(arguments[0])].filter(e => e.innerText.trim()).map(e => {
  const a = lum(getComputedStyle(e).color), b = lum(background(e));
  return [e.innerText.slice(0, 40), (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)];
});
"""


@pytest.mark.parametrize("width", [1280, 390])
def test_no_horizontal_scroll_and_readable_contrast(
        server: Server, browser: Any, scans: dict[str, str], width: int, tmp_path: Path) -> None:
    browser.set_window_size(width, 900)
    try:
        pages = [("/ui/", "#dropzone"), (f"/ui/scans/{scans['hostile']}", "#verdict"),
                 (f"/ui/scans/{scans['appended']}", "#map-bar"), ("/ui/history", "table tbody tr"),
                 ("/ui/hub", "h1")]
        if httpx.get(f"{server.url}/scans/{scans['many']}/tensors", headers=AUTH).status_code == 200:
            pages.append((f"/ui/scans/{scans['many']}/tensors", "#tensor-table tbody tr"))
        for path, ready in pages:
            open_page(browser, server.url + path, ready)
            scroll, client = browser.execute_script(
                "const d = document.documentElement; return [d.scrollWidth, d.clientWidth]")
            assert scroll <= client, (path, width, scroll, client)
            ratios = browser.execute_script(CONTRAST, "p, td, th, .badge, .verdict-word, a, label, h1, h2")
            low = [(t, round(r, 2)) for t, r in ratios if r < 4.5]
            assert not low, (path, low)
            shot(browser, tmp_path / f"{width}-{len(path)}.png")
        if width == 390:   # stacked: table rows become cards, each cell labelled
            open_page(browser, f"{server.url}/ui/scans/{scans['appended']}", "table.findings tbody tr")
            display = browser.execute_script(
                "return getComputedStyle(document.querySelector('table.findings tbody tr')).display")
            assert display == "block"
    finally:
        browser.set_window_size(1280, 900)


def test_history_filters_by_verdict_format_and_sha256(
        server: Server, browser: Any, scans: dict[str, str], tmp_path: Path) -> None:
    with httpx.Client(base_url=server.url, headers=AUTH) as client:
        assert client.post("/scan", files={"file": ("history-evil.pkl", MALICIOUS + b"#")}).status_code == 200
        appended = client.get(f"/scans/{scans['appended']}").json()
    open_page(browser, f"{server.url}/ui/history", "table tbody tr")
    assert "history-evil.pkl" in text(browser) and "appended.pt" in text(browser)

    def choose(select: str, value: str) -> None:
        browser.execute_script("const s = document.querySelector(arguments[0]); s.value = arguments[1];"
                               "s.dispatchEvent(new Event('change', {bubbles: true}))", select, value)

    def verdicts() -> set[str]:
        return {b.text for b in browser.find_elements("css selector", "table tbody .badge")}

    choose("#verdict", "unsafe")
    wait(browser, lambda: verdicts() == {"UNSAFE"} and "history-evil.pkl" in text(browser), "unsafe only")
    assert "appended.pt" not in text(browser)
    choose("#verdict", "")
    css(browser, "#sha256").send_keys(appended["source"]["sha256"])
    css(browser, ".filters button[type=submit]").click()
    wait(browser, lambda: len(browser.find_elements("css selector", "table tbody tr")) == 1
         and "appended.pt" in text(browser), "the sha256 search")
    link = css(browser, "table tbody tr a")
    link.click()
    wait(browser, lambda: browser.current_url.endswith(f"/ui/scans/{scans['appended']}"), "the report link")
    shot(browser, tmp_path / "history.png")
    summary = httpx.get(f"{server.url}/scans", headers=AUTH, params={"format": "pickle"}).json()
    if any(item["format"] != "pickle" for item in summary["items"]):
        pytest.xfail("GET /scans?format= is not on this branch yet (the store work, issue 16)")
    open_page(browser, f"{server.url}/ui/history", "table tbody tr")
    choose("#format", "pickle")
    wait(browser, lambda: "history-evil.pkl" in text(browser) and "appended.pt" not in text(browser),
         "the format filter")


def test_upload_shows_progress_and_can_be_cancelled(server: Server, browser: Any, tmp_path: Path) -> None:
    big = tmp_path / "big.pt"
    big.write_bytes(b"\x80\x02" + bytes(16 * 1024 * 1024))
    before = httpx.get(f"{server.url}/scans", headers=AUTH, params={"limit": 100}).json()["items"]
    open_page(browser, f"{server.url}/ui/", "#dropzone")
    browser.set_network_conditions(offline=False, latency=5, download_throughput=10 * 1024 * 1024,
                                   upload_throughput=2 * 1024 * 1024)
    try:
        css(browser, "#file-input").send_keys(str(big))
        wait(browser, lambda: "Uploading big.pt:" in css(browser, ".status").text, "upload progress")
        progress = css(browser, "progress")
        assert progress.is_displayed()
        cancel = next(b for b in browser.find_elements("css selector", "button") if b.text == "Cancel upload")
        cancel.click()
        wait(browser, lambda: "cancelled" in css(browser, ".status").text, "the cancel")
        assert not progress.is_displayed() and browser.current_url == f"{server.url}/ui/"
    finally:
        browser.delete_network_conditions()
    time.sleep(1)
    after = httpx.get(f"{server.url}/scans", headers=AUTH, params={"limit": 100}).json()["items"]
    assert len(after) == len(before)          # nothing was scanned or stored
