"""Environments (task sources plus verifiers) the rollout engine plays episodes in.

- `suites`: procedural QA suites from reasoning-gym (the embedded default), JSONL task files.
- `jsonl_qa`: GSM8K / MATH JSONL importers and the math-verify verifier.
- `qa`: QAEnvironment — answer / python / sympy primitives over QA tasks.
- `replay`: logged outcomes (one row per query × worker): format, RouteLLM importer, replay env.
- `tooluse`, `scienceworld_env`: multi-turn environments.

Nothing is imported here, so importing a single environment does not load the others' libraries.
"""
