"""The exit status of `ckptguard scan`: the most severe outcome over all files, by severity.

unsafe (2) > invalid (3) > unreadable (4) > suspicious (1) > safe (0): the order is the
danger, not the number, so one unreadable file never hides an attack in another.
`--fail-on` chooses the least severe outcome that fails the run; less severe ones exit 0.
Codes that are no verdict: 64 usage (sysexits EX_USAGE), 70 internal error (EX_SOFTWARE),
130 interrupted, 141 the reader of the output left (128 + SIGPIPE).
"""

from __future__ import annotations

from collections.abc import Iterable

EXIT_BY_OUTCOME = {"safe": 0, "suspicious": 1, "unsafe": 2, "invalid": 3, "unreadable": 4}
SEVERITY = {"safe": 0, "suspicious": 1, "unreadable": 2, "invalid": 3, "unsafe": 4}
EXIT_USAGE = 64
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

# --fail-on X fails the run on X and on everything more severe. `invalid` includes
# `unreadable`: a file that could not be judged is a gap, and a gap must not pass a build
# that asked to fail on files that cannot be judged.
FAIL_ON = {"unsafe": SEVERITY["unsafe"], "invalid": SEVERITY["unreadable"],
           "suspicious": SEVERITY["suspicious"]}

HELP = """exit status (the most severe outcome over all files, not the largest number):
  2  unsafe       evidence of code execution or of an attack on scanners
  3  invalid      cannot be parsed, or the scan hit its memory/CPU/time limit
  4  unreadable   could not be read (missing file, HTTP error)
  1  suspicious   not weights-only loadable, or structural anomalies
  0  safe         torch.load(weights_only=True) accepts it and nothing is anomalous
     (severity order: unsafe > invalid > unreadable > suspicious > safe;
      --fail-on unsafe|invalid|suspicious sets the least severe that fails, default suspicious)
 64  usage error   70  internal error (--debug shows the traceback)   141  output reader left"""


def worst(outcomes: Iterable[str]) -> str:
    return max(outcomes, key=SEVERITY.__getitem__, default="safe")


def exit_status(outcomes: Iterable[str], fail_on: str = "suspicious") -> int:
    """The exit code of the most severe outcome, or 0 if it is below `fail_on`."""
    top = worst(outcomes)
    return EXIT_BY_OUTCOME[top] if SEVERITY[top] >= FAIL_ON[fail_on] else 0
