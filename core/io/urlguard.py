"""Which URLs a remote scan may fetch: the SSRF policy, as pure logic.

Strategy: a URL is checked twice. `check_url` refuses a bad scheme, a missing host
or a literal address that is not public before anything is sent; `resolve` runs at
connect time (core.io.http's pinned transport calls it), checks EVERY address the
name resolves to and returns the one the socket must connect to. Because the
connection goes to the very address that was checked, a DNS answer that changes
between check and connect (rebinding) cannot steer the request inward. Both run
again for every redirect hop.

An address passes when it is public (`is_global`, not multicast, not reserved), with
IPv4 embedded in IPv6 (mapped, 6to4, Teredo) judged by its IPv4 part, or when an
allowlist entry (a CIDR or a host name) permits it explicitly.

Example:
    >>> guard = UrlGuard(allowlist=("127.0.0.1/32",))
    >>> guard.check_url("http://127.0.0.1:8000/x.pt")
    'http://127.0.0.1:8000/x.pt'
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence
from urllib.parse import urlsplit

from ckptguard.core.errors import Code, SourceError
from ckptguard.core.records import field, record

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Sequence[str]]

ALLOWED_SCHEMES = frozenset({"http", "https"})


def resolve_system(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (TCP), via the system resolver."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise SourceError(Code.SOURCE_HTTP, f"cannot resolve {host!r}: {exc}") from exc
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, 6to4, Teredo client), if any."""
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def is_public(ip: IPAddress) -> bool:
    """True for a globally routable unicast address (refuses loopback, private, link-local,
    multicast, reserved, unspecified, shared/CGNAT, and IPv4 smuggled inside IPv6)."""
    inner = embedded_ipv4(ip)
    if inner is not None and not is_public(inner):
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.sixtofour is not None:
        # 6to4 reaches its IPv4 (checked above); Pythons before 3.11.10 / 3.12.4 list all of
        # 2002::/16 as private, later ones do not: decide it the same on every version
        return True
    return (ip.is_global and not ip.is_multicast and not ip.is_reserved
            and not ip.is_unspecified and not ip.is_loopback and not ip.is_link_local)


def _parse_ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        return None


def _split_allowlist(entries: Iterable[str]) -> tuple[tuple[IPNetwork, ...], frozenset[str]]:
    nets: list[IPNetwork] = []
    hosts: set[str] = set()
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        try:
            nets.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            hosts.add(entry.lower().rstrip("."))
    return tuple(nets), frozenset(hosts)


@record(frozen=True, slots=True)
class UrlGuard:
    """The SSRF policy: public addresses only, unless `allow_private` or an allowlist entry says so.

    `allowlist` holds CIDRs (`10.0.0.0/8`, `127.0.0.1`) and host names (`minio.internal`);
    a listed host name may resolve to any address. `resolver` is injectable for tests
    (a stub that answers differently each time simulates DNS rebinding).
    """

    allow_private: bool = False
    allowlist: tuple[str, ...] = ()
    resolver: Resolver = field(default=resolve_system, compare=False)
    _nets: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)
    _hosts: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        nets, hosts = _split_allowlist(self.allowlist)
        object.__setattr__(self, "_nets", nets)
        object.__setattr__(self, "_hosts", hosts)

    @classmethod
    def permissive(cls) -> UrlGuard:
        """Any address (library use on a trusted machine); still http/https only."""
        return cls(allow_private=True)

    def is_allowed_ip(self, ip: IPAddress) -> bool:
        if self.allow_private or is_public(ip):
            return True
        inner = embedded_ipv4(ip)
        return any(ip in net or (inner is not None and inner in net) for net in self._nets)

    def check_url(self, url: str) -> str:
        """Refuse what can be refused without DNS: scheme, missing host, non-public literal IP."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise SourceError(Code.SOURCE_URL_REFUSED, f"malformed URL: {exc}") from exc
        scheme = parts.scheme.lower()
        if scheme not in ALLOWED_SCHEMES:
            raise SourceError(Code.SOURCE_URL_REFUSED,
                              f"scheme {scheme or '(none)'!r} refused: only http and https")
        host = parts.hostname
        if not host:
            raise SourceError(Code.SOURCE_URL_REFUSED, "URL has no host")
        if port == 0:
            raise SourceError(Code.SOURCE_URL_REFUSED, "port 0 refused")
        ip = _parse_ip(host)
        if ip is not None and not self.is_allowed_ip(ip):
            raise SourceError(Code.SOURCE_URL_REFUSED, f"address {ip} is not public")
        return url

    def resolve(self, host: str, port: int) -> str:
        """The address to connect to for `host`: every resolved address must pass."""
        name = host.lower().rstrip(".")
        literal = _parse_ip(name.strip("[]"))
        addresses = [str(literal)] if literal is not None else list(self.resolver(name, port))
        if not addresses:
            raise SourceError(Code.SOURCE_HTTP, f"{host!r} resolves to no address")
        if name in self._hosts:
            return addresses[0]
        for text in addresses:
            ip = _parse_ip(text)
            if ip is None:
                raise SourceError(Code.SOURCE_URL_REFUSED, f"{host!r} resolved to {text!r}")
            if not self.is_allowed_ip(ip):
                raise SourceError(Code.SOURCE_URL_REFUSED,
                                  f"{host!r} resolves to {ip}, which is not public")
        return addresses[0]
