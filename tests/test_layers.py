"""The layering in pyproject.toml's import-linter contracts holds (model/ ← service/, tests/ ← bench/)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    command = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    completed = subprocess.run([command], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]
    assert "BROKEN" not in completed.stdout and "KEPT" in completed.stdout
