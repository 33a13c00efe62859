"""`ckptguard` command line: scan, get, codes, serve, worker. The only module that prints.

    ckptguard scan TARGET... [--format text|json|jsonl|sarif] [-o FILE] [-q] [-j N]
    ckptguard get PATH|URL TENSOR_NAME -o out.npy
    ckptguard serve [--host H] [--port P] [--api-only]
    ckptguard worker

A TARGET is a file, a folder (files chosen by content), a quoted glob, an http(s) URL or
`hf://[datasets/]owner/name[@revision][/path]`. Expansion lives in app/targets.py, the
parallel sandboxed run in app/runner.py, the output formats in app/render.py and
app/sarif.py, the exit status in app/exit_codes.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence

from ckptguard.app.exit_codes import (
    EXIT_BROKEN_PIPE,
    EXIT_BY_OUTCOME,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    FAIL_ON,
    HELP,
    exit_status,
)
from ckptguard.app.targets import UsageError
from ckptguard.core import __version__
from ckptguard.core.errors import SourceError

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import IO, Any, NoReturn

EXIT_UNREADABLE = EXIT_BY_OUTCOME["unreadable"]

SCAN_EXAMPLES = """examples:
  ckptguard scan model.pt                         one file: a summary, exit 0 if safe
  ckptguard scan ~/.cache/huggingface/hub/models--org--name/snapshots -j 4
  ckptguard scan 'ckpts/**/*.bin' hf://org/name@v1.0 --format sarif -o ckptguard.sarif"""


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on a usage error, which is `unsafe` here: raise ours instead (64).
    Its formatter is _Formatter unless one is given."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(**kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def parse_headers(values: Sequence[str] | None) -> dict[str, str]:
    """`--header 'Name: value'` -> {Name: value}; anything else is a usage error."""
    headers: dict[str, str] = {}
    for value in values or ():
        name, sep, content = value.partition(":")
        if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
            raise UsageError(f"--header {value!r}: expected 'Name: value'")
        headers[name.strip()] = content.strip()
    return headers


def _cmd_scan(args: argparse.Namespace) -> int:
    from ckptguard.app import progress as progress_display
    from ckptguard.app.runner import RunLimits, run
    from ckptguard.app.targets import expand, is_url

    headers = parse_headers(args.header)
    if args.json:
        args.format = "json"
    if args.jobs < 1:
        raise UsageError("-j/--jobs: must be at least 1")
    output = _open_output(args.output)
    try:
        expansion = expand(args.target, headers=headers,
                           skip_named_non_checkpoints=args.skip_non_checkpoints)
        items = expansion.items
        remote = any(is_url(i.url or "") for i in items)
        bar = (progress_display.Progress(len(items))
               if progress_display.wanted(quiet=args.quiet, disabled=args.no_progress,
                                          items=len(items), remote=remote) else None)
        try:
            results = run(items, RunLimits(jobs=args.jobs, memory_mb=args.memory_mb,
                                           cpu_seconds=args.cpu_seconds, timeout_s=args.timeout),
                          allow=frozenset(args.allow or ()), verify_crc=args.verify_crc,
                          on_result=bar.update if bar is not None else None,
                          rows=args.format != "text")
        finally:
            if bar is not None:
                bar.close()
        many = expansion.many or len(items) != 1
        for result in results:   # errors reach stderr in every format, -q included
            if result.unreadable:
                print(f"ckptguard: {result.report['findings'][0]['message']}", file=sys.stderr)
        if output is not None or not args.quiet:
            _write(output or sys.stdout, _render(args.format, results, many=many))
    finally:
        if output is not None:
            output.close()
    return exit_status((r.outcome for r in results if r.skipped is None), args.fail_on)


def _open_output(path: str | None) -> IO[str] | None:
    if path is None or path == "-":
        return None
    try:
        return open(path, "w", encoding="utf-8")   # closed by _cmd_scan
    except OSError as exc:
        raise UsageError(f"-o {path}: {exc.strerror}") from exc


def _render(fmt: str, results: list[Any], *, many: bool) -> Iterator[str]:
    from ckptguard.app import render

    reports = [r.report for r in results if r.skipped is None]
    if fmt == "json":
        if many:
            return render.json_list(reports)
        return render.json_lines(reports[0]) if reports else iter(["null\n"])
    if fmt == "jsonl":
        return render.jsonl(reports)
    if fmt == "sarif":
        import json

        from ckptguard.app.sarif import sarif_log

        return iter([json.dumps(sarif_log(results), indent=1) + "\n"])
    return render.text(results, many=many)


def _write(stream: IO[str], chunks: Iterator[str]) -> None:
    for chunk in chunks:
        stream.write(chunk)
    stream.flush()


def _cmd_get(args: argparse.Namespace) -> int:
    """Read one tensor (one ranged read) into a .npy file; never unpickles."""
    import numpy as np

    from ckptguard.core.loader import TensorUnreadable, open_checkpoint

    headers = parse_headers(args.header)
    try:
        with open_checkpoint(args.target, headers=headers) as ckpt:
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
    from ckptguard.core.errors import UNSAFE_EVIDENCE, Code

    rows = ["| code | severity | verdict effect | meaning |", "|---|---|---|---|"]
    rows += [f"| `{c.value}` | {c.severity} | {c.effect} | {c.doc} |" for c in Code]
    rows += ["", "A code is `unsafe` only with evidence that two readers people really use would "
             "read different bytes or run different code; a layout other writers produce (another "
             "zip tool's extra fields, padding, order, a CRC or flag no reader decodes by, "
             "duplicates with the same bytes) is a note, not evidence. A code is `critical` when "
             "that evidence alone shows a reader people use running a known-dangerous callable, or "
             "reading other bytes or names than torch reads; an `unsafe` code of `high` severity "
             "marks a construct no honest writer produces and whose effect depends on what else "
             "the file holds. Per `unsafe` code, its severity and the readers that disagree (the "
             "rule it is judged by):", ""]
    rows += [f"- `{c.value}` ({c.severity}): {why}." for c, why in UNSAFE_EVIDENCE.items()]
    return "\n".join(rows) + "\n"


def _cmd_codes(args: argparse.Namespace) -> int:
    sys.stdout.write(codes_markdown())
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from ckptguard.app.main import serve

    serve(host=args.host, port=args.port, api_only=args.api_only)
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    from ckptguard.app.main import work

    work()
    return 0


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, its width read without `shutil`: argparse makes a formatter for
    every argument it adds, and `shutil` (which imports bz2 and lzma) was ~1.5 ms of a small
    file's whole-process scan. The width is what `shutil.get_terminal_size` gives."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        if width is None:
            width = _terminal_columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)


class _RawFormatter(_Formatter, argparse.RawDescriptionHelpFormatter):
    """The same, keeping the line breaks of a description or epilog (the examples)."""


def _terminal_columns() -> int:
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def _add_scan(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    scan = sub.add_parser(
        "scan", parents=parents, help="scan files, folders, globs, URLs or hf:// repositories",
        description="Judge checkpoints without executing them. Folders are searched recursively "
                    "and files chosen by content (never by extension).",
        formatter_class=_RawFormatter, epilog=f"{HELP}\n\n{SCAN_EXAMPLES}")
    scan.add_argument("target", nargs="+",
                      help="file, folder, quoted glob, http(s) URL, or hf://[datasets/]owner/name[@rev][/path]")
    scan.add_argument("--format", choices=("text", "json", "jsonl", "sarif"), default="text",
                      help="text (default; a table for several files), json (one object for one "
                           "file or URL, else a list), jsonl (a report per line), sarif (2.1.0)")
    scan.add_argument("--json", action="store_true", help="same as --format json")
    scan.add_argument("-o", "--output", metavar="FILE", help="write the output here instead of stdout")
    scan.add_argument("-q", "--quiet", action="store_true",
                      help="print nothing but errors (the exit status still tells)")
    scan.add_argument("--fail-on", choices=tuple(FAIL_ON), default="suspicious",
                      help="least severe outcome that fails the run (default: suspicious, "
                           "i.e. anything not safe)")
    scan.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, metavar="N",
                      help="scan worker processes (default: the machine's cores)")
    scan.add_argument("--memory-mb", type=int, default=2048, metavar="MB",
                      help="address-space limit of each scan worker (default 2048)")
    scan.add_argument("--cpu-seconds", type=int, default=120, metavar="S",
                      help="CPU-time limit per scanned file (default 120)")
    scan.add_argument("--timeout", type=float, default=300.0, metavar="S",
                      help="wall-clock limit per scanned file (default 300)")
    scan.add_argument("--no-progress", action="store_true", help="never show the progress display")
    scan.add_argument("--skip-non-checkpoints", action="store_true",
                      help="sniff files named directly too, and skip those that are no checkpoint "
                           "(as in a folder; the pre-commit hook uses it)")
    scan.add_argument("--allow", action="append", metavar="module.name",
                      help="treat this global as allowlisted (like torch.serialization.add_safe_globals)")
    scan.add_argument("--verify-crc", action="store_true",
                      help="also read every zip record to check its CRC-32 (torch never does)")
    scan.add_argument("--header", action="append", metavar="NAME:VALUE",
                      help="extra HTTP header for URL targets (e.g. Authorization)")
    scan.set_defaults(func=_cmd_scan)


def _add_get(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    get = sub.add_parser("get", parents=parents,
                         help="read one tensor into a .npy file (local path or URL)")
    get.add_argument("target", help="local path or http(s) URL")
    get.add_argument("tensor", help="tensor name as in the report (e.g. layer.0.weight)")
    get.add_argument("-o", "--output", required=True, help="output .npy path")
    get.add_argument("--header", action="append", metavar="NAME:VALUE",
                     help="extra HTTP header for URL targets (e.g. Authorization)")
    get.set_defaults(func=_cmd_get)


def _add_codes(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    codes = sub.add_parser("codes", parents=parents,
                           help="print the table of finding codes (markdown)")
    codes.set_defaults(func=_cmd_codes)


def _add_serve(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve", parents=parents,
                           help="start the HTTP service",
                           description="Start the HTTP service. Everything else is configured by "
                                       "CKPTGUARD_* environment variables (README, Configuration).")
    serve.add_argument("--host", default=None,
                       help="address to bind (default: CKPTGUARD_HOST, 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None,
                       help="port to bind (default: CKPTGUARD_PORT, 8000)")
    serve.add_argument("--api-only", action="store_true",
                       help="serve HTTP and queue jobs, run none: hub revisions and ?async=true URL "
                            "scans go to `ckptguard worker` processes (uploads are still scanned here)")
    serve.set_defaults(func=_cmd_serve)


def _add_worker(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    worker = sub.add_parser(
        "worker", parents=parents,
        help="run hub jobs and asynchronous URL scans (no HTTP)",
        description="Run the job tier's jobs with the sandboxed scan pool until SIGTERM, which "
                    "finishes the running jobs or hands them back. On PostgreSQL any number of "
                    "workers may run on any host that reaches the database and the hub (README, "
                    "Scaling out); on SQLite, on the host of the database file. Configured by "
                    "CKPTGUARD_* environment variables like `serve`.")
    worker.set_defaults(func=_cmd_worker)


def _command(argv: Sequence[str]) -> str | None:
    """The command `argv` runs, if only the top level's `--debug` or `--version` (which take
    no value) come before it; None if anything else does (`-h`, `--he`, `--`, a typo), as
    the top level then answers with every command."""
    for word in argv:
        if word not in ("--debug", "--version"):
            return word if word in COMMANDS else None
    return None


COMMANDS = {"scan": _add_scan, "get": _add_get, "codes": _add_codes, "serve": _add_serve,
            "worker": _add_worker}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or only of the command `argv` runs: the others cannot
    parse it, and building them was ~2 ms of a small file's whole-process scan. Without a
    known command (`--help`, a typo) every command is there, to be listed."""
    command = _command(argv or ())
    parser = _Parser(prog="ckptguard", description=__doc__.splitlines()[0],
                     formatter_class=_RawFormatter, epilog=f"{HELP}\n\n{SCAN_EXAMPLES}")
    parser.add_argument("--version", action="version", version=f"ckptguard {__version__}")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an internal error")
    sub = parser.add_subparsers(dest="command", required=True)
    # --debug after the subcommand too; SUPPRESS so the subcommand's default cannot undo
    # a --debug given before it
    debug = _Parser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="print the traceback of an internal error")
    for name, add in COMMANDS.items():
        if command not in COMMANDS or name == command:
            add(sub, [debug])
    return parser


# ckptguard never multiplies matrices, but numpy's OpenBLAS starts a thread per core when
# numpy is imported: ~80 ms of a one-file scan here, and of each pool worker's start. One
# thread, unless the user's environment says otherwise (set before any scan imports numpy).
BLAS_THREADS = {"OPENBLAS_NUM_THREADS": "1"}


def main(argv: Sequence[str] | None = None) -> int:
    for name, value in BLAS_THREADS.items():
        os.environ.setdefault(name, value)
    args: argparse.Namespace | None = None
    try:
        words = sys.argv[1:] if argv is None else argv
        args = build_parser(words).parse_args(words)
        code: int = args.func(args)
    except UsageError as exc:
        print(f"{exc}\nTry 'ckptguard --help'.", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:   # `ckptguard scan x --json | head`: the reader left, not an error
        # Python would report it again when flushing stdout at exit: point stdout at nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("ckptguard: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        debug = bool(getattr(args, "debug", False)) or "--debug" in (sys.argv if argv is None else argv)
        if debug:
            import traceback  # only for an internal error: ~4 ms of every start otherwise

            traceback.print_exc()
        print(f"ckptguard: internal error: {type(exc).__name__}: {exc}"
              + ("" if debug else " (run with --debug for the traceback)"), file=sys.stderr)
        return EXIT_INTERNAL
    return code


if __name__ == "__main__":
    raise SystemExit(main())
