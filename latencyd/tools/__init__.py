"""What runs around the daemon: the `latencyctl` CLI, measure and attribution with the
latency tools, recommend, explain, the TuneD importer and the man pages. Uses
`latencyd.core` (the config's paths: latencyd.paths) and talks to the daemon over
D-Bus; `latencyd.service` is imported only where a tool reads the daemon's config as the
daemon does (explain, completion) or documents the daemon (its parser, settings and
metrics, for its man page)."""
