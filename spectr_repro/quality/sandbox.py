"""Run untrusted Python (model-written HumanEval completions) in a sandbox.

The program runs the way the ecosystem's tools run untrusted code, in layers:

1. **An isolation tool.** ``bwrap`` (bubblewrap, Debian package ``bubblewrap``) when it works here:
   ``--unshare-all`` (new user, pid, network, ipc, uts and cgroup namespaces: no network, no view of the
   harness's processes or their ``/proc/<pid>/environ``), ``--die-with-parent``, a new session, every
   capability dropped, a read-only root, a private ``/tmp``, ``/dev`` and ``/proc``, and only the program's
   temporary folder writable. Else ``unshare`` (util-linux) with the same namespaces; inside, every mount
   is remounted read-only except the program's folder and every capability is dropped (``setpriv``)
   before the program starts. When neither works the harness **refuses** to run model-written code unless
   the caller opts in with mode ``none`` (``--sandbox none``): then only the limits below apply.
2. **Its own session and process group**, killed whole (SIGKILL) when the program exits or times out; in
   a pid namespace the kernel also kills every process left behind once the program's first process
   exits, so a completion that forks sleepers (even with ``setsid``) leaves nothing running.
3. **Resource limits** set before the program's first line runs (the program cannot raise them): CPU
   seconds, address space, file size, open files, and processes (counted inside the sandbox's own user
   namespace, see ``_LAUNCHER``).
4. **Bounded output**: stdout and stderr (one pipe) are read up to ``OUTPUT_LIMIT_BYTES``; a program that
   writes more is killed and fails, so the harness's memory does not grow with the program's output.
5. **An unprivileged user**: a harness running as root runs the sandbox as ``nobody`` (uid 65534), since
   process limits do not bind root.

    box = find_sandbox("auto")               # probes once per process; SandboxUnavailable if none works
    run = run_python("print(1)", timeout=5, sandbox=box)   # -> Execution(returncode, output, ...)
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SANDBOX_MODES = ("auto", "bwrap", "unshare", "none")
ISOLATING_MODES = ("bwrap", "unshare")  # the order "auto" tries them in

OUTPUT_LIMIT_BYTES = 1 << 20  # stdout + stderr read from one program; more kills it
PROCESS_LIMIT = 64  # processes and threads the program may add (RLIMIT_NPROC above what runs)
FILE_SIZE_LIMIT_BYTES = 16 << 20  # RLIMIT_FSIZE: largest file it may write
OPEN_FILES_LIMIT = 64  # RLIMIT_NOFILE
MEMORY_LIMIT_BYTES = 4 << 30  # RLIMIT_AS
UNPRIVILEGED_ID = 65534  # nobody / nogroup: the sandbox's user when the harness runs as root

# The sandbox's first Python process: set the limits, then exec the program (limits survive exec and an
# unprivileged process cannot raise a hard limit). RLIMIT_NPROC counts the tasks (processes and threads)
# of one user in one user namespace (Linux >= 5.14; older kernels count the user's tasks everywhere), so
# the limit is "what this user already runs in here, plus PROCESS_LIMIT": inside bwrap/unshare that is
# the sandbox alone.
_LAUNCHER = """\
import os, resource, sys
cpu, memory, fsize, nofile, nproc = map(int, sys.argv[1:6])
uid = os.getuid()
running = 0
for entry in filter(str.isdigit, os.listdir('/proc')):
    try:
        with open('/proc/' + entry + '/status') as status:
            fields = dict(line.split(':', 1) for line in status if ':' in line)
        if int(fields['Uid'].split()[0]) == uid:
            running += int(fields['Threads'])
    except (OSError, ValueError, KeyError):
        pass
for name, value in (('CPU', cpu), ('AS', memory), ('FSIZE', fsize), ('NOFILE', nofile),
                    ('NPROC', running + nproc), ('CORE', 0)):
    resource.setrlimit(getattr(resource, 'RLIMIT_' + name), (value, value))
os.execv(sys.executable, [sys.executable, '-I', '-B', *sys.argv[6:]])
"""

# unshare's setup, run as root of the new user namespace (which owns the new mount namespace): make the
# program's folder a mount of its own, remount every other mount read-only (fail closed), then drop every
# capability so that the program cannot remount anything writable again.
_UNSHARE_SETUP = r"""
set -e
folder=$1; shift
mount --bind "$folder" "$folder"
while read -r _id _parent _dev _root point _rest; do
    point=$(printf '%b' "$point")
    [ "$point" = "$folder" ] && continue
    mount -o remount,bind,ro "$point" || { echo "spectr sandbox: cannot make $point read-only" >&2; exit 125; }
done < /proc/self/mountinfo
cd "$folder"
exec setpriv --no-new-privs --bounding-set=-all --inh-caps=-all -- "$@"
"""


MODE_DESCRIPTIONS = {
    "bwrap": "bubblewrap (new user, pid, network, ipc and uts namespaces; read-only root, private /tmp; "
    "resource and output limits)",
    "unshare": "unshare (new user, pid, network, ipc, uts and mount namespaces; every mount read-only but the "
    "program's folder; resource and output limits)",
    "none": "NO ISOLATION (opted in with --sandbox none): resource and output limits and the process-group "
    "kill only; the program shares the harness's network and sees its processes and files",
}


class SandboxUnavailable(RuntimeError):
    """No isolation tool works here and the caller did not opt in to running without one."""


@dataclass(frozen=True)
class Sandbox:
    mode: str  # "bwrap" | "unshare" | "none"
    tool: str | None  # absolute path of bwrap / unshare (None for mode none)
    interpreter: str  # the Python that runs the program (readable by the sandbox's user)
    user: int | None  # uid/gid the sandbox runs as (None: the harness's own)
    tried: tuple[str, ...] = ()  # why other modes were not used (shown in reports)

    def describe(self) -> str:
        parts = [f"{self.mode}: {MODE_DESCRIPTIONS[self.mode]}"]
        if self.user is not None:
            parts.append(f"as uid {self.user}")
        if self.tried:
            parts.append("not used: " + "; ".join(self.tried))
        return ", ".join(parts)


@dataclass(frozen=True)
class Execution:
    returncode: int | None  # None when killed for the timeout
    output: bytes  # stdout and stderr interleaved, at most OUTPUT_LIMIT_BYTES
    timed_out: bool
    output_limited: bool  # wrote more than OUTPUT_LIMIT_BYTES and was killed
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.output_limited


# ---- running ---------------------------------------------------------------------------------------
def run_python(source: str, timeout: float, sandbox: Sandbox | None = None) -> Execution:
    """Run ``source`` (untrusted!) in ``sandbox`` (default ``find_sandbox("auto")``) with a wall-clock
    ``timeout`` in seconds; every process it started is killed before this returns."""
    sandbox = sandbox if sandbox is not None else find_sandbox("auto")
    with tempfile.TemporaryDirectory(prefix="spectr_sandbox_") as folder:
        program = Path(folder) / "program.py"
        program.write_text(source, encoding="utf-8")
        if sandbox.user is not None:  # the folder is the one place the sandbox's user may write
            os.chown(folder, sandbox.user, sandbox.user)
            os.chown(program, sandbox.user, sandbox.user)
        return _execute(_command(sandbox, folder, program, timeout), folder, sandbox, timeout)


def _command(sandbox: Sandbox, folder: str, program: Path, timeout: float) -> list[str]:
    limits = [str(int(timeout) + 2), str(MEMORY_LIMIT_BYTES), str(FILE_SIZE_LIMIT_BYTES), str(OPEN_FILES_LIMIT),
              str(PROCESS_LIMIT)]
    python = [sandbox.interpreter, "-I", "-B", "-c", _LAUNCHER, *limits, str(program)]
    if sandbox.mode == "bwrap":
        return [
            sandbox.tool, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--bind", folder, folder, "--chdir", folder, "--", *python,
        ]
    if sandbox.mode == "unshare":
        return [
            sandbox.tool, "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount",
            "--mount-proc", "--ipc", "--uts", "--propagation", "private",
            "--", "sh", "-c", _UNSHARE_SETUP, "sh", folder, *python,
        ]
    return python


def _execute(command: list[str], folder: str, sandbox: Sandbox, timeout: float) -> Execution:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": folder,
        "TMPDIR": folder,
        "PYTHONHASHSEED": "0",
        "OMP_NUM_THREADS": "1",
        "LANG": "C.UTF-8",
    }
    as_user = {} if sandbox.user is None else {"user": sandbox.user, "group": sandbox.user, "extra_groups": []}
    start = time.monotonic()
    process = subprocess.Popen(
        command, cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True, **as_user,
    )
    output, timed_out, limited = bytearray(), False, False
    try:
        timed_out, limited = _read_until_exit(process, output, start + timeout)
    finally:
        _kill_group(process)
        if not limited:
            _drain(process.stdout, output)
        process.stdout.close()
        process.wait()
    returncode = None if timed_out else process.returncode
    return Execution(returncode, bytes(output[:OUTPUT_LIMIT_BYTES]), timed_out, limited, time.monotonic() - start)


def _read_until_exit(process: subprocess.Popen, output: bytearray, deadline: float) -> tuple[bool, bool]:
    """Read the program's output until its first process exits; (timed out, output over the limit).

    Waits for the process, not for end-of-file: children that inherited the pipe would hold it open.
    """
    fd = process.stdout.fileno()
    os.set_blocking(fd, False)
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        open_pipe = True
        while process.poll() is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True, False
            if not open_pipe:
                time.sleep(min(remaining, 0.02))
                continue
            if selector.select(min(remaining, 0.05)):
                chunk = _read_chunk(fd)
                if chunk == b"":
                    selector.unregister(fd)
                    open_pipe = False
                elif chunk:
                    output += chunk
                    if len(output) > OUTPUT_LIMIT_BYTES:
                        return False, True
    return False, False


def _read_chunk(fd: int) -> bytes | None:
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None


def _drain(stream, output: bytearray) -> None:
    """What is left in the pipe once every writer is dead (bounded: a survivor could keep writing)."""
    fd = stream.fileno()
    while len(output) <= OUTPUT_LIMIT_BYTES:
        chunk = _read_chunk(fd)
        if not chunk:
            return
        output += chunk


def _kill_group(process: subprocess.Popen) -> None:
    # The group holds the tool (bwrap/unshare) and, in mode none, the program and its children; killing
    # the tool kills the sandbox's first process (die-with-parent / kill-child), which ends its pid namespace.
    for kill in (lambda: os.killpg(process.pid, signal.SIGKILL), process.kill):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass


# ---- choosing a sandbox ------------------------------------------------------------------------------
_FOUND: dict[tuple[str, str], Sandbox] = {}


def find_sandbox(mode: str = "auto") -> Sandbox:
    """The sandbox to use: ``auto`` = the first of bwrap, unshare that runs a probe program here; a named
    mode must work; ``none`` runs without isolation (an explicit opt-in). Probed once per process and PATH.
    SandboxUnavailable (with what was tried and how to fix it) when no isolating mode works."""
    if mode not in SANDBOX_MODES:
        raise ValueError(f"sandbox mode must be one of {', '.join(SANDBOX_MODES)}, got {mode!r}")
    key = (mode, os.environ.get("PATH", ""))
    if key not in _FOUND:
        _FOUND[key] = _probe(mode)
    return _FOUND[key]


def _probe(mode: str) -> Sandbox:
    user = UNPRIVILEGED_ID if os.geteuid() == 0 else None
    tried = []
    for candidate in (ISOLATING_MODES if mode == "auto" else (mode,)):
        tool = None if candidate == "none" else shutil.which(candidate)
        if candidate != "none" and tool is None:
            tried.append(f"{candidate}: not installed")
            continue
        errors = []
        for interpreter in _interpreters():
            sandbox = Sandbox(candidate, tool, interpreter, user, tuple(tried))
            try:
                run = run_python("print('sandbox ok')", timeout=30, sandbox=sandbox)
            except OSError as error:
                errors.append(f"{interpreter}: {error}")
                continue
            if run.ok and run.output.strip() == b"sandbox ok":
                return sandbox
            last = run.output.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
            errors.append(f"{interpreter}: exit {run.returncode}, {last[0][:200]}")
        tried.append(f"{candidate}: does not work here ({'; '.join(errors)})")
    raise SandboxUnavailable(
        "no sandbox for model-written code works on this machine ("
        + "; ".join(tried)
        + "). Install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) or enable unprivileged user "
        "namespaces (kernel.unprivileged_userns_clone=1), or pass --sandbox none to run the code WITHOUT "
        "isolation (only on a disposable machine)."
    )


def _interpreters() -> list[str]:
    """Pythons to try, the harness's own first. A harness running as root runs the sandbox as nobody,
    who may not reach a Python installed under /root (pyenv): then a system Python runs the program
    (HumanEval needs the standard library only)."""
    candidates = [sys.executable, os.path.realpath(sys.executable), getattr(sys, "_base_executable", "")]
    candidates += [shutil.which("python3") or "", "/usr/bin/python3", "/usr/local/bin/python3"]
    seen: list[str] = []
    for path in candidates:
        if path and os.path.isfile(path) and path not in seen:
            seen.append(path)
    return seen


__all__ = [
    "Execution", "ISOLATING_MODES", "MODE_DESCRIPTIONS", "OUTPUT_LIMIT_BYTES", "PROCESS_LIMIT", "SANDBOX_MODES",
    "Sandbox", "SandboxUnavailable", "find_sandbox", "run_python",
]
