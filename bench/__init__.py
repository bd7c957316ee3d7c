"""Benchmarks a user or maintainer reruns; each prints a table and writes its JSON report to bench/results/."""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # ../shared/data beside the repository


def report_command(module: str, argv: list[str] | None = None) -> str:
    """The command a report was made by, as a shell takes it back: `python -m module` and its arguments (`argv`,
    else this process's), each quoted where it must be (`--engines "ct2 int8"` stays one engine)."""
    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def write_report(report: dict, output: str | Path | None, default_name: str) -> Path:
    """Write a benchmark's JSON report to `output`, or bench/results/<default_name>; returns the path."""
    path = Path(output) if output else RESULTS / default_name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return path


def close_report(report: dict, output: str | Path | None, default_name: str, table: Callable[[dict], str]) -> int:
    """The end of a model benchmark: the machine with torch's threads into `report`, its table printed, its JSON
    written (write_report); returns the exit status."""
    import torch  # imported when a report is made: torch stays out of `import bench`

    report["machine"] = machine(threads=torch.get_num_threads())
    print(table(report))
    write_report(report, output, default_name)
    return 0


def named_models(items: list[str]) -> dict[str, str]:
    """`NAME` or `NAME=DIRECTORY` arguments → {name: directory or name} (a shipped model by its name)."""
    return {name: directory or name for name, _, directory in (item.partition("=") for item in items)}


def machine(**extra: Any) -> dict[str, Any]:
    """What a benchmark ran on, for its report: the CPU's model (every speed figure names it), the CPU count, the
    platform, and `extra` (a benchmark's own facts: threads, device, CPU capability)."""
    from model.runtime.extension import cpu_model  # imported when a report is made: torch stays out of `import bench`

    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "platform": platform.platform(), **extra}
