"""The check of a database URL given on the command line (`gateway serve|keys --db-url`, `drift check --log`)."""

from __future__ import annotations

from pathlib import Path

from routerops.errors import InputError
from routerops.files import check_output

SQLITE_MAGIC = b"SQLite format 3\x00"


def check_db_url(url: str, flag: str = "--db-url") -> None:
    """Refuse, before the store opens it, a database URL that would end in a driver's traceback: not
    an SQLAlchemy URL, a scheme no installed dialect serves, an SQLite file whose folder does not exist
    or that is not an SQLite database. (Only the URL is checked; a server's availability is not.)"""
    import sqlalchemy as sa
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = sa.engine.make_url(url)
        parsed.get_dialect()
    except NoSuchModuleError:
        scheme = url.partition("://")[0]
        raise InputError("command line", flag, f"unknown database scheme {scheme!r} in {url!r}: use "
                         "sqlite:///PATH (a file) or postgresql://USER@HOST/DB") from None
    except (ArgumentError, ValueError) as exc:
        raise InputError("command line", flag, f"{url!r} is not a database URL ({exc}): use sqlite:///PATH "
                         "or postgresql://USER@HOST/DB") from None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return
    db = Path(parsed.database)
    if db.is_dir():
        raise InputError(db, flag, "is a folder: name the database file, such as sqlite:///" + str(db / "gateway.db"))
    if db.exists():
        try:
            with open(db, "rb") as fh:
                head = fh.read(len(SQLITE_MAGIC))
        except OSError as exc:
            raise InputError(db, flag, f"cannot read the database ({exc.strerror}): check its permissions") from None
        if head and head != SQLITE_MAGIC:
            raise InputError(db, flag, "exists and is not an SQLite database: give a new file name or the "
                             "gateway's database")
        return
    if not db.parent.is_dir():
        raise InputError(db, flag, f"its folder {db.parent} does not exist: create it (mkdir -p {db.parent}) "
                         "or choose another path")
    check_output(db, flag)
