"""Command-line targets -> the files to scan: paths, folders, quoted globs, URLs, `hf://` repos.

Strategy: expansion only names files; it reads no checkpoint bytes. Files found by walking
(a folder, a glob, a hub repository) are marked `from_listing`: the scan step sniffs their
first bytes and skips what cannot hold pickles or tensors, so a folder is chosen by content,
never by extension. A target named directly is always scanned.
- Folders: `os.walk(followlinks=False)` in sorted order. A symlink to a file is followed and
  reported under the link's name (a Hugging Face cache snapshot is a folder of links into
  `../../blobs/`); a symlink to a folder is never entered, so the walk cannot leave the tree
  or loop. Only regular files are opened (a FIFO would block the scan).
- `hf://[datasets/]owner/name[@revision][/path]`: a branch or tag is pinned to its commit
  first (every file is read at one commit), then listed with app/hub/client.py's HubClient,
  the same listing, URLs and Range reads as the service's webhook.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat

from ckptguard.core.errors import Code, SourceError
from ckptguard.core.records import field, record

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Literal

HF_SCHEME = "hf://"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
_GLOB_CHARS = re.compile(r"[*?\[]")
_COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")


class UsageError(Exception):
    """A target the command line cannot even interpret (exit 64, not a verdict)."""


@record(frozen=True, slots=True)
class ScanItem:
    """One file to scan. `name` is what reports and outputs call it."""

    name: str
    kind: Literal["file", "url", "hub"]
    path: str | None = None                # local file (a link is opened through the link)
    url: str | None = None
    headers: dict[str, str] | None = None  # sent with URL reads (hub token, --header)
    from_listing: bool = False             # found by a walk: skip it if it is no checkpoint
    sha256: str | None = None              # the hub's LFS sha256, when listed
    error: SourceError | None = None       # could not even be listed/opened: unreadable


@record(slots=True)
class Expansion:
    """The items of all targets, in the order given; `many` when the answer is a list."""

    items: list[ScanItem] = field(default_factory=list)
    many: bool = False


@record(frozen=True, slots=True)
class HubTarget:
    repo_type: Literal["model", "dataset"]
    repo: str
    revision: str
    path: str          # "" = the whole repository; else a file or a folder in it


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def parse_hf(target: str) -> HubTarget:
    """`hf://[datasets/]owner/name[@revision][/path]`; a revision with `/` is written `%2F`
    (`hf://owner/name@refs%2Fpr%2F3`), as huggingface_hub's file system spells it."""
    rest = target[len(HF_SCHEME):]
    repo_type: Literal["model", "dataset"] = "model"
    if rest.startswith("datasets/"):
        repo_type, rest = "dataset", rest[len("datasets/"):]
    elif rest.startswith("models/"):
        rest = rest[len("models/"):]
    parts = rest.split("/")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise UsageError(f"{target}: expected hf://[datasets/]owner/name[@revision][/path]")
    owner, name_rev, path_parts = parts[0], parts[1], parts[2:]
    name, _, revision = name_rev.partition("@")
    if not name or (("@" in name_rev) and not revision):
        raise UsageError(f"{target}: expected hf://[datasets/]owner/name[@revision][/path]")
    from urllib.parse import unquote  # hf:// only: a local scan does not load urllib (or ipaddress)

    return HubTarget(repo_type, f"{owner}/{name}", unquote(revision) or "main",
                     "/".join(p for p in path_parts if p))


def hf_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or DEFAULT_HF_ENDPOINT


def hf_token() -> str | None:
    """HF_TOKEN (or its old name), else the token file huggingface_hub writes
    (HF_TOKEN_PATH, $HF_HOME/token, ~/.cache/huggingface/token)."""
    token = (os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or "").strip()
    if token:
        return token
    token_path = os.environ.get("HF_TOKEN_PATH")
    if not token_path:
        hf_home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
        token_path = os.path.join(hf_home, "token")
    from pathlib import Path  # hf:// only: a local scan does not load pathlib

    try:
        return Path(token_path).read_text().strip() or None
    except OSError:
        return None


def expand(targets: list[str], *, headers: dict[str, str] | None = None,
           skip_named_non_checkpoints: bool = False) -> Expansion:
    """Every target's files, in the order given (a folder's in sorted path order).
    `skip_named_non_checkpoints`: files named directly are sniffed like a folder's (a
    pre-commit hook is handed every changed file, READMEs included)."""
    out = Expansion(many=len(targets) > 1)
    for target in targets:
        if target.startswith(HF_SCHEME):
            out.many = True
            out.items.extend(expand_hub(parse_hf(target)))
        elif is_url(target):
            out.items.append(ScanItem(name=target, kind="url", url=target, headers=headers or None))
        elif "://" in target:
            raise UsageError(f"{target}: only local paths, http(s):// and hf:// targets are supported")
        else:
            out.many = _expand_local(target, out.items, skip_named_non_checkpoints) or out.many
    return out


def _expand_local(target: str, items: list[ScanItem], sniff_named: bool = False) -> bool:
    """Append a path's items; True when the target is one that can hold several files."""
    if not os.path.lexists(target) and _GLOB_CHARS.search(target):
        matches = glob_files(target)
        if not matches:
            items.append(_unreadable(target, "no file matches this pattern"))
        matched: list[ScanItem] = []
        for match in matches:
            _expand_path(match, matched, from_listing=True)
        # a folder and the files in it can both match (`models/**`): each file once
        items.extend({item.name: item for item in matched}.values())
        return True
    return _expand_path(target, items, from_listing=sniff_named)


def glob_files(pattern: str) -> list[str]:
    """The paths a quoted glob names (`*`, `?`, `[...]` within a segment, `**` across
    segments), sorted. Not glob.glob: its `**` follows links to folders, so one link to
    `..` makes it list the tree again at every level until ELOOP."""
    parts = pattern.split("/")
    fixed = next(i for i, part in enumerate(parts) if _GLOB_CHARS.search(part))
    base = "/".join(parts[:fixed]) or ("/" if pattern.startswith("/") else ".")
    wanted = parts[fixed:]
    found: list[str] = []
    if not os.path.isdir(base):
        return found
    for folder, dirs, files in os.walk(base, followlinks=False):
        dirs.sort()
        rel = os.path.relpath(folder, base)
        rel_parts = [] if rel == "." else rel.split(os.sep)
        for name in sorted(files) + [d for d in dirs if not os.path.islink(os.path.join(folder, d))]:
            if _segments_match(wanted, [*rel_parts, name]):
                found.append(os.path.join(folder, name) if base != "." or pattern.startswith("./")
                             else os.path.join(*rel_parts, name))
    return sorted(set(found))


def _segments_match(pattern: list[str], path: list[str]) -> bool:
    if not pattern:
        return not path
    head = pattern[0]
    if head == "**":
        return any(_segments_match(pattern[1:], path[i:]) for i in range(len(path) + 1))
    if not path or (path[0].startswith(".") and not head.startswith(".")):   # as glob: no hidden
        return False
    return fnmatch.fnmatchcase(path[0], head) and _segments_match(pattern[1:], path[1:])


def _expand_path(path: str, items: list[ScanItem], *, from_listing: bool) -> bool:
    try:
        st = os.stat(path)   # follows a link: a link to a file is that file
    except OSError as exc:
        items.append(_unreadable(path, exc.strerror or str(exc)))
        return False
    if stat.S_ISDIR(st.st_mode):
        if from_listing and os.path.islink(path):
            return True   # a glob match that links to a folder: not followed, as in a walk
        _walk(path, items)
        return True
    if stat.S_ISREG(st.st_mode):
        items.append(ScanItem(name=path, kind="file", path=path, from_listing=from_listing))
    else:
        items.append(_unreadable(path, "not a regular file"))
    return False


def _walk(root: str, items: list[ScanItem]) -> None:
    """Every regular file under `root`, in sorted path order (the same order on every run)."""
    found: list[ScanItem] = []
    # followlinks=False: links to folders are listed in `dirs` but never entered, so the
    # walk stays in the tree and cannot loop; links to files come in `files`.
    for folder, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except OSError as exc:   # a dangling link: a file of the model that is missing
                found.append(_unreadable(path, exc.strerror or str(exc)))
                continue
            if stat.S_ISREG(st.st_mode):
                found.append(ScanItem(name=path, kind="file", path=path, from_listing=True))
    items.extend(sorted(found, key=lambda item: item.name.split(os.sep)))


def _unreadable(name: str, why: str) -> ScanItem:
    return ScanItem(name=name, kind="file", path=name,
                    error=SourceError(Code.SOURCE_IO, f"cannot read {name}: {why}"))


def expand_hub(target: HubTarget) -> list[ScanItem]:
    """The files of a hub target, pinned to one commit. A listing failure is one
    unreadable item (the target still gets a report saying what happened)."""
    from ckptguard.app.hub.client import HubClient

    display = f"{HF_SCHEME}{'datasets/' if target.repo_type == 'dataset' else ''}{target.repo}"
    client = HubClient(hf_endpoint(), token=hf_token())
    try:
        sha = (target.revision if _COMMIT_SHA.match(target.revision)
               else client.head_sha(target.repo_type, target.repo, target.revision))
        listing = client.list_tree(target.repo_type, target.repo, sha)
    except SourceError as exc:
        where = f"{display}@{target.revision}"
        return [ScanItem(name=where, kind="hub", error=SourceError(exc.code, f"{where}: {exc.message}"))]
    finally:
        client.close()
    prefix = target.path.rstrip("/")
    chosen = [f for f in listing
              if not prefix or f.path == prefix or f.path.startswith(prefix + "/")]
    if not chosen:
        where = f"{display}@{target.revision}/{prefix}"
        return [ScanItem(name=where, kind="hub",
                         error=SourceError(Code.SOURCE_IO, f"{where}: no such file in the repository"))]
    headers = {"Authorization": f"Bearer {client.token}"} if client.token else None
    return [ScanItem(name=f"{display}@{sha}/{f.path}", kind="hub",
                     url=client.resolve_url(target.repo_type, target.repo, sha, f.path),
                     headers=headers, sha256=f.lfs_sha256,
                     from_listing=not (prefix and f.path == prefix))
            for f in sorted(chosen, key=lambda f: f.path)]
