"""Hostile completions against the sandbox that runs model-written HumanEval code (spectr_repro.quality.sandbox).

Each case is a program a model could write, run through ``quality.run_program`` in every sandbox mode this
machine has (bwrap, unshare; each skipped with the probe's reason where it does not work) and in mode
``none`` (no isolation, an explicit opt-in) for the cases that limits alone contain; the cases that need
isolation are skipped there with the reason. Every case is bounded: seconds of wall time, a few MB.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
import tracemalloc
import uuid
from pathlib import Path

import pandas as pd
import pytest

from spectr_repro import quality
from spectr_repro.quality import sandbox
from spectr_repro.quality.sandbox import OUTPUT_LIMIT_BYTES, PROCESS_LIMIT, SandboxUnavailable, find_sandbox

NO_ISOLATION = (
    "mode none has no isolation tool: the program shares the harness's network, processes and files, so "
    "this cannot be contained; the harness refuses to run without bwrap or unshare unless --sandbox none"
)
SLEEP = shutil.which("sleep") or "/bin/sleep"


@pytest.fixture(params=["bwrap", "unshare", "none"])
def mode(request) -> str:
    try:
        find_sandbox(request.param)
    except SandboxUnavailable as error:
        pytest.skip(f"{request.param} unavailable on this machine: {error}")
    return request.param


def _isolating(mode: str) -> None:
    if mode == "none":
        pytest.skip(NO_ISOLATION)


def _processes_with(marker: str, wait_s: float = 2.0) -> list[int]:
    """Pids whose command line holds ``marker``, after giving the kernel ``wait_s`` to reap killed ones."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _harness_environ_token() -> str:
    """The longest entry of this process's environment as the kernel shows it in /proc (what a program
    that can see the harness reads); the sandbox's own environment has nothing like it."""
    entries = Path(f"/proc/{os.getpid()}/environ").read_bytes().split(b"\0")
    return max(entries, key=len).decode("utf-8", "replace")


# ---- the table -----------------------------------------------------------------------------
def test_forked_sleepers_die_and_exit_0_is_a_pass(mode):
    if mode == "none":
        pytest.skip(NO_ISOLATION + " (a child that calls setsid leaves the process group that is killed)")
    marker = f"{4000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"  # a unique sleep length
    source = (
        "import os\n"
        "forked = 0\n"
        "for _ in range(50):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os.setsid()  # leave the process group too\n"
        f"        os.execv({SLEEP!r}, ['sleep', {marker!r}])\n"
        "    forked += 1\n"
        "print('forked', forked)\n"
    )
    result = quality.run_program(source, timeout=30, sandbox=mode)
    # passed, not "timeout": the exit was seen although 50 sleepers held the output pipe open
    assert result.status == "passed" and "forked 50" in result.detail, result
    assert _processes_with(marker) == [], "sleepers outlived the run"


@pytest.mark.parametrize("spawn", ["posix.system", "os.posix_spawn", "importlib.reload(subprocess)"])
def test_shell_commands_run_inside_the_sandbox(mode, spawn, tmp_path):
    _isolating(mode)
    outside = tmp_path / f"pwned-{uuid.uuid4().hex}"
    token = _harness_environ_token()
    # the environment on one line (NUL-separated): it stays inside the 3 output lines the result keeps
    command = f"echo pwned > {outside}; cat /proc/{os.getpid()}/environ; echo"
    call = {
        "posix.system": f"import posix\nposix.system({command!r})\n",
        "os.posix_spawn": (
            "import os\n"
            f"pid = os.posix_spawn('/bin/sh', ['sh', '-c', {command!r}], {{}})\n"
            "os.waitpid(pid, 0)\n"
        ),
        "importlib.reload(subprocess)": (
            "import importlib, subprocess\nimportlib.reload(subprocess)\n"
            f"subprocess.run(['sh', '-c', {command!r}])\n"
        ),
    }[spawn]
    result = quality.run_program(call + "print('spawned')\n", timeout=10, sandbox=mode)
    assert "spawned" in result.detail, result  # the shell ran (inside), the program went on
    assert not outside.exists(), f"{spawn}: a shell command wrote {outside}"
    assert token not in result.detail, f"{spawn}: a shell command read the harness's environment"


@pytest.mark.parametrize("where", ["harness_folder", "shared_tmp"])
def test_write_outside_its_folder_fails_and_writes_nothing(mode, where, tmp_path):
    _isolating(mode)
    # tmp_path: a folder of the harness's; /tmp/<random>: a world-writable place (even nobody may write)
    shared = Path(f"/tmp/spectr-outside-{uuid.uuid4().hex}")
    outside = tmp_path / "outside.txt" if where == "harness_folder" else shared
    try:
        result = quality.run_program(f"open({str(outside)!r}, 'w').write('x')\n", timeout=10, sandbox=mode)
        assert not outside.exists(), f"the program wrote {outside}"
    finally:
        outside.unlink(missing_ok=True)
    if where == "harness_folder":  # bwrap's private /tmp accepts the shared_tmp write (then discards it)
        assert not result.passed and "Error" in result.detail, result  # read-only, missing or not ours


def test_huge_output_is_cut_and_the_harness_stays_small(mode):
    source = "import sys\nchunk = b'x' * (1 << 20)\nfor _ in range(400):\n    sys.stdout.buffer.write(chunk)\n"
    tracemalloc.start()
    try:
        result = quality.run_program(source, timeout=30, sandbox=mode)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.status == "failed" and "more than" in result.detail, result
    assert peak < 4 * OUTPUT_LIMIT_BYTES + (1 << 20), f"harness allocated {peak / 2**20:.0f} MiB for 400 MB of output"


def test_no_harness_port_no_harness_environment(mode):
    _isolating(mode)
    token = _harness_environ_token()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.setblocking(False)
        port = server.getsockname()[1]
        source = (
            "import _socket, os\n"  # the C module: no Python-level guard to get around
            "s = _socket.socket()\n"
            "s.settimeout(2)\n"
            "try:\n"
            f"    s.connect(('127.0.0.1', {port}))\n"
            "    s.send(b'hello')\n"
            "    print('CONNECTED')\n"
            "except OSError as e:\n"
            "    print('refused', e)\n"
            "try:\n"
            f"    print('ENV', open('/proc/{os.getpid()}/environ').read())\n"
            "except OSError as e:\n"
            "    print('no environ', e)\n"
            "try:\n"
            f"    os.kill({os.getpid()}, 0)\n"
            "    print('HARNESS VISIBLE')\n"
            "except OSError as e:\n"
            "    print('harness invisible', e)\n"
        )
        result = quality.run_program(source, timeout=10, sandbox=mode)
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected
    assert "CONNECTED" not in result.detail and "refused" in result.detail, result
    assert token not in result.detail and "HARNESS VISIBLE" not in result.detail, result


def test_without_an_isolation_tool_it_refuses_unless_opted_in(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # neither bwrap nor unshare can be found
    with pytest.raises(SandboxUnavailable, match=r"bwrap: not installed.*unshare: not installed.*--sandbox none"):
        quality.run_program("print('ok')\n", timeout=10)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        quality.humaneval_pass([], {})  # refused before anything runs
    opted_in = quality.run_program("print('ok')\n", timeout=10, sandbox="none")
    assert opted_in.passed and "ok" in opted_in.detail
    assert "NO ISOLATION" in find_sandbox("none").describe()


def test_quality_cli_refuses_without_a_sandbox(tmp_path, monkeypatch, capsys):
    cell = tmp_path / "exp" / "cells" / "ar-he"
    cell.mkdir(parents=True)
    (cell / "summary.json").write_text('{"dataset": "humaneval", "method": "ar", "K": 1, "L": 1, '
                                       '"model_pair": "toy", "temperature": 0.0}')
    (cell / "records.jsonl").write_text('{"prompt_id": "HumanEval/0", "completion": "    return False\\n"}\n')
    scored = tmp_path / "quality.csv"
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(tmp_path))
    assert quality.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no sandbox for model-written code") and "Traceback" not in err
    assert not scored.exists()
    # opted in: it runs, and quality.csv (which the report renders) and the printed table say so
    assert quality.main([str(tmp_path), "--sandbox", "none"]) == 0
    assert list(pd.read_csv(scored)["sandbox"]) == ["none"]
    out = capsys.readouterr().out
    assert "| none " in out and f"wrote {scored}" in out and f"wrote {tmp_path / quality.PROMPTS_FILE}" in out
    monkeypatch.setenv("PATH", path)
    try:
        mode = find_sandbox("auto").mode
    except SandboxUnavailable:
        return
    assert quality.main([str(tmp_path)]) == 0
    assert list(pd.read_csv(scored)["sandbox"]) == [mode]


# ---- the limits ---------------------------------------------------------------------------------------
def test_process_limit(mode):
    marker = f"{5000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"
    source = (
        "import os\n"
        "forked = 0\n"
        "for _ in range(400):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        f"        os.execv({SLEEP!r}, ['sleep', {marker!r}])\n"
        "    forked += 1\n"
        "print('forked', forked)\n"
    )
    result = quality.run_program(source, timeout=30, sandbox=mode)
    forked = int(result.detail.split("forked")[-1].split()[0])
    if mode == "none":  # the limit counts every process of the user on the machine: others come and go
        assert 0 < forked < 400, result
    else:  # counted inside the sandbox's own user namespace: exact
        assert 0 < forked <= PROCESS_LIMIT, result
    assert _processes_with(marker) == []  # mode none too: no setsid here, the group kill reaches them


def test_timeout_kills_the_program_and_its_children(mode):
    marker = f"{6000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"
    source = f"import os\nif os.fork() == 0:\n    os.execv({SLEEP!r}, ['sleep', {marker!r}])\nwhile True:\n    pass\n"
    result = quality.run_program(source, timeout=1, sandbox=mode)
    assert result.status == "timeout"
    assert _processes_with(marker) == []


def test_file_size_and_open_file_limits(mode):
    big = quality.run_program("open('big', 'wb').write(b'x' * (64 << 20))\n", timeout=10, sandbox=mode)
    assert not big.passed and "File too large" in big.detail, big
    files = quality.run_program(
        "handles = []\ntry:\n    while len(handles) < 10000:\n        handles.append(open('f%d' % len(handles), 'w'))\n"
        "except OSError as e:\n    print('opened', len(handles), e)\n",
        timeout=10,
        sandbox=mode,
    )
    opened = int(files.detail.split("opened")[-1].split()[0])
    assert opened < sandbox.OPEN_FILES_LIMIT and "Too many open files" in files.detail, files


def test_unknown_mode_is_one_clear_error():
    with pytest.raises(ValueError, match="sandbox mode must be one of auto, bwrap, unshare, none"):
        quality.run_program("print(1)\n", sandbox="docker")
