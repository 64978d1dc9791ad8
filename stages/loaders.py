"""The config loaders and the stage modules that stages/declarations.py names, each imported only when
a stage or a run needs it: real references that the import graph sees (tests/test_import_graph.py),
where the table once held "module:function" strings, and still nothing heavy imported by
`routerops stage --help` or at a dvc.yaml command's start (torch, transformers, MLflow take seconds)."""

from __future__ import annotations

from types import ModuleType
from typing import Any


def load_main_params(path) -> Any:
    from routerops.config import load_params

    return load_params(path)


def load_mtrouter_run(path) -> Any:
    from stages.mtrouter import load_run

    return load_run(path)


def load_orchestra_run(path) -> Any:
    from stages.orchestra.config import load_run

    return load_run(path)


def load_critique_config(path) -> Any:
    from models.critique.config import load_critique_config

    return load_critique_config(path)


def load_critique_lm_config(path) -> Any:
    from models.critique.lm_config import load_critique_lm_config

    return load_critique_lm_config(path)


def load_arena_run(path) -> Any:
    from evaluation.arena_config import load_arena_run

    return load_arena_run(path)


def stages_arena() -> ModuleType:
    from stages import arena

    return arena


def stages_arena_orchestra() -> ModuleType:
    from stages import arena_orchestra

    return arena_orchestra


def stages_critique() -> ModuleType:
    from stages import critique

    return critique


def stages_mtrouter() -> ModuleType:
    from stages import mtrouter

    return mtrouter


def stages_orchestra_data() -> ModuleType:
    from stages.orchestra import data

    return data


def stages_orchestra_evaluate() -> ModuleType:
    from stages.orchestra import evaluate

    return evaluate


def stages_orchestra_register() -> ModuleType:
    from stages.orchestra import register

    return register


def stages_orchestra_rl() -> ModuleType:
    from stages.orchestra import rl

    return rl


def stages_orchestra_sft() -> ModuleType:
    from stages.orchestra import sft

    return sft


def stages_orchestra_teacher() -> ModuleType:
    from stages.orchestra import teacher

    return teacher


def stages_pipeline() -> ModuleType:
    from stages import pipeline

    return pipeline


def stages_replay() -> ModuleType:
    from stages import replay

    return replay


def stages_retrain() -> ModuleType:
    from stages import retrain

    return retrain


def stages_routers() -> ModuleType:
    from stages import routers

    return routers


def stages_track() -> ModuleType:
    from stages import track

    return track
