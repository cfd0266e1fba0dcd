// Host entry points that run the kernels of ../offload.cu on the CPU through cuda_emu.h, as kernels_emu.cpp does
// for the others (a library of its own: it builds in seconds, and the offload kernels change apart from the
// attention ones). Loaded by minipaged_cli/dataplane/offload.py with ctypes.
// Build: g++ -std=c++20 -O1 -shared -fPIC -pthread -DMINIPAGED_EMULATION offload_emu.cpp
#include "cuda_emu.h"

#include "../offload.cu"

#define EMU_SHAPE unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz

extern "C" void emu_gather_blocks(EMU_SHAPE, char* staging, const int64_t* cache_ptrs, const int64_t* block_ids,
                                  int num_layers, int64_t block_bytes, int vectorized) {
    emu::launch({gx, gy, gz}, {bx, by, bz},
                [&] { gather_blocks(staging, cache_ptrs, block_ids, num_layers, block_bytes, vectorized); });
}

extern "C" void emu_scatter_blocks(EMU_SHAPE, const char* staging, const int64_t* cache_ptrs,
                                   const int64_t* block_ids, int num_layers, int64_t block_bytes, int vectorized) {
    emu::launch({gx, gy, gz}, {bx, by, bz},
                [&] { scatter_blocks(staging, cache_ptrs, block_ids, num_layers, block_bytes, vectorized); });
}
