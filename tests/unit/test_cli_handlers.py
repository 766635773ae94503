"""latencyctl's subcommands and their handlers (latencyd.tools.cli.HANDLERS) are the same
set: a subcommand the parser offers always runs, and no handler is left unreachable."""

from __future__ import annotations

import argparse

from latencyd.tools import cli, cliparser


def test_every_subcommand_has_a_handler_and_every_handler_a_subcommand() -> None:
    (sub,) = [a for a in cliparser.parser()._actions if isinstance(a, argparse._SubParsersAction)]
    named = {p.get_default("handler") for p in sub.choices.values()}
    assert named == set(cli.HANDLERS)
