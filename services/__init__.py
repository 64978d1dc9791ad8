"""The servers a team runs routerops against, started for real by `make serve` and by the tests:
the Prefect server and its workers, an S3-compatible object store (SeaweedFS), Postgres.

Each module starts one server as a context manager on loopback and says why it could not start.
Nothing here is imported by the core (`routerops/`); flows, the CLI and the tests use it.
"""
