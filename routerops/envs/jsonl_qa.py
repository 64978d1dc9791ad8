"""Question-answer datasets brought as JSONL (GSM8K and MATH formats), and their verifier.

Formats, one JSON object per line:
- gsm8k: `question`, `answer` — a worked solution whose final answer follows the last `####`.
- math:  `problem`, `answer` — the final answer; when `answer` is absent, the last \\boxed{...} of
  `solution` (the MATH dataset's convention). `subject`, `level`, `unique_id` are kept in Task.meta.

Task ids are `<suite>/<split>/<line index>` (0-based), so row i of a logged-outcome table built on
the same file (RouteLLM's GSM8K table is one) joins to task i.

Answers are checked with math-verify (`parse` + `verify`), which compares mathematical meaning
(72 = 72.0 = \\frac{144}{2}; sets, intervals, LaTeX) rather than strings.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any, Literal

from routerops.errors import InputError
from routerops.files import read_json_lines
from routerops.types import Task

Format = Literal["gsm8k", "math", "auto"]
FORMATS = ("gsm8k", "math", "auto")
VERIFIER = "math-verify"  # Task.meta["verifier"] for tasks this module imports
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_TIMEOUT_S = 5


# ---------------------------------------------------------------- answers


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}) in `text`, braces balanced; None if none."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, begin = 1, starts[-1]
    for i in range(begin, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i].strip()
    return None  # unbalanced: the box never closes


def gsm8k_final_answer(solution: str) -> str | None:
    """The text after the last '####' of a GSM8K solution, without thousands separators."""
    if "####" not in solution:
        return None
    final = solution.rsplit("####", 1)[1].strip()
    return _THOUSANDS.sub("", final) or None


# ---------------------------------------------------------------- import




def text_field(path: Path, number: int, obj: dict[str, Any], key: str) -> str:
    if key not in obj:
        raise InputError(path, f"line {number}: {key}", "missing")
    value = obj[key]
    if not isinstance(value, str) or not value.strip():
        raise InputError(path, f"line {number}: {key}", f"expected a non-empty string, got {value!r}")
    return value


def detect_format(path: Path, first: dict[str, Any]) -> str:
    """gsm8k when the first record has `question`, math when it has `problem`."""
    if "question" in first:
        return "gsm8k"
    if "problem" in first:
        return "math"
    raise InputError(path, "line 1", "cannot tell the format: expected a 'question' (gsm8k) or 'problem' (math) key")


def _gsm8k_task(path: Path, number: int, obj: dict[str, Any], task_id: str, suite: str, split: str) -> Task:
    question = text_field(path, number, obj, "question")
    answer = gsm8k_final_answer(text_field(path, number, obj, "answer"))
    if answer is None:
        raise InputError(path, f"line {number}: answer", "no final answer after '####'")
    return Task(task_id=task_id, suite=suite, split=split, prompt=question, answer=answer,
                meta={"format": "gsm8k", "verifier": VERIFIER, "line": number})


def _math_task(path: Path, number: int, obj: dict[str, Any], task_id: str, suite: str, split: str) -> Task:
    problem = text_field(path, number, obj, "problem")
    if "answer" in obj:
        answer = text_field(path, number, obj, "answer")
    elif "solution" in obj:
        answer = last_boxed(text_field(path, number, obj, "solution"))
        if not answer:
            raise InputError(path, f"line {number}: solution", "no 'answer' key and no \\boxed{...} in the solution")
    else:
        raise InputError(path, f"line {number}: answer", "missing (and no 'solution' to take a \\boxed{} from)")
    meta = {"format": "math", "verifier": VERIFIER, "line": number}
    meta.update({k: obj[k] for k in ("subject", "level", "unique_id") if k in obj})
    return Task(task_id=task_id, suite=suite, split=split, prompt=problem, answer=answer.strip(), meta=meta)


def refuse_duplicates(path: Path, field: str, texts: list[str], numbers: list[int], unit: str) -> None:
    """Refuse a file in which two records hold the same question: they would get two query ids with
    one text, and a split would put the same question on both of its sides (issue 42 item 8).
    `numbers` are what a user finds the records by (line or row numbers), named in the error."""
    first_at: dict[str, int] = {}
    repeats: list[tuple[int, int]] = []
    for text, number in zip(texts, numbers):
        key = " ".join(text.split())  # the same question up to white space
        if key in first_at:
            repeats.append((first_at[key], number))
        else:
            first_at[key] = number
    if repeats:
        shown = "; ".join(f"{unit}s {a} and {b}" for a, b in repeats[:3])
        more = f" (and {len(repeats) - 3} more)" if len(repeats) > 3 else ""
        raise InputError(path, field, f"{len(repeats)} duplicated question(s): {shown}{more} hold the same "
                         "text; remove the repeats (each question once) and import again")


def import_jsonl_qa(path: str | Path, fmt: Format = "auto", suite: str = "", split: str = "test",
                    limit: int | None = None) -> list[Task]:
    """Tasks from a GSM8K- or MATH-format JSONL file (the first `limit` records when given).

    `suite` defaults to the format name. Any bad record raises InputError naming the file, the line
    and the field; nothing is returned for a file with a bad record.
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise InputError(path, "fmt", f"{fmt!r} is not one of {FORMATS}")
    if limit is not None and limit < 0:
        raise InputError(path, "limit", f"expected a non-negative number, got {limit}")
    rows = read_json_lines(path)
    if not rows:
        raise InputError(path, "<file>", "no records")
    fmt = detect_format(path, rows[0][1]) if fmt == "auto" else fmt
    suite = suite or fmt
    build = _gsm8k_task if fmt == "gsm8k" else _math_task
    rows = rows if limit is None else rows[:limit]
    tasks = [build(path, number, obj, f"{suite}/{split}/{index}", suite, split)
             for index, (number, obj) in enumerate(rows)]
    refuse_duplicates(path, "question" if fmt == "gsm8k" else "problem", [t.prompt for t in tasks],
                      [number for number, _ in rows], "line")
    return tasks


# ---------------------------------------------------------------- verification


def _timeout() -> int | None:
    # math-verify's timeout uses signal.alarm, which only the main thread may set; elsewhere (Prefect
    # task runners, asyncio.to_thread) it must run without one, as its error message advises.
    return _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _as_latex(text: str) -> str:
    """Wrap a bare reference in $...$ so math-verify's LaTeX extractor reads it (it needs an anchor)."""
    return text if ("$" in text or "\\boxed" in text) else f"${text}$"


def verify_math(reference: str, answer: str) -> bool:
    """True when math-verify finds `answer` mathematically equal to `reference`.

    The answer is read two ways — as free text (math-verify's default extractors: "The answer is
    $18." → 18) and as a bare LaTeX expression ("\\frac{1}{2}", "x^2+1") — and counts if either matches.
    """
    from math_verify import parse, verify  # imported here: loading its grammar takes ~1 s

    if not reference or not reference.strip() or not answer or not answer.strip():
        return False
    timeout = _timeout()
    gold = parse(_as_latex(reference.strip()), parsing_timeout=timeout)
    if not gold:
        return False
    readings = [answer]
    if _as_latex(answer) != answer:
        readings.append(_as_latex(answer))
    for text in readings:
        predicted = parse(text, parsing_timeout=timeout)
        if predicted and verify(gold, predicted, timeout_seconds=timeout):
            return True
    return False
