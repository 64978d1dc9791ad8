"""Above the routers: the replay harness (cross-fit and fixed-split leaderboards), serving (the one
Servable contract, the MLflow pyfunc loader), the model registry with its promotion gate, and MLflow tracking."""
