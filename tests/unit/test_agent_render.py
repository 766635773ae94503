"""LatencyProfiles as the files the daemon reads: one digest for the set, and errors said
in the cluster's terms."""

from __future__ import annotations

from pathlib import Path

import pytest

from latencyd.agent.render import RenderError, in_cluster_terms, profile_set


def obj(name: str, text: str) -> dict[str, object]:
    return {"metadata": {"namespace": "tuning", "name": name}, "spec": {"profile": text}}


def test_the_digest_changes_with_any_profile_and_not_with_their_order() -> None:
    one = profile_set([obj("a", "x = 1\n"), obj("b", "y = 2\n")])
    same = profile_set([obj("b", "y = 2\n"), obj("a", "x = 1\n")])
    other = profile_set([obj("a", "x = 1\n"), obj("b", "y = 3\n")])
    # Text moved between names is a different set, though the bytes concatenate alike.
    moved = profile_set([obj("a", "x = 1\ny"), obj("b", " = 2\n")])
    assert one.digest == same.digest
    assert len({one.digest, other.digest, moved.digest}) == 3
    assert one.files() == {"a.toml": b"x = 1\n", "b.toml": b"y = 2\n"}


@pytest.mark.parametrize("name", ["../etc", "Upper", "a/b", ""])
def test_a_name_the_daemon_could_not_look_up_is_refused(name: str) -> None:
    with pytest.raises(RenderError, match="not a name latencyd can look up"):
        profile_set([obj(name, "")])


def test_an_error_in_a_rendered_file_names_the_latencyprofile_and_its_line() -> None:
    profiles = profile_set([obj("rt", "[main]\n"), obj("base", "")])
    where = Path("/run/latencyd/cluster")
    message = f"{where}/rt.toml:7: unknown option 'x' (included from {where}/base.toml)"
    assert in_cluster_terms(message, where, profiles) == (
        "LatencyProfile tuning/rt: line 7: unknown option 'x' "
        "(included from LatencyProfile tuning/base)"
    )
    # A file that is not one of the cluster's stays as it was.
    assert in_cluster_terms("/etc/latencyd/profiles/x.toml:3: bad", where, profiles) == (
        "/etc/latencyd/profiles/x.toml:3: bad"
    )
