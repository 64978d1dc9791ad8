"""The routing gateway: an OpenAI-compatible HTTP server in front of the pool, driven by the registered
champion router, with per-key USD budgets, an explained decision per request and champion hot-swap.

store.py     API keys (hashed at rest), budgets per key and period, the decision log (SQLAlchemy:
             SQLite embedded, Postgres by URL)
champion.py  the champion router loaded from the MLflow registry and swapped in the background
routing.py   the decision: each worker's estimated quality and worst-case cost, the budget rule
app.py       the FastAPI app: /v1/chat/completions (streaming too), /v1/models, /v1/decisions/{id}
cli.py       `routerops gateway serve` and `routerops gateway keys create`
"""
