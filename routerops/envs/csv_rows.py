"""A user's CSV as the user sees it: the delimiter their spreadsheet wrote, and each row named by the
line an editor shows it on.

Spreadsheets in many locales save "CSV" with `;` (the comma is their decimal mark), and tab- or
pipe-separated exports are common; the delimiter is read from the header line, whose column names are
known. A row's number in an error is the 1-based line its record starts on (header = line 1), counted
by the csv module, so quoted cells that span lines (model responses do) and blank lines pandas skips
do not shift it. Values in messages are shown as written (`100`, not numpy's `np.int64(100)`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

DELIMITERS = (",", ";", "\t", "|")

RowLabel = Callable[[int], str]


def plain(value: Any) -> str:
    """A cell value for a message: numpy scalars as the Python value they hold, text quoted."""
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def row_label(i: int) -> str:
    """The default name of row i (0-based) of a table without lines: Parquet, a DataFrame."""
    return f"row {i + 1}"


def sniff_delimiter(path: Path, expected: Iterable[str]) -> str:
    """The delimiter that splits the header line into the most `expected` column names (ties and
    headers with none of them: a comma, the format's own)."""
    with open(path, newline="", encoding="utf-8", errors="replace") as fh:
        header = fh.readline()
    names = set(expected)

    def hits(delimiter: str) -> int:
        fields = next(csv.reader(io.StringIO(header), delimiter=delimiter), [])
        return len(names & {f.strip() for f in fields})

    return max(DELIMITERS, key=lambda d: (hits(d), d == ","))


def record_lines(path: Path, delimiter: str) -> list[int]:
    """The 1-based line each non-blank record of a CSV starts on, the header's first."""
    starts, previous = [], 0
    with open(path, newline="", encoding="utf-8", errors="replace") as fh:
        reader = csv.reader(fh, delimiter=delimiter)
        for record in reader:
            if record:  # pandas skips blank lines; so does the row numbering
                starts.append(previous + 1)
            previous = reader.line_num
    return starts


def csv_row_label(path: Path, delimiter: str) -> RowLabel:
    """Data row i (0-based, as pandas read it) named by its line in the file; the file is read again
    only when an error names a row."""
    lines: list[int] = []

    def label(i: int) -> str:
        if not lines:
            lines.extend(record_lines(path, delimiter))
        return f"line {lines[i + 1]}" if i + 1 < len(lines) else f"row {i + 1}"

    return label
