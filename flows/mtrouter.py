"""MTRouter flow (paper 000): collect → train estimator and ablations → evaluate → analyses → register.

`python -m flows.mtrouter` runs it at small scale on ScienceWorld with the embedded pool
(params.yaml, section `mtrouter`); point `mtrouter.pool` at a vLLM / API pool for the paper scale.
"""

from __future__ import annotations

import argparse

from prefect import flow

from models.mtrouter import pipeline as mt
from tasks.mtrouter import ablation_task, analyses_task, collect_task, evaluate_task, register_task


@flow(name="mtrouter", log_prints=True)
def mtrouter_flow(params_file: str = "params.yaml") -> dict:
    import mlflow

    from routerops.config import load_params
    from routerops.report import to_markdown
    from tasks.tracking import git_commit, use_tracking

    run = mt.load_run(params_file)
    mt.check_run(run)
    use_tracking(load_params(params_file).track)
    with mlflow.start_run(run_name="mtrouter") as parent:
        mlflow.set_tag("git_commit", git_commit())
    episodes, turns, tasks = collect_task(run)
    rows = [ablation_task(run, name, episodes, turns, tasks, parent.info.run_id) for name in run.ablations]
    comparison = __import__("pandas").DataFrame(rows)
    mt.REPORT.mkdir(parents=True, exist_ok=True)
    (mt.REPORT / "ablations.md").write_text(to_markdown(comparison) + "\n")
    evaluation = evaluate_task(run, episodes, turns, tasks, parent.info.run_id)
    analyses_task(parent.info.run_id)
    registered = register_task(run, tasks, parent.info.run_id)
    with mlflow.start_run(run_id=parent.info.run_id):
        mlflow.log_artifact(str(mt.REPORT / "ablations.md"))
    print(to_markdown(comparison))
    print(to_markdown(evaluation))
    return {"parent_run_id": parent.info.run_id, "registered": registered}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    mtrouter_flow(params_file=parser.parse_args().params)


if __name__ == "__main__":
    main()
