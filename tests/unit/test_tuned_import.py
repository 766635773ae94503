"""`latencyctl import-tuned`: TuneD profiles (tuned.conf) into latencyd profiles.

Unit tests of the pure conversion (force_latency forms and fallbacks, TuneD's ${f:...}
functions, scheduler group rules, variables and variables files, include resolution as
TuneD's locator does it, enabled/replace/drop, the TOML writer) on small fixture
profiles in tmp dirs, and an acceptance test: every profile Debian's tuned package ships
converts (exit 0 or 1, never a traceback) and every converted file loads in latencyd.
"""

from __future__ import annotations

import json
import re
import textwrap
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from latencyd.core.profile import ProfileLibrary
from latencyd.core.schema import Schema
from latencyd.core.tomlwrite import toml_key, toml_value
from latencyd.cpuset import CpuSet
from latencyd.errors import ProfileError
from latencyd.kernel.system import POLICIES, Machine
from latencyd.tools import cli
from latencyd.tools import tuned_import as ti
from latencyd.tools.tuned_import.convert import CONVERTERS, convert_merged
from latencyd.tools.tuned_import.convert_cpu import EPB_NAMES, convert_force_latency
from latencyd.tools.tuned_import.convert_knobs import WRITEBACK_SYSCTLS
from latencyd.tools.tuned_import.convert_threads import (
    RT_POLICIES,
    TUNED_POLICIES,
    kthread_regex,
    regex_to_glob,
)
from latencyd.tools.tuned_import.convert_unsupported import NO_PLUGIN
from latencyd.tools.tuned_import.cpulists import cpulist_expr, cpulist_unpack
from latencyd.tools.tuned_import.output import SECTION_ORDER, convert_chain
from latencyd.tools.tuned_import.profiles import (
    KNOWN_PLUGINS,
    load_chain,
    make_unit,
    merge,
    parse_tuned,
    parse_variables_file,
)
from latencyd.tools.tuned_import.results import WRITEBACK_PAIRS, Conversion
from latencyd.tools.tuned_import.values import Evaluator, Func, Text, Tr, Var, parse_value
from latencyd.tools.tuned_import.variables import Variables

STATES = (
    ti.IdleState(0, "POLL", 0),
    ti.IdleState(1, "C1", 2),
    ti.IdleState(2, "C1E", 10),
    ti.IdleState(3, "C6", 133),
)
HOST = ti.Host(
    online=(0, 1, 2, 3),
    present=(0, 1, 2, 3),
    packages={0: "0", 1: "0", 2: "1", 3: "1"},
    cpuinfo="processor\t: 0\nmodel name\t: Intel(R) Xeon(R)\nflags\t\t: fpu vme hypervisor\n",
    uname="Linux box 6.1.0 #1 SMP x86_64",
    virtualized="the CPU flag 'hypervisor' is set",
    idle_states=STATES,
    exists=lambda path: not path.startswith(("/proc/sys/net/netfilter", "/sys/kernel/debug")),
)
MACHINE = Machine(CpuSet.from_list("0-3"), 8 << 30)


class AnyValue:
    """Stands for a plugin's schema where only the merge is under test."""

    label = "anything"

    def parse(self, raw: Any, machine: Machine) -> Any:
        return raw


def permissive() -> dict[str, Schema]:
    schemas = {s: Schema(free_keys=lambda k: None, free_kind=AnyValue()) for s in SECTION_ORDER}
    schemas["writeback"] = Schema(
        free_keys=lambda k: None, free_kind=AnyValue(), exclusive=WRITEBACK_PAIRS
    )
    return schemas


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def dirs_of(root: Path) -> list[Path]:
    """A TuneD search path under `root`, lowest priority first (like TUNED_DIRS)."""
    return [root / "lib", root / "lib/profiles", root / "etc", root / "etc/profiles"]


def run(
    tmp_path: Path, files: dict[str, str], target: str, host: ti.Host = HOST
) -> tuple[ti.ImportResult, dict[str, dict[str, Any]], dict[str, str]]:
    """Convert `target` from fixture profiles: the result, each file parsed, and its text
    (comments unwrapped)."""
    write(tmp_path / "tuned", files)
    out = tmp_path / "out"
    result = ti.import_tuned(target, out, dirs=dirs_of(tmp_path / "tuned"), host=host)
    texts = {p.stem: p.read_text() for p, _f in result.files}
    data = {n: tomllib.loads(t) for n, t in texts.items()}
    return result, data, {n: unwrapped(t) for n, t in texts.items()}


def unwrapped(text: str) -> str:
    """A file's text with its wrapped comments on one line each, to search."""
    return text.replace("\n#   ", " ")


def converted(files: dict[str, str], tmp_path: Path, name: str) -> Conversion:
    """The conversion of TuneD's merge of `name`'s chain, in one piece."""
    write(tmp_path / "tuned", files)
    chain = load_chain(name, dirs_of(tmp_path / "tuned"), HOST)
    profiles = [chain.profiles[p] for p in chain.orders[chain.top]]
    return convert_merged(merge(profiles), chain.variable_files, HOST)


def flat_text(conversion: Conversion) -> str:
    sections: dict[str, list[str]] = {}
    for (section, option), item in conversion.items.items():
        line = f"{toml_key(option)} = {toml_value(item.value)}"
        sections.setdefault(section, []).append(line)
    return "".join(f"[{s}]\n" + "\n".join(lines) + "\n" for s, lines in sections.items())


def assert_round_trip(
    out: Path, result: ti.ImportResult, conversions: Sequence[Conversion]
) -> None:
    """latencyd loading each converted file (its includes merged the latencyd way) gets
    exactly the conversion of what TuneD merged for that profile."""
    lib = ProfileLibrary([out], permissive(), MACHINE)
    for (path, _f), conversion in zip(result.files, conversions, strict=True):
        flat = out / "flat.toml.ref"
        flat.write_text(flat_text(conversion))
        want = lib.load(str(flat))
        got = lib.load(str(path))
        # An emptied section (all dropped) and no section mean the same: nothing to set.
        assert {k: v for k, v in got.sections.items() if v} == want.sections, path.name


# == force_latency =================================================================================


@pytest.mark.parametrize(
    ("value", "chosen", "lost"),
    [
        ("10", 10, 0),
        ("0", 0, 0),
        ("cstate.id:0", "poll", 0),
        ("cstate.id:1", "shallowest", 0),
        ("cstate.name:C1", "state:C1", 0),
        ("cstate.name:XYZ|None", "state:XYZ", 0),  # TuneD: no request if XYZ is missing
        ("None", None, 0),
        ("cstate.id_no_zero:0|5", 5, 0),  # state0 is POLL (0 µs): always skipped
        ("5|cstate.id:1", 5, 0),  # a number always resolves: the rest is never used
        ("cstate.id_no_zero:1|3", "shallowest", 1),  # the fallback is lost
        ("cstate.name:C1|10", "state:C1", 1),
        ("cstate.id:3", "state:C6", 1),  # by number: resolved here, and reported
        ("cstate.id_no_zero:7|70", 70, 1),  # no state 7 here: TuneD's fallback, reported
        ("cstate.name:C6|cstate.id:4|10", "state:C6", 1),
        ("cstate.id:0|5", "poll", 1),  # latencyd asks for 0 µs even without idle states
        ("cstate.name_no_zero:C1", "state:C1", 1),  # TuneD skips a 0 µs state: latencyd not
        ("-5|20", 20, 1),
        ("fast", None, 1),
    ],
)
def test_force_latency_forms_and_fallbacks(value: str, chosen: Any, lost: int) -> None:
    got, reasons, _notes = convert_force_latency(value, STATES)
    assert got == chosen
    assert len(reasons) == lost, reasons


def test_resume_latency_n_a_means_polling_only() -> None:
    assert convert_force_latency("n/a", STATES, allow_na=True)[0] == "n/a"
    assert convert_force_latency("n/a", STATES)[0] is None


def test_force_latency_in_a_profile_and_from_a_variable(tmp_path: Path) -> None:
    result, data, texts = run(
        tmp_path,
        {
            "lib/p/tuned.conf": """
                [variables]
                max_power_state=cstate.name:C1|10
                [cpu]
                force_latency=${max_power_state}
                pm_qos_resume_latency_us=n/a
                devices=cpu2,cpu3
            """
        },
        "p",
    )
    assert data["p"]["cstate"]["force_latency_us"] == "state:C1"
    assert data["p"]["cstate"]["cpus"] == [{"cpus": "2,3", "resume_latency_us": 0}]
    assert "fallback '10' not converted" in texts["p"]
    assert result.code == ti.PARTIAL


def test_resume_latency_zero_is_no_limit(tmp_path: Path) -> None:
    _r, data, _t = run(tmp_path, {"lib/p/tuned.conf": "[cpu]\npm_qos_resume_latency_us=0\n"}, "p")
    assert data["p"]["cstate"]["cpus"] == [{"cpus": "all", "resume_latency_us": "any"}]


# == ${f:...} functions ============================================================================


def translate(value: str, kind: str = "text", variables: str = "") -> Tr:
    unit = make_unit("variables", dict(parse_variables_file(variables)), "p")
    return Variables(unit, {}, HOST).translate_raw(value, kind)


@pytest.mark.parametrize(
    ("value", "kind", "want"),
    [
        ("${f:cpulist_invert:1-2}", "text", "all - (1-2)"),
        ("${f:cpulist2hex_invert:${iso}}", "text", "all - (${iso})"),
        ("${f:cpulist2hex:${iso}}", "text", "${iso}"),
        ("${f:cpulist_unpack:${iso}}", "text", "${iso}"),
        ("${f:cpulist_pack:1,2,3}", "text", "1,2,3"),
        ("${f:cpulist_online:${iso}}", "text", "${iso}"),
        ("${f:cpulist_present:${iso}}", "text", "${iso}"),
        ("${f:hex2cpulist:f}", "text", "0xf"),
        ("${f:cpulist_invert:${f:cpulist_unpack:${iso}}}", "text", "all - (${iso})"),
        ("${f:cpulist_unpack:0-3,^2}", "text", "0-3 - 2"),
        ("${f:strip:  x  }", "text", "x"),
        ("${f:kb2s:8}", "text", "16"),
        ("${f:s2kb:16}", "text", "8"),
        ("${f:regex_search_ternary:${iso}:\\s*[0-9]:yes:no}", "text", "yes"),
        ("${f:check_net_queue_count:4}", "text", "4"),
        ("${f:calc_isolated_cores:1}", "text", "1,3"),
        ("${f:calc_isolated_cores:1}", "cpus", "1,3"),
        ("${f:virt_check:guest:metal}", "text", "guest"),
        ("${f:cpuinfo_check:AMD:amd:Intel:intel:other}", "text", "intel"),
        ("${iso}", "cpus", "${iso}"),
        ("2-3,^3", "cpus", "2-3 - 3"),
        ("fffffffd", "mask", "0xfffffffd"),
        ("1,${iso}", "cpus", "1 | (${iso})"),
    ],
)
def test_functions_become_expressions_or_values(value: str, kind: str, want: str) -> None:
    got = translate(value, kind, "iso=2-3\n")
    assert got.text == want, got


@pytest.mark.parametrize(
    ("value", "approx"),
    [
        ("${f:calc_isolated_cores:1}", "know no sockets"),  # machine-specific: reported
        ("${f:virt_check:guest:metal}", "this machine is virtual"),
        ("${f:cpuinfo_check:Intel:intel:other}", "/proc/cpuinfo"),
        ("${f:cpulist_invert:1}", ""),  # an exact translation: nothing to report
    ],
)
def test_machine_dependent_functions_are_reported(value: str, approx: str) -> None:
    got = translate(value)
    assert (approx in " ".join(got.approx)) if approx else not got.approx


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("${f:exec:mktemp:-d}", "runs a command"),
        ("${f:check_net_queue_count:${netdev_queue_count}}", "netdev_queue_count is not set"),
        ("${f:no_such_function:1}", "unknown"),
        ("${undefined}", "not defined"),
        ("\\${iso}", "escaped"),
    ],
)
def test_what_cannot_be_converted_says_why(value: str, why: str) -> None:
    got = translate(value, "text", "iso=1\n")
    assert got.text is None and why in got.why, got


def test_exec_is_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    got = translate(f"${{f:exec:touch:{marker}}}")
    assert got.text is None and not marker.exists()


def test_evaluator_matches_tuned_for_the_kernel_command_line() -> None:
    ev = Evaluator({"iso": "1,3"}, HOST)
    assert ev.eval(parse_value("${f:cpulist2hex:${iso}}")).text == "0000000a"
    assert ev.eval(parse_value("${f:cpulist_invert:${iso}}")).text == "0,2"
    assert ev.eval(parse_value("${f:cpulist2hex_invert:${iso}}")).text == "00000005"
    assert ev.eval(parse_value("${f:cpulist_pack:1,2,3,5}")).text == "1-3,5"
    assert ev.eval(parse_value("${undefined}")).text == "${undefined}"  # TuneD keeps it


def test_parse_value_nesting_and_escapes() -> None:
    nodes = parse_value("a${x}b${f:f1:${y}:c\\:d}\\${z}")
    assert nodes[0] == Text("a") and nodes[1] == Var("x") and nodes[2] == Text("b")
    func = nodes[3]
    assert isinstance(func, Func) and func.name == "f1"
    assert func.args == ((Var("y"),), (Text("c:d"),))
    assert nodes[4] == Text("${z}", escaped=True)


@pytest.mark.parametrize(
    ("text", "mask", "want"),
    [
        ("0-3,8", False, "0-3,8"),
        ("0-3,^2", False, "0-3 - 2"),
        ("0xf,,5", False, "5 | 0xf"),
        ("'1-2'", False, "1-2"),
        ("", False, "none"),
        ("ff,ffffffff", True, "0xff,ffffffff"),
        ("0x3", True, "0x3"),
        ("1-x", False, None),
        ("xyz", True, None),
    ],
)
def test_tuned_cpulists_as_latencyd_expressions(text: str, mask: bool, want: str | None) -> None:
    got = cpulist_expr(text, mask)
    assert got == want
    if got is not None:  # latencyd reads what we wrote as the same CPUs TuneD meant
        cpus = CpuSet.parse(got, CpuSet.from_list("0-63"))
        tuned = cpulist_unpack("0x" + text if mask and not text.startswith("0x") else text)
        assert list(cpus) == (tuned or [])


# == variables =====================================================================================


VARIABLES = {
    "lib/iso/tuned.conf": """
        [main]
        summary=isolate
        [variables]
        include=${i:PROFILE_DIR}/../vars.conf
        isolated_cores_assert_check = \\\\${isolated_cores}
        isolated_cores = ${isolated_cores}
        assert1=${f:assertion_non_equal:set:${isolated_cores}:${isolated_cores_assert_check}}
        not_isolated=${f:cpulist_invert:${isolated_cores}}
        tmpdir=${f:strip:${f:exec:mktemp:-d}}
        [scheduler]
        isolated_cores=${isolated_cores}
        [kthread_unused]
        type=sysfs
        /sys/devices/virtual/workqueue/cpumask=${f:cpulist2hex:${not_isolated}}
        [bootloader]
        cmdline_x=+nohz_full=${isolated_cores} initrd=${tmpdir}
    """,
    "lib/vars.conf": """
        # comments, and no section header
        isolated_cores=2-3
    """,
}


def test_variables_file_include_and_tuned_idioms(tmp_path: Path) -> None:
    _r, data, texts = run(tmp_path, VARIABLES, "iso")
    variables = data["iso"]["variables"]
    # The variables file's value, the self-reference idiom dropped (latencyd binds late),
    # the assertion and its escaped check gone (latencyd refuses undefined variables).
    assert variables == {"isolated_cores": "2-3", "not_isolated": "all - (${isolated_cores})"}
    assert data["iso"]["kthread"]["unbound_cpumask"] == "${not_isolated}"
    assert data["iso"]["irq"]["isolate"] == "${isolated_cores}"
    # Only the boot loader used ${tmpdir} (a command): reported there; its other argument
    # converts with latencyd's variable (the loader evaluates it where it runs).
    assert "initrd=${tmpdir}: not evaluated" in texts["iso"]
    assert data["iso"]["bootloader"] == {"cmdline": ["nohz_full=${isolated_cores}"]}
    assert "tmpdir" not in variables


def test_a_child_sets_the_variable_the_parent_uses(tmp_path: Path) -> None:
    files = {
        **VARIABLES,
        "etc/mine/tuned.conf": "[main]\ninclude=iso\n[variables]\nisolated_cores=1\n",
    }
    result, data, _t = run(tmp_path, files, "mine")
    assert data["mine"] == {"main": {"include": ["iso.toml"]}, "variables": {"isolated_cores": "1"}}
    lib = ProfileLibrary([tmp_path / "out"], permissive(), MACHINE)
    profile = lib.load(str(tmp_path / "out/mine.toml"))
    assert profile.sections["kthread"]["unbound_cpumask"] == "all - (1)"
    assert profile.sections["irq"]["isolate"] == "1"
    assert result.code == ti.PARTIAL  # the boot loader


def test_a_missing_variables_file_is_reported(tmp_path: Path) -> None:
    conf = "[variables]\ninclude=/nonexistent/vars.conf\n[sysctl]\nvm.swappiness=5\n"
    files = {"lib/p/tuned.conf": conf}
    result, _d, texts = run(tmp_path, files, "p")
    assert "cannot be read" in texts["p"] and result.code == ti.PARTIAL


def test_nothing_left_to_isolate_is_reported_not_written(tmp_path: Path) -> None:
    one_per_socket = ti.Host(online=(0, 1), packages={0: "0", 1: "1"}, idle_states=STATES)
    files = {
        "lib/p/tuned.conf": """
            [variables]
            isolated_cores=${f:calc_isolated_cores:1}
            [scheduler]
            isolated_cores=${isolated_cores}
            [sysctl]
            vm.swappiness=5
        """
    }
    result, data, texts = run(tmp_path, files, "p", host=one_per_socket)
    assert data["p"].keys() == {"main", "sysctl"} and result.code == ti.PARTIAL
    assert "leaves no CPU to isolate on this machine" in texts["p"]


def test_a_tuned_user_is_told_that_taskset_fails_inside_the_shield(tmp_path: Path) -> None:
    """TuneD's cpu-partitioning leaves placing the application to `taskset -c N` in its
    start script; under latencyd's cpuset shield the kernel refuses that (EINVAL): the
    imported profile says so beside [shield], with what to do instead (issue 51)."""
    files = {"lib/p/tuned.conf": "[scheduler]\nisolated_cores=1\n"}
    _result, data, texts = run(tmp_path, files, "p")
    assert data["p"]["shield"]["cpus"] == "1"
    note = texts["p"][texts["p"].index("taskset -c 1 ./app") :]
    assert "Invalid argument" in note and "latencyctl run -- ./app" in note
    assert 'mechanism = "affinity"' in note


def test_tuned_cpulist_syntax_in_a_variable(tmp_path: Path) -> None:
    files = {"lib/p/tuned.conf": "[variables]\niso=2-3,^3\n[irqbalance]\nbanned_cpus=${iso}\n"}
    _r, data, _t = run(tmp_path, files, "p")
    assert data["p"]["variables"]["iso"] == "2-3 - 3"


# == scheduler: group rules, isolation =============================================================


def test_group_rules(tmp_path: Path) -> None:
    _r, data, texts = run(
        tmp_path,
        {
            "lib/rt/tuned.conf": r"""
                [scheduler]
                isolated_cores=2-3
                ps_blacklist=^\[ksoftirqd;.*pmd.*;^DPDK
                group.ksoftirqd=0:f:2:*:^\[ksoftirqd
                group.ktimers=0:f:2:*:^\[ktimers
                group.ktimersoftd=0:f:3:*:^\[ktimersoftd
                group.rcub=1:r:4:3:^\[rcub
                group.batch=0:b:0:ff,ffffffff:\[kswapd.*\]$
                group.off=
                group.user=0:o:0:*:^java
                group.cg=0:f:1:cgroup.group1:^\[foo
            """
        },
        "rt",
    )
    kthread = data["rt"]["kthread"]
    rules = kthread["rule"]
    # TuneD sorts by rule priority and the last match wins; latencyd's first match wins.
    assert [r["match"] for r in rules[:5]] == [
        "^rcub",
        "^kswapd.*$",
        "^ktimersoftd",
        "^ktimers",
        "^ksoftirqd",
    ]
    assert rules[0] == {"match": "^rcub", "cpus": "0x3", "policy": "rr", "priority": 4}
    assert rules[1] == {"match": "^kswapd.*$", "cpus": "0xff,ffffffff", "policy": "batch"}
    # '*' affinity: where isolated_cores put it (housekeeping), unless blacklisted (all).
    assert rules[2]["cpus"] == "all - (2-3)" and rules[4]["cpus"] == "all"
    assert "affinity '*' (leave as it is) became all CPUs" in texts["rt"]
    # The isolation rule comes last and leaves the blacklisted threads alone.
    isolation = rules[-1]
    assert isolation["cpus"] == "all - (2-3)"
    assert not re.search(isolation["match"], "ksoftirqd/3")
    assert not re.search(isolation["match"], "xpmd0") and not re.search(isolation["match"], "DPDKx")
    assert re.search(isolation["match"], "kswapd0") and re.search(isolation["match"], "xDPDK")
    assert "isolate_tasks" not in kthread and "allow" not in kthread
    assert data["rt"]["shield"] == {"cpus": "2-3", "allow": ["*pmd*", "DPDK*"]}
    assert "\n[shield]\ncpus = " in texts["rt"]  # the new spelling, nothing to warn of
    assert data["rt"]["irq"]["isolate"] == "2-3"
    assert "matches only user processes" in texts["rt"]  # group.user
    assert "latencyd uses no cgroups" in texts["rt"]  # group.cg


def test_group_rules_merge_across_the_chain(tmp_path: Path) -> None:
    files = {
        "lib/base/tuned.conf": "[scheduler]\ngroup.a=0:f:10:*:^\\[a\ngroup.b=0:f:20:*:^\\[b\n",
        "lib/child/tuned.conf": "[main]\ninclude=base\n"
        "[scheduler]\ngroup.b=0:f:30:*:^\\[b\ngroup.a=\n",
    }
    result, data, _t = run(tmp_path, files, "child")
    # TuneD merges group.* option by option: a is switched off, b changed. latencyd's
    # child rule list replaces the parent's, so it is written whole.
    assert [(r["match"], r["priority"]) for r in data["child"]["kthread"]["rule"]] == [("^b", 30)]
    conversions = [converted(files, tmp_path, n) for n in ("child", "base")]
    assert_round_trip(tmp_path / "out", result, conversions)


@pytest.mark.parametrize(
    ("regex", "want"),
    [
        ("^\\[ksoftirqd", "^ksoftirqd"),
        ("\\[rcuc.*\\]$", "^rcuc.*$"),
        ("ksoftirqd.*", "ksoftirqd.*"),  # also user processes in TuneD: kept, with a remark
        ("^java", None),  # user processes only
    ],
)
def test_kthread_regex(regex: str, want: str | None) -> None:
    assert kthread_regex(regex)[0] == want


@pytest.mark.parametrize(
    ("regex", "glob"),
    [
        (".*pmd.*", "*pmd*"),
        ("^DPDK", "DPDK*"),
        ("^contrail-vroute$", "contrail-vroute"),
        ("^lcore-slave-.*", "lcore-slave-*"),
        ("qemu-kvm", "*qemu-kvm*"),
        ("^a\\.b$", "a.b"),
        ("^(a|b)$", None),
        ("\\d+", None),
    ],
)
def test_blacklist_regexes_as_globs(regex: str, glob: str | None) -> None:
    assert regex_to_glob(regex) == glob


# == include resolution ============================================================================


def test_include_resolution_order_and_the_profiles_layout(tmp_path: Path) -> None:
    files = {
        "lib/base/tuned.conf": "[sysctl]\nvm.swappiness=1\n",  # shadowed by profiles/
        "lib/profiles/base/tuned.conf": "[sysctl]\nvm.swappiness=2\n",  # the newer layout
        "etc/mid/tuned.conf": "[main]\ninclude=base\n[sysctl]\nkernel.sysrq=1\n",
        "lib/profiles/mid/tuned.conf": "[sysctl]\nkernel.sysrq=9\n",  # /etc wins
        "etc/profiles/top/tuned.conf": "[main]\ninclude=mid, -optional\n",
    }
    result, data, texts = run(tmp_path, files, "top")
    sources = [f.source for _p, f in result.files]
    assert sources == [
        str(tmp_path / "tuned/etc/profiles/top/tuned.conf"),
        str(tmp_path / "tuned/etc/mid/tuned.conf"),
        str(tmp_path / "tuned/lib/profiles/base/tuned.conf"),
    ]
    assert data["top"]["main"]["include"] == ["mid.toml"]
    assert data["mid"]["sysctl"] == {"kernel.sysrq": 1}
    assert data["base"]["sysctl"] == {"vm.swappiness": 2}
    assert "optional '-optional' not found" in texts["top"]


def test_an_override_includes_the_profile_it_shadows(tmp_path: Path) -> None:
    files = {
        "lib/x/tuned.conf": "[sysctl]\nvm.swappiness=1\nkernel.sysrq=1\n",
        "etc/x/tuned.conf": "[main]\ninclude=x\n[sysctl]\nvm.swappiness=5\n",
    }
    result, data, _t = run(tmp_path, files, "x")
    names = [p.name for p, _f in result.files]
    assert names[0] == "x.toml" and names[1].startswith("x@") and names[1].endswith(".toml")
    assert data["x"]["main"]["include"] == [names[1]]
    assert data["x"]["sysctl"] == {"vm.swappiness": 5}


def test_a_diamond_is_merged_once(tmp_path: Path) -> None:
    files = {
        "lib/d/tuned.conf": "[sysctl]\nvm.swappiness=1\n",
        "lib/b/tuned.conf": "[main]\ninclude=d\n[sysctl]\nkernel.sysrq=2\n",
        "lib/c/tuned.conf": "[main]\ninclude=d\n[sysctl]\nvm.swappiness=3\n",
        "lib/a/tuned.conf": "[main]\ninclude=b,c\n",
    }
    result, _d, _t = run(tmp_path, files, "a")
    assert sorted(p.stem for p, _f in result.files) == ["a", "b", "c", "d"]
    lib = ProfileLibrary([tmp_path / "out"], permissive(), MACHINE)
    merged = lib.load(str(tmp_path / "out/a.toml")).sections["sysctl"]
    assert merged == {"vm.swappiness": 3, "kernel.sysrq": 2}


@pytest.mark.parametrize(
    ("files", "target", "why"),
    [
        (
            {"lib/a/tuned.conf": "[main]\ninclude=b\n", "lib/b/tuned.conf": "[main]\ninclude=a\n"},
            "a",
            "include cycle: a -> b -> a",
        ),
        ({"lib/a/tuned.conf": "[main]\ninclude=a\n"}, "a", "include cycle"),
        ({"lib/a/tuned.conf": "[main]\ninclude=nope\n"}, "a", "'nope' not found"),
        ({}, "nope", "no TuneD profile named 'nope'"),
        ({"lib/a/tuned.conf": "not an ini file\n"}, "a", "not a TuneD profile"),
        ({"lib/a/tuned.conf": "[weird]\nx=1\n"}, "a", "not a TuneD profile"),
        ({"lib/a/tuned.conf": "[main]\nsummary\n"}, "a", "not a TuneD profile"),
    ],
)
def test_impossible_imports(tmp_path: Path, files: dict[str, str], target: str, why: str) -> None:
    write(tmp_path / "tuned", files)
    with pytest.raises(ti.ImportFailed, match=why):
        ti.import_tuned(target, tmp_path / "out", dirs=dirs_of(tmp_path / "tuned"), host=HOST)


def test_a_toml_file_is_not_a_tuned_profile(tmp_path: Path) -> None:
    toml = tmp_path / "p.toml"
    toml.write_text('[main]\nsummary = "x"\n')
    with pytest.raises(ti.ImportFailed, match="latencyd profile"):
        ti.import_tuned(str(toml), tmp_path / "out", host=HOST)


def test_a_directory_or_a_file_path(tmp_path: Path) -> None:
    write(
        tmp_path / "src", {"my/tuned.conf": "[sysctl]\nvm.swappiness=7\n", "other.conf": "[main]\n"}
    )
    for target in (str(tmp_path / "src/my"), str(tmp_path / "src/my/tuned.conf")):
        result = ti.import_tuned(target, tmp_path / "out", dirs=[], host=HOST)
        assert [p.name for p, _f in result.files] == ["my.toml"]
    result = ti.import_tuned(str(tmp_path / "src/other.conf"), tmp_path / "out", dirs=[], host=HOST)
    assert [p.name for p, _f in result.files] == ["other.toml"]


# == enabled, replace, drop ========================================================================


INHERIT = {
    "lib/base/tuned.conf": """
        [cpu]
        governor=performance
        force_latency=10
        [sysctl]
        vm.swappiness=10
        kernel.sysrq=1
        vm.dirty_ratio=10
        [vm]
        transparent_hugepages=never
        [sysfs]
        /sys/kernel/mm/ksm/run=0
    """,
    "lib/child/tuned.conf": """
        [main]
        include=base
        [cpu]
        replace=1
        governor=powersave
        [sysctl]
        drop=kernel.sysrq,vm.dirty_ratio
        [vm]
        enabled=false
    """,
}


def test_enabled_replace_drop(tmp_path: Path) -> None:
    result, data, _t = run(tmp_path, INHERIT, "child")
    child = data["child"]
    # replace: TuneD's [cpu] is the child's alone; latencyd replaces both sections it feeds.
    assert child["cpu"] == {"replace": True, "governor": "powersave"}
    assert child["cstate"] == {"replace": True}
    # drop: sysctl keys by name; vm.dirty_ratio lives in latencyd's [writeback].
    assert child["sysctl"] == {"drop": ["kernel.sysrq"]}
    assert child["writeback"] == {"drop": ["dirty_ratio"]}
    # enabled = false on [vm] takes THP away, but [sysfs] also holds the ksm setting: drop.
    assert child["sysfs"] == {"drop": ["/sys/kernel/mm/transparent_hugepage/enabled"]}
    conversions = [converted(INHERIT, tmp_path, n) for n in ("child", "base")]
    assert_round_trip(tmp_path / "out", result, conversions)


def test_enabled_false_switches_a_whole_section_off(tmp_path: Path) -> None:
    files = {
        "lib/base/tuned.conf": "[sysctl]\nvm.swappiness=10\n[cpu]\ngovernor=performance\n",
        "lib/child/tuned.conf": "[main]\ninclude=base\n[sysctl]\nenabled=false\nvm.swappiness=1\n",
    }
    result, data, _t = run(tmp_path, files, "child")
    assert data["child"]["sysctl"] == {"enabled": False}
    conversions = [converted(files, tmp_path, n) for n in ("child", "base")]
    assert_round_trip(tmp_path / "out", result, conversions)


def test_unit_merge_is_tuneds() -> None:
    base = parse_tuned("[net]\ndevices=eth*\ncoalesce=rx-usecs 3\n", "base", Path("b"))
    child = parse_tuned("[net]\nring=rx 512\n", "child", Path("c"))
    unit = merge([base, child]).units["net"]
    # Options merge; devices is the child's (TuneD's Unit() defaults it to "*").
    assert unit.options == {"coalesce": "rx-usecs 3", "ring": "rx 512"} and unit.devices == "*"


# == the other plugins =============================================================================


def test_sysctl_vm_sysfs_and_writeback(tmp_path: Path) -> None:
    result, data, texts = run(
        tmp_path,
        {
            "lib/p/tuned.conf": """
                [sysctl]
                net.ipv4.tcp_rmem="4096 87380 16777216"
                kernel.pid_max=>4194304
                net.netfilter.nf_conntrack_max=1048576
                kernel.shmall = 18446744073692774399
                vm.dirty_ratio=0
                vm.dirty_bytes=536870912
                vm.dirty_background_ratio=5
                [vm]
                transparent_hugepages=never
                dirty_background_bytes=3%
                [sysfs]
                /sys/devices/virtual/workqueue/writeback/cpumask=fffffffd
                /sys/kernel/mm/ksm/run=2
            """
        },
        "p",
    )
    p = data["p"]
    assert p["sysctl"] == {
        "net.ipv4.tcp_rmem": "4096 87380 16777216",
        "kernel.shmall": "18446744073692774399",  # beyond a TOML integer
    }
    assert p["writeback"] == {"dirty_bytes": 536870912, "dirty_background_ratio": 3}
    assert p["sysfs"] == {
        "/sys/kernel/mm/transparent_hugepage/enabled": "never",
        "/sys/kernel/mm/ksm/run": 2,
    }
    assert p["kthread"] == {"writeback_cpumask": "0xfffffffd"}
    assert '# "kernel.pid_max" = 4194304' in texts["p"]  # only if greater: left to the user
    assert '# "net.netfilter.nf_conntrack_max" = 1048576' in texts["p"]  # not on this kernel
    assert result.code == ti.PARTIAL


def test_conditions_are_evaluated_here_and_reported(tmp_path: Path) -> None:
    _r, data, texts = run(
        tmp_path,
        {
            "lib/p/tuned.conf": """
                [sysctl]
                vm.swappiness=10
                [sysctl.arm]
                type=sysctl
                uname_regex=aarch64
                kernel.sysrq=1
                [sysctl.intel]
                type=sysctl
                cpuinfo_regex=Intel
                kernel.panic=5
            """
        },
        "p",
    )
    assert data["p"]["sysctl"] == {"vm.swappiness": 10, "kernel.panic": 5}
    assert "this machine does not match" in texts["p"] and "this machine matches" in texts["p"]


def test_net(tmp_path: Path) -> None:
    files = {
        "lib/base/tuned.conf": "[net]\ndevices=eth* !eth9\ncoalesce=rx-usecs 0 adaptive-rx off\n",
        "lib/child/tuned.conf": """
            [main]
            include=base
            [net]
            devices=eth* !eth9
            features=gro off, lro on
            ring=rx 4096 bogus 1
            channels=combined ${f:check_net_queue_count:${netdev_queue_count}}
            mtu=9000
        """,
    }
    result, data, texts = run(tmp_path, files, "child")
    nic = {"match": ["eth*"], "exclude": ["lo", "eth9"]}
    nic |= {"coalesce": {"rx-usecs": 0, "adaptive-rx": False}}
    nic |= {"features": {"gro": False, "lro": True}, "ring": {"rx": 4096}}
    assert data["child"]["net"]["nic"] == [nic]  # the parent's keys too: the list is replaced
    for why in ("'bogus' is not a key", "netdev_queue_count is not set", "has no mtu", "dynamic"):
        assert why in texts["child"]
    conversions = [converted(files, tmp_path, n) for n in ("child", "base")]
    assert_round_trip(tmp_path / "out", result, conversions)


def test_irq_and_irqbalance(tmp_path: Path) -> None:
    _r, data, _t = run(
        tmp_path,
        {
            "lib/p/tuned.conf": """
                [irqbalance]
                banned_cpus=3
                [scheduler]
                isolated_cores=2-3
                default_irq_smp_affinity=0
                [irq_special]
                type=irq
                devices=irq16
                affinity=1
                [irq]
                affinity=0-1
            """
        },
        "p",
    )
    irq = data["p"]["irq"]
    assert irq["isolate"] == "(3) | (2-3)"
    assert irq["default_affinity"] == "0-1"  # the [irq] section's DEFAULT device, applied last
    assert irq["rule"] == [{"match": "irq:16", "cpus": "1"}, {"match": "*", "cpus": "0-1"}]


def test_cpu_plugin_options(tmp_path: Path) -> None:
    _r, data, texts = run(
        tmp_path,
        {
            "lib/p/tuned.conf": """
                [cpu_iso]
                type=cpu
                devices=${f:cpulist2devs:2-3}
                governor=performance
                [cpu]
                governor=ondemand|powersave
                energy_perf_bias=powersave|power
                energy_performance_preference=balance_performance
                min_perf_pct=100
                no_turbo=true
                boost=0
                sampling_down_factor=100
            """
        },
        "p",
    )
    cpu = data["p"]["cpu"]
    assert cpu["governor"] == "ondemand" and "fallback 'powersave'" in texts["p"]
    assert cpu["energy_perf_bias"] == "power"  # powersave is power: no fallback lost
    assert cpu["energy_performance_preference"] == "balance_performance"
    assert (cpu["min_perf_pct"], cpu["no_turbo"], cpu["boost"]) == (100, True, False)
    assert cpu["cpus"] == [{"cpus": "2-3", "governor": "performance"}]
    assert "sampling_down_factor" in texts["p"]
    # TuneD's first [cpu] section ([cpu_iso]) sets the PM QoS latency, by load without a
    # force_latency: reported once.
    assert texts["p"].count("dynamic tuning") == 1


def test_bootloader_and_unsupported_plugins_are_listed(tmp_path: Path) -> None:
    result, data, texts = run(
        tmp_path,
        {
            "lib/p/tuned.conf": """
                [bootloader]
                cmdline_a=+isolcpus=1 nohz_full=1
                cmdline_b=-quiet
                initrd_add_dir=/x
                [disk]
                readahead=>4096
                [script]
                script=${i:PROFILE_DIR}/script.sh
                [systemd]
                cpu_affinity=0
                [rtentsk]
                [frobnicate]
                x=1
            """
        },
        "p",
    )
    text = texts["p"]
    # The kernel arguments convert (issue 38); the initrd stays TuneD's.
    converted = {"cmdline": ["isolcpus=1", "nohz_full=1"], "remove": ["quiet"]}
    assert data["p"]["bootloader"] == converted
    assert "latencyd does not build or change initrds" in text
    assert f"{tmp_path}/tuned/lib/p/script.sh" in text
    for why in ("no latencyd plugin", "CPUAffinity", "SO_TIMESTAMP", "'frobnicate' is unknown"):
        assert why in text
    assert result.code == ti.PARTIAL


def test_numbers_beyond_any_int_and_nul_in_paths_are_reported_not_raised(tmp_path: Path) -> None:
    """What the importer fuzz found (bench fuzz, 10,000 cases: 3 escapes): a sysctl value
    of 4,400 digits (int() refuses beyond 4,300), a [sysfs] glob with a NUL byte."""
    digits = "1" * 4400
    result, data, _t = run(tmp_path, {"lib/p/tuned.conf": (
        f"[sysctl]\nvm.swappiness={digits}\n[sysfs]\n/sys/kernel/x\x00*/y=1\n"
        f"[cpu]\nmin_perf_pct={digits}\n[scheduler]\ngroup.x={digits}:f:1:*:x\n"
    )}, "p")  # fmt: skip
    assert data["p"]["sysctl"]["vm.swappiness"] == digits  # kept as text, refused at load
    assert result.code == ti.PARTIAL


def test_complete_when_everything_converts(tmp_path: Path) -> None:
    result, data, texts = run(
        tmp_path, {"lib/p/tuned.conf": "[main]\nsummary=s\n[sysctl]\nvm.swappiness=5\n"}, "p"
    )
    assert result.code == ti.COMPLETE
    assert data["p"] == {"main": {"summary": "s"}, "sysctl": {"vm.swappiness": 5}}
    assert texts["p"].startswith(ti.MARKER)


# == the TOML writer ===============================================================================


@pytest.mark.parametrize(
    "value",
    [
        "plain",
        'quote " and back\\slash',
        "tab\tnewline\nbell\x07del\x7f",
        "unicode µs — ü",
        "",
        0,
        -1,
        (1 << 63) - 1,
        -(1 << 63),
        True,
        False,
        1.5,
        [1, "two", [3]],
        [],
        {"a": 1, "b-c": {"d e": [True]}, "/sys/x": "y", "dotted.key": 1},
        {},
    ],
)
def test_toml_values_round_trip(value: Any) -> None:
    assert tomllib.loads(f"x = {toml_value(value)}")["x"] == value


@pytest.mark.parametrize("key", ["bare_key-1", "vm.swappiness", "/sys/a b", 'q"uote', "ü", ""])
def test_toml_keys_round_trip(key: str) -> None:
    assert tomllib.loads(f"{toml_key(key)} = 1") == {key: 1}


def test_toml_refuses_what_it_cannot_write() -> None:
    with pytest.raises(ValueError):
        toml_value(1 << 63)
    with pytest.raises(TypeError):
        toml_value(object())


# == facts the importer shares with latencyd's plugins ===========================================


def test_the_importers_copies_of_plugin_facts_are_the_plugins() -> None:
    """latencyd's core does not import its plugins: the few facts the importer needs from
    them are written again there, and must stay the same."""
    from latencyd.plugins import cpu, kthread, writeback

    assert tuple(cpu.EPB_NAMES) == EPB_NAMES
    assert tuple(writeback.PAIRS.values()) == WRITEBACK_PAIRS
    writeback_keys = [k for pair in writeback.PAIRS.values() for k in pair] + [*writeback.PLAIN]
    assert {f"vm.{k}": k for k in writeback_keys} == WRITEBACK_SYSCTLS
    assert RT_POLICIES == kthread.RT_POLICIES
    assert set(TUNED_POLICIES.values()) == set(POLICIES)


def test_every_tuned_plugin_is_converted_or_reported() -> None:
    assert {*CONVERTERS, *NO_PLUGIN, "variables"} == KNOWN_PLUGINS


def test_odd_ini_values_still_make_valid_toml(tmp_path: Path) -> None:
    conf = (
        '[main]\nsummary=say "hi" \\ there\ndescription=two\n  lines\n'
        "[sysctl]\nkernel.printk=4 4\n  1 7\n"
        "[cpu]\nforce_latency=cstate.name:C1\n  |10\n"
    )
    _r, data, _t = run(tmp_path, {"lib/p/tuned.conf": conf}, "p")  # tomllib parses every file
    assert data["p"]["main"]["summary"] == 'say "hi" \\ there'
    assert data["p"]["sysctl"]["kernel.printk"] == "4 4\n1 7"


def test_arrays_of_tables_are_written_as_such(tmp_path: Path) -> None:
    _r, _d, texts = run(tmp_path, {"lib/p/tuned.conf": "[scheduler]\ngroup.a=0:f:1:3:^\\[a\n"}, "p")
    assert "\n[[kthread.rule]]\n" in texts["p"]


# == the command line ==============================================================================


def test_cli_exit_codes_and_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(
        tmp_path / "t",
        {
            "good/tuned.conf": "[sysctl]\nvm.swappiness=5\n",
            "part/tuned.conf": "[usb]\nautosuspend=1\n",
        },
    )
    out = str(tmp_path / "out")
    assert cli.main(["import-tuned", str(tmp_path / "t/good"), "-o", out]) == 0
    assert cli.main(["import-tuned", str(tmp_path / "t/part"), "-o", out]) == 1
    err = capsys.readouterr().err
    assert "part.toml: not converted: [usb] autosuspend" in err
    assert cli.main(["import-tuned", str(tmp_path / "nope"), "-o", out]) == 2
    # A file import-tuned did not write is never overwritten, nor anything written then.
    (tmp_path / "out/good.toml").write_text('[main]\nsummary = "mine"\n')
    assert cli.main(["import-tuned", str(tmp_path / "t/good"), "-o", out]) == 2
    assert "was not written by import-tuned" in capsys.readouterr().err
    write(tmp_path / "t", {"top/tuned.conf": "[main]\ninclude=good\n"})
    args = ["import-tuned", "top", "--tuned-dir", str(tmp_path / "t"), "-o", out]
    assert cli.main(args) == 2 and not (tmp_path / "out/top.toml").exists()
    (tmp_path / "out/good.toml").unlink()
    assert cli.main(args) == 0
    assert tomllib.loads((tmp_path / "out/top.toml").read_text())["main"] == {
        "include": ["good.toml"]
    }


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "t", {"part/tuned.conf": "[usb]\nautosuspend=1\n"})
    assert cli.main(["--json", "import-tuned", str(tmp_path / "t/part"), "-o", str(tmp_path)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert (
        data["exit_code"] == 1
        and data["files"][0]["not_converted"][0]["setting"] == "[usb] autosuspend"
    )


# == acceptance: every profile Debian's tuned ships ================================================

TUNED = Path("/usr/lib/tuned")
SHIPPED = sorted(
    p.parent.name
    for pattern in ("*/tuned.conf", "profiles/*/tuned.conf")
    for p in TUNED.glob(pattern)
)


@pytest.fixture(scope="module")
def installed() -> tuple[dict[str, Schema], Machine, ti.Host]:
    """The installed plugins' schemas and this machine, as latencyd/tools/explain.py builds them."""
    from latencyd.core.engine import section_schemas
    from latencyd.core.plugin import load_plugins
    from latencyd.kernel.system import System

    system = System("/")
    return section_schemas(load_plugins(system)), system.machine(), ti.read_host(system)


@pytest.mark.skipif(not TUNED.is_dir(), reason="/usr/lib/tuned is absent: apt-get install tuned")
@pytest.mark.parametrize("name", SHIPPED or ["(none)"])
def test_every_shipped_tuned_profile_converts_and_loads(
    name: str,
    tmp_path: Path,
    installed: tuple[dict[str, Schema], Machine, ti.Host],
    capsys: pytest.CaptureFixture[str],
) -> None:
    schemas, machine, host = installed
    out = tmp_path / "out"
    code = cli.main(["import-tuned", name, "-o", str(out)])  # a traceback fails the test
    assert code in (ti.COMPLETE, ti.PARTIAL), capsys.readouterr().err
    files = sorted(out.glob("*.toml"))
    assert files
    missing: set[str] = set()
    for path in files:
        missing |= load_with(path, schemas, machine, out)
    # And latencyd's merge of the converted chain is the conversion of TuneD's merge.
    chain = load_chain(name, ti.TUNED_DIRS, host)
    result = ti.ImportResult([(out / f"{f.name}.toml", f) for f in convert_chain(chain, host)], 0)
    conversions = [
        convert_merged(
            merge([chain.profiles[p] for p in chain.orders[f.source]]),
            chain.variable_files,
            host,
        )
        for _p, f in result.files
    ]
    assert_round_trip(out, result, conversions)
    if missing:
        pytest.skip(
            f"the {', '.join(sorted(missing))} plugin(s) are not registered yet: the rest of "
            "each converted profile loads"
        )


def load_with(path: Path, schemas: dict[str, Schema], machine: Machine, out: Path) -> set[str]:
    """Load a converted file with the installed plugins; sections whose plugin is not
    installed (yet) are checked with stand-ins, and returned."""
    missing: set[str] = set()
    while True:
        lib = ProfileLibrary([out], {**permissive_only(missing), **schemas}, machine)
        try:
            lib.load(str(path))
            return missing
        except ProfileError as exc:
            unknown = _unknown_section(exc.message)
            if unknown is None or unknown in missing or unknown not in SECTION_ORDER:
                raise
            missing.add(unknown)


def permissive_only(sections: set[str]) -> dict[str, Schema]:
    every = permissive()
    return {s: every[s] for s in sections}


def _unknown_section(message: str) -> str | None:
    m = re.match(r"unknown plugin section \[(\w+)\]", message)
    return m.group(1) if m else None


def test_the_host_is_read_through_the_system_it_is_given(tmp_path: Path) -> None:
    from latencyd.kernel.system import System
    from tests.unit.fakesys import make_fake_root, put

    root = make_fake_root(tmp_path, cpus="0-1", sysctls={"kernel/sched_rt_runtime_us": "950000"})
    cpu = "sys/devices/system/cpu"
    put(root, f"{cpu}/present", "0-1")
    for n in (0, 1):
        put(root, f"{cpu}/cpu{n}/topology/physical_package_id", "0")
    put(root, f"{cpu}/cpu0/cpuidle/state0/name", "POLL")
    put(root, f"{cpu}/cpu0/cpuidle/state0/latency", "0")
    put(root, f"{cpu}/cpu0/cpuidle/state1/name", "C1")
    put(root, f"{cpu}/cpu0/cpuidle/state1/latency", "2")
    (root / "proc/cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu hypervisor\n")
    host = ti.read_host(System(root))
    assert (host.online, host.present, dict(host.packages)) == ((0, 1), (0, 1), {0: "0", 1: "0"})
    assert host.idle_states == (ti.IdleState(0, "POLL", 0), ti.IdleState(1, "C1", 2))
    assert host.virtualized == "the CPU flag 'hypervisor' is set"
    assert host.cpuinfo.endswith("hypervisor\n")  # as the file has it
    assert host.has_sysctl("kernel.sched_rt_runtime_us") and not host.has_sysctl("vm.nothing")
    assert host.exists("/proc/sys/kernel/sched_rt_*") and not host.exists("/proc/sys/nothing/*")
