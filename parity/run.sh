#!/usr/bin/env bash
# The vLLM parity harness: builds the reference venv when it is missing (parity/setup_env.sh), then replays a trace
# through vLLM's v1 scheduler and minipaged with the same settings (parity/vllm_parity.py --help).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$("$ROOT/parity/setup_env.sh" | tail -n 1)"
# vLLM logs warnings about a model and a device this CPU-only replay never uses. No VLLM_TARGET_DEVICE: vLLM 0.34.0's
# CPU platform refuses to start on x86 without triton-cpu (parity/README.md, parity/vllm_side.py).
unset VLLM_TARGET_DEVICE
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" VLLM_LOGGING_LEVEL=ERROR
exec "$VENV/bin/python" -m parity.vllm_parity "$@"
