"""The MTRouter stage tests use the tiny MTRouter fixtures of tests/models/mtrouter/conftest.py."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("mtrouter_fixtures", Path(__file__).parents[1] / "models/mtrouter/conftest.py")
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
tiny_cfg, tiny_encoder, pool, book, tables = (_fixtures.tiny_cfg, _fixtures.tiny_encoder, _fixtures.pool, _fixtures.book,
                                              _fixtures.tables)
