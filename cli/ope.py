"""`routerops ope`: registered routers estimated off-policy on the gateway's decision log
(evaluation/ope.py), and `routerops ope --gate`: the promotion gate on the champion's traffic.

    routerops ope --log sqlite:///gateway.db --router router-knn --routers router-knn/3 router-mf@challenger

writes leaderboard.csv, leaderboard.md, ope.json and the log snapshot it read (log_snapshot.parquet)
under --out, and one MLflow run `ope <router>` whose dataset input is that snapshot.
Router references: NAME (its champion), NAME/VERSION, NAME@ALIAS, or a saved bundle directory.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from routerops.errors import InputError, RouteropsError
from routerops.ope import ESTIMATORS, NoSupportError, OPEConfig


def add_ope_parser(sub: argparse._SubParsersAction) -> None:
    ope = sub.add_parser("ope", help="off-policy leaderboard of routers on the gateway's decision log")
    ope.add_argument("--log", required=True, help="the gateway's database URL (sqlite:///gateway.db) or an "
                                                  "exported decision table (.parquet / .csv)")
    ope.add_argument("--router", help="the served router whose traffic is read (default: the log's only one)")
    ope.add_argument("--routers", nargs="*", default=[],
                     help="targets: NAME (its champion), NAME/VERSION, NAME@ALIAS or a bundle directory")
    ope.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=ESTIMATORS)
    ope.add_argument("--direct-model", default="router", choices=("router", "fitted"),
                     help="DR's q̂: each router's own quality estimates, or an outcome model fitted on the log")
    ope.add_argument("--cost-weight", type=float, help="λ of the objective score − λ·USD (default: the log's λ)")
    ope.add_argument("--clip", type=float, help="largest importance weight kept (default: no clipping)")
    ope.add_argument("--min-support", type=float, default=1.0, help="share of traffic that must have support")
    ope.add_argument("--n-boot", type=int, default=1000)
    ope.add_argument("--seed", type=int, default=0)
    ope.add_argument("--gate", metavar="NAME/VERSION",
                     help="also run the promotion gate for this candidate on the champion's traffic")
    ope.add_argument("--gate-metric", default="accuracy", choices=("accuracy", "objective"))
    ope.add_argument("--gate-estimator", default="snips", choices=ESTIMATORS)
    ope.add_argument("--min-ess", type=float, default=30.0)
    ope.add_argument("--params", default="params.yaml", help="its `track` section says where MLflow is")
    ope.add_argument("--out", default="reports/ope")
    ope.set_defaults(func=ope_command)


def resolve_router(ref: str) -> tuple[str, Any]:
    """(label, servable) of a router reference (module docstring)."""
    from evaluation.registry import CHAMPION_ALIAS, load_registered
    from evaluation.serving import load_servable

    if Path(ref).is_dir():
        return ref, load_servable(ref)
    import mlflow
    from mlflow.exceptions import MlflowException

    name, version = ref, None
    if "/" in ref:
        name, version = ref.rsplit("/", 1)
    alias = None
    if "@" in name:
        name, alias = name.split("@", 1)
    try:
        if version is None:
            version = mlflow.MlflowClient().get_model_version_by_alias(name, alias or CHAMPION_ALIAS).version
        return f"{name}/{version}", load_registered(name, str(version))
    except MlflowException as exc:
        raise InputError("command line", "--routers", f"{ref!r}: no such registered version or alias ({exc})") from None


def log_cost_weight(logged) -> float:
    """The log's λ when every request had the same one (else the flag must say which)."""
    values = set(logged.cost_weight.round(12).tolist())
    if len(values) != 1:
        raise InputError("command line", "--cost-weight", f"the log's requests used several λ ({sorted(values)[:5]}): "
                                                          "say which the objective uses")
    return values.pop()


def ope_command(args: argparse.Namespace) -> None:
    from evaluation.ope import evaluate, leaderboard, markdown, read_log, traffic
    from routerops import schema

    from routerops.files import check_output

    check_output(args.out, "--out", folder=True, inputs=(args.log,))  # before any work (one error style)
    frame = read_log(args.log, args.router)
    if args.router is None and frame.router.nunique() > 1:
        raise InputError("command line", "--router", f"the log serves several routers {sorted(frame.router.unique())}: "
                                                     "name the one whose traffic to read")
    router = args.router or str(frame.router.iloc[0])
    logged = traffic(frame)
    cost_weight = args.cost_weight if args.cost_weight is not None else log_cost_weight(logged)
    cfg = OPEConfig(estimators=tuple(args.estimators), n_boot=args.n_boot, clip=args.clip,
                    min_support=args.min_support, cost_weight=cost_weight, seed=args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    snapshot = out / "log_snapshot.parquet"
    partial = snapshot.with_suffix(".parquet.partial")
    frame.to_parquet(partial, index=False)
    partial.replace(snapshot)  # atomic: a reader never sees half a snapshot
    routers = dict(resolve_router(ref) for ref in args.routers) if args.routers else {}
    try:
        result = evaluate(logged, routers, cfg, args.direct_model)
    except NoSupportError as exc:
        raise InputError(args.log, "propensity", str(exc)) from None
    board = leaderboard(result, "snips" if "snips" in cfg.estimators else cfg.estimators[0])
    schema.write_csv_atomic(board, out / "leaderboard.csv")
    table = markdown(board, "snips" if "snips" in cfg.estimators else cfg.estimators[0])
    schema.write_text_atomic(table, out / "leaderboard.md")
    summary = {"log": str(args.log), "router": router, "n": len(frame), "config": result.config,
               "direct_model": args.direct_model, "rows": result.rows,
               "epsilon": sorted(set(logged.epsilon.tolist()))}
    decision = None
    if args.gate:
        decision = gate_command(args, router, frame)
        summary["gate"] = decision
    schema.write_json_atomic(summary, out / "ope.json")
    run_id = track(args, router, board, snapshot, out)
    print(table)
    if decision is not None:
        print(f"gate: {'PROMOTED' if decision['promote'] else 'refused'}: {decision['reason']}")
    print(f"wrote {out}/leaderboard.csv, leaderboard.md, ope.json; MLflow run {run_id}")


def gate_command(args: argparse.Namespace, router: str, frame) -> dict[str, Any]:
    from evaluation.ope import promote_off_policy
    from routerops.promotion import OffPolicyGateConfig

    if "/" not in args.gate:
        raise InputError("command line", "--gate", f"expected NAME/VERSION, got {args.gate!r}")
    name, version = args.gate.rsplit("/", 1)
    cfg = OffPolicyGateConfig(estimator=args.gate_estimator, metric=args.gate_metric, min_ess=args.min_ess,
                              min_support=args.min_support, n_boot=max(args.n_boot, 100), clip=args.clip,
                              seed=args.seed)
    decision = promote_off_policy(name, version, args.log, cfg, cost_weight=args.cost_weight,
                                  direct_model=args.direct_model, served_name=router)
    return decision.to_dict()


def track(args: argparse.Namespace, router: str, board, snapshot: Path, out: Path) -> str:
    """One MLflow run: the log snapshot as its dataset input, each policy's estimates as metrics."""
    import mlflow

    from evaluation.tracking import log_dataset_inputs, use_tracking
    from routerops.config import load_params

    params = load_params(args.params) if Path(args.params).is_file() else None
    if params is not None:
        use_tracking(params.track)
    elif "MLFLOW_TRACKING_URI" not in __import__("os").environ:
        raise RouteropsError(f"{args.params} not found and MLFLOW_TRACKING_URI unset: nowhere to log the run")
    with mlflow.start_run(run_name=f"ope {router}", nested=mlflow.active_run() is not None) as run:
        log_dataset_inputs([snapshot], context="ope")
        mlflow.log_params({"log": str(args.log)[:500], "router": router, "estimators": ",".join(args.estimators),
                           "direct_model": args.direct_model, "clip": args.clip, "n_boot": args.n_boot,
                           "min_support": args.min_support, "routers": ",".join(args.routers)[:500]})
        metrics = {}
        for i, row in board.iterrows():
            for key, value in row.items():
                if key != "policy" and isinstance(value, (int, float)) and math.isfinite(value):
                    metrics[f"p{i}.{key}"] = float(value)
        mlflow.log_metrics(metrics)
        mlflow.set_tags({f"policy.p{i}": str(p)[:500] for i, p in enumerate(board.policy)})
        mlflow.log_artifact(str(out / "leaderboard.csv"))
        mlflow.log_artifact(str(out / "leaderboard.md"))
        mlflow.log_artifact(str(out / "ope.json"))
        return run.info.run_id
