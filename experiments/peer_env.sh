#!/usr/bin/env bash
# The peer's own environment for experiments/k_worker_peer.py (issue 28, item 4): llmrouter-lib 0.4.0
# beside a CPU torch, outside the project's venv (its pins, gradio and litellm among them, stay out of ours).
#
#   bash experiments/peer_env.sh [/work/peer-venv]
#
# torch is pinned in the same pip command: left free, pip resolves llmrouter-lib's `torch>=2.0` to a
# CUDA build and gigabytes of nvidia-* wheels. The `router-r1` / `all` extras (vllm, torch 2.4) are not
# installed: no router run here needs them. About 2 GiB on disk, a few minutes from a PyPI mirror.
set -euo pipefail
VENV="${1:-/work/peer-venv}"
python3 -m venv "$VENV"
"$VENV/bin/pip" install "torch==2.13.0" "llmrouter-lib==0.4.0"
"$VENV/bin/python" -c "import torch, llmrouter.models as m; print('peer env ok: torch', torch.__version__, m.KNNRouter.__name__)"
