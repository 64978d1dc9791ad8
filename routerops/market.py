"""The market a run works in (issue 41 item 2): the pool of workers and the two price books, each
loaded, checked and hashed once, then handed around as objects instead of path strings.

A run has two books: the *collection* book, under which budgets were enforced while the trajectories
were collected, and the *evaluation* book, under which they are re-priced and scored (README "Price
changes"). `resolve_book` / `resolve_pool` are the one place the files are read: keyed on the files'
content hashes, so the stages of one flow (one process) share each loaded book, and an edited file is
read again. A Market reads each of its files when first asked for it: re-pricing needs no collection
book, and a stage fails only on a file it uses.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

from routerops.pricing import Pool, PriceBook, check_pool_priced, load_pool, load_price_book


def content_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass(frozen=True)
class Book:
    """A price book with the file it came from and that file's content hash."""

    file: Path
    book: PriceBook
    sha256: str

    @property
    def version(self) -> str:
        return self.book.version


@functools.lru_cache(maxsize=32)
def _book(file: Path, sha256: str) -> Book:
    return Book(file, load_price_book(file), sha256)


@functools.lru_cache(maxsize=32)
def _pool(file: Path, sha256: str) -> Pool:
    return load_pool(file)


def resolve_book(file: str | Path) -> Book:
    """The price book at `file`, loaded once per content (InputError naming the file and field)."""
    file = Path(file)
    if not file.is_file():
        load_price_book(file)  # the loader's own error for a missing file
    return _book(file, content_sha256(file))


def resolve_pool(file: str | Path) -> Pool:
    """The pool at `file`, loaded once per content."""
    file = Path(file)
    if not file.is_file():
        load_pool(file)
    return _pool(file, content_sha256(file))


@dataclass(frozen=True)
class Market:
    """The pool and the collection and evaluation price books of one run, by file; each is read (once
    per content) when first used."""

    pool_file: Path
    collection_file: Path
    evaluation_file: Path

    @property
    def pool(self) -> Pool:
        return resolve_pool(self.pool_file)

    @property
    def collection(self) -> Book:
        return resolve_book(self.collection_file)

    @property
    def evaluation(self) -> Book:
        return resolve_book(self.evaluation_file)

    @property
    def pool_version(self) -> str:
        """A pool file has no version field: its name plus the first 12 hex digits of its content hash
        (routerops/publishing.py: pool_version, what the registry and the tags record)."""
        return f"{self.pool.name}-{content_sha256(self.pool_file)[:12]}"

    def priced(self, which: str = "evaluation") -> Book:
        """Book `which` ("collection" or "evaluation"), once every worker of the pool has a price in it
        (an unpriced worker would make its costs silently zero): InputError naming the book and worker."""
        pool = self.pool  # the pool first: its errors before the book's, as the stages always read them
        book = getattr(self, which)
        check_pool_priced(pool, book.book, book.file)
        return book

    def versions(self) -> dict[str, str]:
        """What a run records of its market (tags, registry decisions): the evaluation book's version
        (costs are reported under it) and the pool's."""
        return {"price_book_version": self.evaluation.version, "pool_version": self.pool_version}


def resolve_market(pool_file: str | Path, collection: str | Path, evaluation: str | Path | None = None) -> Market:
    """The Market of a pool and its books (one book for both when `evaluation` is None)."""
    return Market(Path(pool_file), Path(collection), Path(evaluation if evaluation is not None else collection))
