#!/usr/bin/env bash
# Builds the reference environment for the vLLM parity harness: a vLLM release's own v1 scheduler, KV-cache manager
# and block pool, importable on a CPU machine without a model or a GPU. A separate venv, so vLLM is never a
# dependency of minipaged. Idempotent: a complete venv (stamp file) is left as it is.
#
#   MINIPAGED_VLLM_VERSION  the release (default 0.34.0, the newest minipaged supports; 0.33.0 also)
#   MINIPAGED_VLLM_VENV     where the venv lives (default ~/.cache/minipaged/vllm-$MINIPAGED_VLLM_VERSION)
#
# Prints the venv's path on its last line.
set -euo pipefail

VERSION="${MINIPAGED_VLLM_VERSION:-0.34.0}"
case "$VERSION" in
    0.34.0|0.33.0) ;;
    *) echo "MINIPAGED_VLLM_VERSION=$VERSION: the harness supports 0.34.0 and 0.33.0" >&2; exit 2 ;;
esac
VENV="${MINIPAGED_VLLM_VENV:-$HOME/.cache/minipaged/vllm-$VERSION}"
STAMP="$VENV/.minipaged-parity-complete"
PYTHON="${PYTHON:-python3}"

if [[ -f "$STAMP" ]]; then
    echo "$VENV"
    exit 0
fi

echo "building the vLLM $VERSION reference venv in $VENV (about 2 GB, a few minutes)" >&2
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)

# The CPU build of torch, pinned: an unpinned torch would pull the multi-GB CUDA build.
"${PIP[@]}" "torch==2.13.0"

# vLLM itself without its dependencies: they name triton, CUDA wheels and more that the scheduler never imports.
WHEELS="$(mktemp -d)"
trap 'rm -rf "$WHEELS"' EXIT
"$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps -d "$WHEELS" "vllm==$VERSION"
"${PIP[@]}" --no-deps "$WHEELS"/vllm-*.whl

# What importing the scheduler and building a ModelConfig need, pinned to the versions the harness was checked with;
# numpy, pyyaml, typer and rich also let the harness import minipaged_cli from the repository.
"${PIP[@]}" \
    packaging==26.4 numpy==2.4.6 pyyaml==6.0.4 pydantic==2.14.4 msgspec==0.23.0 cloudpickle==3.1.3 psutil==7.2.2 \
    cachetools==8.0.2 regex==2026.11.19 requests==2.34.2 tqdm==4.70.1 cbor2==6.3.0 pyzmq==27.3.0 \
    transformers==5.24.0 aiohttp==3.14.5 openai-harmony==0.0.8 openai==3.57.0 pillow==13.0.0 pybase64==1.5.1 \
    uvloop==0.23.0 py-cpuinfo==9.0.0 prometheus_client==0.26.0 fastapi==0.165.0 partial-json-parser==0.2.1.1.post7 \
    llguidance==1.9.1 einops==0.8.2 typer==0.29.2 rich==15.0.0
# These two declare triton-style GPU dependencies the scheduler never reaches.
"${PIP[@]}" --no-deps xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2

touch "$STAMP"
echo "$VENV"
