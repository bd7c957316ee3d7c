"""Every module under bench/ imports (a benchmark that cannot start is found here, not by the next person who runs
it). In a fresh interpreter, by name: tests/ import nothing from bench/ (import-linter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def bench_modules() -> list[str]:
    modules = []
    for path in sorted((REPOSITORY / "bench").rglob("*.py")):
        parts = path.relative_to(REPOSITORY).with_suffix("").parts
        modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def test_every_bench_module_imports():
    modules = bench_modules()
    assert "bench.peer" in modules and "bench.experiments.search_step" in modules
    script = (
        "import importlib, sys, traceback\n"
        "failed = []\n"
        f"for name in {modules!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"
        "        failed.append(name + ': ' + traceback.format_exc().strip().splitlines()[-1])\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPOSITORY, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
