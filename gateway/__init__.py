"""The routing gateway: an OpenAI-compatible HTTP server in front of the pool, driven by the registered
champion (of any served family: a single-turn router, MTRouter, the orchestrator, critique-and-route),
with per-key USD budgets, an explained
decision per request and champion hot-swap.

store.py     API keys (hashed at rest), budgets per key and period, the decision log (SQLAlchemy:
             SQLite embedded, Postgres by URL)
champion.py  the champion loaded from the MLflow registry, checked against the pool, swapped in the background
families/    every served family's adapter, looked up by name (the registry in families/__init__.py):
             how it reads a chat and answers it — single_turn.py (the query), mtrouter.py (the history
             h_t), orchestra.py (one executor episode, reserved and settled), critique.py (draft, verdict, escalation)
routing.py   the decision: each worker's estimated quality and worst-case cost, the budget rule
errors.py    the OpenAI-format request error
intake.py    a request's head, key, rate and body, checked before it may take a slot (408/413/429/431)
upstream.py  a worker's answer checked: its usage (an impossible one is a worker error), a stream's delivered bound
app.py       the FastAPI app: /v1/chat/completions (streaming too), /v1/models, /v1/decisions/{id}
cli.py       `routerops gateway serve` and `routerops gateway keys create` (keys.py: list, revoke, set-budget, spend)
settings.py  the settings file of `gateway serve --config` (configs/gateway.yaml) and its flags
ops.py       GET /health and /ready
telemetry.py Prometheus series per router and worker, OpenTelemetry traces (what `gateway serve` runs)
"""
