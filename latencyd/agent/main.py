"""latencyd-agent: the node agent of a Kubernetes fleet (docs/fleet.md). One process per
node, in a DaemonSet's pod: informer threads keep the cluster's objects current and wake
the main thread, which runs the GLib loop the daemon's signals arrive on and takes each
step (latencyd.agent.agent) there, so every D-Bus call is made from one thread."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import threading
from pathlib import Path

from latencyd.agent import cluster
from latencyd.agent.agent import Agent
from latencyd.agent.daemon import Daemon
from latencyd.agent.install import InstallError, ProfileDir
from latencyd.kernel.system import System
from latencyd.paths import CLUSTER_PROFILES, KUBELET_CONFIG
from latencyd.service.logs import setup_logging
from latencyd.service.mainloop import MainLoop

log = logging.getLogger("latencyd.agent")

DEBOUNCE_MS = 100  # a burst of watch events (a relist, a rollout) is one step


def arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="latencyd-agent",
        description="Choose latencyd's profile for this node from the cluster's rules, "
        "and report on the Node what latencyd holds.",
    )
    p.add_argument(
        "--node", default=os.environ.get("NODE_NAME"), help="this node's name (NODE_NAME)"
    )
    p.add_argument(
        "--namespace",
        default=os.environ.get("NAMESPACE", "latencyd"),
        help="where the LatencyProfiles and LatencyRecommends are (NAMESPACE)",
    )
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="a kubeconfig file (KUBECONFIG); without one, the pod's ServiceAccount",
    )
    p.add_argument(
        "--profile-dir",
        type=Path,
        default=CLUSTER_PROFILES,
        help="where the cluster's profiles are installed for the daemon (its profile_dirs)",
    )
    p.add_argument(
        "--kubelet-config",
        default=str(KUBELET_CONFIG),
        help="the kubelet's KubeletConfiguration, to check the isolated CPUs against ('' : none)",
    )
    p.add_argument(
        "--allow-boot-writes",
        action="store_true",
        help="let the cluster's profiles have latencyd write this host's boot configuration "
        "([bootloader] write = true); without it they are refused, and kernel arguments "
        "are only published in the latencyd.org/kernel-args annotation",
    )
    p.add_argument("--resync", type=float, default=15.0, help="seconds between steps without news")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = arg_parser().parse_args(argv)
    setup_logging(level=args.log_level.upper())
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # a line per request otherwise
    if not args.node:
        log.error("no node name: give --node or set NODE_NAME (the pod's spec.nodeName)")
        return 2
    profile_dir = ProfileDir(args.profile_dir)
    try:
        profile_dir.prepare()
    except (InstallError, OSError) as exc:
        log.error("%s", exc)
        return 2

    import dbus.mainloop.glib

    dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
    loop = MainLoop()
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def wake() -> None:
        with contextlib.suppress(BlockingIOError):  # a wake-up is already waiting
            os.write(wake_w, b"!")

    daemon = Daemon()
    agent = Agent(
        cluster.client(args.kubeconfig),
        args.node,
        args.namespace,
        daemon,
        profile_dir,
        System("/"),
        Path(args.kubelet_config) if args.kubelet_config else None,
        wake,
        boot_writes=args.allow_boot_writes,
    )
    pending: list[int] = []

    def step() -> bool:
        pending.clear()
        try:
            agent.step()
        except Exception:
            log.exception("step failed; the next one tries again")
        return False

    def woken() -> bool:
        try:
            while os.read(wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        if not pending:
            pending.append(loop.timeout_add(DEBOUNCE_MS, step))
        return True

    def resync() -> bool:
        step()
        return True

    def on_noise(cpu: int, sources: str) -> None:
        agent.noise(cpu, sources)
        wake()

    loop.fd_add(wake_r, woken)
    loop.timeout_add(round(args.resync * 1000), resync)
    try:
        daemon.on_noise(on_noise)
        daemon.on_profile_changed(wake)
    except Exception as exc:  # no bus yet: steps say the daemon is unreachable
        log.warning("latencyd's signals not followed: %s", exc)

    def stop() -> bool:
        loop.quit()
        return False

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.signal_add(signum, stop)
    threads = [
        threading.Thread(target=i.run, daemon=True, name=i.kind.__name__) for i in agent.informers
    ]
    for t in threads:
        t.start()
    log.info("agent for node %s, profiles from namespace %s", args.node, args.namespace)
    loop.run()
    for i in agent.informers:
        i.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
