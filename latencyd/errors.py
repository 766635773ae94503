"""The single error hierarchy. Every message is written for the person who has to act on it."""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path


class LatencydError(Exception):
    """Base of every error latencyd reports to a user.

    `dbus_name` is the D-Bus error name the service sends; the CLI maps it back
    to an exit code.
    """

    dbus_name = "org.latencyd.Error.Failed"


@dataclass
class Location:
    path: Path | None
    line: int | None = None

    def __str__(self) -> str:
        if self.path is None:
            return "<profile>"
        return f"{self.path}:{self.line}" if self.line else str(self.path)


class ProfileError(LatencydError):
    """A profile is malformed or names something that does not exist: `file:line: what is wrong`."""

    dbus_name = "org.latencyd.Error.BadProfile"

    def __init__(self, location: Location, message: str) -> None:
        super().__init__(f"{location}: {message}" if location.path else message)
        self.location = location
        self.message = message


class ProfileNotFound(ProfileError):
    dbus_name = "org.latencyd.Error.NoSuchProfile"


class FileRefused(LatencydError):
    """A file latencyd was given to read (a profile) is not one it may read: it could block,
    is not a regular file, or someone other than root could have written it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class KernelRefused(LatencydError):
    """The kernel refused a write (errno), or accepted it but kept the old value."""

    dbus_name = "org.latencyd.Error.KernelRefused"

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.what = what
        self.reason = reason


class NotApplicable(LatencydError):
    """A setting this machine cannot take (kernel-managed IRQ, unsupported driver).

    Raised by a plugin's apply; the engine records it with its reason instead of
    failing the whole profile.
    """

    dbus_name = "org.latencyd.Error.NotApplicable"


class LeftInPlace(NotApplicable):
    """Giving a setting back was refused where it stands, and it stays as it is (a task
    whose unit ended or will not take it back, a slice processes still run in). A step
    goes on without it: rolling the step back would keep in force a profile nobody
    holds. `off`, which gives everything back, lists it among its problems."""


class ApplyFailed(LatencydError):
    """Applying a profile failed; everything changed in that step was rolled back."""

    dbus_name = "org.latencyd.Error.ApplyFailed"


class PermissionDenied(LatencydError):
    dbus_name = "org.latencyd.Error.PermissionDenied"


class ConfigError(LatencydError):
    """The daemon's configuration file is malformed: `file: what is wrong`."""

    dbus_name = "org.latencyd.Error.BadConfig"


class NotPlaced(LatencydError):
    """A hold asked that its holder be put on the shielded CPUs, and it is not: the hold
    is undone, and the message says why and what to do instead."""

    dbus_name = "org.latencyd.Error.NotPlaced"


class HoldConflict(LatencydError):
    """A hold asks a machine-wide setting another hold sets otherwise: refused, with both
    holds, the setting, both values and where each was set (latencyd.core.compose)."""

    dbus_name = "org.latencyd.Error.HoldConflict"


class NoSuchHold(LatencydError):
    dbus_name = "org.latencyd.Error.NoSuchHold"


class Cancelled(LatencydError):
    """A change ended before it was done (`off` while it ran): rolled back, nothing stays."""

    dbus_name = "org.latencyd.Error.Cancelled"


class UnsafePath(LatencydError):
    """A file or directory another user could change, which a root process must not trust."""

    dbus_name = "org.latencyd.Error.UnsafePath"


class JournalError(LatencydError):
    dbus_name = "org.latencyd.Error.Journal"


class Internal(LatencydError):
    """A bug in latencyd: logged in full, answered without internals."""

    dbus_name = "org.latencyd.Error.Internal"

    def __init__(self) -> None:
        super().__init__("internal error in latencyd; the details are in its log")


def describe_oserror(exc: OSError, nofollow: bool = False) -> str:
    """An OSError in words, with its errno's name: "Permission denied (EACCES)". With
    `nofollow` (the path was opened with O_NOFOLLOW) ELOOP means the path is a symlink."""
    if nofollow and exc.errno == errno.ELOOP:
        return "it is a symlink"
    name = errno.errorcode.get(exc.errno or 0, "")
    text = exc.strerror or str(exc)
    return f"{text} ({name})" if name else text
