"""What every plugin and tool relies on: CPU sets, profiles and their schema, the engine
(expand, diff, apply, read back), the journal of originals, the plugin contract
(`latencyd.core.plugin`, the API a third-party plugin imports), the system interface (the
one way to touch the kernel), the errors users see and the escaping of text other users
chose (`text`). Imports nothing from `latencyd.service` or `latencyd.tools`
(tests/unit/test_layout.py)."""
