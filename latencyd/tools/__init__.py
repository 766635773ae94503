"""What runs around the daemon: the `latencyctl` CLI, measure and attribution with the
latency tools, recommend, explain, the TuneD importer and the man pages. Uses
`latencyd.core` and talks to the daemon over D-Bus; `latencyd.service` is imported only
for what the daemon and its tools share (config paths, the daemon's own parser for its
man page)."""
