"""`ckptguard` command line: scan, serve, get. The only module that prints.

    ckptguard scan PATH|URL [--json] [--allow module.name ...]
    ckptguard serve [--host H] [--port P]
    ckptguard get PATH|URL TENSOR_NAME -o out.npy

Exit status of `scan`: 0 safe, 1 suspicious, 2 unsafe, 3 invalid, 4 could not read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from ckptguard.core import __version__
from ckptguard.core.errors import SourceError
from ckptguard.core.report import Report
from ckptguard.core.state import ScanOptions

EXIT_BY_VERDICT = {"safe": 0, "suspicious": 1, "unsafe": 2, "invalid": 3}
EXIT_UNREADABLE = 4
EXIT_BROKEN_PIPE = 141     # 128 + SIGPIPE, what a shell reports for a killed writer


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def scan_target(target: str, options: ScanOptions, headers: dict[str, str] | None = None) -> Report:
    """Scan a local path or an http(s) URL (read with Range requests)."""
    if is_url(target):
        from ckptguard.core.io.http import HttpSource
        from ckptguard.core.report import SourceInfo
        from ckptguard.core.scan import scan_source

        with HttpSource(target, headers=headers) as source:
            info = SourceInfo(kind="url", name=target.rsplit("/", 1)[-1], url=target,
                              size=source.size)
            return scan_source(source, options=options, info=info)
    from ckptguard.core.scan import scan_path

    return scan_path(target, options=options)


def _cmd_scan(args: argparse.Namespace) -> int:
    options = ScanOptions(allow=frozenset(args.allow or ()), verify_crc=args.verify_crc)
    headers = dict(h.split(":", 1) for h in args.header or ())
    try:
        report = scan_target(args.target, options, {k.strip(): v.strip() for k, v in headers.items()})
    except SourceError as exc:
        print(f"ckptguard: cannot read {args.target}: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    if args.json:
        for chunk in json_lines(report.to_json()):
            sys.stdout.write(chunk)
    else:
        sys.stdout.write(format_summary(report.to_json()))
    return EXIT_BY_VERDICT[report.verdict]


def json_lines(report: dict[str, Any]) -> Iterator[str]:
    """The report as JSON, one top-level field and one list item (tensor, storage, global,
    finding) per line. json's indenting encoder is pure Python; this way the C encoder
    writes each line, so a 1M-tensor report prints in seconds, not minutes."""
    yield "{\n"
    for i, (key, value) in enumerate(report.items()):
        sep = "," if i < len(report) - 1 else ""
        if isinstance(value, list) and value:
            yield f"  {json.dumps(key)}: [\n"
            last = len(value) - 1
            for j, item in enumerate(value):
                yield f"    {json.dumps(item)}{',' if j < last else ''}\n"
            yield f"  ]{sep}\n"
        else:
            yield f"  {json.dumps(key)}: {json.dumps(value)}{sep}\n"
    yield "}\n"


def format_summary(r: dict[str, Any]) -> str:
    """A readable summary of a report for terminals."""
    wo = r["weights_only"]
    lines = [
        f"{r['source'].get('name') or r['source'].get('url')}: {r['verdict'].upper()} "
        f"({r['format']}, {len(r['tensors'])} tensors, {len(r['storages'])} storages)",
        f"  weights_only load: {'yes' if wo['loadable'] else 'no'}"
        + (f" — {wo['error_type']}: {wo['error']}" if wo["error"] else ""),
    ]
    flagged = [g for g in r["globals"] if g["status"] != "allowed"]
    if flagged:
        lines.append("  globals outside the allowlist:")
        lines += [f"    {g['status']:<9} {g['module']}.{g['name']} (x{g['count']})" for g in flagged]
    if r["findings"]:
        lines.append("  findings:")
        for f in r["findings"][:50]:
            where = f" @{f['offset']}" if f["offset"] is not None else ""
            lines.append(f"    [{f['severity']}] {f['code']}{where}: {f['message'][:160]}")
        if len(r["findings"]) > 50:
            lines.append(f"    ... {len(r['findings']) - 50} more (use --json)")
    if wo.get("safe_globals_hint"):
        lines.append(f"  if you trust these globals: {wo['safe_globals_hint']}")
    lines.append(f"  read {r['io']['bytes_read']} bytes in {r['io']['requests']} requests, "
                 f"{r['timings_ms']['total']:.1f} ms")
    return "\n".join(lines) + "\n"


def _cmd_get(args: argparse.Namespace) -> int:
    """Read one tensor (one ranged read) into a .npy file; never unpickles."""
    import numpy as np

    from ckptguard.core.loader import TensorUnreadable, open_checkpoint

    headers = dict(h.split(":", 1) for h in args.header or ())
    try:
        with open_checkpoint(args.target, headers={k.strip(): v.strip() for k, v in headers.items()}
                             ) as ckpt:
            array = ckpt.read_tensor(args.tensor)
    except SourceError as exc:
        print(f"ckptguard: cannot read {args.target}: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    except (KeyError, TensorUnreadable) as exc:
        print(f"ckptguard: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 1
    np.save(args.output, array, allow_pickle=False)
    print(f"{args.tensor}: {array.dtype} {list(array.shape)} -> {args.output}")
    return 0


def codes_markdown() -> str:
    """The README's table of finding codes, generated from `core.errors.Code`."""
    from ckptguard.core.errors import Code

    rows = ["| code | severity | verdict effect | meaning |", "|---|---|---|---|"]
    rows += [f"| `{c.value}` | {c.severity} | {c.effect} | {c.doc} |" for c in Code]
    return "\n".join(rows) + "\n"


def _cmd_codes(args: argparse.Namespace) -> int:
    sys.stdout.write(codes_markdown())
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from ckptguard.app.main import serve

    serve(host=args.host, port=args.port)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ckptguard", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"ckptguard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    scan = sub.add_parser("scan", help="scan a checkpoint file or URL")
    scan.add_argument("target", help="local path or http(s) URL")
    scan.add_argument("--json", action="store_true", help="print the JSON report")
    scan.add_argument("--allow", action="append", metavar="module.name",
                      help="treat this global as allowlisted (like torch.serialization.add_safe_globals)")
    scan.add_argument("--verify-crc", action="store_true",
                      help="also read every zip record to check its CRC-32 (torch never does)")
    scan.add_argument("--header", action="append", metavar="NAME:VALUE",
                      help="extra HTTP header for URL targets (e.g. Authorization)")
    scan.set_defaults(func=_cmd_scan)

    get = sub.add_parser("get", help="read one tensor into a .npy file (local path or URL)")
    get.add_argument("target", help="local path or http(s) URL")
    get.add_argument("tensor", help="tensor name as in the report (e.g. layer.0.weight)")
    get.add_argument("-o", "--output", required=True, help="output .npy path")
    get.add_argument("--header", action="append", metavar="NAME:VALUE",
                     help="extra HTTP header for URL targets (e.g. Authorization)")
    get.set_defaults(func=_cmd_get)

    codes = sub.add_parser("codes", help="print the table of finding codes (markdown)")
    codes.set_defaults(func=_cmd_codes)

    serve = sub.add_parser("serve", help="start the HTTP service")
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None)
    serve.set_defaults(func=_cmd_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except BrokenPipeError:   # `ckptguard scan x --json | head`: the reader left, not an error
        # Python would report it again when flushing stdout at exit: point stdout at nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


if __name__ == "__main__":
    raise SystemExit(main())
