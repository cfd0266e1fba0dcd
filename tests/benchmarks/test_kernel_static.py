"""benchmarks/kernel_static.py's readers of ptxas and SASS output, on hand-written listings (no CUDA tools needed)."""

from __future__ import annotations

from benchmarks.kernel_static import ctas_per_sm, kv_loops, loads_before_first_use, ptxas_report, sass_instructions

PTXAS = """\
ptxas info    : Compiling entry function 'k_g4' for 'sm_90'
ptxas info    : Function properties for k_g4
    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 117 registers, used 1 barriers, 17152 bytes smem
"""

# An outer loop (0x0010-0x0090) around an inner one (0x0020-0x0070): the inner loop issues two 128-bit loads, then
# one instruction that does not read them, then one that reads R8 (the first load's result).
SASS = """\
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/                   LDG.E.128.CONSTANT R8, desc[UR12][R2.64] ;
        /*0030*/                   LDG.E.128.CONSTANT R12, desc[UR12][R4.64] ;
        /*0040*/                   IADD3 R4, R4, 0x10, RZ ;
        /*0050*/                   FFMA R20, R9, R30, R20 ;
        /*0060*/                   ISETP.GE.AND P0, PT, R4, R5, PT ;
        /*0070*/              @!P0 BRA 0x20 ;
        /*0080*/                   ISETP.GE.AND P1, PT, R2, R6, PT ;
        /*0090*/              @!P1 BRA 0x10 ;
        /*00a0*/                   EXIT ;
"""


def test_ptxas_report_reads_registers_spills_and_shared_memory() -> None:
    assert ptxas_report(PTXAS) == {"k_g4": {"registers": 117, "spill_bytes": 12, "shared_bytes": 17152}}


def test_ctas_per_sm_by_hand() -> None:
    # 117 registers: 117 * 32 = 3,744 per warp, allocated in 256s: 3,840; 4 warps: 15,360; 65,536 // 15,360 = 4.
    # Shared: 228 KB // (17,152 + 1,024) = 12; threads: 2,048 // 128 = 16. Registers decide: 4.
    assert ctas_per_sm(117, 17152, 128, "sm_90") == 4
    # 193 registers: 6,176 -> 6,400 per warp, 25,600 a CTA: 2.
    assert ctas_per_sm(193, 33792, 128, "sm_90") == 2
    # 48 registers: 1,536 per warp, 6,144 a CTA: 10 by registers; shared 4,672 + 1,024: 40; threads: 16.
    assert ctas_per_sm(48, 4672, 128, "sm_90") == 10


def test_the_innermost_loop_with_loads_and_what_it_keeps_in_flight() -> None:
    instructions = sass_instructions(SASS)
    assert len(instructions) == 11
    [loop] = kv_loops(instructions)
    assert (loop.start, loop.end, loop.instructions, loop.loads) == (0x20, 0x70, 6, 2)
    assert loop.loads_in_flight == 2  # both loads are issued before the FFMA reads R9
    body = [text for _, text in instructions[2:8]]
    assert loads_before_first_use([body[0], "FADD R3, R8, R8", body[1]]) == 1  # R8 used before the second load


def test_async_copies_count_as_loads_in_flight_until_their_wait() -> None:
    # A loop that copies two 16-byte chunks into shared memory (cp.async), then loads one into registers and reads
    # it: 3 loads an iteration, all outstanding together before the HMMA waits on the register load.
    sass = """\
        /*0000*/                   LDGSTS.E.BYPASS.128 [R19], desc[UR8][R50.64], !P1 ;
        /*0010*/                   LDGSTS.E.BYPASS.128 [R19+0x800], desc[UR8][R52.64], !P1 ;
        /*0020*/                   LDGDEPBAR ;
        /*0030*/                   LDG.E.128 R8, desc[UR8][R2.64] ;
        /*0040*/                   HMMA.16816.F32.BF16 R20, R4, R8, R20 ;
        /*0050*/              @!P0 BRA 0x0 ;
"""
    [loop] = kv_loops(sass_instructions(sass))
    assert (loop.loads, loop.loads_in_flight, loop.instructions) == (3, 3, 6)
    assert loads_before_first_use([t for _, t in sass_instructions(sass)]) == 1  # the copies are not register loads
