"""A stand-in for systemd's file-descriptor store, speaking its notify protocol.

It listens on a datagram socket (NOTIFY_SOCKET), keeps the fds a service sends
with FDSTORE=1 under their FDNAME, drops them on FDSTOREREMOVE=1, and hands them
back to the next start the way systemd does: as fds 3, 4, ... with LISTEN_FDS,
LISTEN_FDNAMES and LISTEN_PID set to the new process's pid.
"""

from __future__ import annotations

import array
import os
import shlex
import socket
import threading
from pathlib import Path


class FdStoreStandIn:
    def __init__(self, directory: Path) -> None:
        self.path = directory / "notify"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.fds: dict[str, list[int]] = {}
        self.messages: list[str] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        fd_size = array.array("i").itemsize
        while True:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(16 * fd_size))
            except OSError:
                return
            fds = array.array("i")
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[: len(payload) - len(payload) % fd_size])
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            with self.lock:
                self.messages.append(data.decode())
                name = fields.get("FDNAME", "stored")
                if fields.get("FDSTORE") == "1":
                    self.fds.setdefault(name, []).extend(fds)
                    continue
                for fd in fds:  # fds sent without FDSTORE are not kept
                    os.close(fd)
                if fields.get("FDSTOREREMOVE") == "1":
                    for fd in self.fds.pop(name, []):
                        os.close(fd)

    def stored(self) -> dict[str, int]:
        with self.lock:
            return {name: len(fds) for name, fds in self.fds.items()}

    def environment(self) -> dict[str, str]:
        """For the service: where to send its fds."""
        return {"NOTIFY_SOCKET": str(self.path)}

    def wrap(self, argv: list[str]) -> tuple[list[str], list[int], dict[str, str]]:
        """(argv, fds to pass, environment) that start `argv` as systemd would restart it:
        the stored fds become 3, 4, ... and LISTEN_PID is the service's own pid."""
        with self.lock:
            items = [(name, fd) for name, fds in self.fds.items() for fd in fds]
        moves = " ".join(f"{3 + i}<&{fd}" for i, (_, fd) in enumerate(items))
        script = f"exec {moves}; export LISTEN_PID=$$; exec {shlex.join(argv)}"
        if not items:
            script = f"exec {shlex.join(argv)}"
        env = self.environment() | {
            "LISTEN_FDS": str(len(items)),
            "LISTEN_FDNAMES": ":".join(name for name, _ in items),
        }
        return ["bash", "-c", script], [fd for _, fd in items], env

    def close(self) -> None:
        self.sock.close()
        with self.lock:
            for fds in self.fds.values():
                for fd in fds:
                    os.close(fd)
            self.fds.clear()
