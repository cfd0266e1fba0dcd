// Host entry points that run the kernels of ../cache_write.cu, ../paged_attention.cu, ../paged_attention_tc.cu and
// ../copy_blocks.cu on the CPU through
// cuda_emu.h: one C function per kernel, taking the launch shape first, loaded by minipaged_cli/emulation.py
// with ctypes. Build: g++ -std=c++20 -O1 -shared -fPIC -pthread -DMINIPAGED_EMULATION kernels_emu.cpp
// (-DMINIPAGED_EMULATION_SUBSET: only bf16, head_dim 128, no fp8 cache).
#include "cuda_emu.h"

#include "../cache_write.cu"
#include "../paged_attention.cu"
#include "../paged_attention_tc.cu"
#include "../copy_blocks.cu"

// Every entry point takes the launch shape first, as CUDA does: grid x, y, z, then block x, y, z.
#define EMU_SHAPE unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz

extern "C" void emu_copy_blocks(EMU_SHAPE, char* key_cache, char* value_cache, const int64_t* block_mapping,
                                int64_t block_bytes, int vectorized) {
    emu::launch({gx, gy, gz}, {bx, by, bz},
                [&] { copy_blocks(key_cache, value_cache, block_mapping, block_bytes, vectorized); });
}

#define EMU_CACHE_WRITE(SUFFIX, T, C)                                                                            \
    extern "C" void emu_cache_write_##SUFFIX(EMU_SHAPE, const T* key, const T* value, C* key_cache,              \
                                             C* value_cache, const int64_t* slot_mapping, const float* k_scale,  \
                                             const float* v_scale, int64_t key_stride, int64_t value_stride,     \
                                             int num_kv_heads, int head_dim, int block_size, int vectorized) {   \
        emu::launch({gx, gy, gz}, {bx, by, bz}, [&] {                                                           \
            cache_write_##SUFFIX(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, key_stride, \
                                 value_stride, num_kv_heads, head_dim, block_size, vectorized);                  \
        });                                                                                                      \
    }

#define EMU_PAGED_ATTENTION_G(SUFFIX, T, C, HEAD_DIM, MAX_G)                                                    \
    extern "C" void emu_paged_attention_##SUFFIX##_hd##HEAD_DIM##_g##MAX_G(                                      \
        EMU_SHAPE, T* out, const T* query, const C* key_cache, const C* value_cache, const int* block_tables,    \
        const int* seq_lens, const float* k_scale, const float* v_scale, float* tmp_out, float* tmp_max,        \
        float* tmp_sum, float scale, int num_kv_heads, int group, int block_size, int max_blocks,                \
        int tokens_per_split, int num_splits) {                                                                  \
        emu::launch({gx, gy, gz}, {bx, by, bz}, [&] {                                                           \
            paged_attention_##SUFFIX##_hd##HEAD_DIM##_g##MAX_G(out, query, key_cache, value_cache, block_tables, \
                                                               seq_lens, k_scale, v_scale, tmp_out, tmp_max,     \
                                                               tmp_sum, scale, num_kv_heads, group, block_size,  \
                                                               max_blocks, tokens_per_split, num_splits);        \
        });                                                                                                      \
    }

#define EMU_PAGED_ATTENTION_GROUPS(SUFFIX, T, C, HEAD_DIM)                                                       \
    EMU_PAGED_ATTENTION_G(SUFFIX, T, C, HEAD_DIM, 1)                                                             \
    EMU_PAGED_ATTENTION_G(SUFFIX, T, C, HEAD_DIM, 2)                                                             \
    EMU_PAGED_ATTENTION_G(SUFFIX, T, C, HEAD_DIM, 4)                                                             \
    EMU_PAGED_ATTENTION_G(SUFFIX, T, C, HEAD_DIM, 8)

// The fp8 caches' instantiations for a query type.
#define EMU_PAGED_ATTENTION_FP8(SUFFIX, T, HEAD_DIM)                                                             \
    EMU_PAGED_ATTENTION_GROUPS(SUFFIX##_e4m3, T, __nv_fp8_e4m3, HEAD_DIM)                                        \
    EMU_PAGED_ATTENTION_GROUPS(SUFFIX##_e5m2, T, __nv_fp8_e5m2, HEAD_DIM)

#define EMU_PAGED_ATTENTION(SUFFIX, T, HEAD_DIM)                                                                 \
    EMU_PAGED_ATTENTION_GROUPS(SUFFIX, T, T, HEAD_DIM)                                                           \
    extern "C" void emu_paged_attention_merge_##SUFFIX##_hd##HEAD_DIM(                                           \
        EMU_SHAPE, T* out, const float* tmp_out, const float* tmp_max, const float* tmp_sum,                     \
        const int* seq_lens, int num_q_heads, int num_splits, int tokens_per_split) {                            \
        emu::launch({gx, gy, gz}, {bx, by, bz}, [&] {                                                           \
            paged_attention_merge_##SUFFIX##_hd##HEAD_DIM(out, tmp_out, tmp_max, tmp_sum, seq_lens, num_q_heads, \
                                                          num_splits, tokens_per_split);                         \
        });                                                                                                      \
    }

#define EMU_PAGED_ATTENTION_TC_ONE(SUFFIX, T, C, HEAD_DIM)                                                      \
    extern "C" void emu_paged_attention_tc_##SUFFIX##_hd##HEAD_DIM(                                              \
        EMU_SHAPE, T* out, const T* query, const C* key_cache, const C* value_cache, const int* block_tables,    \
        const int* seq_lens, const float* k_scale, const float* v_scale, float* tmp_out, float* tmp_max,        \
        float* tmp_sum, float scale, int num_kv_heads, int group, int block_size, int max_blocks,                \
        int tokens_per_split, int num_splits) {                                                                  \
        emu::launch({gx, gy, gz}, {bx, by, bz}, [&] {                                                           \
            paged_attention_tc_##SUFFIX##_hd##HEAD_DIM(out, query, key_cache, value_cache, block_tables,         \
                                                       seq_lens, k_scale, v_scale, tmp_out, tmp_max, tmp_sum,    \
                                                       scale, num_kv_heads, group, block_size, max_blocks,       \
                                                       tokens_per_split, num_splits);                            \
        });                                                                                                      \
    }

#define EMU_PAGED_ATTENTION_TC(SUFFIX, T, HEAD_DIM) EMU_PAGED_ATTENTION_TC_ONE(SUFFIX, T, T, HEAD_DIM)
#define EMU_PAGED_ATTENTION_TC_FP8(SUFFIX, T, HEAD_DIM)                                                          \
    EMU_PAGED_ATTENTION_TC_ONE(SUFFIX##_e4m3, T, __nv_fp8_e4m3, HEAD_DIM)                                        \
    EMU_PAGED_ATTENTION_TC_ONE(SUFFIX##_e5m2, T, __nv_fp8_e5m2, HEAD_DIM)

#ifdef MINIPAGED_EMULATION_SUBSET
// One instantiation of each kernel (bf16, head_dim 128): a build in seconds, for the mutation tests.
EMU_CACHE_WRITE(bf16, __nv_bfloat16, __nv_bfloat16)
EMU_PAGED_ATTENTION(bf16, __nv_bfloat16, 128)
EMU_PAGED_ATTENTION_TC(bf16, __nv_bfloat16, 128)
#else
EMU_CACHE_WRITE(f32, float, float)
EMU_CACHE_WRITE(f16, __half, __half)
EMU_CACHE_WRITE(bf16, __nv_bfloat16, __nv_bfloat16)
EMU_CACHE_WRITE(f32_e4m3, float, __nv_fp8_e4m3)
EMU_CACHE_WRITE(f16_e4m3, __half, __nv_fp8_e4m3)
EMU_CACHE_WRITE(bf16_e4m3, __nv_bfloat16, __nv_fp8_e4m3)
EMU_CACHE_WRITE(f32_e5m2, float, __nv_fp8_e5m2)
EMU_CACHE_WRITE(f16_e5m2, __half, __nv_fp8_e5m2)
EMU_CACHE_WRITE(bf16_e5m2, __nv_bfloat16, __nv_fp8_e5m2)
EMU_PAGED_ATTENTION(f32, float, 64)
EMU_PAGED_ATTENTION(f32, float, 128)
EMU_PAGED_ATTENTION(f16, __half, 64)
EMU_PAGED_ATTENTION(f16, __half, 128)
EMU_PAGED_ATTENTION(bf16, __nv_bfloat16, 64)
EMU_PAGED_ATTENTION(bf16, __nv_bfloat16, 128)
EMU_PAGED_ATTENTION_TC(f16, __half, 64)
EMU_PAGED_ATTENTION_TC(f16, __half, 128)
EMU_PAGED_ATTENTION_TC(bf16, __nv_bfloat16, 64)
EMU_PAGED_ATTENTION_TC(bf16, __nv_bfloat16, 128)
EMU_PAGED_ATTENTION_FP8(f32, float, 64)
EMU_PAGED_ATTENTION_FP8(f32, float, 128)
EMU_PAGED_ATTENTION_FP8(f16, __half, 64)
EMU_PAGED_ATTENTION_FP8(f16, __half, 128)
EMU_PAGED_ATTENTION_FP8(bf16, __nv_bfloat16, 64)
EMU_PAGED_ATTENTION_FP8(bf16, __nv_bfloat16, 128)
EMU_PAGED_ATTENTION_TC_FP8(f16, __half, 64)
EMU_PAGED_ATTENTION_TC_FP8(f16, __half, 128)
EMU_PAGED_ATTENTION_TC_FP8(bf16, __nv_bfloat16, 64)
EMU_PAGED_ATTENTION_TC_FP8(bf16, __nv_bfloat16, 128)
#endif
