"""Static cost of the decode-attention kernel, without a GPU: what ptxas and the machine code say.

For the decode-attention kernels at one dtype and head_dim — each instantiation of ``cuda/paged_attention.cu`` (the
simple kernel; GQA group sizes 1, 2, 4, 8) and, for fp16 / bf16, ``cuda/paged_attention_tc.cu`` (tensor cores; one
instantiation for every group up to 8) — it compiles the files for ``--arch`` (``nvcc -cubin -Xptxas -v``) and
prints:

- registers, spill bytes and static shared memory per thread block (ptxas);
- CTAs per SM: the fewest allowed by registers (allocated per warp in units of 256), shared memory (plus the 1 KB
  the driver reserves per CTA) and threads, for the architecture's limits below;
- the loops that stream K/V, found in the SASS (``cuobjdump -sass``): innermost loops (a backward ``BRA`` whose
  body holds no other backward branch) that contain 128-bit global loads (``LDG.E.128``, or ``LDGSTS...128``: the
  16-byte asynchronous copies into shared memory of ``cp.async``). The compiler may emit
  several versions of one source loop (unrolled, or specialised on a condition), and which runs is not visible
  statically, so each is reported, and the targets are judged on the worst;
- bytes in flight per SM, per loop: the loads issued before the first instruction that reads a register one of them
  writes (what one thread keeps outstanding) plus every asynchronous copy of the iteration (outstanding until a
  later wait), x 16 bytes x threads x CTAs per SM;
- SASS instructions per KB of K/V, per loop: the body's instructions, which every warp executes once per iteration,
  divided by the K/V bytes one warp loads per iteration (its 128-bit loads x 16 bytes x 32 lanes).

These are proxies, how the kernel is steered without a GPU: DRAM latency is covered with roughly 24-32 KB in flight
per SM, and the instruction count per byte bounds how fast an SM can consume what arrives. Targets for bf16 head_dim
128 (issue 14): no spills, >= 32 KB in flight per SM for every group, <= 100 instructions per KB for group 4 and
<= 150 for group 8, judged on the kernel the launcher runs for that group and dtype
(``minipaged_cli.dataplane.kernels.attention_kernel``: the tensor-core kernel for fp16 and bf16).

Needs nvcc and cuobjdump with nvdisasm (``pip download nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm``: the wheels
hold the binaries; put their ``bin`` directories on PATH).

    python benchmarks/kernel_static.py [--arch sm_90] [--dtype bf16] [--head-dim 128]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from minipaged_cli.dataplane import kernels
from minipaged_cli.dataplane.kernels import CUDA_DIR, GROUP_SIZES, NUM_THREADS

# Per-SM limits of the architectures the kernels target (CUDA C programming guide, compute capability tables).
SM_LIMITS = {
    "sm_80": {"registers": 65536, "shared_bytes": 164 * 1024, "threads": 2048, "ctas": 32},
    "sm_90": {"registers": 65536, "shared_bytes": 228 * 1024, "threads": 2048, "ctas": 32},
}
RESERVED_SHARED_PER_CTA = 1024  # the driver keeps 1 KB of shared memory per CTA (compute capability 8.0 and later)
TARGETS = {"in_flight_kb": 32.0, "instructions_per_kb": {4: 100.0, 8: 150.0}}
TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class Loop:
    start: int  # address of the first instruction
    end: int  # address of the backward branch
    instructions: int
    loads: int  # 128-bit global loads per iteration
    loads_in_flight: int  # of those, issued before the first use of any of their results


@dataclass
class StaticCost:
    name: str
    registers: int
    spill_bytes: int
    shared_bytes: int
    ctas_per_sm: int
    loops: list[Loop]

    def in_flight_kb_per_sm(self, loop: Loop) -> float:
        return loop.loads_in_flight * 16 * NUM_THREADS * self.ctas_per_sm / 1024

    @staticmethod
    def instructions_per_kb(loop: Loop) -> float:
        return loop.instructions / (loop.loads * 16 * 32 / 1024)


def ptxas_report(text: str) -> dict[str, dict[str, int]]:
    """Registers, spills and shared memory per entry function, from ``-Xptxas -v`` output."""
    report: dict[str, dict[str, int]] = {}
    name = None
    for line in text.splitlines():
        if match := re.search(r"Function properties for (\S+)", line):
            name = match.group(1)
            report[name] = {"registers": 0, "spill_bytes": 0, "shared_bytes": 0}
        elif name and (match := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            report[name]["spill_bytes"] = int(match.group(1)) + int(match.group(2))
        elif name and (match := re.search(r"Used (\d+) registers", line)):
            report[name]["registers"] = int(match.group(1))
            if smem := re.search(r"(\d+) bytes smem", line):
                report[name]["shared_bytes"] = int(smem.group(1))
    return report


def ctas_per_sm(registers: int, shared_bytes: int, threads: int, arch: str) -> int:
    limits = SM_LIMITS[arch]
    warps = -(-threads // 32)
    registers_per_warp = -(-registers * 32 // 256) * 256
    by_registers = limits["registers"] // (registers_per_warp * warps)
    by_shared = limits["shared_bytes"] // (shared_bytes + RESERVED_SHARED_PER_CTA)
    return min(by_registers, by_shared, limits["threads"] // threads, limits["ctas"])


_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def sass_instructions(sass: str) -> list[tuple[int, str]]:
    """(address, instruction text) of every instruction of one function's SASS listing."""
    return [(int(address, 16), text) for address, text in _INSTRUCTION.findall(sass)]


def _backward_target(address: int, text: str) -> int | None:
    match = re.search(r"\bBRA\b.*?0x([0-9a-f]+)$", text)
    return int(match.group(1), 16) if match and int(match.group(1), 16) < address else None


def kv_loops(instructions: list[tuple[int, str]]) -> list[Loop]:
    """The innermost loops that issue 128-bit global loads."""
    loops = []
    for index, (address, text) in enumerate(instructions):
        start = _backward_target(address, text)
        if start is None:
            continue
        body = [(a, t) for a, t in instructions[:index] if a >= start]
        if any(_backward_target(a, t) is not None for a, t in body):
            continue  # an outer loop
        texts = [t for _, t in body] + [text]
        copies = sum(_is_async_copy(t) for t in texts)
        loads = sum("LDG.E.128" in t for t in texts) + copies
        if loads:
            loops.append(Loop(start, address, len(texts), loads, loads_before_first_use(texts) + copies))
    return loops


def _is_async_copy(text: str) -> bool:
    return "LDGSTS" in text and ".128" in text


def loads_before_first_use(body: list[str]) -> int:
    """128-bit loads issued before any instruction reads a register one of them wrote."""
    written: set[str] = set()
    issued = 0
    for text in body:
        operands = text.split(None, 1)[1] if " " in text.strip() else ""
        if text.lstrip("@!P0123456789 ").startswith("LDG"):
            if "LDG.E.128" in text:
                first = int(re.search(r"R(\d+)", operands).group(1))
                written |= {f"R{first + k}" for k in range(4)}
                issued += 1
            continue
        sources = re.findall(r"R\d+", operands)[1:]  # the first register is the destination
        if written & set(sources):
            break
    return issued


def analyse(arch: str, dtype: str, head_dim: int) -> dict[str, StaticCost]:
    """Every kernel the launcher may run for ``dtype`` and ``head_dim``, by name."""
    for tool in ("nvcc", "cuobjdump", "nvdisasm"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not on PATH (see this script's docstring)")
    torch_dtype = TORCH_DTYPES[dtype]
    names = {kernels.attention_kernel(torch_dtype, head_dim, group, "simple") for group in GROUP_SIZES}
    if torch_dtype in kernels.TENSOR_CORE_DTYPES:
        names.add(kernels.attention_kernel(torch_dtype, head_dim, 1, "tensor-core"))
    costs = {}
    with tempfile.TemporaryDirectory() as scratch:
        for source in sorted({source for source, _ in names}):
            cubin = Path(scratch) / f"{source}.cubin"
            compiled = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-O3", "-Xptxas", "-v", "-o", str(cubin),
                                       str(CUDA_DIR / f"{source}.cu")], capture_output=True, text=True, check=True)
            report = ptxas_report(compiled.stderr)
            for name in sorted(n for s, n in names if s == source):
                sass = subprocess.run(["cuobjdump", "-sass", "-fun", name, str(cubin)], capture_output=True,
                                      text=True, check=True).stdout
                ptxas = report[name]
                costs[name] = StaticCost(
                    name=name, registers=ptxas["registers"], spill_bytes=ptxas["spill_bytes"],
                    shared_bytes=ptxas["shared_bytes"],
                    ctas_per_sm=ctas_per_sm(ptxas["registers"], ptxas["shared_bytes"], NUM_THREADS, arch),
                    loops=kv_loops(sass_instructions(sass)))
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90", choices=sorted(SM_LIMITS))
    parser.add_argument("--dtype", default="bf16", choices=("f32", "f16", "bf16"))
    parser.add_argument("--head-dim", type=int, default=128, choices=(64, 128))
    args = parser.parse_args()
    costs = analyse(args.arch, args.dtype, args.head_dim)
    print(f"decode attention for {args.arch}, {args.dtype}, head_dim {args.head_dim}, {NUM_THREADS} threads a CTA")
    print(f"{'instantiation':34} {'regs':>5} {'spill B':>8} {'smem B':>7} {'CTAs/SM':>8}  {'K/V loop':15} "
          f"{'instr':>6} {'loads/iter':>11} {'in flight KB/SM':>16} {'instr/KB':>9}")
    for cost in costs.values():
        print(f"{cost.name:34} {cost.registers:>5} {cost.spill_bytes:>8} {cost.shared_bytes:>7} {cost.ctas_per_sm:>8}")
        for loop in cost.loops:
            print(f"{'':68}{loop.start:#07x}-{loop.end:#07x} {loop.instructions:>6} {loop.loads:>11} "
                  f"{cost.in_flight_kb_per_sm(loop):>16.1f} {cost.instructions_per_kb(loop):>9.0f}")
    if args.dtype == "bf16" and args.head_dim == 128:
        print("targets: no spills; >= 32 KB in flight per SM for every group; <= 100 instructions per KB at group 4, "
              "<= 150 at group 8; on the kernel the launcher runs for each group")
        for group in GROUP_SIZES:
            cost = costs[kernels.attention_kernel(TORCH_DTYPES[args.dtype], args.head_dim, group)[1]]
            misses = []
            if cost.spill_bytes:
                misses.append("spills")
            in_flight = min(cost.in_flight_kb_per_sm(loop) for loop in cost.loops)
            per_kb = max(cost.instructions_per_kb(loop) for loop in cost.loops)
            if in_flight < TARGETS["in_flight_kb"]:
                misses.append(f"{in_flight:.0f} KB in flight")
            limit = TARGETS["instructions_per_kb"].get(group)
            if limit is not None and per_kb > limit:
                misses.append(f"{per_kb:.0f} instructions per KB")
            verdict = "met" if not misses else "NOT met (" + ", ".join(misses) + ")"
            print(f"  group {group} ({cost.name}): {verdict}")


if __name__ == "__main__":
    main()
