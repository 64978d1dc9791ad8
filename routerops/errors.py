"""Errors raised at the edges: each names the file and the field that is wrong."""

from __future__ import annotations


class RouteropsError(Exception):
    """Base class for errors the CLI reports as a clean message and a non-zero exit."""


class InputError(RouteropsError):
    """A user-supplied file (pool, price book, dataset, trajectory table) is invalid."""

    def __init__(self, path: object, field: str, problem: str):
        self.path = str(path)
        self.field = field
        self.problem = problem
        super().__init__(f"{self.path}: field '{field}': {problem}")


class BudgetExceeded(RouteropsError):
    """A call was refused before it was made because it would exceed the episode budget."""
