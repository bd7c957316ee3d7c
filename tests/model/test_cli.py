"""The command line's aligned token table, as a terminal shows it."""

from __future__ import annotations

import subprocess
import sys

from wcwidth import wcswidth


def test_token_table_columns_line_up_in_display_width_with_chinese_tokens():
    completed = subprocess.run(
        [sys.executable, "-m", "model", "translate", "--model", "en-zh", "--beam-size", "2", "I like cats very much."],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    rows = [line for line in completed.stdout.splitlines() if line[:6].strip().isdigit()]
    assert len(rows) >= 2 and any(wcswidth(row) > len(row) for row in rows), completed.stdout  # wide characters
    # the probability column ends at the same terminal column in every row
    ends = set()
    for row in rows:
        probability = next(part for part in row.split()[2:] if part.replace(".", "", 1).isdigit() and "." in part)
        ends.add(wcswidth(row[: row.index(probability, 7) + len(probability)]))
    assert len(ends) == 1, completed.stdout
