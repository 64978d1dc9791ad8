"""Reading user-supplied text files (YAML, JSONL, CSV) so that a wrong file is an `InputError`
naming the file and where it goes wrong, never a `UnicodeDecodeError` traceback.

Every text format routerops reads is UTF-8. A file that is not (a binary file passed by mistake, a
CSV saved as Latin-1 by a spreadsheet) is reported with the byte offset and line of its first
undecodable byte, so the user can find it with `head -c` or an editor.
"""

from __future__ import annotations

import codecs
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from routerops.errors import InputError

CHUNK_BYTES = 1 << 20


def utf8_error(path: Path, data: bytes, exc: UnicodeDecodeError, base_offset: int = 0,
               base_line: int = 1) -> InputError:
    """The InputError for the undecodable byte `exc` found in `data`, which starts at file byte
    `base_offset` on line `base_line`."""
    offset = base_offset + exc.start
    line = base_line + data.count(b"\n", 0, exc.start)
    byte = data[exc.start:exc.start + 1].hex()
    hint = " (is it a binary file?)" if b"\x00" in data[:4096] else "; save it as UTF-8"
    return InputError(path, "<file>", f"not UTF-8 text: byte 0x{byte} at offset {offset} (line {line}){hint}")


def read_text(path: str | Path) -> str:
    """The whole file decoded as UTF-8; InputError if it is missing, unreadable or not UTF-8."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, "<file>", "file not found")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(path, "<file>", f"not readable: {exc.strerror or exc}") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise utf8_error(path, data, exc) from None


def utf8_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line) for every line of a UTF-8 file, streamed; a line that is
    not UTF-8 raises InputError naming the line and the byte offset."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, "<file>", "file not found")
    offset = 0
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise utf8_error(path, raw, exc, offset, number) from None
            offset += len(raw)


def check_utf8(path: str | Path) -> None:
    """Scan a file in chunks and raise InputError at its first byte that is not UTF-8; used after a
    parser (pandas' CSV reader) failed to decode, to say where, without loading the file twice."""
    path = Path(path)
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, line = 0, 1
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as exc:
                # The incremental decoder reports positions within its buffer: the chunk plus at
                # most 3 bytes of a character begun in the previous chunk.
                carried = len(exc.object) - len(chunk)
                raise utf8_error(path, exc.object, exc, offset - carried, line) from None
            offset += len(chunk)
            line += chunk.count(b"\n")
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as exc:
            raise InputError(path, "<file>", f"not UTF-8 text: the file ends inside a character "
                                             f"(offset {offset - len(exc.object) + exc.start})") from None


def read_json_lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(1-based line number, object) for every non-blank line; errors name file and line."""
    rows = []
    for number, line in utf8_lines(path):  # a non-UTF-8 line is an InputError naming it
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(path, f"line {number}", f"not valid JSON: {exc.msg}") from exc
        if not isinstance(obj, dict):
            raise InputError(path, f"line {number}", "expected a JSON object")
        rows.append((number, obj))
    return rows


def read_yaml_mapping(path: str | Path) -> dict:
    """A YAML file whose top level is a mapping (an empty file reads as {}): InputError naming the file
    for invalid YAML, a non-UTF-8 file or another top-level type."""
    import yaml

    path = Path(path)
    try:
        raw = yaml.safe_load(read_text(path)) or {}
    except yaml.YAMLError as exc:
        raise InputError(path, "<file>", f"not valid YAML: {exc}") from exc
    except ValueError as exc:  # a scalar YAML reads as a date that is not one: `2024-13-45`
        raise InputError(path, "<file>", f"not valid YAML: {exc} (quote it if it is not meant as a date)") from exc
    except RecursionError:  # thousands of nested [ or {: PyYAML's constructor recurses per level
        raise InputError(path, "<file>", "not valid YAML: nested too deeply") from None
    if not isinstance(raw, dict):
        raise InputError(path, "<file>", "expected a mapping")
    return raw


def check_output(path: str | Path, flag: str, *, folder: bool = False,
                 inputs: tuple[str | Path | None, ...] = ()) -> None:
    """Before any work, refuse an output that could not be written, or that is one of `inputs`:
    InputError naming the path, the flag and the fix. `folder`: the output is a folder (it may exist);
    else a file (it may exist and is replaced). Nothing is left behind: the check creates and removes
    one temporary file in the nearest folder that exists, the only way to know a location is writable
    (permissions, read-only mounts and pseudo filesystems such as /proc all say no to it alone)."""
    path = Path(path)
    if str(path) == "":
        raise InputError("command line", flag, "is empty; give a path")
    for given in inputs:
        if given is not None and Path(given).resolve() == path.resolve():
            raise InputError(path, flag, f"is an input of this command ({given}); writing it would overwrite "
                                         "the input: choose another path")
    if folder and path.exists() and not path.is_dir():
        raise InputError(path, flag, "exists and is not a folder: give a folder (existing or new)")
    if not folder and path.is_dir():
        raise InputError(path, flag, f"is a folder: give a file name, such as {path / 'out'}")
    nearest = path if folder else path.parent
    while not nearest.exists() and nearest != nearest.parent:  # exists() is False for a dangling link too
        if nearest.is_symlink():
            raise InputError(path, flag, f"{nearest} is a broken symbolic link: remove it or choose another path")
        nearest = nearest.parent
    if not nearest.is_dir():
        raise InputError(path, flag, f"{nearest} is a file, not a folder: choose a path under a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=nearest, prefix=".routerops-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InputError(path, flag, f"cannot write in {nearest} ({exc.strerror or exc}): choose a "
                                     "writable location") from None
