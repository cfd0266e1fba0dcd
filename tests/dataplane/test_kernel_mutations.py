"""Mutation tests of the emulation: each copies cuda/ to a temporary folder, plants one bug a GPU would expose (a
missing barrier, a cp.async wait in the wrong place, a merge over a split nobody wrote, a cache write one slot
off), builds the emulated kernels from the copy and asserts that the emulated checks catch it — as an
EmulationError naming the broken rule, NaN, or a wrong result. The same checks pass on the real kernels."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from minipaged_cli.dataplane import kernels
from minipaged_cli.dataplane.emulation import FLAGS, EmulatedBackend, EmulationError
from minipaged_cli.dataplane.reference import cache_write_naive, paged_attention_vectorized
from tests.dataplane.test_paged_ops import NUM_KV_HEADS, make_batch, tolerance

pytestmark = [pytest.mark.native_build, pytest.mark.slow]


def replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the mutation's anchor is gone from the kernel: {old!r}"
    return text.replace(old, new)


_TC_WAITS = """        if (more)
            cp_async_wait<1>();  // this tile's V has landed; the next tile's may still be in flight
        else
            cp_async_wait<0>();
"""
_TC_LOOP_END = "        __syncwarp();  // every lane has read this buffer before the next stage overwrites it\n"


@dataclass(frozen=True)
class Mutation:
    source: str  # a file of cuda/
    apply: Callable[[str], str]
    check: str  # the emulated check that must catch it: a key of CHECKS


MUTATIONS = {
    # The audit's two, which the emulation missed before it kept the GPU's rules: the warp reads V rows other
    # lanes' copies have landed but not made visible, or that have not landed at all.
    "no __syncwarp after the cp.async wait": Mutation(
        "paged_attention_tc.cu", lambda text: replace_once(text, _TC_WAITS + "        __syncwarp();\n", _TC_WAITS),
        "tensor-core"),
    "cp.async waits at the end of the loop": Mutation(
        "paged_attention_tc.cu",
        lambda text: replace_once(replace_once(text, _TC_WAITS, ""), _TC_LOOP_END, _TC_LOOP_END + _TC_WAITS),
        "tensor-core"),
    "wait_group 1 where 0 is needed": Mutation(
        "paged_attention_tc.cu",
        lambda text: replace_once(text, "            cp_async_wait<0>();", "            cp_async_wait<1>();"),
        "tensor-core"),
    "no __syncthreads before the simple kernel's reduction": Mutation(
        "paged_attention.cu",
        lambda text: replace_once(text, "    __syncthreads();\n    write_attention_output<T, HEAD_DIM, false>",
                                  "    write_attention_output<T, HEAD_DIM, false>"),
        "simple"),
    "a split merge that reads one split too many": Mutation(
        "paged_attention.cu",
        lambda text: replace_once(text, "(seq_lens[seq] + tokens_per_split - 1) / tokens_per_split)",
                                  "(seq_lens[seq] + tokens_per_split - 1) / tokens_per_split + 1)"),
        "split"),
    "a cache write one slot off": Mutation(
        "cache_write.cu",
        lambda text: replace_once(text, "const int64_t offset = slot % block_size;",
                                  "const int64_t offset = (slot + 1) % block_size;"),
        "cache-write"),
}


def attention_check(**backend: object) -> Callable[[ctypes.CDLL | None], None]:
    """bf16, head_dim 128 (what the subset build holds), 4 query heads per kv head, three sequences up to 517
    tokens with NaN in every slot no sequence owns: the emulated kernel against the vectorized reference."""
    def check(library: ctypes.CDLL | None) -> None:
        query, key_cache, value_cache, block_tables, seq_lens = make_batch(16, 128, 4, torch.bfloat16, False)
        out = EmulatedBackend(library=library, **backend).paged_attention(query, key_cache, value_cache,
                                                                          block_tables, seq_lens, 0.088)
        assert not out.isnan().any(), "NaN in the output"
        expected = paged_attention_vectorized(query, key_cache, value_cache, block_tables, seq_lens, 0.088)
        torch.testing.assert_close(out, expected, **tolerance(torch.bfloat16))
    return check


def cache_write_check(library: ctypes.CDLL | None) -> None:
    """37 tokens into random slots (every fifth padding) of NaN-filled caches, bit for bit against the naive loop."""
    generator = torch.Generator().manual_seed(3)
    key, value = (torch.randn(37, NUM_KV_HEADS, 128, generator=generator).to(torch.bfloat16) for _ in range(2))
    slots = torch.randperm(6 * 8, generator=generator)[:37].to(torch.int64)
    slots[::5] = -1
    caches = [torch.full((6, NUM_KV_HEADS, 8, 128), float("nan"), dtype=torch.bfloat16) for _ in range(4)]
    cache_write_naive(key, value, caches[0], caches[1], slots)
    EmulatedBackend(library=library).cache_write(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0].view(torch.int16), caches[2].view(torch.int16))
    assert torch.equal(caches[1].view(torch.int16), caches[3].view(torch.int16))


CHECKS = {
    "tensor-core": attention_check(attention_variant="tensor-core"),
    "simple": attention_check(attention_variant="simple"),
    "split": attention_check(attention_variant="simple", tokens_per_split=64),
    "cache-write": cache_write_check,
}


def build_command(cuda_dir: Path, output: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """g++ for the emulated kernels of ``cuda_dir`` (the subset: one instantiation of each kernel)."""
    compiler = os.environ.get("CXX") or shutil.which("g++")
    if compiler is None:
        pytest.skip("needs g++")
    return [compiler, *FLAGS, "-DMINIPAGED_EMULATION_SUBSET", *extra, "-shared", "-fPIC",
            str(cuda_dir / "emulation" / "kernels_emu.cpp"), "-o", str(output)]


@pytest.fixture(scope="module")
def mutated_libraries(tmp_path_factory) -> dict[str, Path]:
    """Every mutation built at once (the builds run side by side)."""
    builds = {}
    for name, mutation in MUTATIONS.items():
        folder = tmp_path_factory.mktemp("mutation")
        shutil.copytree(kernels.CUDA_DIR, folder / "cuda")
        path = folder / "cuda" / mutation.source
        path.write_text(mutation.apply(path.read_text()))
        output = folder / "kernels_emu.so"
        builds[name] = (output, subprocess.Popen(build_command(folder / "cuda", output), stderr=subprocess.PIPE,
                                                 text=True))
    for name, (_, process) in builds.items():
        assert process.wait() == 0, f"{name}: {process.stderr.read()}"
    return {name: output for name, (output, _) in builds.items()}


@pytest.mark.parametrize("check", CHECKS)
def test_the_checks_pass_on_the_real_kernels(check: str) -> None:
    CHECKS[check](None)


@pytest.mark.parametrize("name", MUTATIONS)
def test_each_planted_bug_is_caught(mutated_libraries: dict[str, Path], name: str) -> None:
    library = ctypes.CDLL(str(mutated_libraries[name]))
    with pytest.raises((EmulationError, AssertionError)) as caught:
        CHECKS[MUTATIONS[name].check](library)
    print(f"{name}: {caught.typename}: {str(caught.value).splitlines()[0]}")
