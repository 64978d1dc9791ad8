"""Above the routers: the replay harness (cross-fit and fixed-split leaderboards; replay.py, curves.py),
serving (the one Servable contract, servable.py; every served family's servable behind one registry,
serving/, which is also the MLflow pyfunc loader), the model registry with its promotion gate, and MLflow tracking."""
