"""`agora batch submit`'s pure parsing: Slurm-style values, #AGORA directives, the JobSpec built."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import pwd
import shlex

import pytest
from agora.frameworks.batch.parse import (
    add_submit_options,
    build_spec,
    parse_array,
    parse_dependencies,
    parse_duration,
    parse_memory,
    parse_when,
    read_directives,
)
from agora.frameworks.batch.spec import (
    MAX_ARRAY_TASKS,
    ArraySpec,
    Constraint,
    Dependency,
    DepKind,
    SpecError,
)


def options(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_submit_options(parser)
    return parser.parse_args(list(argv))


# ------------------------------------------------------------------ arrays


@pytest.mark.parametrize(
    ("text", "indices", "max_running"),
    [
        ("7", [7], 0),
        ("0-4", [0, 1, 2, 3, 4], 0),
        ("0-999%50", list(range(1000)), 50),
        ("1,3,5-7", [1, 3, 5, 6, 7], 0),
        ("0-15:4", [0, 4, 8, 12], 0),
        ("0-15:4%2", [0, 4, 8, 12], 2),
        ("3, 1", [3, 1], 0),
    ],
)
def test_parse_array(text: str, indices: list[int], max_running: int) -> None:
    array = parse_array(text)
    assert list(array.indices()) == indices
    assert array.max_running == max_running


def test_parse_array_round_trips_through_its_text() -> None:
    assert str(parse_array("0-15:4,20%3")) == "0-15:4,20%3"
    assert parse_array("0-9") == ArraySpec(((0, 9, 1),))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no indices"),
        ("%5", "no indices"),
        ("-1", "0 or more"),
        ("-3-5", "0 or more"),
        ("9-2", "backwards"),
        ("0-9:0", "step"),
        ("abc", "cannot read"),
        ("1,,2", "cannot read"),
        ("0-9%0", "limit"),
        ("0-9%x", "limit"),
        (f"0-{MAX_ARRAY_TASKS}", "at most"),
        ("1.5", "cannot read"),
    ],
)
def test_parse_array_refuses_naming_the_text(text: str, why: str) -> None:
    with pytest.raises(SpecError, match=why) as info:
        parse_array(text)
    assert repr(text) in str(info.value)


# ------------------------------------------------------------------ dependencies


def test_parse_dependencies() -> None:
    assert parse_dependencies("afterok:12,afterany:13") == (
        Dependency(DepKind.AFTEROK, 12),
        Dependency(DepKind.AFTERANY, 13),
    )
    assert parse_dependencies("afterok:12:13") == (
        Dependency(DepKind.AFTEROK, 12),
        Dependency(DepKind.AFTEROK, 13),
    )
    assert parse_dependencies("AfterNotOK:4") == (Dependency(DepKind.AFTERNOTOK, 4),)


@pytest.mark.parametrize(
    "text", ["after:12", "singleton", "afterok", "afterok:x", "afterok:1:", ""]
)
def test_parse_dependencies_refuses(text: str) -> None:
    with pytest.raises(SpecError, match="bad dependency"):
        parse_dependencies(text)


# ------------------------------------------------------------------ durations and sizes


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 1800.0),  # Slurm: minutes
        ("1:30", 90.0),  # MM:SS
        ("2:00:05", 7205.0),  # HH:MM:SS
        ("1-2", 93600.0),  # D-HH
        ("1-2:30", 95400.0),  # D-HH:MM
        ("1-0:0:10", 86410.0),  # D-HH:MM:SS
        ("90s", 90.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1.5h", 5400.0),
        ("1d", 86400.0),
        ("500ms", 0.5),
        ("10 S", 10.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["0", "0s", "-5", "-1h", "", "soon", "1:2:3:4", "1x", "inf", "nan"]
)
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(SpecError, match="bad time"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("512", 512.0),
        ("512M", 512.0),
        ("4G", 4096.0),
        ("4g", 4096.0),
        ("4GB", 4096.0),
        ("4GiB", 4096.0),
        ("1T", 1048576.0),
        ("100K", 100 / 1024),
        ("1.5G", 1536.0),
    ],
)
def test_parse_memory(text: str, mib: float) -> None:
    assert parse_memory(text) == pytest.approx(mib)


@pytest.mark.parametrize("text", ["", "lots", "-1G", "4X", "4B", "G"])
def test_parse_memory_refuses(text: str) -> None:
    with pytest.raises(SpecError, match="bad size"):
        parse_memory(text)


def test_parse_when() -> None:
    now = 1_800_000_000.0
    assert parse_when("1767225600", now) == 1767225600.0
    assert parse_when("2h", now) == now - 7200
    assert parse_when("30m", now) == now - 1800
    assert parse_when("2026-12-03", now) == dt.datetime(2026, 12, 3).timestamp()
    assert parse_when("2026-12-03T10:00", now) == dt.datetime(2026, 12, 3, 10).timestamp()
    with pytest.raises(SpecError, match="bad time"):
        parse_when("yesterday", now)


# ------------------------------------------------------------------ directives

SCRIPT = """\
#!/bin/bash
# a comment
#AGORA --cpus 2 --mem=4G

#AGORA -J 'my job'   # trailing comment
#AGORAX not ours
echo hello
#AGORA --cpus 64
"""


def test_read_directives_reads_the_header_only() -> None:
    assert read_directives(SCRIPT) == [
        (3, ["--cpus", "2", "--mem=4G"]),
        (5, ["-J", "my job"]),
    ]


def test_read_directives_without_shebang_and_indented() -> None:
    assert read_directives("  #AGORA -c 1\nrun\n") == [(1, ["-c", "1"])]


def test_an_empty_directive_names_its_line() -> None:
    with pytest.raises(SpecError, match=r"job\.sh:2: #AGORA without options"):
        read_directives("#!/bin/sh\n#AGORA\n", "job.sh")
    with pytest.raises(SpecError, match="line 1"):
        read_directives("#AGORA -J 'unclosed\n")


# ------------------------------------------------------------------ build_spec


def test_build_spec_from_options() -> None:
    opts = options(
        "-J", "sim", "-c", "2.5", "--mem", "4G", "--gpus", "1", "--disk", "1G",
        "-a", "0-9%2", "-d", "afterok:3:4", "--priority", "-5", "-p", "gpu",
        "--user", "alice", "-t", "1:30:00", "--retries", "2",
        "--env", "A=1", "--env", "B=x=y", "-D", "/scratch",
        "-C", "zone=west,rack!=r1", "-C", "os=linux",
    )  # fmt: skip
    spec = build_spec(opts, command_words=["python", "run.py", "a b"])
    assert spec.command == shlex.join(["python", "run.py", "a b"])
    assert (spec.name, spec.user, spec.queue, spec.priority) == ("sim", "alice", "gpu", -5)
    assert (spec.cpus, spec.mem, spec.gpus, spec.disk) == (2.5, 4096.0, 1, 1024.0)
    assert spec.array == ArraySpec(((0, 9, 1),), 2)
    assert [str(d) for d in spec.dependencies] == ["afterok:3", "afterok:4"]
    assert (spec.time_limit, spec.retries, spec.workdir) == (5400.0, 2, "/scratch")
    assert dict(spec.environment) == {"A": "1", "B": "x=y"}
    assert spec.constraints == (
        Constraint("zone", "west"),
        Constraint("rack", "r1", negate=True),
        Constraint("os", "linux"),
    )


def test_build_spec_defaults() -> None:
    spec = build_spec(options(), command_words=["/usr/bin/echo", "hi"])
    assert (spec.name, spec.user, spec.cpus, spec.mem, spec.queue) == (
        "echo",
        pwd.getpwuid(os.geteuid()).pw_name,
        1.0,
        128.0,
        "default",
    )
    assert spec.command == "/usr/bin/echo hi" and spec.array is None and spec.time_limit is None


def test_build_spec_gang() -> None:
    spec = build_spec(options("-n", "4", "--ntasks-per-node", "2"), command_words=["mpirun"])
    assert (spec.ntasks, spec.ntasks_per_node, spec.task_count()) == (4, 2, 4)


def test_build_spec_script_directives_and_overrides() -> None:
    text = "#!/bin/sh\n#AGORA -c 2 --mem 1G -t 10\n#AGORA --env A=1 --env B=2\nrun $1\n"
    opts = options("--mem", "2G", "--env", "B=3")
    spec = build_spec(
        opts, script_path="/home/u/job.sh", script_text=text, script_args=["x", "--flag"]
    )
    assert (spec.name, spec.cpus, spec.mem, spec.time_limit) == ("job.sh", 2.0, 2048.0, 600.0)
    assert dict(spec.environment) == {"A": "1", "B": "3"}
    assert (spec.script, spec.script_args, spec.command) == (text, ("x", "--flag"), "")


def test_later_directives_override_earlier_ones() -> None:
    text = "#AGORA -c 2\n#AGORA --cpus 3\nrun\n"
    assert build_spec(options(), script_path="j.sh", script_text=text).cpus == 3.0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("#AGORA --bogus", "job.sh:3: unknown option --bogus"),
        ("#AGORA -c 1 stray", "job.sh:3: unknown argument stray"),
        ("#AGORA --cpus", "job.sh:3: argument -c/--cpus: expected one argument"),
        ("#AGORA --cpus many", "job.sh:3: --cpus needs a number, not 'many'"),
        ("#AGORA --mem 4X", "job.sh:3: bad size '4X'"),
        ("#AGORA --array 5-1", "job.sh:3: bad array '5-1'"),
        ("#AGORA --chdir rel/dir", "job.sh:3: --chdir needs an absolute path"),
        ("#AGORA --env NOVALUE", "job.sh:3: bad --env 'NOVALUE'"),
        ("#AGORA --na x", "job.sh:3: unknown option --na"),
    ],
)
def test_a_bad_directive_names_file_and_line(line: str, message: str) -> None:
    text = f"#!/bin/sh\n# about\n{line}\nrun\n"
    with pytest.raises(SpecError) as info:
        build_spec(options(), script_path="/x/job.sh", script_text=text)
    assert str(info.value).startswith(message)


def test_build_spec_refusals() -> None:
    with pytest.raises(SpecError, match="nothing to run"):
        build_spec(options(), command_words=[])
    with pytest.raises(SpecError, match="--retries needs a whole number"):
        build_spec(options("--retries", "1.5"), command_words=["x"])
    with pytest.raises(SpecError, match="array or a gang"):
        build_spec(options("-a", "0-3", "-n", "2"), command_words=["x"])
    with pytest.raises(SpecError, match="bad constraint"):
        build_spec(options("-C", "zone"), command_words=["x"])
