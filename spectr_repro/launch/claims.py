"""One runner per cell: claim files, taken over when their runner is dead, and a registry of live runners.

Several runners may work on one results folder at once (two ``sweep`` commands, a SLURM array, N jobs of
one grid). Before computing a cell a runner *claims* it by creating ``cells/<cell_id>/claim.json``
with ``O_CREAT | O_EXCL`` (atomic on local file systems and on NFS v3+), holding host, pid, the
process's start time and the runner's id. Whoever creates the file computes the cell; everyone else
skips it (or waits for it, when a later cell needs it: the AR baseline of a group). The claim is
removed when the cell is written or the computation fails.

A claim whose runner died is taken over:

* same host: the pid is gone, or is now another process (its start time differs);
* another host (a cluster node): the claim file was not refreshed for ``stale_after_s`` seconds
  (a live runner touches its claims every ``heartbeat_s`` seconds from a background thread).

A takeover goes through ``claim.json.takeover`` (also created with ``O_EXCL``), so that two runners that
both saw the same dead claim cannot both win, and one never removes the fresh claim of the other.

The registry (``$SPECTR_REPRO_RUNNERS``, default ``<cache>/runners``) holds one small file per live
runner with what it is doing; a cell's timing records the other runners of the same machine that were
loading or computing meanwhile (``contention`` in the summary).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spectr_repro.models.offline import cache_root
from spectr_repro.units import CLAIM_FILE, TAKEOVER_FILE  # the files of a unit folder that are not its records

REGISTRY_ENV_VAR = "SPECTR_REPRO_RUNNERS"
UNREADABLE_GRACE_S = 30.0  # a claim file being written is empty for a moment: live for this long
TAKEOVER_LOCK_STALE_S = 60.0  # a takeover takes milliseconds; a lock this old was left by a dead runner
BUSY_STATES = ("loading", "computing")


def registry_dir() -> Path:
    explicit = os.environ.get(REGISTRY_ENV_VAR)
    if explicit:
        return Path(explicit).expanduser()

    return cache_root() / "runners"


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks after boot (/proc/<pid>/stat field 22); None where unknown.

    Tells a live claimant from an unrelated process that got the same pid later.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after "(comm)"; starttime is field 22 overall


def pid_alive(pid: int, start: str | None = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    except OSError:
        return False
    return start is None or process_start(pid) in (None, start)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Holder:
    """Who holds a claim (as read from its file) and how long ago the file was last refreshed."""

    host: str
    pid: int
    runner: str
    started_at: str
    pid_start: str | None
    age_s: float
    readable: bool = True

    def describe(self) -> str:
        if not self.readable:
            return f"an unreadable claim ({self.age_s:.0f} s old)"
        return f"{self.host} pid {self.pid} (since {self.started_at})"


@dataclass(frozen=True)
class ClaimResult:
    acquired: bool
    holder: Holder | None = None  # the live holder when not acquired
    took_over: Holder | None = None  # the dead holder whose claim was taken over


@dataclass
class Runner:
    """This process as a claimant; use as a context manager (registry entry, heartbeat, cleanup)."""

    heartbeat_s: float = 30.0
    stale_after_s: float = 600.0
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    _held: set[Path] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _state: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pid_start = process_start(self.pid)
        self._registry_file = registry_dir() / f"{self.host}-{self.pid}-{self.id}.json"

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> Runner:
        self.set_state("idle")
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat, name="spectr-claims-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for directory in list(self._held):
            self.release(directory)
        self._registry_file.unlink(missing_ok=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with self._lock:
                held = list(self._held)
            for directory in held:
                try:
                    os.utime(directory / CLAIM_FILE)
                except OSError:
                    pass
            try:
                os.utime(self._registry_file)
            except OSError:
                pass

    # -- claims ----------------------------------------------------------------------------------
    def claim(self, directory: Path) -> ClaimResult:
        """Claim the cell folder ``directory`` (created if needed); see the module docstring."""
        directory.mkdir(parents=True, exist_ok=True)
        holder = None
        for _ in range(3):
            if self._create(directory):
                return ClaimResult(True)
            holder = self.holder(directory)
            if holder is None:
                continue  # released between our attempt and the read: try again
            if holder.runner == self.id:
                return ClaimResult(True)
            if self.is_live(holder):
                return ClaimResult(False, holder)
            if self._take_over(directory, holder):
                return ClaimResult(True, took_over=holder)
        return ClaimResult(False, holder)

    def release(self, directory: Path) -> None:
        """Remove our claim on ``directory`` (never another runner's).

        The claim leaves ``_held`` only once its file is gone: a signal raised inside this call (SIGTERM while a
        cell's ``finally`` releases it) then leaves it held, and ``__exit__`` releases it on the way out (CI,
        2026-12-04: a loaded machine left the first cell's claim.json behind when it was the other way round)."""
        holder = self.holder(directory)
        if holder is not None and holder.runner == self.id:
            (directory / CLAIM_FILE).unlink(missing_ok=True)
            try:
                directory.rmdir()  # a cell that failed before writing anything leaves no empty folder
            except OSError:
                pass
        with self._lock:
            self._held.discard(directory)

    def holder(self, directory: Path) -> Holder | None:
        return read_holder(directory)

    def is_live(self, holder: Holder) -> bool:
        if not holder.readable:
            return holder.age_s < UNREADABLE_GRACE_S
        if holder.host == self.host:
            return pid_alive(holder.pid, holder.pid_start)
        return holder.age_s < self.stale_after_s

    def _create(self, directory: Path) -> bool:
        path = directory / CLAIM_FILE
        try:
            handle = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(handle, "w") as out:
            json.dump({"host": self.host, "pid": self.pid, "runner": self.id, "started_at": _now(),
                       "pid_start": self.pid_start}, out)
            out.flush()
            os.fsync(out.fileno())
        with self._lock:
            self._held.add(directory)
        return True

    def _take_over(self, directory: Path, dead: Holder) -> bool:
        lock = directory / TAKEOVER_FILE
        try:
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            try:
                if time.time() - lock.stat().st_mtime > TAKEOVER_LOCK_STALE_S:
                    lock.unlink(missing_ok=True)
            except OSError:
                pass
            return False
        try:
            current = self.holder(directory)
            if current is not None and (current.runner != dead.runner or self.is_live(current)):
                return False  # not the claim we judged dead any more
            (directory / CLAIM_FILE).unlink(missing_ok=True)
            return self._create(directory)
        finally:
            lock.unlink(missing_ok=True)

    # -- registry of live runners (contention) --------------------------------------------------
    def set_state(self, state: str, cell: str | None = None) -> None:
        """What this runner is doing (idle, loading, computing, waiting), for other runners to see."""
        self._state = {"host": self.host, "pid": self.pid, "pid_start": self.pid_start, "runner": self.id,
                       "state": state, "cell": cell, "since": _now()}
        try:
            self._registry_file.parent.mkdir(parents=True, exist_ok=True)
            temporary = self._registry_file.with_suffix(".tmp")
            temporary.write_text(json.dumps(self._state))
            os.replace(temporary, self._registry_file)
        except OSError:
            pass  # contention is recorded as unknown rather than failing the run

    def others_busy(self) -> list[str]:
        """Other live runners on this machine that are loading or computing: ["host pid N: computing <cell>"]."""
        busy = []
        try:
            entries = list(self._registry_file.parent.glob("*.json"))
        except OSError:
            return busy
        for path in entries:
            try:
                entry = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if entry.get("runner") == self.id or entry.get("host") != self.host:
                continue
            if not pid_alive(int(entry.get("pid", -1)), entry.get("pid_start")):
                path.unlink(missing_ok=True)  # a runner that died without cleaning up
                continue
            if entry.get("state") in BUSY_STATES:
                busy.append(f"{entry['host']} pid {entry['pid']}: {entry['state']} {entry.get('cell') or ''}".strip())
        return sorted(busy)


def read_holder(directory: Path) -> Holder | None:
    """The claim on ``directory`` as read from disk (None when unclaimed)."""
    path = directory / CLAIM_FILE
    try:
        age = max(0.0, time.time() - path.stat().st_mtime)
        data = json.loads(path.read_text())
        return Holder(host=str(data["host"]), pid=int(data["pid"]), runner=str(data["runner"]),
                      started_at=str(data.get("started_at")), pid_start=data.get("pid_start"), age_s=age)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        try:
            age = max(0.0, time.time() - path.stat().st_mtime)
        except OSError:
            return None
        return Holder(host="?", pid=-1, runner="?", started_at="?", pid_start=None, age_s=age, readable=False)


@dataclass
class ContentionWatch:
    """Samples, while a cell is timed, the other runners busy on this machine (the registry, and live claims
    of other runners in the same cells folder) and the load average."""

    runner: Runner
    cells_dir: Path | None = None
    others: dict[str, str] = field(default_factory=dict)  # "host pid" -> what it was seen doing
    load_average_max: float = 0.0

    def sample(self) -> None:
        for entry in self.runner.others_busy():
            self.others.setdefault(entry.split(":", 1)[0], entry)
        if self.cells_dir is not None:
            for path in self.cells_dir.glob(f"*/{CLAIM_FILE}"):
                holder = read_holder(path.parent)
                if (holder is not None and holder.readable and holder.host == self.runner.host
                        and holder.runner != self.runner.id and self.runner.is_live(holder)):
                    key = f"{holder.host} pid {holder.pid}"
                    self.others.setdefault(key, f"{key}: claim on {path.parent.name}")
        try:
            self.load_average_max = max(self.load_average_max, os.getloadavg()[0])
        except OSError:
            pass

    def result(self) -> dict[str, Any]:
        return {"other_runners": sorted(self.others.values()), "load_average_max": round(self.load_average_max, 2),
                "cpu_count": os.cpu_count()}


__all__ = ["CLAIM_FILE", "REGISTRY_ENV_VAR", "ClaimResult", "ContentionWatch", "Holder", "Runner", "pid_alive",
           "process_start", "read_holder", "registry_dir"]
