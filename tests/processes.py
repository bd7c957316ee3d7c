"""Processes the tests and benchmarks start: free ports, OS sessions, and stopping exactly what was started.

Everything is addressed by process id or OS session id, never by name: other Ray clusters on the
same machine are left alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def session_pids(session_id: int) -> list[int]:
    """PIDs of the processes in an OS session (a process started with start_new_session leads one)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # gone meanwhile
                if os.getsid(int(entry.name)) == session_id:
                    pids.append(int(entry.name))
    return pids


def command_line(pid: int) -> str:
    """A process's command line, arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def stop_process_group(process: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGINT (serve run shuts Ray down), then SIGKILL to whatever of its session lingers (Ray's daemons)."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    for pid in [process.pid, *session_pids(process.pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)
