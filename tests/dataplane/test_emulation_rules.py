"""The GPU rules cuda/emulation/cuda_emu.h keeps, one small CUDA kernel each, compiled against it: shuffles with
PTX's width and mask semantics (the values hand-worked from the CUDA programming guide's wording), shared memory
poisoned before every block, a missing __syncthreads visible as NaN, blocks in a seeded random order, and the
errors it raises: a cp.async still in flight at exit, lanes at different collectives, a misaligned cp.async."""

from __future__ import annotations

import ctypes
import math
import re
import subprocess

import pytest

from minipaged_cli.dataplane import kernels
from tests.dataplane.test_kernel_mutations import build_command

pytestmark = [pytest.mark.native_build]

KERNELS = r"""
#include "cuda_emu.h"

__global__ void shuffles(float* out) {  // one warp; lane l holds the value l
    const int lane = threadIdx.x;
    const float value = lane;
    out[0 * 32 + lane] = __shfl_xor_sync(0xffffffffu, value, 8, 8);
    out[1 * 32 + lane] = __shfl_up_sync(0xffffffffu, value, 3, 8);
    out[2 * 32 + lane] = __shfl_down_sync(0xffffffffu, value, 3, 8);
    out[3 * 32 + lane] = __shfl_sync(0xffffffffu, value, 9, 8);
    out[4 * 32 + lane] = lane < 16 ? __shfl_xor_sync(0x0000ffffu, value, 16) : -1.0f;  // sources outside the mask
}

__global__ void written_by_block_zero(float* out) {  // only block 0 writes shared memory; every block reads it
    __shared__ float s[32];
    if (blockIdx.x == 0) s[threadIdx.x] = 1.0f;
    __syncthreads();
    out[blockIdx.x * 32 + threadIdx.x] = s[threadIdx.x];
}

template <bool SYNCHRONISED>
__device__ void mirror(float* out) {  // two warps; each thread reads the element the other warp writes
    __shared__ float s[64];
    s[threadIdx.x] = threadIdx.x;
    if (SYNCHRONISED) __syncthreads();
    out[blockIdx.x * 64 + threadIdx.x] = s[63 - threadIdx.x];
}

__global__ void block_order(int* out, int* counter) { out[blockIdx.x] = (*counter)++; }

__global__ void copy_left_in_flight(const float* in) {
    __shared__ __align__(16) float s[32 * 4];
    cp_async_16(&s[threadIdx.x * 4], in + threadIdx.x * 4, true);
    cp_async_commit();
}

__global__ void diverged_shuffle(float* out) {
    float value = threadIdx.x;
    if (threadIdx.x < 16) value = __shfl_xor_sync(0xffffffffu, value, 1);
    else value = __shfl_xor_sync(0xffffffffu, value, 2);
    out[threadIdx.x] = value;
}

__global__ void misaligned_copy(const float* in) {
    __shared__ __align__(16) float s[8];
    cp_async_16(&s[1], in, true);
    cp_async_commit();
    cp_async_wait<0>();
}

extern "C" void run_shuffles(float* out) { emu::launch({1}, {32}, [&] { shuffles(out); }); }
extern "C" void run_written_by_block_zero(float* out) { emu::launch({8}, {32}, [&] { written_by_block_zero(out); }); }
extern "C" void run_mirror(float* out, int synchronised) {
    emu::launch({16}, {64}, [&] { synchronised ? mirror<true>(out) : mirror<false>(out); });
}
extern "C" void run_block_order(int* out, int* counter) { emu::launch({16}, {1}, [&] { block_order(out, counter); }); }
extern "C" void run_copy_left_in_flight(const float* in) { emu::launch({1}, {32}, [&] { copy_left_in_flight(in); }); }
extern "C" void run_diverged_shuffle(float* out) { emu::launch({1}, {32}, [&] { diverged_shuffle(out); }); }
extern "C" void run_misaligned_copy(const float* in) { emu::launch({1}, {32}, [&] { misaligned_copy(in); }); }
"""


@pytest.fixture(scope="module")
def rules(tmp_path_factory) -> ctypes.CDLL:
    folder = tmp_path_factory.mktemp("rules")
    (folder / "rules.cpp").write_text(KERNELS)
    command = build_command(kernels.CUDA_DIR, folder / "rules.so")
    command[command.index(str(kernels.CUDA_DIR / "emulation" / "kernels_emu.cpp"))] = str(folder / "rules.cpp")
    result = subprocess.run([*command, f"-I{kernels.CUDA_DIR / 'emulation'}"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    library = ctypes.CDLL(str(folder / "rules.so"))
    library.emu_take_error.restype = ctypes.c_char_p
    return library


def floats(n: int) -> ctypes.Array:
    return (ctypes.c_float * n)()


def test_shuffles_follow_ptx_width_and_mask_semantics(rules: ctypes.CDLL) -> None:
    out = floats(5 * 32)
    rules.run_shuffles(out)
    assert rules.emu_take_error() == b""
    # Segments of width 8 (lanes 8s .. 8s + 7). xor: "threads can access elements from earlier groups, ... later
    # groups get their own value": lane 9 ^ 8 = 1 lies in an earlier group (lane 1's value); lane 1 ^ 8 = 9 later.
    expected_xor = [lane if lane % 16 < 8 else lane - 8 for lane in range(32)]
    expected_up = [lane - 3 if lane % 8 >= 3 else lane for lane in range(32)]  # no wrap below the segment
    expected_down = [lane + 3 if lane % 8 < 5 else lane for lane in range(32)]  # nor above it
    expected_index = [8 * (lane // 8) + 1 for lane in range(32)]  # source lane 9 modulo the width
    assert list(out[0:32]) == expected_xor
    assert list(out[32:64]) == expected_up
    assert list(out[64:96]) == expected_down
    assert list(out[96:128]) == expected_index
    assert all(math.isnan(x) for x in out[128:144])  # lane l ^ 16 is outside mask 0xffff: undefined, NaN here
    assert list(out[144:160]) == [-1.0] * 16


def test_shared_memory_is_poisoned_before_every_block(rules: ctypes.CDLL) -> None:
    out = floats(8 * 32)
    rules.run_written_by_block_zero(out)
    assert rules.emu_take_error() == b""
    assert list(out[0:32]) == [1.0] * 32
    assert all(math.isnan(x) for x in out[32:])  # not block 0's values: a GPU gives no block another's memory


def test_a_missing_syncthreads_reads_the_poison(rules: ctypes.CDLL) -> None:
    # One warp runs at a time until it reaches a barrier (or exits): without __syncthreads the first warp of each
    # block reads the other's elements before they are written.
    for synchronised in (1, 0):
        out = floats(16 * 64)
        rules.run_mirror(out, synchronised)
        assert rules.emu_take_error() == b""
        for block in range(16):
            values = out[block * 64:(block + 1) * 64]
            unwritten = sum(math.isnan(x) for x in values)
            if synchronised:
                assert values == [float(63 - t) for t in range(64)]
            else:
                assert unwritten == 32, f"block {block}: {unwritten} elements read before they were written"


def test_blocks_run_in_a_seeded_random_order(rules: ctypes.CDLL, monkeypatch) -> None:
    orders = []
    for seed in ("1", "2", "1"):
        monkeypatch.setenv("MINIPAGED_EMULATION_SEED", seed)
        out, counter = (ctypes.c_int * 16)(), ctypes.c_int(0)
        rules.run_block_order(out, ctypes.byref(counter))
        orders.append(list(out))
    assert sorted(orders[0]) == list(range(16)) and orders[0] != list(range(16))
    assert orders[0] != orders[1] and orders[0] == orders[2]  # another seed, another order; the same, the same


def line_of(text: str) -> int:
    """The line of rules.cpp (KERNELS) that holds ``text``: the call site an error must name."""
    return KERNELS[:KERNELS.index(text)].count("\n") + 1


@pytest.mark.parametrize(("entry", "message"), [
    ("run_copy_left_in_flight", "exits with 1 cp.async copies in flight (the first issued at rules.cpp:"
                                f"{line_of('cp_async_16(&s[threadIdx.x * 4]')})"),
    ("run_misaligned_copy", f"cp.async at rules.cpp:{line_of('cp_async_16(&s[1]')}: shared address not 16-byte "
                            "aligned"),
])
def test_broken_rules_stop_the_launch_with_their_name(rules: ctypes.CDLL, entry: str, message: str) -> None:
    buffer = floats(32 * 4)
    getattr(rules, entry)(buffer)
    assert message in rules.emu_take_error().decode()
    assert rules.emu_take_error() == b""  # taken once


def test_diverged_lanes_are_named_with_the_collective_each_reached(rules: ctypes.CDLL) -> None:
    # Which lane arrives first is the threads' scheduling: the error names it and the first lane that differs,
    # each at the call its branch makes (lanes 0-15 the first shuffle, 16-31 the second).
    rules.run_diverged_shuffle(floats(32 * 4))
    error = rules.emu_take_error().decode()
    found = re.search(r"reach different collectives: lane (\d+) __shfl_xor_sync at rules\.cpp:(\d+), "
                      r"lane (\d+) __shfl_xor_sync at rules\.cpp:(\d+)", error)
    assert found, error
    first, second = (int(found[1]), int(found[2])), (int(found[3]), int(found[4]))
    branch = {True: line_of("value = __shfl_xor_sync(0xffffffffu, value, 1)"),
              False: line_of("value = __shfl_xor_sync(0xffffffffu, value, 2)")}
    for lane, line in (first, second):
        assert line == branch[lane < 16], error
    assert (first[0] < 16) != (second[0] < 16), error
