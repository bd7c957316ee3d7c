"""Find the OS processes of one Ray Serve instance's replicas, for the fault tests, through the instance's own
HTTP port (several Ray clusters may run on one machine).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx

from tests.harness.processes import command_line, session_pids

PROC = Path("/proc")
LISTEN = "0A"


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        path = PROC / "net" / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == LISTEN:
                inodes.add(fields[9])
    return inodes


def _pids() -> list[int]:
    return [int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()]


def _listener_once(port: int) -> int | None:
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    for pid in _pids():
        try:
            descriptors = os.listdir(PROC / str(pid) / "fd")
        except OSError:
            continue
        for descriptor in descriptors:
            try:
                if os.readlink(PROC / str(pid) / "fd" / descriptor) in wanted:
                    return pid
            except OSError:
                continue
    return None


def listener_pid(port: int, timeout_s: float = 15.0) -> int:
    """The process that holds the listening socket of `port` (the Serve proxy, or HAProxy).

    HAProxy reloads by starting a new process that takes the socket over from the old one, and the old one exits:
    for a moment no live process may hold it, so the search is repeated until one does."""
    deadline = time.monotonic() + timeout_s
    while (pid := _listener_once(port)) is None:
        if time.monotonic() > deadline:
            raise LookupError(f"no process listens on port {port}")
        time.sleep(0.1)
    return pid


_sessions: dict[int, int] = {}  # port → the OS session of the Serve instance listening there


def instance_session(port: int) -> int:
    """The OS session of the Serve instance on `port`: found once through its listener, then kept while that
    session has processes (a listener found mid-reload, or none, would otherwise fail a test for nothing)."""
    session = _sessions.get(port)
    if session is None or not session_pids(session):
        session = _sessions[port] = os.getsid(listener_pid(port))
    return session


def replica_pids(port: int, application: str, deployment: str) -> list[int]:
    """PIDs of the live replicas of `deployment` in `application` of the Serve instance on `port`.

    The Serve proxy listening on `port` belongs to the OS session of the `serve run` that started the
    cluster (the fixture starts it in a new session), and every Ray process of that cluster shares the
    session id; replica processes name themselves `ray::ServeReplica:<application>:<deployment>`.
    """
    title = f"ray::ServeReplica:{application}:{deployment}"
    session = instance_session(port)
    return sorted(pid for pid in session_pids(session) if command_line(pid).split(" ", 1)[0] == title)


def started_at(pid: int) -> int:
    """When `pid` started, in clock ticks since boot (/proc/<pid>/stat field 22): orders processes by age even
    when process ids wrap around (pid_max is 32768 on many machines, and a long test session reaches it)."""
    stat = (PROC / str(pid) / "stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


def serving_replicas(url: str, port: int, deployment: str, count: int = 2, timeout_s: float = 30.0) -> list[int]:
    """PIDs of `deployment`'s replicas in the Serve instance at `url` (its HTTP port `port`) that are up and
    serving, oldest first, once there are `count` of them (AssertionError after `timeout_s`).

    A replacement's process exists (and has its name) while its constructor still loads the model; a replica
    that has finished it reports translation_replica_info, per live pid, in /metrics. The oldest serving replica
    is the one every router has known longest: the one to kill when requests must be in flight on it. (Not the
    lowest pid: pids wrap around at pid_max, 32768 on the CI machine.)"""
    from tests.harness.prometheus_text import by_label

    deadline = time.monotonic() + timeout_s
    while True:
        text = httpx.get(f"{url}/metrics", timeout=60).text
        ready = by_label(text, "translation_replica_info", "pid", deployment=deployment)
        serving = set(replica_pids(port, "translate", deployment)) & {int(pid) for pid in ready}
        if len(serving) >= count:
            return sorted(serving, key=started_at)
        assert time.monotonic() < deadline, f"{deployment} has {len(serving)} serving replicas, not {count}"
        time.sleep(0.5)
