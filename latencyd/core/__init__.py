"""The framework every plugin and tool relies on: profiles and their schema, the engine
(expand, diff, apply, read back), the journal of originals and the plugin contract
(`latencyd.core.plugin`, the API a third-party plugin imports). Reaches the kernel only
through `latencyd.kernel`; imports nothing from `latencyd.service` or `latencyd.tools`
(tests/unit/test_layout.py)."""
