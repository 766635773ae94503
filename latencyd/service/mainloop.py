"""MainLoop: the GLib main loop, driven through ctypes.

dbus-python dispatches on GLib's default main context (dbus.mainloop.glib), but
running that loop does not need PyGObject: importing `gi` costs ~13 MB of RSS and
~30 ms of start-up here, more than the rest of the daemon. The few GLib calls
the daemon needs (run/quit, timeouts, fd watches, Unix signals) are bound here.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

_glib = ctypes.CDLL("libglib-2.0.so.0")
_SourceFunc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_FdFunc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p)

_glib.g_main_loop_new.restype = ctypes.c_void_p
_glib.g_main_loop_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
_glib.g_main_loop_run.argtypes = [ctypes.c_void_p]
_glib.g_main_loop_quit.argtypes = [ctypes.c_void_p]
_glib.g_main_loop_unref.argtypes = [ctypes.c_void_p]
_glib.g_timeout_add_full.restype = ctypes.c_uint
_glib.g_timeout_add_full.argtypes = [
    ctypes.c_int,
    ctypes.c_uint,
    _SourceFunc,
    ctypes.c_void_p,
    ctypes.c_void_p,
]
_glib.g_unix_signal_add_full.restype = ctypes.c_uint
_glib.g_unix_signal_add_full.argtypes = [
    ctypes.c_int,
    ctypes.c_int,
    _SourceFunc,
    ctypes.c_void_p,
    ctypes.c_void_p,
]
_glib.g_unix_fd_add_full.restype = ctypes.c_uint
_glib.g_unix_fd_add_full.argtypes = [
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_uint,
    _FdFunc,
    ctypes.c_void_p,
    ctypes.c_void_p,
]
_glib.g_source_remove.argtypes = [ctypes.c_uint]
_glib.g_main_context_iteration.argtypes = [ctypes.c_void_p, ctypes.c_int]

PRIORITY_HIGH = -100
PRIORITY_DEFAULT = 0
IO_IN = 1


class MainLoop:
    def __init__(self) -> None:
        self._loop = _glib.g_main_loop_new(None, 0)
        # ctypes callbacks must outlive their GLib sources: keep them by source id.
        # Finished one-shot sources are dropped later, never from inside themselves.
        self._callbacks: dict[int, object] = {}
        self._finished: list[int] = []

    def run(self) -> None:
        _glib.g_main_loop_run(self._loop)

    def quit(self) -> None:
        _glib.g_main_loop_quit(self._loop)

    def dispatch_pending(self) -> None:
        """Run every callback that is ready now, without waiting (outside run())."""
        while _glib.g_main_context_iteration(None, 0):
            pass

    def dispatch_once(self) -> None:
        """One turn of the loop: wait for a source to be ready, dispatch those of the
        highest priority ready (outside run())."""
        _glib.g_main_context_iteration(None, 1)

    def timeout_add(self, ms: int, fn: Callable[[], bool], priority: int = PRIORITY_DEFAULT) -> int:
        """Call fn every `ms` milliseconds while it returns True."""
        return self._add(
            fn,
            lambda call: _SourceFunc(lambda _data: call()),
            lambda cb: _glib.g_timeout_add_full(priority, ms, cb, None, None),
        )

    def fd_add(self, fd: int, fn: Callable[[], bool], priority: int = PRIORITY_DEFAULT) -> int:
        """Call fn whenever fd is readable, while it returns True."""
        return self._add(
            fn,
            lambda call: _FdFunc(lambda _fd, _cond, _data: call()),
            lambda cb: _glib.g_unix_fd_add_full(priority, fd, IO_IN, cb, None, None),
        )

    def signal_add(self, signum: int, fn: Callable[[], bool]) -> int:
        """Call fn (in the loop, not in a signal handler) when signum arrives."""
        return self._add(
            fn,
            lambda call: _SourceFunc(lambda _data: call()),
            lambda cb: _glib.g_unix_signal_add_full(PRIORITY_HIGH, signum, cb, None, None),
        )

    def _add(
        self,
        fn: Callable[[], bool],
        wrap: Callable[[Callable[[], int]], object],
        attach: Callable[[object], int],
    ) -> int:
        self._collect()
        holder: list[int] = []
        cb = wrap(lambda: self._call(fn, holder))
        source = int(attach(cb))
        holder.append(source)
        self._callbacks[source] = cb
        return source

    def source_remove(self, source: int) -> None:
        if self._callbacks.pop(source, None) is not None:
            _glib.g_source_remove(source)

    def _call(self, fn: Callable[[], bool], holder: list[int]) -> int:
        try:
            keep = bool(fn())
        except Exception:  # a failing callback must not take the loop down
            log.exception("error in a main-loop callback")
            keep = True
        if not keep and holder:
            self._finished.append(holder[0])
        return int(keep)

    def _collect(self) -> None:
        for source in self._finished:
            self._callbacks.pop(source, None)
        self._finished.clear()
