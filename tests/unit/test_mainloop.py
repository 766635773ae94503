"""The ctypes-driven GLib main loop: timeouts, fd watches, Unix signals, one-shot sources."""

from __future__ import annotations

import os
import signal

from latencyd.service.mainloop import MainLoop


def test_timeouts_fd_watches_and_signals_dispatch_in_the_loop() -> None:
    loop = MainLoop()
    ticks: list[int] = []
    reads: list[bytes] = []
    r, w = os.pipe()

    def tick() -> bool:
        ticks.append(1)
        os.write(w, b"x")
        return len(ticks) < 3  # False ends the source

    def readable() -> bool:
        reads.append(os.read(r, 10))
        return True

    def on_usr1() -> bool:
        loop.quit()
        return False

    loop.timeout_add(5, tick)
    watch = loop.fd_add(r, readable)
    loop.signal_add(signal.SIGUSR1, on_usr1)
    loop.timeout_add(80, lambda: os.kill(os.getpid(), signal.SIGUSR1) or False)
    loop.run()
    assert len(ticks) == 3
    assert b"".join(reads) == b"xxx"
    loop.source_remove(watch)
    os.close(r)
    os.close(w)


def test_a_failing_callback_is_logged_and_the_loop_goes_on(caplog) -> None:  # type: ignore[no-untyped-def]
    loop = MainLoop()
    calls: list[int] = []

    def boom() -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("bug in a callback")
        loop.quit()
        return False

    loop.timeout_add(1, boom)
    loop.run()
    assert len(calls) == 2
    assert "error in a main-loop callback" in caplog.text
