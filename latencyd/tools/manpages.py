"""Where a person looks: man pages and shell completions, generated from the code.

latencyd(8) and latencyctl(8) are built from the same argparse parsers as `--help`
(`latencyd.service.main.arg_parser`, `latencyd.tools.cli.parser`), latencyd.profile(5) from the
README's rules for profiles plus `plugin_docs()` (every installed plugin's options),
and the bash and zsh completions from latencyctl's parser. Nothing here names a
subcommand, an option or a plugin: one added later appears by itself.

Nothing generated is kept in the repository. setup.py runs `python -m latencyd.tools.manpages
--readme README.md DIR` while building, and installs DIR's files under share/
(`install_layout`); from a checkout, `latencyctl man PAGE | man -l -` and
`latencyctl completion SHELL` print them.

Values that change at run time are looked up on Tab by the completion scripts with
`latencyctl __complete KIND` (`complete_words`): profile names from the live search
path, plugin names, section.option names. This module therefore imports only the
standard library at module level; the parsers and plugins are imported when needed.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latencyd import BUS_NAME, __version__
from latencyd.core.tomlwrite import toml_section, toml_value  # standard library only

PAGES: dict[str, int] = {"latencyd": 8, "latencyctl": 8, "latencyd.profile": 5}  # name: section
SHELLS = ("bash", "zsh")
COMPLETION_KINDS = ("profiles", "plugins", "options")

# The README's subsection that summarises the plugins; the profile page puts the full,
# generated list of every plugin's options in its place.
PLUGINS_SUBSECTION = "Plugins and their options"

# Arguments whose values the completions look up, by dest (a convention, so that an
# argument added later with one of these names completes without a change here).
DYNAMIC_DESTS = {
    "profile": "profiles",
    "profiles": "profiles",
    "plugin": "plugins",
    "plugins": "plugins",
    "section": "plugins",
    "option": "options",
    "options": "options",
    "setting": "options",
}


# -- what gets installed ---------------------------------------------------------------
def install_layout() -> dict[str, list[str]]:
    """Generated files by their directory under share/ (setup.py installs them there)."""
    layout: dict[str, list[str]] = {}
    for name, section in PAGES.items():
        layout.setdefault(f"man/man{section}", []).append(f"{name}.{section}")
    layout["bash-completion/completions"] = ["latencyctl"]
    layout["zsh/site-functions"] = ["_latencyctl"]
    return layout


def generated_files(readme: str | None = None) -> dict[str, str]:
    """Every generated file: its path under share/ -> its text."""
    files: dict[str, str] = {}
    for directory, names in install_layout().items():
        for name in names:
            if directory.startswith("man/"):
                text = page(name.rsplit(".", 1)[0], readme)
            elif directory.startswith("bash"):
                text = bash_completion()
            else:
                text = zsh_completion()
            files[f"{directory}/{name}"] = text
    return files


def write_all(outdir: Path, readme: str | None = None) -> list[Path]:
    written = []
    for rel, text in generated_files(readme).items():
        path = outdir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def page(name: str, readme: str | None = None) -> str:
    """One man page as roff; `readme` is the README's text (default: `find_readme()`)."""
    if name == "latencyd":
        return latencyd_page(readme)
    if name == "latencyctl":
        return latencyctl_page()
    if name == "latencyd.profile":
        return profile_page(readme)
    raise ValueError(f"no man page {name!r} (known: {', '.join(PAGES)})")


def completion(shell: str) -> str:
    if shell == "bash":
        return bash_completion()
    if shell == "zsh":
        return zsh_completion()
    raise ValueError(f"no completion for {shell!r} (known: {', '.join(SHELLS)})")


def find_readme() -> str:
    """The README: next to the package in a checkout, else the installed distribution's
    long description (pyproject.toml's `readme`); "" if neither is there."""
    candidate = Path(__file__).resolve().parents[2] / "README.md"
    try:
        text = candidate.read_text()
        if text.startswith("# latencyd"):
            return text
    except OSError:
        pass
    try:
        from importlib.metadata import PackageNotFoundError, metadata

        return metadata("latencyd")["Description"] or ""
    except (PackageNotFoundError, KeyError):
        return ""


# -- roff --------------------------------------------------------------------------------
def esc(text: str) -> str:
    """Text for roff: backslashes, hyphen-minus (so options and code copy as typed) and
    anything outside ASCII as groff escapes, so a page renders alike in every locale."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch == "\\":
            out.append("\\e")
        elif ch == "-":
            out.append("\\-")
        elif code > 126 or (code < 32 and ch != "\t"):
            out.append(f"\\[u{code:04X}]")
        else:
            out.append(ch)
    return "".join(out)


def text_line(line: str) -> str:
    """A line of (escaped) text that must not be read as a request."""
    return "\\&" + line if line.startswith((".", "'")) else line


def bold(text: str) -> str:
    return f"\\fB{esc(text)}\\fR"


def italic(text: str) -> str:
    return f"\\fI{esc(text)}\\fR"


def sentence(text: str) -> str:
    """argparse help ("apply a profile") as a sentence ("Apply a profile."); a first word
    that is not plain lower-case letters ("sockperf,cyclictest", "--") is left alone."""
    text = " ".join(text.split())
    if not text:
        return text
    if re.match(r"[a-z]+(-[a-z]+)*(\s|$)", text):
        text = text[0].upper() + text[1:]
    return text if text[-1] in ".!?:" else text + "."


def header(name: str, section: int, title: str) -> list[str]:
    where = "System Administration" if section == 8 else "File Formats"
    return [
        f'.\\" Generated by latencyd.tools.manpages from the code; do not edit '
        f"(latencyctl man {name}).",
        f'.TH {esc(name.upper())} {section} "" "latencyd {esc(__version__)}" "{where}"',
        ".SH NAME",
        f"{esc(name)} \\- {esc(title)}",
    ]


# -- Markdown (the README) to roff -------------------------------------------------------
_INLINE = re.compile(
    r"`(?P<code>[^`]+)`"
    r"|\*\*(?P<bold>[^*]+)\*\*"
    r"|(?<![\w*])\*(?P<italic>[^*\s](?:[^*]*[^*\s])?)\*(?![\w*])"
    r"|\[(?P<link>[^\]]+)\]\([^)]*\)"
)


def _plain(text: str) -> str:
    return text.replace("`", "")


def inline(text: str) -> str:
    """Markdown inline markup to roff: `code` and **bold** in bold, *emphasis* in italics."""
    out = []
    pos = 0
    for m in _INLINE.finditer(text):
        out.append(esc(text[pos : m.start()]))
        if m["code"] is not None:
            out.append(bold(m["code"]))
        elif m["bold"] is not None:
            out.append(bold(_plain(m["bold"])))
        elif m["italic"] is not None:
            out.append(italic(_plain(m["italic"])))
        else:
            out.append(inline(m["link"]))
        pos = m.end()
    out.append(esc(text[pos:]))
    return "".join(out)


def _cells(row: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", row.strip().strip("|"))
    return [c.strip().replace("\\|", "|") for c in cells]


def _fit_code(line: str, width: int = 68) -> list[str]:
    """A code line too wide for an 80-column page (7 + 4 columns of indent) with its
    trailing `# comment` moved above it."""
    m = re.match(r"(\s*)(\S.*?)\s+(#.*)$", line)
    if len(line) <= width or not m:
        return [line]
    return [m[1] + m[3], m[1] + m[2]]


def markdown(text: str) -> list[str]:
    """Block-level Markdown (paragraphs, fenced code, lists, tables, ### headings) as roff."""
    out: list[str] = []
    lines = text.splitlines()
    para: list[str] = []
    item: list[str] = []
    item_mark = ""

    def flush() -> None:
        nonlocal item_mark
        if para:
            out.extend([".PP", text_line(inline(" ".join(para)))])
            para.clear()
        if item:
            out.extend([f".IP {item_mark} 4", text_line(inline(" ".join(item)))])
            item.clear()
            item_mark = ""

    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        i += 1
        if stripped.startswith("```"):
            flush()
            block = []
            while i < len(lines) and not lines[i].strip().startswith("```"):
                block.append(lines[i])
                i += 1
            i += 1
            block = [fitted for b in block for fitted in _fit_code(b)]
            out.extend([".PP", ".RS 4", ".nf", *(text_line(esc(b)) for b in block), ".fi", ".RE"])
        elif not stripped:
            flush()
        elif m := re.match(r"(#{1,6})\s+(.*)", stripped):
            flush()
            out.append((".SS " if len(m[1]) <= 3 else ".PP\n.B ") + esc(_plain(m[2])))
        elif stripped.startswith("|"):
            flush()
            rows = [stripped]
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(lines[i].strip())
                i += 1
            heads = _cells(rows[0])
            body = [r for r in rows[1:] if not re.fullmatch(r"[|:\-\s]+", r)]
            for row in body:  # a row: its first cell as the tag, the others under it
                cells = _cells(row)
                out.extend([".TP", text_line(inline(cells[0]))])
                for col, cell in enumerate(cells[1:], 1):
                    if not cell.strip("—- "):
                        continue
                    if col > 1:  # the second and later columns under their headings
                        head = _plain(heads[col]) if col < len(heads) else ""
                        out += [".br", text_line(f"\\fI{inline(head)}\\fR: {inline(cell)}")]
                    else:
                        out.append(text_line(inline(cell)))
        elif m := re.match(r"([-*+]|\d+[.)])\s+(.*)", stripped):
            flush()
            item_mark = "\\(bu" if m[1] in "-*+" else esc(m[1])
            item.append(m[2])
        elif item and line.startswith((" ", "\t")):
            item.append(stripped)
        elif item:
            flush()
            para.append(stripped)
        else:
            para.append(stripped)
    flush()
    return out


def readme_sections(readme: str, level: int = 2) -> dict[str, str]:
    """Markdown sections at `level` (## by default): title -> body, subsections included.
    "" holds the text under no such heading: before the first one, or after a heading
    above `level` (the document's # title: the heading line itself is left out)."""
    sections: dict[str, str] = {}
    title = ""
    body: list[str] = []
    fenced = False
    for line in readme.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"(#+) ", line)
        if heading and len(heading[1]) <= level:
            sections[title] = sections.get(title, "") + "\n".join(body)
            title = line[heading.end() :].strip() if len(heading[1]) == level else ""
            body = []
        else:
            body.append(line)
    sections[title] = sections.get(title, "") + "\n".join(body)
    return sections


def _readme(readme: str | None) -> str:
    return find_readme() if readme is None else readme


# -- argparse ----------------------------------------------------------------------------
@dataclass
class Command:
    """A parser: the program itself, or one (sub)command that --help lists."""

    path: tuple[str, ...]  # () for the program, ("hold",) for `latencyctl hold`
    parser: argparse.ArgumentParser
    help: str
    commands: list[Command]  # visible subcommands
    options: list[argparse.Action]  # visible optionals
    positionals: list[argparse.Action]

    def name(self, prog: str) -> str:
        return " ".join((prog, *self.path))

    def walk(self) -> Iterator[Command]:
        yield self
        for sub in self.commands:
            yield from sub.walk()


def command_tree(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = (), help_: str = ""
) -> Command:
    """The parser and every subcommand its --help lists (recursively); hidden ones (added
    without help, like `__complete`) and options with help=SUPPRESS are left out."""
    commands: list[Command] = []
    options: list[argparse.Action] = []
    positionals: list[argparse.Action] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                sub = action.choices[choice.dest]
                commands.append(
                    command_tree(sub, (*path, choice.dest), sub.description or choice.help or "")
                )
        elif action.help == argparse.SUPPRESS:
            continue
        elif action.option_strings:
            options.append(action)
        else:
            positionals.append(action)
    return Command(path, parser, help_ or parser.description or "", commands, options, positionals)


def _metavars(action: argparse.Action) -> list[str]:
    if action.metavar is not None:
        meta = action.metavar
    elif action.choices is not None:
        meta = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        meta = action.dest if not action.option_strings else action.dest.upper()
    count = action.nargs if isinstance(action.nargs, int) else 1
    return list(meta) if isinstance(meta, tuple) else [meta] * count


def _args(action: argparse.Action) -> str:
    """An action's arguments as roff, the way argparse's usage shows them."""
    names = [italic(m) for m in _metavars(action)]
    nargs = action.nargs
    if nargs == 0:
        return ""
    if nargs == "?":
        return f"[{names[0]}]"
    if nargs in ("*", argparse.REMAINDER):
        return f"[{names[0]}\\~...]"
    if nargs == "+":
        return f"{names[0]} [{names[0]}\\~...]"
    return "\\~".join(names)


def _invocation(action: argparse.Action, all_strings: bool = True) -> str:
    strings = action.option_strings if all_strings else action.option_strings[:1]
    args = _args(action)
    return ", ".join(bold(s) + (f"\\~{args}" if args else "") for s in strings)


def _synopsis(command: Command, prog: str) -> list[str]:
    out = [f'.SY "{esc(command.name(prog))}"']
    for action in command.options:
        text = _invocation(action, all_strings=False)
        out.append(text_line(text if action.required else f"[{text}]"))
    for action in command.positionals:
        out.append(text_line(_args(action)))
    if command.commands:
        out.append(f"{italic('COMMAND')} [{italic('ARGS')}]")
    out.append(".YS")
    return out


def expand_help(action: argparse.Action, prog: str) -> str:
    """The help text with %(default)s and the like filled in, as argparse does."""
    text = action.help or ""
    if "%" not in text:
        return text
    params: dict[str, Any] = dict(vars(action), prog=prog)
    params = {k: v for k, v in params.items() if v is not argparse.SUPPRESS}
    params = {k: getattr(v, "__name__", v) for k, v in params.items()}
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    try:
        return text % params
    except (KeyError, TypeError, ValueError):
        return text


def _action_items(actions: Sequence[argparse.Action], prog: str) -> list[str]:
    out = []
    for action in actions:
        tag = _invocation(action) if action.option_strings else _args(action)
        help_ = sentence(expand_help(action, prog))
        out.extend([".TP", text_line(tag), text_line(esc(help_) if help_ else "")])
    return [line for line in out if line != ""]


def _common_options(tree: Command) -> set[str]:
    """Options every subcommand takes (latencyctl's --json), documented once."""
    sets = [
        {s for a in c.options for s in a.option_strings}
        for c in tree.walk()
        if c.path and not c.commands
    ]
    return set.intersection(*sets) if sets else set()


def _exit_codes(epilog: str) -> tuple[list[tuple[str, str]], str]:
    """'Exit codes: 0 ok, 1 drift, ...' -> [("0", "ok"), ...], and the rest of the text."""
    m = re.search(
        r"exit (?:codes|status)\s*:\s*(.*?)(?:\.\s*$|\.\s+(?=[A-Z])|$)", epilog, re.I | re.S
    )
    if not m:
        return [], epilog
    codes = re.findall(r"(\d+)\s+(.+?)(?=,\s*\d+\s|$)", m[1].strip().rstrip("."), re.S)
    rest = (epilog[: m.start()] + epilog[m.end() :]).strip()
    return [(code, " ".join(text.split())) for code, text in codes], rest


# -- the pages ---------------------------------------------------------------------------
def _module_summary(module: str, prog: str) -> str:
    """The first paragraph of a module's docstring ("latencyctl: drive latencyd ...")."""
    import importlib

    doc = (importlib.import_module(module).__doc__ or "").strip().split("\n\n")[0]
    return doc.removeprefix(f"{prog}:").strip()


def _daemon_parser() -> argparse.ArgumentParser:
    from latencyd.service.main import arg_parser

    return arg_parser()


def _cli_parser() -> argparse.ArgumentParser:
    from latencyd.tools.cli import parser

    return parser()


_CONFIG_DOCS = {
    "default_profile": "profile applied at start when --profile is not given",
    "admin_group": "members of this group may change state, besides root "
    "(they name profiles from the search path only)",
    "verify_interval_s": "seconds between checks of every owned setting (0: never)",
    "poll_interval_s": "seconds between read-backs of settings no event reports, "
    "such as thread affinities and NIC settings",
    "profile_dirs": "directories searched for profiles before /etc/latencyd/profiles",
    "task_events": "where new kernel threads are heard of: auto, perf, proc-connector "
    "or none (periodic rescan)",
    "on_stop": "on SIGTERM: restore every original value, or keep the tuning for the "
    "next start to adopt",
    "metrics_listen": "serve Prometheus metrics at http://ADDRESS:PORT/metrics, e.g. "
    '"127.0.0.1:9477" (see METRICS); off when unset',
}


def latencyd_page(readme: str | None = None) -> str:
    import dataclasses

    from latencyd.service.config import CONFIG_FILE, ETC_PROFILES, Config

    parser = _daemon_parser()
    prog = parser.prog
    tree = command_tree(parser)
    intro = readme_sections(_readme(readme)).get("", "")
    out = header(prog, PAGES[prog], (parser.description or "").rstrip(".").lower() or prog)
    out += [".SH SYNOPSIS", *_synopsis(tree, prog), ".SH DESCRIPTION"]
    out += markdown(intro) if intro.strip() else [text_line(esc(parser.description or ""))]
    out += [
        ".PP",
        f"It is driven over D\\-Bus (name {bold(BUS_NAME)}) by {bold('latencyctl')}(8); "
        f"profiles are described in {bold('latencyd.profile')}(5).",
        ".SH OPTIONS",
        *_action_items(tree.options, prog),
        ".SH CONFIGURATION",
        f"{bold(str(CONFIG_FILE))} (TOML, optional; another with {bold('--config')}) "
        "takes these settings:",
    ]
    for field in dataclasses.fields(Config):
        default = getattr(Config(), field.name)
        shown = (
            toml_value([str(p) for p in default])
            if isinstance(default, tuple)
            else toml_value(default)
            if default is not None
            else "unset"
        )
        out += [".TP", f"{bold(field.name)} = {esc(shown)}"]
        if field.name in _CONFIG_DOCS:
            out.append(text_line(esc(sentence(_CONFIG_DOCS[field.name]))))
    from latencyd.service.metrics import HELP, NAMES

    out += [".SH METRICS", "With metrics_listen set, the exposition holds:"]
    for key, name in NAMES.items():
        out += [".TP", bold(name), text_line(esc(sentence(HELP[key])))]
    out += [
        ".SH SIGNALS",
        ".TP",
        "SIGTERM, SIGINT",
        'Stop: put every original value back (or keep the tuning, with on_stop = "keep").',
        ".TP",
        "SIGHUP",
        "Re\\-read the profiles (systemctl reload latencyd).",
        ".SH FILES",
        ".TP",
        bold(str(CONFIG_FILE)),
        "Configuration.",
        ".TP",
        bold(str(ETC_PROFILES)),
        "Local profiles: searched after any --profile-dir and profile_dirs, before the "
        "profiles shipped with latencyd.",
        ".TP",
        bold("/run/latencyd/journal.jsonl"),
        "Every original value, written before a setting changes (see \\-\\-state\\-dir).",
        ".SH SEE ALSO",
        "\\fBlatencyctl\\fR(8), \\fBlatencyd.profile\\fR(5)",
    ]
    return "\n".join(out) + "\n"


def latencyctl_page() -> str:
    from latencyd.service.config import CONFIG_FILE

    parser = _cli_parser()
    prog = parser.prog
    tree = command_tree(parser)
    common = _common_options(tree)
    codes, rest = _exit_codes(parser.epilog or "")
    description = (parser.description or "").rstrip(".")
    out = header(prog, PAGES[prog], description.lower() or prog)
    out += [".SH SYNOPSIS", *_synopsis(tree, prog), ".SH DESCRIPTION"]
    out.append(text_line(esc(sentence(description))))
    summary = _module_summary("latencyd.tools.cli", prog)
    if summary:
        out += [".PP", text_line(esc(sentence(summary)))]
    if rest:
        out += [".PP", text_line(esc(rest))]
    common -= {"-h", "--help"}
    if common:
        shared = ", ".join(bold(s) for s in sorted(common))
        out += [".PP", f"Every command takes {shared} (see OPTIONS), and {bold('--help')}."]
    out += [".SH OPTIONS", *_action_items(tree.options, prog), ".SH COMMANDS"]
    for command in tree.walk():
        if not command.path:
            continue
        out += [f".SS {esc(' '.join(command.path))}", *_synopsis(command, prog)]
        if command.help:
            out += [".PP", text_line(esc(sentence(command.help)))]
        shown = [
            a
            for a in command.positionals + command.options
            if a.help and not set(a.option_strings) & (common | {"-h", "--help"})
        ]
        out += _action_items(shown, prog)
    if codes:
        out.append(".SH EXIT STATUS")
        for code, meaning in codes:
            out += [".TP", code, text_line(esc(sentence(meaning)))]
    out += [
        ".SH ENVIRONMENT",
        ".TP",
        bold("DBUS_SYSTEM_BUS_ADDRESS"),
        f"The system bus latencyd ({esc(BUS_NAME)}) is reached on.",
        ".SH FILES",
        ".TP",
        bold(str(CONFIG_FILE)),
        "Its profile_dirs are searched by the commands that read profiles without the daemon.",
        ".SH SEE ALSO",
        "\\fBlatencyd\\fR(8), \\fBlatencyd.profile\\fR(5)",
    ]
    return "\n".join(out) + "\n"


_INHERITANCE_DOCS = {
    "enabled": "false: switch off the section inherited from included profiles",
    "replace": "true: drop every inherited option of the section; keep only this file's",
    "drop": "[names]: drop these inherited options",
}


def profile_page(readme: str | None = None) -> str:
    from latencyd.core.profile import INHERITANCE_KEYS, MAIN_KEYS, SUFFIX
    from latencyd.service.config import ETC_PROFILES
    from latencyd.tools.explain import plugin_docs

    name = "latencyd.profile"
    text = _readme(readme)
    profiles = readme_sections(text).get("Profiles", "")
    subsections = readme_sections(profiles, level=3)
    out = header(name, PAGES[name], "latencyd tuning profiles")
    out += [
        ".SH SYNOPSIS",
        ".nf",
        *(f"{d}/{italic('NAME')}{esc(SUFFIX)}" for d in (italic("DIR"), esc(str(ETC_PROFILES)))),
        f"{italic('SHIPPED')}/{italic('NAME')}{esc(SUFFIX)}",
        ".fi",
        ".PP",
        f"{italic('DIR')} is a {bold('--profile-dir')} or one of the configuration's "
        f"{bold('profile_dirs')}; {italic('SHIPPED')} holds the profiles that come with "
        "latencyd. The first directory that has NAME.toml wins.",
        ".SH DESCRIPTION",
    ]
    out += (
        markdown(subsections.get("", ""))
        if profiles
        else ["A profile is a TOML file NAME.toml in a profile directory."]
    )
    generated = False
    for title, body in subsections.items():
        if not title:
            continue
        if title == PLUGINS_SUBSECTION:
            out += _plugin_sections(plugin_docs(), MAIN_KEYS, INHERITANCE_KEYS)
            generated = True
        else:
            out += [f".SH {esc(title.upper())}", *markdown(body)]
    if not generated:
        out += _plugin_sections(plugin_docs(), MAIN_KEYS, INHERITANCE_KEYS)
    out += [
        ".SH SEE ALSO",
        "\\fBlatencyd\\fR(8), \\fBlatencyctl\\fR(8) (latencyctl plugins, latencyctl explain)",
    ]
    return "\n".join(out) + "\n"


def _plugin_sections(
    docs: dict[str, Any], main_keys: dict[str, str], inheritance: Sequence[str]
) -> list[str]:
    from latencyd.core.plugin import discover

    examples = {name: getattr(cls, "example", None) for name, cls in discover().items()}
    out = [".SH SECTIONS", ".SS [main]"]
    for key, doc in main_keys.items():
        out += [".TP", bold(key), text_line(esc(sentence(doc)))]
    out += [
        ".SS [variables]",
        "Names for ${NAME} anywhere in the profile and in the profiles it includes.",
        ".SS Inheritance",
        "Any plugin section may also hold these keys, which shape what the section "
        "inherits from included profiles:",
    ]
    for key in inheritance:
        out += [".TP", bold(key)]
        if key in _INHERITANCE_DOCS:
            out.append(text_line(esc(_INHERITANCE_DOCS[key])))
    out.append(".PP")
    out.append(
        "Every other section belongs to a plugin; these are installed "
        f"({bold('latencyctl plugins')} prints the same list):"
    )
    for section, info in docs.items():
        out += [f".SS [{esc(section)}]", text_line(esc(sentence(info["summary"])))]
        out += _option_items(info["options"])
        example = examples.get(section)
        if example:
            out += [".PP", "Example:", ".PP", ".RS 4", ".nf"]
            out += [text_line(esc(line)) for line in toml_section(section, example)]
            out += [".fi", ".RE"]
    return out


def _option_items(options: list[dict[str, Any]]) -> list[str]:
    out = []
    for opt in options:
        name = opt["option"]
        tag = italic(name) if name.startswith("<") else bold(name)
        if opt["type"] != "tables":
            tag += f" = {italic(opt['type'])}"
        doc = sentence(opt["doc"])
        if opt["unit"]:
            doc += f" Unit: {opt['unit']}."
        if opt["default"] is not None:
            doc += f" Default: {toml_value(opt['default'])}."
        out += [".TP", text_line(tag), text_line(esc(doc))]
        if opt.get("fields"):
            out += [".RS", *_option_items(opt["fields"]), ".RE"]
    return out


# -- shell completion --------------------------------------------------------------------
def value_kind(action: argparse.Action) -> str:
    """What an argument's values are, for the completions: "" (a flag, no value), "text"
    (nothing to offer), "profiles"/"plugins"/"options" (asked of `latencyctl __complete`),
    "dirs", "files", "command" (the rest of the line is a command) or "choices:a,b"."""
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        choices = [str(c) for c in action.choices]
        return "choices:" + ",".join(c for c in choices if re.fullmatch(r"[\w.:+@/-]+", c))
    dest = action.dest.lower()
    if dest in DYNAMIC_DESTS:
        return DYNAMIC_DESTS[dest]
    if action.nargs == argparse.REMAINDER:
        return "command"
    if action.type is Path or isinstance(action.type, argparse.FileType):
        return "dirs" if "dir" in dest or "DIR" in str(action.metavar) else "files"
    return "text"


def _slots(command: Command) -> list[str]:
    """The positionals' kinds in order; "KIND..." repeats, as the last one."""
    slots = []
    for action in command.positionals:
        kind = value_kind(action) or "text"
        if action.nargs in ("*", "+"):
            slots.append(kind + "...")
        elif isinstance(action.nargs, int):
            slots += [kind] * action.nargs
        else:
            slots.append(kind)
    return slots


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def complete_words(kind: str, profile_dirs: Sequence[Path] = ()) -> list[str]:
    """What `latencyctl __complete KIND` prints, one per line: profile names on the
    search path (as `explain` searches it), plugin names, or section.option names."""
    if kind == "profiles":
        from latencyd.core.errors import LatencydError
        from latencyd.core.profile import SUFFIX
        from latencyd.service.config import Config, load_config, search_path

        try:
            config = load_config()
        except LatencydError:
            config = Config()
        names: set[str] = set()
        for directory in search_path(list(profile_dirs), config):
            try:
                names.update(p.name[: -len(SUFFIX)] for p in directory.glob(f"*{SUFFIX}"))
            except OSError:
                continue
        return sorted(names)
    if kind == "plugins":
        from latencyd.core.plugin import ENTRY_POINT_GROUP, entry_point_specs

        return sorted(entry_point_specs(ENTRY_POINT_GROUP))
    if kind == "options":
        from latencyd.tools.explain import plugin_docs

        out: list[str] = []

        def add(prefix: str, options: list[dict[str, Any]]) -> None:
            for opt in options:
                name = opt["option"]
                if name.startswith("[["):  # [[irq.rule]] -> irq.rule, and its fields
                    out.append(name.strip("[]"))
                    add(name.strip("[]"), opt.get("fields", []))
                elif not name.startswith("<"):
                    out.append(f"{prefix}.{name}")

        for section, info in plugin_docs().items():
            add(section, info["options"])
        return out
    raise ValueError(f"unknown completion kind {kind!r} (known: {', '.join(COMPLETION_KINDS)})")


_BASH_MAIN = r"""
_NAME() {
    local cur=${COMP_WORDS[COMP_CWORD]} prog=${COMP_WORDS[0]}
    local path='' commands='' options='' positionals='' value='' kind='' want='' word
    local i npos=0 dashdash=0
    local -a dirs=()
    COMPREPLY=()
    [[ $prog == '~'* ]] && prog=$HOME${prog:1}
    _NAME__node ''
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${COMP_WORDS[i]}
        if ((!dashdash)) && [[ $word == -- ]]; then
            dashdash=1
        elif ((!dashdash)) && [[ $word == -?* ]]; then
            _NAME__value "$path" "$word"
            [[ -n $value ]] || continue
            ((i++))
            [[ ${COMP_WORDS[i]} == = ]] && ((i++)) # --option=VALUE: bash splits at the =
            if ((i >= COMP_CWORD)); then
                want=$value
                break
            fi
            [[ $word == --profile-dir ]] && dirs+=(--profile-dir "${COMP_WORDS[i]}")
        elif ((!dashdash)) && [[ " $commands " == *" $word "* ]]; then
            path=${path:+$path }$word
            npos=0
            _NAME__node "$path"
        else
            _NAME__slot "$npos"
            if [[ $kind == command ]]; then # the rest is a command line of its own
                if declare -F _command_offset >/dev/null; then
                    _command_offset "$i"
                else
                    mapfile -t COMPREPLY < <(compgen -f -- "$cur")
                fi
                return 0
            fi
            ((npos++))
        fi
    done
    [[ $cur == = ]] && cur=''
    if [[ -n $want ]]; then
        kind=$want
    elif ((!dashdash)) && [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$options" -- "$cur")
        return 0
    elif [[ -n $commands ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$commands" -- "$cur")
        return 0
    else
        _NAME__slot "$npos"
    fi
    case $kind in
    profiles | plugins | options)
        if [[ $kind == profiles && $cur == */* ]]; then # a profile file's path
            compopt -o filenames 2>/dev/null
            mapfile -t COMPREPLY < <(compgen -f -- "$cur")
        else
            mapfile -t COMPREPLY < <(compgen -W \
                "$("$prog" __complete "$kind" "${dirs[@]}" 2>/dev/null)" -- "$cur")
        fi
        ;;
    dirs)
        compopt -o filenames 2>/dev/null
        mapfile -t COMPREPLY < <(compgen -d -- "$cur")
        ;;
    files)
        compopt -o filenames 2>/dev/null
        mapfile -t COMPREPLY < <(compgen -f -- "$cur")
        ;;
    command)
        mapfile -t COMPREPLY < <(compgen -c -- "$cur")
        ;;
    choices:*)
        mapfile -t COMPREPLY < <(compgen -W "${kind#choices:}" -- "$cur")
        ;;
    esac
    return 0
}

_NAME__slot() { # $1: index of a positional: sets kind (for the current command)
    local -a slots
    read -ra slots <<<"$positionals"
    kind=''
    if (($1 < ${#slots[@]})); then
        kind=${slots[$1]}
    elif ((${#slots[@]})) && [[ ${slots[-1]} == *... ]]; then
        kind=${slots[-1]}
    fi
    kind=${kind%...}
    [[ $kind == choices:* ]] && kind=${kind//,/ }
    return 0
}

complete -F _NAME PROG
"""


def bash_completion(parser: argparse.ArgumentParser | None = None) -> str:
    """The bash completion script for latencyctl (or another argparse parser)."""
    parser = parser or _cli_parser()
    prog = parser.prog
    fn = "_" + re.sub(r"\W", "_", prog)
    tree = command_tree(parser)
    nodes, values = [], []
    for command in tree.walk():
        key = _sh_quote(" ".join(command.path))
        subs = " ".join(c.path[-1] for c in command.commands)
        opts = " ".join(s for a in command.options for s in a.option_strings)
        slots = " ".join(_slots(command))
        nodes.append(
            f"    {key}) commands={_sh_quote(subs)} options={_sh_quote(opts)} "
            f"positionals={_sh_quote(slots)} ;;"
        )
        for action in command.options:
            kind = value_kind(action)
            if kind:
                kind = kind.replace(",", " ") if kind.startswith("choices:") else kind
                for s in action.option_strings:
                    values.append(f"    {_sh_quote(' '.join((*command.path, s)).strip())}) "
                                  f"value={_sh_quote(kind)} ;;")  # fmt: skip
    head = [
        f"# bash completion for {prog}: generated from its argparse parser by "
        "latencyd.tools.manpages",
        f"# ({prog} completion bash). Profile, plugin and option names are asked of",
        f"# `{prog} __complete KIND` on Tab, so they follow the live profile search path.",
        "",
        f"{fn}__node() {{ # $1: command path ('' or 'hold'): its subcommands, options, positionals",
        "    case $1 in",
        *nodes,
        "    *) commands='' options='' positionals='' ;;",
        "    esac",
        "}",
        "",
        f"{fn}__value() {{ # $1: command path, $2: option: what its value is ('' = a flag)",
        '    case "${1:+$1 }$2" in',
        *values,
        "    *) value='' ;;",
        "    esac",
        "}",
    ]
    main = _BASH_MAIN.replace("_NAME", fn).replace("PROG", prog)
    return "\n".join(head) + "\n" + main


def _zsh_desc(text: str) -> str:
    return text.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]").replace("\n", " ")


def _zsh_message(text: str) -> str:
    return text.replace(":", " ").replace("\\", "").replace("\n", " ") or "value"


def _zsh_action(kind: str, fn: str) -> str:
    if kind in COMPLETION_KINDS:
        return f"{fn}__dynamic {kind}"
    if kind.startswith("choices:"):
        return "(" + " ".join(kind.removeprefix("choices:").split(",")) + ")"
    return {"dirs": "_files -/", "files": "_files", "command": "_command_names -e"}.get(kind, " ")


def _zsh_specs(command: Command, fn: str, prog: str) -> list[str]:
    specs = []
    for action in command.options:
        desc = _zsh_desc(expand_help(action, prog))
        kind = value_kind(action)
        strings = list(action.option_strings)
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            exclusive = "(- *)"
        elif len(strings) > 1:
            exclusive = "(" + " ".join(strings) + ")"
        else:
            exclusive = ""
        repeat = "*" if isinstance(action, argparse._AppendAction | argparse._CountAction) else ""
        for s in strings:
            arg = ""
            if kind:
                message = _zsh_message(" ".join(_metavars(action)).lower())
                arg = (
                    f"{'=' if s.startswith('--') else ''}[{desc}]:{message}:{_zsh_action(kind, fn)}"
                )
            else:
                arg = f"[{desc}]"
            specs.append(_sh_quote(f"{repeat}{exclusive}{s}{arg}"))
    if command.commands:
        specs += [_sh_quote("1:command:->command"), _sh_quote("*::argument:->argument")]
        return specs
    for action in command.positionals:
        kind = value_kind(action) or "text"
        message = _zsh_message(" ".join(_metavars(action)))
        if action.nargs == argparse.REMAINDER:
            specs.append(_sh_quote(f"*:::{message}:_normal"))  # :::, words = the rest
        elif action.nargs in ("*", "+"):
            specs.append(_sh_quote(f"*:{message}:{_zsh_action(kind, fn)}"))
        elif action.nargs == "?":
            specs.append(_sh_quote(f"::{message}:{_zsh_action(kind, fn)}"))
        else:
            count = action.nargs if isinstance(action.nargs, int) else 1
            specs += [_sh_quote(f":{message}:{_zsh_action(kind, fn)}")] * count
    return specs


def _zsh_function(name: str) -> str:
    return "_" + re.sub(r"\W", "_", name)


def _zsh_node(fn: str, path: tuple[str, ...]) -> str:
    """The function for one (sub)command: _latencyctl_cmd, _latencyctl_cmd_hold, ..."""
    return "_".join((f"{fn}_cmd", *(re.sub(r"\W", "_", p) for p in path)))


def zsh_completion(parser: argparse.ArgumentParser | None = None) -> str:
    """The zsh completion function for latencyctl (or another argparse parser)."""
    parser = parser or _cli_parser()
    prog = parser.prog
    fn = _zsh_function(prog)
    tree = command_tree(parser)
    out = [
        f"#compdef {prog}",
        f"# zsh completion for {prog}: generated from its argparse parser by "
        "latencyd.tools.manpages",
        f"# ({prog} completion zsh). Profile, plugin and option names are asked of",
        f"# `{prog} __complete KIND` on Tab, so they follow the live profile search path.",
        "",
        f"{fn}__dynamic() {{ # [compadd options, from _arguments] KIND: profiles, plugins, options",
        "    local kind=$argv[-1] i",
        "    local -a items dirs",
        "    argv[-1]=()",
        "    if [[ $kind == profiles && $PREFIX == */* ]]; then # a profile file's path",
        '        _files "$@"',
        "        return",
        "    fi",
        "    for ((i = 1; i < $#words; i++)); do",
        "        case $words[i] in",
        "        --profile-dir) dirs+=(--profile-dir $words[i+1]) ;;",
        "        --profile-dir=*) dirs+=(--profile-dir ${words[i]#--profile-dir=}) ;;",
        "        esac",
        "    done",
        f'    items=(${{(f)"$(_call_program $kind ${{(q)_{fn}_prog}} __complete $kind ${{(q)dirs}} '
        '2>/dev/null)"})',
        '    compadd "$@" -a items',
        "}",
    ]
    for command in tree.walk():
        name = _zsh_node(fn, command.path)
        specs = _zsh_specs(command, fn, prog)
        out += [
            "",
            f"{name}() {{",
            "    local curcontext=$curcontext state state_descr line ret=1",
            "    typeset -A opt_args",
            "    _arguments -C -S : \\",
            *(f"        {s} \\" for s in specs),
            "        && ret=0",
        ]
        if command.commands:
            described = " ".join(
                _sh_quote(f"{c.path[-1].replace(':', chr(92) + ':')}:{c.help}")
                for c in command.commands
            )
            out += [
                "    case $state in",
                "    command)",
                f"        local -a commands=({described})",
                "        _describe -t commands command commands && ret=0",
                "        ;;",
                "    argument)",
                f'        curcontext="${{curcontext%:*:*}}:{command.name(prog)}-$words[1]:"',
                "        case $words[1] in",
            ]
            for sub in command.commands:
                out.append(
                    f"        {_sh_quote(sub.path[-1])}) {_zsh_node(fn, sub.path)} && ret=0 ;;"
                )
            out += ["        esac", "        ;;", "    esac"]
        out += ["    return ret", "}"]
    out += [
        "",
        f"{fn}() {{",
        f"    local _{fn}_prog=${{(Q)words[1]}}",
        f"    [[ $_{fn}_prog == '~'* ]] && _{fn}_prog=$HOME${{_{fn}_prog#'~'}}",
        f"    {_zsh_node(fn, ())}",
        "}",
        "",
        "# Autoloaded from $fpath: complete now; sourced (after compinit): register.",
        f'if [[ $zsh_eval_context[-1] == loadautofunc ]]; then {fn} "$@"; '
        f"else compdef {fn} {prog}; fi",
    ]
    return "\n".join(out) + "\n"


# -- python -m latencyd.tools.manpages ---------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m latencyd.tools.manpages",
        description="Write the man pages and shell completions (as laid out under share/).",
    )
    p.add_argument("outdir", type=Path, help="e.g. build/share (setup.py) or /usr/local/share")
    p.add_argument("--readme", type=Path, help="the README (default: the checkout's)")
    args = p.parse_args(argv)
    readme = args.readme.read_text() if args.readme else None
    from latencyd.core.plugin import ENTRY_POINT_GROUP, discover

    if not discover():  # a page without them would look fine and be wrong
        p.error(f"no plugins found (entry points {ENTRY_POINT_GROUP!r}): is latencyd installed?")
    for path in write_all(args.outdir, readme):
        print(path, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
