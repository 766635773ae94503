"""The running daemon only: its entry point (main), the GLib main loop, the D-Bus service
(dbus), operations run a slice at a time, watchers (drift, udev, task events), the noise
watch and its metrics, sd_notify and the fd store, the daemon's config and logs. Imports
from `latencyd.core`, never from `latencyd.tools`."""
