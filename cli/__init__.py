"""The top floor: the `routerops` command line (cli/main.py), above the flows, the gateway, the stages
and the services, which it imports directly (lazily, inside each command) and none of which imports
it. `routerops ...`, `python -m cli ...` and `python -m cli.main ...` are the same command."""
