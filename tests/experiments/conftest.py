"""The experiment scripts are files, not a package: `bench` loads experiments/NAME.py for tests/experiments/test_NAME.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "experiments"


@pytest.fixture(scope="module")
def bench(request):
    name = Path(request.module.__file__).stem.removeprefix("test_")
    spec = importlib.util.spec_from_file_location(f"{name}_experiment", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
