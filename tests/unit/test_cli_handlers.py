"""latencyctl's subcommands and their handlers (latencyd.tools.cli.HANDLERS) are the same
set: a subcommand the parser offers always runs, and no handler is left unreachable."""

from __future__ import annotations

import argparse

import pytest

from latencyd.tools import cli, cliparser


def test_every_subcommand_has_a_handler_and_every_handler_a_subcommand() -> None:
    (sub,) = [a for a in cliparser.parser()._actions if isinstance(a, argparse._SubParsersAction)]
    named = {p.get_default("handler") for p in sub.choices.values()}
    assert named == set(cli.HANDLERS)


@pytest.mark.parametrize(
    ("argv", "cpus", "reason", "command"),
    [
        (["hold", "realtime", "--cpus", "1", "--", "sleep", "60"], "1", None, ["sleep", "60"]),
        (["hold", "--cpus", "1", "p", "--", "sleep", "60"], "1", None, ["sleep", "60"]),
        (["run", "--cpus", "2", "--reason", "B", "--", "a", "--cpus", "--", "b"], "2", "B",
         ["a", "--cpus", "--", "b"]),
        (["hold", "p"], None, None, []),
        # A command begun before `--` is the command's, its `--` included.
        (["run", "git", "log", "--", "path"], None, None, ["git", "log", "--", "path"]),
        (["hold", "p", "./wrapper", "--", "./app"], None, None, ["./wrapper", "--", "./app"]),
    ],
)  # fmt: skip
def test_options_before_the_double_dash_are_latencyctls_and_after_it_the_commands(
    argv: list[str], cpus: str | None, reason: str | None, command: list[str]
) -> None:
    # `hold PROFILE --cpus 1 -- CMD` once gave `--cpus 1 --` to CMD (argparse's REMAINDER
    # after a positional), so the hold had no CPUs of its own.
    args = cliparser.parse(cliparser.parser(), argv)
    assert (args.cpus, args.reason, args.command) == (cpus, reason, command)


def test_a_command_after_the_double_dash_of_a_subcommand_that_runs_none_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["status", "--", "sleep", "1"]) == 2
    assert "status takes no command after --" in capsys.readouterr().err
