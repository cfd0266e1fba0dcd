// Host entry points that run the kernels of ../mla_decode.cu on the CPU through cuda_emu.h, loaded by
// minipaged_cli/dataplane/mla.py with ctypes (a library of its own: cuda_emu.h gives each library's .bss to its
// kernels as shared memory). Build: g++ -std=c++20 -O1 -shared -fPIC -pthread -DMINIPAGED_EMULATION mla_emu.cpp
#include "cuda_emu.h"

#include "../mla_decode.cu"

// The launch shape first, as CUDA takes it: grid x, y, z, then block x, y, z.
#define EMU_MLA_DECODE(SUFFIX, T)                                                                                \
    extern "C" void emu_mla_decode_##SUFFIX(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,     \
                                            unsigned bz, float* out, const float* query, const T* latent_cache,  \
                                            const int* block_tables, const int* seq_lens, float scale,           \
                                            int num_heads, int kv_lora_rank, int row_width, int block_size,      \
                                            int max_blocks) {                                                    \
        emu::launch({gx, gy, gz}, {bx, by, bz}, [&] {                                                           \
            mla_decode_##SUFFIX(out, query, latent_cache, block_tables, seq_lens, scale, num_heads,              \
                                kv_lora_rank, row_width, block_size, max_blocks);                                \
        });                                                                                                      \
    }

EMU_MLA_DECODE(f32, float)
EMU_MLA_DECODE(f16, __half)
EMU_MLA_DECODE(bf16, __nv_bfloat16)
