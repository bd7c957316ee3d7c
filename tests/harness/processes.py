"""Processes the tests and benchmarks start: free ports, OS sessions, and stopping exactly what was started,
by process or session id, never by name (other Ray clusters on the same machine are left alone).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from model import cpu_isa

ROOT = Path(__file__).resolve().parents[2]

_handed_out: set[int] = set()


def python_output(script: str, timeout_s: float = 120, env: dict[str, str] | None = None) -> str:
    """The stripped stdout of `script` run by this Python in a fresh interpreter at the repository root (so it may
    import the tests), with `env` (default: this process's) (raises if it fails)."""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


def held_to(isa: str, **more: str) -> dict[str, str]:
    """This process's environment for a child held to `isa` by TRANSLATE_CPU_ISA alone: the libraries' own limits
    (model.cpu_isa.LIBRARY_ENV) and TRANSLATE_RUNTIME left for it to derive, plus `more`."""
    from model.runtime import RUNTIME_ENV  # torch: only where a child is held to an instruction set

    env = {**os.environ, cpu_isa.ISA_ENV: isa, **more}
    for name in (*cpu_isa.LIBRARY_ENV.get(isa, {}), RUNTIME_ENV):
        env.pop(name, None)
    return env


def free_port() -> int:
    """A port free now and never handed out before by this process: a port drawn for one service but not bound
    yet (services start side by side, and a cluster's nodes one after the other) is not drawn again for another."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


# Ray Serve's high-throughput mode: the HAProxy ingress and direct gRPC between replicas (docs/operations.md). The
# tests and benchmarks run Serve the way the README does; TRANSLATE_TEST_SERVE_MODE=python runs Serve's Python proxy.
HIGH_THROUGHPUT_MODE = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}


def serve_mode_environment() -> dict[str, str]:
    """Environment for one `serve run`: the Serve mode, and free ports for what HAProxy mode binds on fixed
    ones by default (its metrics and stats frontends, the fallback proxy), so that several test or
    benchmark clusters can run on one machine."""
    if os.environ.get("TRANSLATE_TEST_SERVE_MODE", "high-throughput") == "python":
        return {}
    ports = {
        name: str(free_port())
        for name in (
            "RAY_SERVE_HAPROXY_METRICS_PORT",
            "RAY_SERVE_HAPROXY_STATS_PORT",
            "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
            "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",
        )
    }
    return {**HIGH_THROUGHPUT_MODE, **ports}


def serve_environment(repository: Path | None = None) -> dict[str, str]:
    """Environment for a `serve run` the tests or benchmarks start: a fresh local Ray cluster without token auth
    or usage stats, the repository (this one, or another checkout of it) importable first, and Serve's mode
    (serve_mode_environment)."""
    repository = str(repository or Path(__file__).resolve().parents[2])
    return {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_ADDRESS": "local",  # a fresh local cluster, never one another process started
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONPATH": os.pathsep.join(p for p in (repository, os.environ.get("PYTHONPATH", "")) if p),
        **serve_mode_environment(),
    }


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


# How long a test's `serve run` gets to shut down after SIGINT before its whole session is killed. Nothing the tests
# assert depends on a clean shutdown, and serve run took over 30 s to exit on SIGINT (Serve drains every replica,
# then Ray's daemons stop): a test-session wait that bought nothing, five times over. Killed, Ray leaves only its
# session folder under /tmp/ray (a local `ray.init` writes no ray_current_cluster).
TEST_STOP_GRACE_S = 3.0


def stop_process_group(process: subprocess.Popen, grace_s: float = TEST_STOP_GRACE_S) -> None:
    """SIGINT (serve run shuts Ray down), then, after grace_s, SIGKILL to whatever of its session lingers."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    # Again until the session is empty: a process can start while the others are killed (Serve's HAProxy manager
    # restarting its haproxy), and one left behind holds its ports with nothing to stop it later.
    for _ in range(20):
        lingering = [process.pid, *session_pids(process.pid)] if process.poll() is None else session_pids(process.pid)
        if not lingering:
            break
        for pid in lingering:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.25)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)
