"""docs/experiments.md and docs/benchmarks.md are generated from the scripts (routerops/script_index.py):
the committed pages are what the scripts give now, so a page cannot miss a script or keep a removed one,
and a script without a docstring is refused."""

from __future__ import annotations

import pytest

from routerops import script_index
from routerops.errors import InputError


def test_the_committed_index_pages_are_current():
    assert script_index.stale_pages() == [], "run: python -m routerops.script_index"
    assert script_index.main(["--check"]) == 0


def test_every_script_has_a_row_with_its_command():
    for folder in script_index.FOLDERS:
        page = (script_index.REPO / "docs" / folder.page).read_text()
        for script in script_index.scripts(folder):
            assert f"| `{script.name}` |" in page
            assert script_index.command(script), f"{script}: its docstring gives no `python {folder.name}/{script.name}`"


def test_a_stale_page_and_a_script_without_a_docstring_are_caught(tmp_path):
    folder = script_index.FOLDERS[0]
    (tmp_path / "docs").mkdir()
    (tmp_path / folder.name / "results").mkdir(parents=True)
    script = tmp_path / folder.name / "study.py"
    script.write_text('"""What a study measures. More.\n\n    python experiments/study.py\n"""\n')
    (tmp_path / folder.name / "results" / "study.json").write_text("{}")
    (tmp_path / "docs" / "page.md").write_text("# A page\n\nSee `experiments/study.py`.\n")
    text = script_index.render(folder, tmp_path)
    assert ("| `study.py` | What a study measures. | `python experiments/study.py` | `study.json` "
            "| [A page](page.md) |") in text
    (tmp_path / folder.name / "new.py").write_text("x = 1\n")  # a script added without a docstring
    with pytest.raises(InputError, match="module docstring"):
        script_index.render(folder, tmp_path)
