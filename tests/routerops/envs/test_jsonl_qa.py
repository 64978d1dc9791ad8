"""GSM8K / MATH JSONL importers and the math-verify verifier."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from routerops.envs.jsonl_qa import gsm8k_final_answer, import_jsonl_qa, last_boxed, verify_math
from routerops.errors import InputError

REPO = Path(__file__).resolve().parents[3]
SHARED = REPO / "../shared/data"
shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is absent")


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


GSM = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A farm sells 1,200 eggs a day for 2 days. How many?", "answer": "1200*2=2400\n#### 2,400"},
    {"question": "What is half of 9?", "answer": "9/2 = 4.5\n#### 4.5"},
]
MATH = [
    {"problem": "Compute $1/2 + 1/3$.", "answer": "\\frac{5}{6}", "subject": "Algebra", "level": 1,
     "unique_id": "test/algebra/1.json"},
    {"problem": "Solve $x^2 = 4$, $x > 0$.", "solution": "So $x = \\boxed{2}$."},
    {"problem": "Nested?", "solution": "First \\boxed{1}, finally \\boxed{\\frac{\\sqrt{2}}{2}}."},
]


# ---------------------------------------------------------------- importing


def test_gsm8k_tasks_take_the_answer_after_the_hashes(tmp_path):
    tasks = import_jsonl_qa(write_jsonl(tmp_path / "g.jsonl", GSM), "gsm8k", "gsm8k", "test")
    assert [t.answer for t in tasks] == ["7", "2400", "4.5"]
    assert [t.task_id for t in tasks] == ["gsm8k/test/0", "gsm8k/test/1", "gsm8k/test/2"]
    assert tasks[0].prompt == GSM[0]["question"] and tasks[0].meta["verifier"] == "math-verify"


def test_math_tasks_use_answer_else_the_last_box_of_the_solution(tmp_path):
    tasks = import_jsonl_qa(write_jsonl(tmp_path / "m.jsonl", MATH), "math", "math500", "test")
    assert [t.answer for t in tasks] == ["\\frac{5}{6}", "2", "\\frac{\\sqrt{2}}{2}"]
    assert tasks[0].meta["subject"] == "Algebra" and tasks[0].meta["level"] == 1


def test_auto_detects_the_format_and_limit_cuts(tmp_path):
    gsm = import_jsonl_qa(write_jsonl(tmp_path / "g.jsonl", GSM), "auto", limit=2)
    assert len(gsm) == 2 and gsm[0].suite == "gsm8k"
    assert import_jsonl_qa(write_jsonl(tmp_path / "m.jsonl", MATH))[0].suite == "math"


@pytest.mark.parametrize(
    "records, fmt, field",
    [
        ([GSM[0], "{oops"], "gsm8k", "line 2"),
        ([GSM[0], {"question": "q?"}], "gsm8k", "line 2: answer"),
        ([GSM[0], {"question": "q?", "answer": "no hashes"}], "gsm8k", "line 2: answer"),
        ([GSM[0], {"question": 5, "answer": "#### 5"}], "gsm8k", "line 2: question"),
        ([MATH[0], {"problem": "p", "solution": "no box"}], "math", "line 2: solution"),
        ([MATH[0], {"problem": "p"}], "math", "line 2: answer"),
        ([{"text": "neither"}], "auto", "line 1"),
        (["[1, 2]"], "gsm8k", "line 1"),
    ],
)
def test_bad_records_name_file_line_and_field(tmp_path, records, fmt, field):
    path = write_jsonl(tmp_path / "bad.jsonl", records)
    with pytest.raises(InputError) as err:
        import_jsonl_qa(path, fmt)
    assert (err.value.path, err.value.field) == (str(path), field)


def test_missing_or_empty_file_and_bad_format_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        import_jsonl_qa(tmp_path / "absent.jsonl")
    with pytest.raises(InputError, match="no records"):
        import_jsonl_qa(write_jsonl(tmp_path / "empty.jsonl", []))
    with pytest.raises(InputError) as err:
        import_jsonl_qa(write_jsonl(tmp_path / "g.jsonl", GSM), "csv")
    assert err.value.field == "fmt"


def test_answer_helpers():
    assert gsm8k_final_answer("a\n#### 1,234,567") == "1234567"
    assert gsm8k_final_answer("no final answer") is None
    assert last_boxed("x \\boxed{a} y \\boxed{\\frac{1}{\\sqrt{2}}} z") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\boxed{unclosed") is None and last_boxed("none") is None


# ---------------------------------------------------------------- verification


@pytest.mark.parametrize(
    "reference, answer, expected",
    [
        ("72", "72", True),
        ("72", "72.0", True),
        ("1000", "1,000", True),
        ("\\frac{1}{2}", "0.5", True),
        ("\\frac{14}{3}", "14/3", True),
        ("\\frac{5}{6}", "\\frac{10}{12}", True),
        ("x^2+1", "1+x^2", True),
        ("18", "The answer is $18$.", True),
        ("18", "\\boxed{18}", True),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
        ("3", "4", False),
        ("\\frac{1}{2}", "0.51", False),
        ("72", "", False),
        ("", "72", False),
    ],
)
def test_verify_math(reference, answer, expected):
    assert verify_math(reference, answer) is expected


def test_verify_math_works_off_the_main_thread():
    results = []
    thread = threading.Thread(target=lambda: results.append(verify_math("\\frac{1}{2}", "0.5")))
    thread.start()
    thread.join()
    assert results == [True]


# ---------------------------------------------------------------- the real datasets


@shared
@pytest.mark.shared
def test_real_gsm8k_test_file():
    tasks = import_jsonl_qa(SHARED / "gsm8k/test.jsonl", "auto", "gsm8k", "test")
    assert len(tasks) == 1319 and len({t.task_id for t in tasks}) == 1319
    assert tasks[0].answer == "18"  # Janet's ducks
    assert all(verify_math(t.answer, t.answer) for t in tasks[:200])
    assert len(import_jsonl_qa(SHARED / "gsm8k/train.jsonl", "gsm8k", "gsm8k", "train", limit=8)) == 8


@shared
@pytest.mark.shared
def test_real_math500_file():
    tasks = import_jsonl_qa(SHARED / "math500/test.jsonl", "auto", "math500", "test")
    assert len(tasks) == 500
    assert tasks[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    # The reference answer verifies against itself, and against the box of its own solution.
    records = [json.loads(line) for line in (SHARED / "math500/test.jsonl").read_text().splitlines()[:60]]
    agree = [verify_math(t.answer, last_boxed(r["solution"]) or "") for t, r in zip(tasks, records)]
    assert sum(agree) >= 55
    assert all(verify_math(t.answer, t.answer) for t in tasks[:60] if t.answer.strip())
