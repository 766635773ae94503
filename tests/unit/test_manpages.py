"""The man pages: generated from latencyd's and latencyctl's parsers (their arguments walked),
every plugin's schema and the shipped profiles (latencyd/tools/manpages.py), rendered by the
real `man` without a warning, and built and installed by setup.py's build step.

- every latencyctl subcommand, with its help and options, is in latencyctl(8), and the
  exit codes from the parser's epilog; every latencyd option is in latencyd(8);
- every plugin section and option (table fields included) is in latencyd.profile(5),
  with the rules of profiles (includes, variables, CPU lists, errors) and the shipped
  profiles, and every page names the README;
- a subcommand or plugin added later appears without a change to the generator;
- `MANWIDTH=80 man --warnings -l PAGE` prints nothing on stderr, in a UTF-8 and in the
  C locale (groff -ww where man-db is missing);
- `latencyctl man PAGE` prints the same page, and setup.py's build writes every page
  and completion that its data_files install, with the README (checked on a copy of the
  tree).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from latencyd import cpuset
from latencyd.core.profile import INHERITANCE_KEYS, MAIN_KEYS
from latencyd.service.main import arg_parser
from latencyd.tools import cli, cliparser, manpages
from latencyd.tools.explain import plugin_docs
from latencyd.tools.manpages import PAGES, README, SHARE, esc, page
from tests.harness import REPO


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return {name: page(name) for name in PAGES}


def _option_names(options: list[dict[str, Any]]) -> list[str]:
    names = []
    for opt in options:
        names.append(opt["option"])
        names += _option_names(opt.get("fields", []))
    return names


def _text(roff: str) -> str:
    """Roff with the font escapes and italic corrections removed and \\- as -, to look
    for words in."""
    text = re.sub(r"\\f[BIRP]|\\[,/]", "", roff)
    return text.replace("\\-", "-").replace("\\~", " ")


def subcommands(
    parser: argparse.ArgumentParser,
) -> list[tuple[str, str, list[argparse.Action]]]:
    """Each subcommand --help lists (not the hidden ones, added without help): its name,
    help and visible arguments."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [
        (
            c.dest,
            c.help or "",
            [a for a in sub.choices[c.dest]._actions if a.help != argparse.SUPPRESS],
        )
        for c in sub._choices_actions
    ]


# -- content -------------------------------------------------------------------------------
def test_every_latencyctl_subcommand_with_its_help_and_options_is_in_latencyctl_8(
    pages: dict[str, str],
) -> None:
    roff = pages["latencyctl"]
    text = _text(roff)
    commands = subcommands(cli.parser())
    assert len(commands) >= 10
    for name, help_, actions in commands:
        # a subsection and usage line for each
        assert f".SS \\fBlatencyctl {esc(name)}\\fR\n" in roff, f"no section for latencyctl {name}"
        assert f"usage: latencyctl {name} [-h]" in text
        assert " ".join(help_.split()[:4]).lower() in text.lower(), f"{name}: help"
        for action in actions:
            for option in action.option_strings:
                assert option in text, f"{name} {option} missing"
            if action.help and not {"-h", "--help", "--json"} & set(action.option_strings):
                first_words = " ".join(action.help.split()[:3])
                assert first_words.lower() in text.lower(), f"{name}: {action.help!r}"
    hidden = [c for c in cli.parser()._actions if isinstance(c, argparse._SubParsersAction)]
    assert "__complete" in hidden[0].choices, "the completion helper is registered"
    assert "__complete" not in roff, "hidden subcommands stay out of the page"


def test_exit_codes_come_from_the_epilog(pages: dict[str, str]) -> None:
    epilog = cli.parser().epilog or ""
    section = pages["latencyctl"].split(".SH EXIT STATUS\n")[1].split(".SH")[0]
    for code in re.findall(r"(\d+) [a-z]", epilog):
        assert f".TP\n{code}\n" in section
    assert "Permission denied." in section


def test_every_latencyd_option_is_in_latencyd_8(pages: dict[str, str]) -> None:
    text = _text(pages["latencyd"])
    parser = arg_parser()
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            assert not set(action.option_strings) & set(re.findall(r"--[\w-]+", text))
            continue
        for option in action.option_strings:
            assert option in text
    assert f"latencyd - {(parser.description or '').rstrip('.').lower()}" in text
    description = text.split(".SH DESCRIPTION")[1].split(".SH")[0]
    assert all(f"[{section}]" in description for section in plugin_docs())
    for setting in ("default_profile", "admin_group", "on_stop", "profile_dirs"):
        assert f"{setting} =" in text


def test_every_plugin_section_and_option_is_in_the_profile_page(pages: dict[str, str]) -> None:
    roff = pages["latencyd.profile"]
    docs = plugin_docs()
    assert {"sysctl", "writeback", "cstate", "irq", "kthread", "net"} <= set(docs)
    for section, info in docs.items():
        assert f".SS [{esc(section)}]\n" in roff, f"no section [{section}]"
        body = _text(roff.split(f".SS [{esc(section)}]\n")[1].split("\n.SS ")[0])
        for name in _option_names(info["options"]):
            assert re.search(rf"^{re.escape(name)}( = |$)", body, re.M), f"[{section}] {name}"


def test_the_profile_page_has_the_rules_of_profiles_and_the_shipped_ones(
    pages: dict[str, str],
) -> None:
    text = _text(pages["latencyd.profile"])
    flat = " ".join(text.split())
    for key, doc in {**MAIN_KEYS, **INHERITANCE_KEYS}.items():
        assert re.search(rf"^{key}$", text, re.M), key
        assert " ".join(doc.split()[:6]).lower() in flat.lower(), key
    assert "a cycle is an error" in flat and "merged once" in flat  # includes
    assert "[variables]" in text and "${NAME}" in text
    assert "never applied, not even in part" in flat  # errors
    # The CPU-list notations, from the CpuSet module that parses them.
    for example in re.findall(r"``([^`]+)``", cpuset.__doc__ or ""):
        assert example in flat, example
    shipped = text.split(".SH SHIPPED PROFILES")[1].split(".SH")[0]
    for path in sorted((REPO / "profiles").glob("*.toml")):
        summary = tomllib.loads(path.read_text())["main"]["summary"]
        assert f".TP\n{path.stem}\n{summary}" in shipped, path.stem
    for name in PAGES:  # each names the README (installed beside them) for what profiles bought
        assert README in _text(pages[name]).split(".SH SEE ALSO")[1]


def test_a_command_and_a_plugin_added_later_appear_by_themselves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def parser() -> argparse.ArgumentParser:
        p = cli.parser()
        sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        frob = sub.add_parser("frobnicate", help="frobnicate the widgets")
        frob.add_argument("--widget", help="which widget (%(default)s)", default="all")
        return p

    run = {"option": "run", "type": "boolean", "unit": "", "default": None, "doc": "merge"}
    docs = {"ksm": {"summary": "Same-page merging", "options": [run]}}
    monkeypatch.setattr(cliparser, "parser", parser)
    monkeypatch.setattr("latencyd.tools.explain.plugin_docs", lambda: docs)
    text = _text(manpages.latencyctl_page())
    assert "frobnicate the widgets" in text.lower()
    assert "--widget WIDGET" in text and "Which widget (all)." in text
    profile = manpages.profile_page()
    assert ".SS [ksm]" in profile and "\\fBrun\\fR = \\fIboolean\\fR" in profile
    assert "frobnicate" in manpages.completion("bash")
    assert "frobnicate" in manpages.completion("zsh")


def test_latencyctl_man_prints_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert set(PAGES) == set(cliparser.MAN_PAGES)
    for name in PAGES:
        assert cli.main(["man", name]) == 0
        assert capsys.readouterr().out == page(name)
    assert cli.main(["man"]) == 0
    assert capsys.readouterr().out.startswith('.\\" Generated by latencyd.tools.manpages')
    assert cli.main(["man", "nosuchpage"]) == 2


# -- rendering -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(PAGES))
@pytest.mark.parametrize("locale", ["C.UTF-8", "C"])
def test_man_renders_each_page_without_warnings(
    name: str, locale: str, pages: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / f"{name}.{PAGES[name]}"
    path.write_text(pages[name])
    env = {**os.environ, "MANWIDTH": "80", "LC_ALL": locale, "MAN_DISABLE_SECCOMP": "1"}
    if shutil.which("man"):
        command = ["man", "--warnings", "-l", str(path)]
    elif shutil.which("groff"):
        command = ["groff", "-man", "-Tutf8", "-ww", "-z", str(path)]
    else:
        pytest.skip("neither man (man-db) nor groff is installed")
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", f"{' '.join(command)}:\n{done.stderr}"
    if command[0] == "man":
        assert "NAME" in done.stdout and "SEE ALSO" in done.stdout
        assert max(len(line) for line in done.stdout.splitlines()) <= 80


def test_groff_is_strict_too(pages: dict[str, str], tmp_path: Path) -> None:
    if not shutil.which("groff"):
        pytest.skip("groff is not installed")
    for name, text in pages.items():
        path = tmp_path / name
        path.write_text(text)
        done = subprocess.run(
            ["groff", "-man", "-Tutf8", "-ww", "-z", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.stderr == "", f"{name}: {done.stderr}"


# -- building and installing ----------------------------------------------------------------
def test_write_all_writes_what_setup_py_installs(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "latencyd.tools.manpages", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == sorted(SHARE)
    assert (tmp_path / "man/man5/latencyd.profile.5").read_text() == page("latencyd.profile")


def test_setup_py_builds_and_installs_pages_and_completions(tmp_path: Path) -> None:
    """`setup.py build` in a copy of the tree (the build step runs the generator on the
    packages as installed, not on the checkout's latencyd/), then `install_data`."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("latencyd", "plugins", "profiles", "docs"):
        shutil.copytree(REPO / name, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build", "install_data", "-d", str(tmp_path / "root")],
        cwd=tree,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    share = tmp_path / "root" / "share"
    for path in SHARE:
        assert (share / path).is_file(), f"{path} not installed"
    assert (tmp_path / "root" / README).read_text() == (REPO / "README.md").read_text()
    for doc in (REPO / "docs").glob("*.md"):  # where the README's links lead
        assert (tmp_path / "root" / README).with_name("docs").joinpath(doc.name).is_file()
    profile = (share / "man/man5/latencyd.profile.5").read_text()
    assert profile == page("latencyd.profile"), "built from the tree's plugins and profiles"
    assert (share / "man/man8/latencyctl.8").read_text() == page("latencyctl")


def test_make_install_is_pip_into_the_system_and_no_test_runs_it() -> None:
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    done = subprocess.run(
        ["make", "-n", "install", "DESTDIR=/nonexistent"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "-m pip install" in done.stdout and "--root=/nonexistent ." in done.stdout
    makefile = (REPO / "Makefile").read_text()
    for target in ("test", "lint", "setup", "run"):
        rule = re.search(rf"^{target}:(.*)$", makefile, re.M)
        assert rule and "install" not in rule.group(1)
