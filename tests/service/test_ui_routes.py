"""The page's shell, /docs offline and the OpenAPI document (issue 17), through the ASGI app.

The browser tests (tests/ui) check what the page does; these check what the service sends:
a public shell with a strict policy and no data, assets only from the package, and an
OpenAPI document that names the report schema, every problem code and the bearer scheme.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from ckptguard.core.scan import scan_bytes
from tests.service.conftest import MakeClient
from tests.service.test_error_table import sent_by_the_service

UI = Path(__file__).resolve().parents[2] / "app" / "ui"
KEY = "a-test-key-0123456789"


def test_root_redirects_and_the_shell_is_public_with_a_strict_policy(make_client: MakeClient) -> None:
    client = make_client(api_keys=[KEY])
    root = client.get("/", follow_redirects=False)
    assert root.status_code == 307 and root.headers["location"] == "/ui/"
    for path in ("/ui/", "/ui/history", "/ui/hub", "/ui/scans/" + "ab" * 16,
                 "/ui/scans/" + "ab" * 16 + "/tensors"):
        page = client.get(path)   # no key: the shell holds no data
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        for rule in ("default-src 'self'", "script-src 'self'", "style-src 'self'",
                     "connect-src 'self'", "object-src 'none'", "frame-ancestors 'none'",
                     "base-uri 'none'"):
            assert rule in csp
        assert "unsafe" not in csp and page.headers["x-frame-options"] == "DENY"
        assert page.headers["x-content-type-options"] == "nosniff"
    assert client.get("/scans").status_code == 401           # the data is not public
    assert client.get("/ui/scans/not-an-id").status_code in (404, 422)


def test_assets_come_from_the_package_only(client: TestClient) -> None:
    for asset in sorted(p.name for p in UI.iterdir() if p.suffix in (".js", ".css")):
        got = client.get(f"/ui/assets/{asset}")
        assert got.status_code == 200 and got.content == (UI / asset).read_bytes()
        assert "content-security-policy" in got.headers
    assert client.get("/ui/assets/app.js").headers["content-type"].startswith("text/javascript")
    for bad in ("..%2F..%2Fmain.py", "index.html", "x.py", "APP.JS", ".hidden.js"):
        assert client.get(f"/ui/assets/{bad}").status_code in (404, 422), bad


def test_page_sources_render_text_only_and_name_no_other_origin() -> None:
    """The rule the browser test proves on hostile files, checked on every source line."""
    for path in UI.iterdir():
        text = path.read_text()
        assert not re.search(r"https?://", text), path          # no CDN, no external request
        if path.suffix == ".js":
            code = re.sub(r"^\s*//[^\n]*|/\*.*?\*/", "", text, flags=re.M | re.S)   # comments name them
            for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                         "new Function", "setAttribute(\"style\"", "srcdoc"):
                assert sink not in code, (path.name, sink)
            assert "sessionStorage." not in text or path.name == "api.js", path.name   # the key: one module


def test_docs_work_offline(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    refs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert refs and all(r.startswith("/docs/assets/") for r in refs), refs
    for ref in refs:
        asset = client.get(ref)
        assert asset.status_code == 200 and len(asset.content) > 0, ref
        assert not re.search(rb"https?://[^\"' ]*(unpkg|jsdelivr|cdnjs)", asset.content), ref
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/docs/assets/other.js").status_code == 404


def _documented(doc: dict[str, Any]) -> set[tuple[str, int]]:
    out: set[tuple[str, int]] = set()
    for operations in doc["paths"].values():
        for op in operations.values():
            for status, response in op["responses"].items():
                media = response.get("content", {})
                if status.isdigit() and int(status) >= 400:
                    assert list(media) == ["application/problem+json"], (status, response)
                    codes = response["description"].removeprefix("codes: ").split(", ")
                    out |= {(code, int(status)) for code in codes}
    return out


def test_openapi_documents_every_field_a_report_and_a_tensor_page_carry(client: TestClient) -> None:
    """Every key of a real report's objects and rows (a torch zip: tensors, storages, regions),
    and of the tensor page's rows, is a property of its schema in /openapi.json."""
    from ckptguard.app.routes.scans import TensorRow
    from ckptguard.core.report import TensorEntry
    from tests.builders.torchlayout import state_dict, torch_layout, v2

    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    pickled = state_dict(("w", v2("0")), extra=[])
    report = scan_bytes(torch_layout("a", pickled, [("0", bytes(8))])).to_json()
    assert report["tensors"] and report["storages"] and report["regions"]
    for key, schema in (("tensors", "Tensor"), ("storages", "Storage"), ("regions", "Region"),
                        ("globals", "Global")):
        for row in report[key]:
            assert set(row) <= set(schemas[schema]["properties"]), (key, set(row))
    assert set(report["weights_only"]) <= set(schemas["WeightsOnly"]["properties"])
    # the tensor page's rows are the manifest's rows and their place in it
    assert set(TensorRow.model_fields) == {*TensorEntry._fields, "index"}
    assert set(schemas["TensorRow"]["properties"]) == {*TensorEntry._fields, "index"}


def test_openapi_names_the_report_every_problem_and_the_bearer_scheme(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    report = scan_bytes(b"cos\nsystem\n(S'x'\ntR.").to_json()
    assert set(report) <= set(schemas["Report"]["properties"])
    assert set(report["findings"][0]) <= set(schemas["Finding"]["properties"])
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": doc["components"]["securitySchemes"][
            "bearer"]["description"]}
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            public = path in ("/healthz", "/webhooks/huggingface")
            assert bool(op.get("security")) != public, (method, path)
            if not public:
                assert "UNAUTHORIZED" in op["responses"]["401"]["description"]
    scan = doc["paths"]["/scans/{scan_id}"]["get"]["responses"]["200"]
    assert scan["content"]["application/json"]["schema"]["$ref"].endswith("/ScanReport")
    literal, _ = sent_by_the_service()
    generic = {("NOT_FOUND", 404), ("METHOD_NOT_ALLOWED", 405)}   # any path, any method
    missing = literal - generic - _documented(doc)
    assert not missing, f"add to app/openapi.py ERRORS: {sorted(missing)}"
