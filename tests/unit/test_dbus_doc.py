"""docs/dbus.md's table of methods is the API the daemon exports: every method of the
interface, each with its in- and out-signature as the code declares it. A signature is a
promise to every client already written: HoldAndPlace kept its own when the hold's CPUs
came (HoldAndPlaceOn, issue 52)."""

from __future__ import annotations

import re
from pathlib import Path

from latencyd import INTERFACE
from latencyd.service.dbus import Service, dbus_methods

DOC = Path(__file__).resolve().parents[2] / "docs" / "dbus.md"
# | `HoldAndPlaceOn(s profile, s reason, s cpus) → u cookie` | ...
ROW = re.compile(r"^\| `(\w+)\(([^)]*)\)(?: → ([^`]+))?` \|")


def signature(text: str) -> str:
    """'s profile, s reason' -> 'ss'; 'a(sss)' -> 'a(sss)'; 'u cookie' -> 'u'."""
    return "".join(part.split()[0] for part in text.split(",") if part.strip())


def documented(text: str) -> dict[str, tuple[str, str]]:
    out = {}
    for line in text.splitlines():
        if m := ROW.match(line):
            out[m[1]] = (signature(m[2]), signature(m[3] or ""))
    return out


def exported() -> dict[str, tuple[str, str]]:
    return {
        member: (sig, getattr(Service, member)._dbus_out_signature or "")
        for (interface, member), sig in dbus_methods(Service).items()
        if interface == INTERFACE
    }


def test_the_documented_methods_are_the_exported_ones_with_their_signatures() -> None:
    assert documented(DOC.read_text()) == exported()


def test_hold_and_place_keeps_its_signature_beside_the_one_that_names_cpus() -> None:
    methods = exported()
    assert methods["HoldAndPlace"] == ("ss", "u")  # profile, reason: as before issue 52
    assert methods["HoldAndPlaceOn"] == ("sss", "u")  # and the hold's CPUs


def test_a_row_is_read_as_written() -> None:
    rows = documented(
        "| `ListProfiles() → a(sss)` | x |\n| `ReleaseProfile(u)` | y |\n"
        "| `HoldAndPlaceOn(s profile, s reason, s cpus) → u cookie` | z |\nprose\n"
    )
    assert rows == {
        "ListProfiles": ("", "a(sss)"),
        "ReleaseProfile": ("u", ""),
        "HoldAndPlaceOn": ("sss", "u"),
    }
