"""Shell completion for latencyctl, generated from its parser by shtab
(latencyd/tools/manpages.py).

- `latencyctl completion bash` passes `bash -n` and, driven with COMP_WORDS/COMP_CWORD
  in a real bash, completes commands, their options, option values, the shipped profile
  names (asked of `latencyctl __complete profiles` on Tab, so from the live search path),
  choices, and paths in the command line after `hold PROFILE --`;
- `latencyctl completion zsh` passes `zsh -n` and completes the same in a real
  interactive zsh on a pty (compinit, the script autoloaded from $fpath);
- an argument named like `plugin` or `option`, added later, completes plugin names or
  section.option names without a change to the generator;
- `latencyctl __complete` is hidden from --help, the man page and the completions.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from latencyd.tools import cli, cliparser, manpages
from latencyd.tools.explain import plugin_docs
from latencyd.tools.manpages import complete_words, completion
from tests.harness import REPO

SHIPPED = sorted(p.stem for p in (REPO / "profiles").glob("*.toml"))
# `latencyctl` as the scripts call it on Tab: the venv's, first on PATH.
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

DRIVE_BASH = r"""
source "$1"
shift
COMP_WORDS=("$@")
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
COMP_LINE="${COMP_WORDS[*]}"
COMP_POINT=${#COMP_LINE}
fn=$(complete -p latencyctl) # the function the script registered
fn=${fn##* -F }
"${fn%% *}" latencyctl "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
"""


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bash") / "latencyctl"
    path.write_text(completion("bash"))
    return path


def bash_complete(
    script: Path, line: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> list[str]:
    """What Tab offers at the end of `line` (a trailing space: a new, empty word)."""
    words = line.split()
    if line.endswith(" "):
        words.append("")
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", DRIVE_BASH, "drive", str(script), *words],
        capture_output=True,
        text=True,
        env=ENV | (env or {}),
        cwd=cwd,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    return sorted({w for w in done.stdout.splitlines() if w})


# -- bash ------------------------------------------------------------------------------------
def test_bash_script_is_valid(bash_script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(bash_script)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_bash_completes_commands(bash_script: Path) -> None:
    assert bash_complete(bash_script, "latencyctl sw") == ["switch"]
    every = bash_complete(bash_script, "latencyctl ")
    sub = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    visible = [c.dest for c in sub._choices_actions]  # not the hidden, added without help
    assert every == sorted(visible)
    assert "__complete" not in every
    assert bash_complete(bash_script, "latencyctl --json sw") == ["switch"]


def test_bash_completes_the_shipped_profile_names(bash_script: Path) -> None:
    assert set(SHIPPED) <= set(bash_complete(bash_script, "latencyctl switch "))
    for command in ("hold", "explain"):
        assert set(SHIPPED) <= set(bash_complete(bash_script, f"latencyctl {command} "))
    assert bash_complete(bash_script, "latencyctl switch network-l") == ["network-latency"]
    # Only one profile per command: nothing after it.
    assert bash_complete(bash_script, "latencyctl switch balanced ") == []


def test_bash_completes_options_and_their_values(bash_script: Path, tmp_path: Path) -> None:
    options = bash_complete(bash_script, "latencyctl explain --")
    assert {"--json", "--help", "--profile-dir"} <= set(options)
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("")
    assert bash_complete(bash_script, "latencyctl explain --profile-dir a", cwd=tmp_path) == [
        "adir"
    ]
    assert bash_complete(bash_script, "latencyctl man ") == sorted(manpages.PAGES)
    assert bash_complete(bash_script, "latencyctl completion ") == ["bash", "zsh"]
    assert bash_complete(bash_script, "latencyctl release ") == []  # a cookie: nothing to offer


def test_bash_completes_paths_in_the_command_a_profile_is_held_for(
    bash_script: Path, tmp_path: Path
) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "engine").write_text("")
    line = "latencyctl hold balanced -- ./app/eng"
    assert bash_complete(bash_script, line, cwd=tmp_path) == ["./app/engine"]
    line = "latencyctl hold balanced ./app/engine --config ./ap"
    assert bash_complete(bash_script, line, cwd=tmp_path) == ["./app"]
    assert "--reason" in bash_complete(bash_script, "latencyctl hold --re")


def test_an_argument_added_later_completes_plugins_and_options(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def parser() -> argparse.ArgumentParser:
        p = cli.parser()
        sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        describe = sub.add_parser("describe", help="one plugin, or one option")
        describe.add_argument("plugin")
        describe.add_argument("option", nargs="?")
        return p

    monkeypatch.setattr(cliparser, "parser", parser)
    script = tmp_path / "latencyctl"
    script.write_text(completion("bash"))
    assert bash_complete(script, "latencyctl desc") == ["describe"]
    assert bash_complete(script, "latencyctl describe ") == sorted(plugin_docs())
    offered = bash_complete(script, "latencyctl describe writeback writeback.dirty_")
    assert "writeback.dirty_ratio" in offered and "writeback.dirty_bytes" in offered
    assert "describe" in completion("zsh")


# -- what the scripts ask for on Tab ---------------------------------------------------------
def test_complete_words() -> None:
    assert set(SHIPPED) <= set(complete_words("profiles"))
    docs = plugin_docs()
    assert complete_words("plugins") == sorted(docs)
    options = complete_words("options")
    for section, info in docs.items():
        for opt in info["options"]:
            name = opt["option"]
            if name.startswith("[["):
                table = name.strip("[]")
                assert table in options
                assert all(f"{table}.{f['option']}" in options for f in opt["fields"])
            elif not name.startswith("<"):
                assert f"{section}.{name}" in options
    with pytest.raises(ValueError):
        complete_words("nonsense")


def test_the_helper_is_hidden_and_works_without_the_daemon(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {**ENV, "DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent"}
    latencyctl = [sys.executable, "-m", "latencyd.tools.cli"]
    done = subprocess.run(
        [*latencyctl, "__complete", "profiles"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0 and set(SHIPPED) <= set(done.stdout.split())
    helps = subprocess.run([*latencyctl, "--help"], capture_output=True, text=True, env=env)
    assert "__complete" not in helps.stdout
    assert cli.main(["completion", "bash"]) == 0
    assert capsys.readouterr().out == completion("bash")
    assert cli.main(["completion", "zsh"]) == 0
    assert capsys.readouterr().out == completion("zsh")


# -- zsh -------------------------------------------------------------------------------------
needs_zsh = pytest.mark.skipif(
    shutil.which("zsh") is None,
    reason="zsh is not installed (apt-get install zsh; scripts/setup.sh lists it)",
)

# Types a line and Tab into an interactive zsh on a pty, compadd wrapped to print every
# match the completion system offers ("##match"), and prints the matches.
ZSH_HARNESS = r"""
zmodload zsh/zpty || exit 3
zpty z zsh -f -i
zpty -w z "PROMPT=''; fpath=(${(q)1} \$fpath); autoload -U compinit; compinit -u -D"
zpty -w z 'zstyle ":completion:*" insert-tab false; bindkey "^I" complete-word'
zpty -w z 'compadd() { if [[ ${argv[1,(i)(-|--)]} == *-(O|A|D)\ * ]]; then builtin compadd "$@"; return; fi; local -a h; builtin compadd -A h "$@"; local m="#""#"; (( $#h )) && print -rl -- "$m"${^h}; builtin compadd "$@" }'
zpty -w z 'comppostfuncs=(x); x() { print -r -- "E""ND""%"; exit }'
zpty -w -n z "$2"$'\t'
local out
zpty -r z out '*END%*'
zpty -d z
for line in ${(f)out//$'\r'/}; do
  [[ $line == *'##'* && $line != *'"#""#"'* ]] && print -r -- ${line##*\#\#}
done
exit 0
"""  # noqa: E501


@pytest.fixture(scope="module")
def zsh_fpath(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("zsh")
    (directory / "_latencyctl").write_text(completion("zsh"))
    return directory


def zsh_complete(fpath: Path, line: str) -> list[str]:
    process = subprocess.Popen(
        ["zsh", "-f", "-c", ZSH_HARNESS, "harness", str(fpath), line],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**ENV, "TERM": "dumb", "HOME": str(fpath)},
        start_new_session=True,  # the pty's shell goes with it on a timeout
    )
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"zsh completion of {line!r} did not finish")
    if process.returncode == 3:
        pytest.skip("zsh/zpty is not available")
    assert process.returncode == 0, err
    return sorted(set(out.split()))


@needs_zsh
def test_zsh_script_is_valid(zsh_fpath: Path) -> None:
    done = subprocess.run(
        ["zsh", "-n", str(zsh_fpath / "_latencyctl")], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr


@needs_zsh
@pytest.mark.parametrize(
    ("line", "check"),
    [
        ("latencyctl sw", lambda got: got == ["switch"]),
        ("latencyctl switch ", lambda got: set(SHIPPED) <= set(got)),
        ("latencyctl hold net", lambda got: got == ["network-latency"]),
        ("latencyctl man ", lambda got: got == sorted(manpages.PAGES)),
        ("latencyctl explain --pro", lambda got: got == ["--profile-dir"]),
    ],
)
def test_zsh_completes(zsh_fpath: Path, line: str, check: Callable[[list[str]], bool]) -> None:
    got = zsh_complete(zsh_fpath, line)
    assert check(got), f"{line!r} offered {got}"


@needs_zsh
def test_zsh_completes_paths_in_the_command_a_profile_is_held_for(zsh_fpath: Path) -> None:
    got = zsh_complete(zsh_fpath, f"latencyctl hold balanced -- {zsh_fpath}/_latency")
    assert got == ["_latencyctl"], got


def test_a_shtab_that_writes_broken_scripts_is_refused_with_where_the_ready_ones_are(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Debian 12's shtab 1.5.5 writes bash scripts that complete only the first choice;
    `latencyctl completion` says so rather than print one, and names the package's."""
    import shtab

    from latencyd.errors import LatencydError

    monkeypatch.setattr(shtab, "__version__", "1.5.5")
    with pytest.raises(LatencydError, match=r"shtab >= 1\.13 \(shtab 1\.5\.5 here\)"):
        completion("bash")
    assert cli.main(["completion", "bash"]) == 1
    # The generator copies ready-made scripts instead (the Debian package's build).
    ready = tmp_path / "ready"
    for rel in manpages.SCRIPTS:
        (ready / rel).parent.mkdir(parents=True, exist_ok=True)
        (ready / rel).write_text(f"# {rel}\n")
    assert manpages.main([str(tmp_path / "out"), "--completions-from", str(ready)]) == 0
    for rel in manpages.SCRIPTS:
        assert (tmp_path / "out" / rel).read_text() == f"# {rel}\n"
