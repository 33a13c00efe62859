"""HttpSource against a real HTTP server on 127.0.0.1, including every fault mode."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptguard.core.errors import Code, LimitExceeded, SourceError
from ckptguard.core.io.http import HttpSource
from ckptguard.core.io.spancache import SpanCache, coalesce
from ckptguard.core.io.urlguard import UrlGuard
from ckptguard.core.limits import Limits
from ckptguard.core.zip.layout import peek_central_directory
from tests.rangeserver import RangeServer


def open_src(srv: RangeServer, path: str, guard: UrlGuard, **kw: object) -> HttpSource:
    kw.setdefault("backoff", 0.01)
    return HttpSource(srv.url(path), guard=guard, **kw)  # type: ignore[arg-type]


# --- the happy path -----------------------------------------------------------------

def test_open_is_one_round_trip_of_two_concurrent_requests(server, guard, small_ckpt) -> None:
    with open_src(server, "/small.pt", guard) as src:
        assert src.size == len(small_ckpt)
        assert src.stats.requests == 2 and src.round_trips == 1
        assert sorted(server.ranged()) == sorted(["bytes=0-65535", "bytes=-69632"])
        # the whole small file is now cached: any read is free
        assert src.read_at(0, src.size) == small_ckpt
        assert src.read_at(100, 7) == small_ckpt[100:107]
        assert src.stats.requests == 2
        assert src.stats.bytes_read <= 2 * len(small_ckpt)


def test_big_manifest_costs_two_round_trips(server, guard, many_ckpt) -> None:
    cd = peek_central_directory(many_ckpt[-69632:], len(many_ckpt) - 69632, len(many_ckpt), Limits())
    assert cd is not None and cd[0] > 65536
    with open_src(server, "/many.pt", guard) as src:
        assert src.round_trips == 2 and src.stats.requests == 4
        # the central directory and data.pkl are cached: reading them costs nothing more
        pkl_end = many_ckpt.index(b"PK\x07\x08")  # data.pkl's descriptor follows its bytes
        before = src.stats.requests
        assert src.read_at(cd[0], cd[1] - cd[0]) == many_ckpt[cd[0]:cd[1]]
        assert src.read_at(0, pkl_end) == many_ckpt[:pkl_end]
        assert src.stats.requests == before
        # and no more than the pickle + central directory + head/tail slack was read
        assert src.stats.bytes_read <= pkl_end + (cd[1] - cd[0]) + 128 * 1024


def test_missing_spans_are_coalesced_into_one_wave(server, guard, many_ckpt) -> None:
    with open_src(server, "/many.pt", guard, speculate=False) as src:
        n0, rt0 = src.stats.requests, src.round_trips
        size = src.size
        mid = size // 2
        spans = [(mid, 10), (mid + 100, 10), (mid + 5000, 3), (70000, 8)]
        got = src.read_many(spans)
        assert got == [many_ckpt[o:o + n] for o, n in spans]
        # three near spans -> one request, the far one -> another; concurrently: one round trip
        assert src.stats.requests - n0 == 2 and src.round_trips - rt0 == 1
        last = server.log[-2:]
        assert all(e.if_range is not None for e in last)  # ETag pinned and sent


def test_reads_past_the_end_are_short_reads(server, guard) -> None:
    with open_src(server, "/tiny.bin", guard) as src:
        assert src.read_at(0, 10) == b"0123456789"
        with pytest.raises(SourceError) as exc:
            src.read_at(5, 6)
        assert exc.value.code == Code.SOURCE_SHORT_READ


def test_empty_file(server, guard) -> None:
    with open_src(server, "/empty.bin", guard) as src:
        assert src.size == 0
        assert src.read_many([]) == []


def test_big_reads_bypass_the_cache(server, guard, many_ckpt, monkeypatch) -> None:
    monkeypatch.setattr("ckptguard.core.io.http.CACHE_SPAN_LIMIT", 1000)
    with open_src(server, "/many.pt", guard, speculate=False) as src:
        assert src.read_at(200_000, 5000) == many_ckpt[200_000:205_000]
        assert src.read_at(200_000, 5000) == many_ckpt[200_000:205_000]
        assert server.log[-1].range == server.log[-2].range == "bytes=200000-204999"


def test_byte_budget(server, guard) -> None:
    with open_src(server, "/many.pt", guard, speculate=False,
                  limits=Limits(max_bytes_read=200_000)) as src:
        with pytest.raises(LimitExceeded) as exc:
            src.read_at(0, 150_000)
        assert exc.value.code == Code.LIMIT_BYTES_READ
        src.budget = None  # what core.loader does once the scan is done
        assert len(src.read_at(0, 150_000)) == 150_000


# --- fault injection ---------------------------------------------------------------

def test_server_ignoring_range_still_gives_the_right_bytes(server, guard, small_ckpt) -> None:
    server.set_fault("ignore_range")
    with open_src(server, "/small.pt", guard) as src:
        assert src.size == len(small_ckpt)
        assert src.read_at(0, src.size) == small_ckpt
        assert all(e.status == 200 for e in server.log)


def test_server_ignoring_range_head_read_stops_early(server, guard, many_ckpt) -> None:
    server.set_fault("ignore_range")
    with pytest.raises(LimitExceeded):
        open_src(server, "/many.pt", guard, limits=Limits(max_bytes_read=100_000))


def test_wrong_content_range_is_an_error(server, guard) -> None:
    server.set_fault("wrong_content_range")
    with pytest.raises(SourceError) as exc:
        open_src(server, "/small.pt", guard)
    assert exc.value.code == Code.SOURCE_HTTP
    assert "Content-Range" in exc.value.message


def test_wrong_total_later_is_a_changed_file(server, guard) -> None:
    with open_src(server, "/many.pt", guard, speculate=False) as src:
        server.set_fault("wrong_total")
        with pytest.raises(SourceError) as exc:
            src.read_at(100_000, 10)
        assert exc.value.code == Code.SOURCE_CHANGED


def test_etag_changing_between_concurrent_first_requests(server, guard) -> None:
    server.set_fault("etag_changes")
    with pytest.raises(SourceError) as exc:
        open_src(server, "/small.pt", guard)
    assert exc.value.code == Code.SOURCE_CHANGED


def test_file_replaced_mid_scan_is_detected_via_if_range(server, guard, many_ckpt) -> None:
    with open_src(server, "/many.pt", guard, speculate=False) as src:
        server.files["/many.pt"] = many_ckpt[:-1] + b"!"   # same size, new content...
        server.set_fault("etag_changes")                    # ...and a new ETag
        with pytest.raises(SourceError) as exc:
            src.read_at(100_000, 10)
        assert exc.value.code == Code.SOURCE_CHANGED
        assert server.log[-1].if_range is not None


def test_no_validators_still_checks_the_size(server, guard, small_ckpt) -> None:
    server.set_fault("no_validators")
    with open_src(server, "/small.pt", guard) as src:
        assert src.etag is None
        assert src.read_at(0, 10) == small_ckpt[:10]


def test_dropped_body_is_retried(server, guard, many_ckpt) -> None:
    with open_src(server, "/many.pt", guard, speculate=False) as src:
        server.set_fault("drop_mid_body", times=1)
        n0 = src.stats.requests
        assert src.read_at(100_000, 5000) == many_ckpt[100_000:105_000]
        assert src.stats.requests - n0 == 2


def test_dropped_body_every_time_is_a_short_read(server, guard) -> None:
    with open_src(server, "/many.pt", guard, speculate=False, retries=2) as src:
        server.set_fault("drop_mid_body")
        with pytest.raises(SourceError) as exc:
            src.read_at(100_000, 5000)
        assert exc.value.code == Code.SOURCE_SHORT_READ
        assert "3 attempts" in exc.value.message


def test_stalled_server_times_out(server, guard) -> None:
    server.set_fault("stall", stall_seconds=3.0)
    started = time.monotonic()
    with pytest.raises(SourceError) as exc:
        open_src(server, "/small.pt", guard, timeout=0.3, retries=1)
    assert exc.value.code == Code.SOURCE_HTTP and "timed out" in exc.value.message
    assert time.monotonic() - started < 2.5


@pytest.mark.parametrize("status", [403, 404, 401, 410])
def test_client_errors_are_not_retried(server, guard, status) -> None:
    server.set_fault("status", status=status)
    with pytest.raises(SourceError) as exc:
        open_src(server, "/small.pt", guard)
    assert exc.value.code == Code.SOURCE_HTTP and f"HTTP {status}" in exc.value.message
    assert server.requests == 2


def test_server_errors_are_retried_then_fail(server, guard) -> None:
    server.set_fault("status", status=500)
    with pytest.raises(SourceError) as exc:
        open_src(server, "/small.pt", guard, retries=2)
    assert exc.value.code == Code.SOURCE_HTTP and "HTTP 500" in exc.value.message
    assert server.requests == 6


def test_transient_server_error_recovers(server, guard, small_ckpt) -> None:
    server.set_fault("status", times=1, status=503)
    with open_src(server, "/small.pt", guard) as src:
        assert src.read_at(0, src.size) == small_ckpt
    assert server.requests == 3


def test_content_encoding_is_refused(server, guard) -> None:
    server.set_fault("gzip")
    with pytest.raises(SourceError) as exc:
        open_src(server, "/small.pt", guard)
    assert exc.value.code == Code.SOURCE_HTTP


def test_missing_file_is_404(server, guard) -> None:
    with pytest.raises(SourceError) as exc:
        open_src(server, "/nope.pt", guard)
    assert "HTTP 404" in exc.value.message


# --- redirects and SSRF ---------------------------------------------------------------

def test_redirect_keeps_range_and_drops_auth_on_other_hosts(server, small_ckpt) -> None:
    guard = UrlGuard(allowlist=("127.0.0.1",), resolver=lambda h, p: ["127.0.0.1"])
    server.set_fault("redirect", times=2, redirect_to=server.url("/small.pt", host="cdn.test"))
    server.fault_paths = {"/hub.pt"}
    server.files["/hub.pt"] = small_ckpt
    with HttpSource(server.url("/hub.pt"), guard=guard,
                    headers={"Authorization": "Bearer s3cret"}) as src:
        assert src.read_at(0, src.size) == small_ckpt
        assert src.round_trips == 2
    hub = [e for e in server.log if e.path == "/hub.pt"]
    cdn = [e for e in server.log if e.path == "/small.pt"]
    # head and tail go out concurrently; on a loaded machine one may start only after the
    # other's chain ended, and then goes straight to the reused target (one hub request)
    assert len(hub) in (1, 2) and len(cdn) == 2
    assert all(e.headers.get("Authorization") == "Bearer s3cret" for e in hub)
    assert all("Authorization" not in e.headers for e in cdn)
    assert sorted(e.range for e in cdn) == sorted(["bytes=0-65535", "bytes=-69632"])
    assert all(e.headers["Host"].startswith("cdn.test:") for e in cdn)


def test_redirect_target_is_reused_and_walked_again_when_it_expires(server, many_ckpt) -> None:
    guard = UrlGuard(allowlist=("127.0.0.1",))
    server.files["/hub.pt"] = many_ckpt
    server.files["/cdn.pt"] = many_ckpt
    server.set_fault("redirect", redirect_to=server.url("/cdn.pt"))
    server.fault_paths = {"/hub.pt"}
    with HttpSource(server.url("/hub.pt"), guard=guard, speculate=False, backoff=0.01) as src:
        n_hub = sum(e.path == "/hub.pt" for e in server.log)
        assert src.read_at(300_000, 10) == many_ckpt[300_000:300_010]
        assert sum(e.path == "/hub.pt" for e in server.log) == n_hub  # straight to the CDN
        del server.files["/cdn.pt"]          # the signed URL expired: 404
        server.files["/cdn2.pt"] = many_ckpt
        server.set_fault("redirect", redirect_to=server.url("/cdn2.pt"))
        assert src.read_at(400_000, 10) == many_ckpt[400_000:400_010]
        assert [e.path for e in server.log[-3:]] == ["/cdn.pt", "/hub.pt", "/cdn2.pt"]


@pytest.mark.parametrize("target", ["http://169.254.169.254/latest/meta-data/",
                                    "http://10.0.0.1/x.pt", "http://[::1]/x.pt",
                                    "file:///etc/passwd"])
def test_redirect_to_a_refused_address(server, guard, target) -> None:
    server.set_fault("redirect", redirect_to=target)
    with pytest.raises(SourceError) as exc:
        open_src(server, "/small.pt", guard)
    assert exc.value.code == Code.SOURCE_URL_REFUSED


def test_redirect_loop_is_bounded(server, guard) -> None:
    server.set_fault("redirect", redirect_to=server.url("/small.pt"))
    with pytest.raises(SourceError) as exc:
        open_src(server, "/small.pt", guard, max_redirects=3)
    assert "redirects" in exc.value.message
    assert server.requests == 8  # two concurrent requests x (1 + 3 hops)


def test_loopback_is_refused_without_allowlist(server) -> None:
    with pytest.raises(SourceError) as exc:
        HttpSource(server.url("/small.pt"), guard=UrlGuard())
    assert exc.value.code == Code.SOURCE_URL_REFUSED
    with pytest.raises(SourceError) as exc:
        HttpSource(server.url("/small.pt", host="localhost"), guard=UrlGuard())
    assert exc.value.code == Code.SOURCE_URL_REFUSED
    assert server.requests == 0


def test_connection_goes_to_the_checked_address(server, small_ckpt) -> None:
    # a name no real DNS knows: the request can only arrive if the pinned address is used
    guard = UrlGuard(allowlist=("127.0.0.1",), resolver=lambda h, p: ["127.0.0.1"])
    with HttpSource(server.url("/small.pt", host="pinned.test"), guard=guard) as src:
        assert src.read_at(0, 4) == small_ckpt[:4]
    assert server.log and all(e.headers["Host"].startswith("pinned.test:") for e in server.log)


def test_dns_rebinding_is_refused_at_connect_time(server) -> None:
    """First answer 127.0.0.1 (allowed), then 10.11.12.13: every new connection re-checks."""
    calls: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        return ["127.0.0.1"] if len(calls) == 1 else ["10.11.12.13"]

    guard = UrlGuard(allowlist=("127.0.0.1",), resolver=rebinding)
    url = server.url("/many.pt", host="rebind.test")
    with pytest.raises(SourceError) as exc:
        # open needs two concurrent connections: the second one is usually refused already;
        # if the pool reused the first, a dropped body forces a new connection on retry
        src = HttpSource(url, guard=guard, retries=1, backoff=0.01, speculate=False)
        server.set_fault("drop_mid_body")
        src.read_at(200_000, 5000)
    assert exc.value.code == Code.SOURCE_URL_REFUSED and "10.11.12.13" in exc.value.message
    assert len(calls) >= 2


def test_name_resolving_to_private_address_is_refused_at_connect(server) -> None:
    guard = UrlGuard(resolver=lambda h, p: ["10.11.12.13"])
    with pytest.raises(SourceError) as exc:
        HttpSource(server.url("/small.pt", host="inside.test"), guard=guard, retries=0)
    assert exc.value.code == Code.SOURCE_URL_REFUSED
    assert server.requests == 0


# --- pure helpers -----------------------------------------------------------------------

def test_span_cache_merges_and_reports_gaps() -> None:
    cache = SpanCache()
    cache.add(10, b"abcde")
    cache.add(20, b"XYZ")
    assert cache.missing(0, 30) == [(0, 10), (15, 20), (23, 30)]
    cache.add(14, b"EFGHIJ")       # bridges both spans
    assert len(cache) == 1
    assert cache.get(10, 23) == b"abcdEFGHIJXYZ"
    assert cache.missing(10, 23) == []
    assert cache.get(9, 12) is None


@settings(max_examples=300, deadline=None)
@given(kept=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 12)), max_size=6),
       spans=st.lists(st.tuples(st.integers(0, 70), st.integers(0, 12)), max_size=8),
       in_order=st.booleans())
def test_span_cache_touching_means_a_shared_byte(kept: list[tuple[int, int]],
                                                 spans: list[tuple[int, int]], in_order: bool) -> None:
    """`touching` (the local reader's quick pass; spans in file order take another way)
    against the byte sets themselves."""
    if in_order:
        spans = sorted(spans)
    cache = SpanCache()
    for off, n in kept:
        cache.add(off, bytes(n))
    held = {b for off, n in kept for b in range(off, off + n)}
    assert cache.touching(spans) == [bool(held & set(range(off, off + n))) for off, n in spans]


def test_coalesce() -> None:
    assert coalesce([(50, 60), (0, 10), (12, 20), (200, 210)], gap=5) == [(0, 20), (50, 60), (200, 210)]


# --- multi-range requests ----------------------------------------------------------------

@pytest.fixture
def spread(server):
    """A 2 MB file, and 40 small spans 50 KB apart (too far apart to coalesce)."""
    data = bytes(range(256)) * 8192
    server.files["/spread.bin"] = data
    return data, [(i * 50_000 + 7, 100 + i) for i in range(40)]


def test_many_far_spans_go_as_few_multi_range_requests(server, guard, spread) -> None:
    data, spans = spread
    with open_src(server, "/spread.bin", guard, speculate=False, head_bytes=16, tail_bytes=16,
                  coalesce_gap=1000) as src:
        n0, rt0 = src.stats.requests, src.round_trips
        assert src.read_many(spans) == [data[o:o + n] for o, n in spans]
        assert src.stats.requests - n0 == 4 and src.round_trips - rt0 == 1  # one per worker
        assert all(e.range and e.range.count(",") >= 9 for e in server.log[-4:])
        assert all(e.status == 206 for e in server.log[-4:])


def test_server_without_multi_range_falls_back_to_single_ranges(server, guard, spread) -> None:
    data, spans = spread
    with open_src(server, "/spread.bin", guard, speculate=False, head_bytes=16, tail_bytes=16,
                  coalesce_gap=1000) as src:
        server.set_fault("no_multirange")
        assert src.read_many(spans) == [data[o:o + n] for o, n in spans]
        assert src.stats.bytes_read < 20_000  # the 200 bodies were abandoned at once
        assert src.read_many([(o + 1000, 5) for o, _ in spans[:8]]) == [
            data[o + 1000:o + 1005] for o, _ in spans[:8]]
        assert not any("," in (e.range or "") for e in server.log[-8:])


def test_multi_range_with_shifted_parts_is_an_error(server, guard, spread) -> None:
    _, spans = spread
    with open_src(server, "/spread.bin", guard, speculate=False, head_bytes=16, tail_bytes=16,
                  coalesce_gap=1000) as src:
        server.set_fault("wrong_content_range")
        with pytest.raises(SourceError) as exc:
            src.read_many(spans)
        assert exc.value.code == Code.SOURCE_HTTP and "requested ranges" in exc.value.message


def test_multi_range_cut_mid_body_is_retried(server, guard, spread) -> None:
    data, spans = spread
    with open_src(server, "/spread.bin", guard, speculate=False, head_bytes=16, tail_bytes=16,
                  coalesce_gap=1000) as src:
        server.set_fault("drop_mid_body", times=2)
        assert src.read_many(spans) == [data[o:o + n] for o, n in spans]


def test_parse_byteranges_accepts_merged_parts_and_rejects_strangers() -> None:
    from ckptguard.core.io.byteranges import parse_byteranges

    body = (b"\r\n--B\r\nContent-Type: x\r\nContent-Range: bytes 0-9/100\r\n\r\n" + b"a" * 10 +
            b"\r\n--B\r\nContent-Range: bytes 50-59/100\r\n\r\n" + b"b" * 10 + b"\r\n--B--\r\n")
    parts, complete = parse_byteranges(body, b"B", 100, {0, 5, 50}, {5, 10, 60})
    assert complete and parts == [(0, b"a" * 10), (50, b"b" * 10)]
    parts, complete = parse_byteranges(body[:-9], b"B", 100, {0, 5, 50}, {5, 10, 60})
    assert not complete and parts == [(0, b"a" * 10), (50, b"b" * 10)]
    with pytest.raises(SourceError):
        parse_byteranges(body, b"B", 100, {1, 50}, {10, 60})
    with pytest.raises(SourceError) as exc:
        parse_byteranges(body, b"B", 101, {0, 50}, {10, 60})
    assert exc.value.code == Code.SOURCE_CHANGED
