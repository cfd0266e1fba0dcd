#!/usr/bin/env bash
# One GPU window's work, unattended, in at most 8 minutes of command time (the device tool allows 10 a command
# and about 15 in all, the machine's start included). Everything lands in $OUT, one full log per step:
#
#   summary.txt     commit, GPU, driver, one line per step: status, exit code, seconds, limit; then the set-up's
#                   log: carried wheels, PATH, and the import that must work: torch + PyCUDA on torch's context
#   bench.log       benchmarks/kernels_gpu.py: kernel figures beside same-run baselines (first: they matter most),
#                   and KV offloading's store/load GB/s per block size in both host layouts beside a pinned copy
#   gpu_tests.log   pytest -m gpu, full output; MINIPAGED_REQUIRE_GPU=1 makes a skipped GPU test a failure
#   sanitizers.log  compute-sanitizer: memcheck over the bf16 attention, cache-write, copy-blocks and offload (gather
#                   and scatter kernels, pinned copies on a side stream) GPU tests;
#                   racecheck, synccheck and initcheck over the tensor-core kernel's small GPU tests (what the CPU
#                   emulation cannot prove: shared-memory hazards and barriers on the real hardware)
#   calibrate.log   minipaged calibrate: Qwen3-8B's GEMMs, element-wise kernels, prefill attention (torch) and
#                   this project's decode attention and cache-write kernels, timed over their grids (prompts and
#                   contexts up to the model's 40,960 tokens) against the H200 preset's model
#   calibration-h200-qwen3-8b.yaml   what it measured: simulate --calibration reads it (configs/calibrations/)
#   run.log         minipaged run on a slice of the Azure conversation trace, on the CUDA kernels
#   verify.log      minipaged verify --layer 3 on the CUDA kernels, bf16
#
# The project is not installed there (the image has no hatchling): it runs from the source tree (PYTHONPATH).
# The emulation tests do not run here: CI runs them.
#
#   on the GPU machine (device tool, carry [".whl"]):  bash benchmarks/gpu_session.sh
#   here, without a GPU (CI runs it too):              bash benchmarks/gpu_session.sh --check
#
# --check shows that every pytest selection collects what it names, that every command parses (its exact
# options, with --help appended), that every benchmark case runs (--dry-run on the emulated kernels), and that
# the step limits fit the budget.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

PY=${PYTHON:-python3}  # the interpreter with the project's dependencies (the GPU image's python3)
BUDGET_S=480
SETUP_S=45
STEPS=(bench gpu_tests sanitizers calibrate run verify)
declare -A LIMIT=([bench]=115 [gpu_tests]=80 [sanitizers]=130 [calibrate]=45 [run]=30 [verify]=35)
CALIBRATION=calibration-h200-qwen3-8b.yaml

GPU_TESTS=(tests/ -m gpu)
# Selected by node id: -k cannot spell "(32, 8)", and the ids spell the dtype torch.bfloat16, not bf16.
MEMCHECK_TESTS=(
    "tests/dataplane/test_kernels.py::test_gpu_attention_on_vllm_shapes[(32, 8)-128-16-torch.bfloat16]"
    "tests/dataplane/test_kernels.py::test_gpu_attention_on_vllm_shapes[(64, 8)-128-16-torch.bfloat16]"
    "tests/dataplane/test_kernels.py::test_gpu_cache_write_is_bit_exact[torch.bfloat16]"
    "tests/dataplane/test_kernels.py::test_gpu_copy_blocks_is_exact[torch.bfloat16]"
    "tests/dataplane/test_offload.py::test_gpu_store_waits_for_the_step_and_load_finishes_before_attention[contiguous]"
)
# racecheck, synccheck and initcheck slow a kernel by 10-100x: the tensor-core kernel on 3 sequences (<= 517 tokens),
# with and without split-K, not vLLM's 8k-token shapes.
TC_SANITIZERS=(racecheck synccheck initcheck)
TC_TESTS=(
    "tests/dataplane/test_kernels.py::test_gpu_tensor_core_kernel_on_small_batches[plan-torch.bfloat16]"
    "tests/dataplane/test_kernels.py::test_gpu_tensor_core_kernel_on_small_batches[split 64-torch.bfloat16]"
)
BENCH_CMD=("$PY" benchmarks/kernels_gpu.py --repeat 7 --launches 20)
RUN_CMD=("$PY" -m minipaged_cli run traces/azure_conv_1k.yaml --limit 100 --device cuda --kv-memory 16GiB
         --max-steps 400 --json -)
CALIBRATE_CMD=("$PY" -m minipaged_cli calibrate "${OUT:-gpu-out}/$CALIBRATION" --model qwen3-8b --gpu h200
               --device cuda --repeat 3)
VERIFY_CMD=("$PY" -m minipaged_cli verify --layer 3 --device cuda --dtype bfloat16 --json -)

step_command() {  # the command of step $1, one word per line of the array
    case $1 in
        bench) CMD=("${BENCH_CMD[@]}") ;;
        gpu_tests) CMD=(env MINIPAGED_REQUIRE_GPU=1 "$PY" -m pytest -rfE "${GPU_TESTS[@]}") ;;
        sanitizers) CMD=(bash "$ROOT/benchmarks/gpu_session.sh" --sanitizers) ;;
        calibrate) CMD=("${CALIBRATE_CMD[@]}") ;;
        run) CMD=("${RUN_CMD[@]}") ;;
        verify) CMD=("${VERIFY_CMD[@]}") ;;
    esac
}

total_limit() {
    local total=$SETUP_S name
    for name in "${STEPS[@]}"; do total=$((total + LIMIT[$name])); done
    echo "$total"
}

check_selection() {  # $1 the tools, $2 what the tests cover, then the test ids: each must be in GPU_IDS, once
    local tools=$1 covers=$2 failed=0 count id found=0 lines=""
    shift 2
    for id in "$@"; do
        count=$(grep -cxF "$id" <<< "$GPU_IDS")
        found=$((found + count))
        lines+="  $count  $id"$'\n'
        [ "$count" -eq 1 ] || failed=1
    done
    echo "$tools: the selection collects $found tests ($covers)"
    printf '%s' "$lines"
    return "$failed"
}

check() {
    export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
    local failed=0 count
    # One collection of the GPU tests (it imports every test module): the sanitizers' selections are ids in it.
    GPU_IDS=$("$PY" -m pytest --collect-only -q -p no:cacheprovider "${GPU_TESTS[@]}" 2>/dev/null | grep "::")
    count=$(grep -c "::" <<< "$GPU_IDS")
    echo "gpu_tests: pytest ${GPU_TESTS[*]} collects $count tests"
    [ "$count" -gt 0 ] || { echo "  FAIL: no GPU test collected"; failed=1; }
    check_selection "memcheck" "bf16 attention, cache write, copy blocks, offload" "${MEMCHECK_TESTS[@]}" || failed=1
    check_selection "${TC_SANITIZERS[*]}" "the tensor-core kernel, small batches" "${TC_TESTS[@]}" || failed=1
    if "$PY" benchmarks/kernels_gpu.py --dry-run > /dev/null 2>&1; then
        echo "bench: every case runs (--dry-run: tiny shapes on the emulated kernels, untimed)"
    else
        echo "bench: FAIL: benchmarks/kernels_gpu.py --dry-run"
        failed=1
    fi
    for name in bench calibrate run verify; do
        step_command "$name"
        if "${CMD[@]}" --help > /dev/null 2>&1; then
            echo "$name: parses: ${CMD[*]}"
        else
            echo "$name: FAIL: does not parse: ${CMD[*]} --help"
            failed=1
        fi
    done
    local total
    total=$(total_limit)
    echo "budget: set-up ${SETUP_S} s + steps $(for n in "${STEPS[@]}"; do printf '%s %s s, ' "$n" "${LIMIT[$n]}"; done)"
    echo "        = ${total} s of at most ${BUDGET_S} s"
    [ "$total" -le "$BUDGET_S" ] || { echo "  FAIL: over budget"; failed=1; }
    local files=$((2 + ${#STEPS[@]}))  # summary (with the set-up's log), one log per step, the calibration
    echo "files under \$OUT: $files (at most 8)"
    [ "$files" -le 8 ] || failed=1
    [ "$failed" -eq 0 ] && echo "check passed" || echo "check FAILED"
    return "$failed"
}

# The sanitizers step: memcheck, then each tool of TC_SANITIZERS in turn; fails if any reports an error.
sanitizers() {
    local failed=0 tool
    export MINIPAGED_REQUIRE_GPU=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1
    echo "== memcheck"
    compute-sanitizer --tool memcheck --error-exitcode 1 "$PY" -m pytest -rfE -m gpu "${MEMCHECK_TESTS[@]}" || failed=1
    for tool in "${TC_SANITIZERS[@]}"; do
        echo "== $tool"
        compute-sanitizer --tool "$tool" --error-exitcode 1 "$PY" -m pytest -rfE -m gpu "${TC_TESTS[@]}" || failed=1
    done
    return "$failed"
}

if [ "${1:-}" = "--check" ]; then
    check
    exit $?
fi
if [ "${1:-}" = "--sanitizers" ]; then
    sanitizers
    exit $?
fi

OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
{
    echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with changes)')"
    echo "date $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu, driver, memory: /'
} > "$SUMMARY"

elapsed_since() { echo $(( $(date +%s) - $1 )); }

# -- set-up: fatal ---------------------------------------------------------------------------------------------
started=$(date +%s)
(
    set -e
    echo "== carried wheels into /tmp/site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    for dir in /usr/local/cuda*/bin /usr/local/cuda*/compute-sanitizer; do
        [ -d "$dir" ] && PATH=$PATH:$dir
    done
    echo "nvcc: $(command -v nvcc || echo missing); host compiler: $(command -v g++ || command -v c++ || echo missing)"
    echo "compute-sanitizer: $(command -v compute-sanitizer || echo missing)"
    command -v nvcc > /dev/null  # PyCUDA compiles the kernels at run time: without nvcc nothing can run
    command -v g++ > /dev/null || command -v c++ > /dev/null
    timeout "$SETUP_S" env PYTHONPATH="$ROOT:/tmp/site" "$PY" -c "
import torch
torch.cuda.init()
import pycuda.autoprimaryctx
import minipaged_cli.dataplane.cuda as cb
print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'on', torch.cuda.get_device_name())
print('cuda backend:', cb.cuda_backend_unavailable_reason() or 'available')
"
) > /tmp/gpu_session_setup.log 2>&1
rc=$?
export PATH
for dir in /usr/local/cuda*/bin /usr/local/cuda*/compute-sanitizer; do [ -d "$dir" ] && PATH=$PATH:$dir; done
export PYTHONPATH=$ROOT:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYCUDA_CACHE_DIR=/tmp/pycuda-cache
mkdir -p "$PYCUDA_CACHE_DIR"
if [ "$rc" -ne 0 ]; then
    echo "setup      FAILED  rc=$rc  $(elapsed_since "$started") s (limit $SETUP_S s): its log is below" >> "$SUMMARY"
    { echo; echo "== set-up log"; cat /tmp/gpu_session_setup.log; } >> "$SUMMARY"
    cat "$SUMMARY"
    exit 1
fi
echo "setup      ok      rc=0  $(elapsed_since "$started") s (limit $SETUP_S s)" >> "$SUMMARY"

# -- the steps, in order of what matters most ------------------------------------------------------------------
failures=0
for name in "${STEPS[@]}"; do
    step_command "$name"
    started=$(date +%s)
    { echo "\$ ${CMD[*]}"; timeout --kill-after=10 "${LIMIT[$name]}" "${CMD[@]}"; } > "$OUT/$name.log" 2>&1
    rc=$?
    case $rc in
        0) status=ok ;;
        124|137) status=TIMEOUT ;;
        *) status=FAILED ;;
    esac
    [ "$rc" -eq 0 ] || failures=$((failures + 1))
    printf '%-10s %-7s rc=%-3s %s s (limit %s s)\n' "$name" "$status" "$rc" "$(elapsed_since "$started")" \
        "${LIMIT[$name]}" >> "$SUMMARY"
done
{ echo; echo "== set-up log"; cat /tmp/gpu_session_setup.log; } >> "$SUMMARY"
cat "$SUMMARY"
[ "$failures" -eq 0 ]  # the exit status says whether every step passed
