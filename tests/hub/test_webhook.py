"""app/hub/webhook.py: the secret check and the payload parser (examples + a property test)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptguard.app.hub.webhook import Target, check_secret, parse_event, valid_repo
from ckptguard.app.problems import AppError
from tests.hub.conftest import payload

SHA = "c3" * 20


def status_of(fn: Any, *args: Any) -> int | None:
    try:
        fn(*args)
    except AppError as exc:
        return exc.status
    return None


def test_secret() -> None:
    assert status_of(check_secret, "s", "s") is None
    assert status_of(check_secret, "s", None) == 401
    assert status_of(check_secret, "s", "") == 401
    assert status_of(check_secret, "s", "t") == 403
    assert status_of(check_secret, "s", "s ") == 403          # verbatim, no trimming
    assert status_of(check_secret, None, "s") == 503         # no secret configured: webhook off
    assert status_of(check_secret, "sé", "sé") is None        # non-ASCII secrets compare as bytes


def test_content_event_gives_each_updated_ref() -> None:
    body = payload(SHA)
    body["updatedRefs"] = [{"ref": "refs/heads/main", "oldSha": "0" * 40, "newSha": SHA},
                           {"ref": "refs/pr/3", "oldSha": None, "newSha": "d4" * 20},
                           {"ref": "refs/tags/old", "oldSha": SHA, "newSha": None}]   # deleted ref
    targets, ignored = parse_event(body)
    assert ignored is None
    assert targets == [Target("model", "acme/tiny-model", "refs/heads/main", SHA),
                       Target("model", "acme/tiny-model", "refs/pr/3", "d4" * 20)]


def test_head_sha_without_updated_refs() -> None:
    body = payload(SHA, kind="dataset")
    del body["updatedRefs"]
    assert parse_event(body) == ([Target("dataset", "acme/tiny-model", "refs/heads/main", SHA)], None)


@pytest.mark.parametrize(("change", "reason"), [
    ({"scope": "discussion"}, "scope"),
    ({"scope": "repo"}, "scope"),
    ({"scope": "repo.config"}, "scope"),
    ({"action": "delete"}, "action"),
    ({"kind": "space"}, "repo type"),
])
def test_other_events_are_acknowledged_without_work(change: dict[str, str], reason: str) -> None:
    body = payload(SHA, kind=change.get("kind", "model"))
    body["event"].update({k: v for k, v in change.items() if k != "kind"})
    targets, ignored = parse_event(body)
    assert targets == [] and ignored is not None and reason in ignored


@pytest.mark.parametrize("mutate", [
    lambda b: b.update(repo=[]),
    lambda b: b["repo"].update(name="../etc/passwd"),
    lambda b: b["repo"].update(name="a/b/c"),
    lambda b: b["updatedRefs"][0].update(newSha="zz"),
    lambda b: b["updatedRefs"][0].update(ref="refs/../../x"),
    lambda b: (b.pop("updatedRefs"), b["repo"].update(headSha=None)),
])
def test_malformed_payloads_are_400(mutate: Any) -> None:
    body = payload(SHA)
    mutate(body)
    assert status_of(parse_event, body) == 400


def test_repo_names() -> None:
    assert valid_repo("acme/tiny-model") == "acme/tiny-model"
    assert valid_repo("gpt2") == "gpt2"
    for bad in ("", "/x", "a//b", "a/.hidden", "a/b..c", "a b/c", 7, None, "a/" + "x" * 200):
        assert valid_repo(bad) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=50)
    | st.sampled_from(["repo.content", "update", "model", "dataset", "acme/x", SHA, "refs/heads/main"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["event", "repo", "scope", "action", "type", "name", "headSha", "updatedRefs",
                         "ref", "newSha", "oldSha", "x"]), inner, max_size=6),
    max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_any_json_is_targets_ignored_or_400(body: object) -> None:
    try:
        targets, ignored = parse_event(body)
    except AppError as exc:
        assert exc.status == 400
        return
    assert (targets == []) == (ignored is not None)
    for t in targets:
        assert valid_repo(t.repo) == t.repo and len(t.sha) == 40 and t.ref.startswith("refs/")
