"""`routerops prices publish FILE` / `routerops pool publish FILE`: validate, version and store,
upload to the team's bucket, emit the event the retrain deployment's trigger waits for
(cli/main.py parses the arguments)."""

from __future__ import annotations

import argparse
from pathlib import Path

from routerops.config import load_params
from routerops.files import check_output
from routerops.pricing import load_pool
from routerops.publishing import POOL, PRICES, in_force, pool_changes, publish, published_event_name
from services.prefect_server import emit_published
from services.s3 import endpoint_from_env, publish_file


# The one way to retrain by hand, as docs/operations/retrain.md and the README give it.
RETRAIN_BY_HAND = "make retrain"


def publish_command(args: argparse.Namespace) -> None:
    """Validate, version and store a price book or pool, then emit the event that starts a retrain."""
    root = Path(args.root)
    params = load_params(root / args.params, sections=("pool", "reprice", "ops"))
    store = root / params.ops.publish_dir
    check_output(store, f"ops.publish_dir in {root / args.params}", folder=True)  # before anything is validated
    pool_file = in_force(store, POOL, root / params.pool.file)
    book_file = in_force(store, PRICES, root / params.prices.evaluation)
    old_pool = load_pool(pool_file) if args.kind == POOL else None
    published, changed = publish(args.kind, args.file, store, pool_file=pool_file, book_file=book_file)
    if not changed:
        print(f"{args.kind} version {published.version} is already in force; nothing published, no retrain")
        return
    changes = pool_changes(old_pool, load_pool(published.path)) if args.kind == POOL else None
    print(f"published {args.kind} version {published.version} -> {published.path}")
    if endpoint_from_env():  # a team's store: the same file where every host can fetch it (boto3)
        key = f"published/{args.kind}/{published.version}.yaml"
        publish_file(params.ops.s3_bucket, key, published.path)
        print(f"uploaded to s3://{params.ops.s3_bucket}/{key}")
    if changes is not None:
        print("workers " + "; ".join(f"{k}: {', '.join(v) or '-'}" for k, v in changes.items()))
    event_id = emit_published(published, changes)
    print(f"emitted {published_event_name(args.kind)} (event {event_id}): the retrain deployment's trigger starts "
          "a retrain" if event_id else "PREFECT_API_URL is not set: no event emitted, no retrain triggered "
          f"(run `{RETRAIN_BY_HAND}`)")
