"""latencyd: puts a machine into a low-latency state, keeps it there, and measures the gain."""

__version__ = "0.1.0"

BUS_NAME = "org.latencyd.Daemon1"
OBJECT_PATH = "/org/latencyd/Daemon1"
INTERFACE = "org.latencyd.Daemon1"
