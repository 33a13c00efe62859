"""The SSRF policy: pure logic, with a stub resolver."""

from __future__ import annotations

import ipaddress

import pytest

from ckptguard.core.errors import Code, SourceError
from ckptguard.core.io.urlguard import UrlGuard, is_public

REFUSED = ["127.0.0.1", "127.8.9.10", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
           "100.64.0.1", "0.0.0.0", "224.0.0.1", "239.255.255.250", "255.255.255.255", "240.0.0.1",
           "198.18.0.1", "192.0.2.1", "::1", "::", "fe80::1", "fc00::1", "fd12::1", "ff02::1",
           "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "2002:7f00:1::1",
           "2002:a00:1::1", "64:ff9b::a00:1"]
PUBLIC = ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2001:4860:4860::8888",
          "2002:808:808::1"]


@pytest.mark.parametrize("addr", REFUSED)
def test_non_public_addresses_are_refused(addr: str) -> None:
    assert not is_public(ipaddress.ip_address(addr))
    host = f"[{addr}]" if ":" in addr else addr
    with pytest.raises(SourceError) as exc:
        UrlGuard().check_url(f"http://{host}/x.pt")
    assert exc.value.code == Code.SOURCE_URL_REFUSED


@pytest.mark.parametrize("addr", PUBLIC)
def test_public_addresses_pass(addr: str) -> None:
    assert is_public(ipaddress.ip_address(addr))
    assert UrlGuard(resolver=lambda h, p: [addr]).resolve("example.org", 443) == addr


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.org/x", "gopher://x/",
                                 "http:///nohost", "example.org/x.pt", "http://[::1/x",
                                 "http://example.org:0/x"])
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(SourceError) as exc:
        UrlGuard().check_url(url)
    assert exc.value.code == Code.SOURCE_URL_REFUSED


def test_names_are_judged_by_every_resolved_address() -> None:
    guard = UrlGuard(resolver=lambda h, p: ["8.8.8.8", "10.0.0.7"])
    with pytest.raises(SourceError) as exc:
        guard.resolve("mixed.example", 80)
    assert exc.value.code == Code.SOURCE_URL_REFUSED
    assert "10.0.0.7" in exc.value.message


def test_decimal_and_hex_hosts_are_judged_after_resolution() -> None:
    # 2130706433 == 127.0.0.1: not a literal for ipaddress, but the resolver turns it into one
    guard = UrlGuard()
    assert guard.check_url("http://2130706433/x") == "http://2130706433/x"
    with pytest.raises(SourceError) as exc:
        guard.resolve("2130706433", 80)
    assert exc.value.code == Code.SOURCE_URL_REFUSED


def test_allowlist_cidr_and_host() -> None:
    guard = UrlGuard(allowlist=("127.0.0.1/32", "10.0.0.0/8", "minio.internal"),
                     resolver=lambda h, p: {"minio.internal": ["192.168.5.5"],
                                            "other.internal": ["192.168.5.6"]}[h])
    assert guard.check_url("http://127.0.0.1:9/x")
    assert guard.resolve("127.0.0.1", 80) == "127.0.0.1"
    assert guard.resolve("10.9.9.9", 80) == "10.9.9.9"
    assert guard.resolve("MINIO.internal.", 80) == "192.168.5.5"
    with pytest.raises(SourceError):
        guard.resolve("other.internal", 80)
    with pytest.raises(SourceError):
        guard.check_url("http://127.0.0.2/x")
    # an allowlisted IPv4 network also covers its IPv4-mapped IPv6 form
    assert guard.resolve("::ffff:127.0.0.1", 80) == "::ffff:7f00:1"


def test_allow_private_allows_everything_but_bad_schemes() -> None:
    guard = UrlGuard(allow_private=True)
    assert guard.resolve("127.0.0.1", 80) == "127.0.0.1"
    with pytest.raises(SourceError):
        guard.check_url("file:///etc/passwd")


def test_unresolvable_name_is_a_source_error() -> None:
    with pytest.raises(SourceError) as exc:
        UrlGuard().resolve("does-not-exist.invalid", 80)
    assert exc.value.code in (Code.SOURCE_HTTP, Code.SOURCE_URL_REFUSED)
