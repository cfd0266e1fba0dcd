// Decode paged attention on tensor cores (fp16 / bf16): the same result as paged_attention.cu, which explains the
// algorithm; this one is built to keep the HBM busy with few instructions.
//
// Grid (num_kv_heads, batch, num_splits), 4 warps. A thread block owns one kv head of one sequence (one split of
// its tokens) and all the GQA group's query heads (at most 8). The split's tokens go in tiles of 16: tile i to
// warp i % 4. Per tile a warp runs two products on tensor cores (mma.sync m16n8k16, fp32 accumulation):
//
//   S = Q K^T   M = 16 rows (the group's query heads, zero rows past the group), N = the tile's 16 tokens in two
//               halves of 8, K = head_dim. A lane loads whole 16-byte chunks of its token's K row straight into
//               the B fragment: the dot product does not care in which order the dimensions are summed, so the
//               query's A fragment takes the same permutation of head_dim (the chunk's words 0-1 feed one k-step,
//               words 2-3 the next). No shared memory, no conversion for K.
//   O += P V    P (the tile's probabilities) is S's accumulator fragment reused as the A fragment, exactly;
//               V comes through shared memory, copied asynchronously (cp.async, zero-filled past the end) one tile
//               ahead and read transposed by ldmatrix.trans; its rows are XOR-swizzled by 16-byte chunk so that
//               the eight rows one ldmatrix reads sit in eight different bank groups.
//
// Online softmax in base 2 (scale * log2 e applied to S), one max per tile per head (two shuffles across the
// four lanes that hold a row), one rescale of the accumulators per tile. The next tile's K is loaded into
// registers and its V copied into shared memory before the current tile is computed: every warp keeps 8 KB of
// K/V in flight. At the end the warps merge through shared memory; with num_splits > 1 each split writes its
// unnormalised (acc, m, l), m in natural-log units, for paged_attention.cu's merge kernel.
//
// An fp8 cache (C an fp8 type): every fp8 value is exactly an fp16 and a bf16, so K and V are widened to T and
// the products stay exact; k_scale goes into S's scale and v_scale into the output. A K chunk is an 8-byte load
// widened into the same 16-byte B fragment; a V chunk is loaded into registers, widened and stored into the same
// swizzled v_s (cp.async copies bytes and cannot widen), so V's prefetch is synchronous there.
#include "common.cuh"

#define TC_WARPS 4
#define TC_TILE 16  // tokens per tile: the N of S and the K of P V

#ifndef MINIPAGED_EMULATION
// The warp-level instructions, as PTX; cuda/emulation/cuda_emu.h defines the same functions on the CPU.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}
// 16 bytes global -> shared, asynchronously; zeros when !valid (nothing is read then).
__device__ __forceinline__ void cp_async_16(void* shared, const void* global, bool valid) {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
#endif

// Eight consecutive cache elements as eight T (16 bytes, the first in the low half of x): one 16-byte load when
// the cache holds T, an 8-byte load widened (exactly) when it holds fp8.
template <typename T, typename C>
__device__ __forceinline__ uint4 load_chunk(const C* p) {
    if constexpr (!QUANTIZED<T, C>) {
        return *reinterpret_cast<const uint4*>(p);
    } else {
        union {
            uint2 raw;
            C values[8];
        } in;
        union {
            uint4 raw;
            T values[8];
        } widened;
        in.raw = *reinterpret_cast<const uint2*>(p);
#pragma unroll
        for (int i = 0; i < 8; ++i) widened.values[i] = from_float<T>(to_float(in.values[i]));
        return widened.raw;
    }
}

// Two storage-type values as the 32 bits an mma fragment register holds (x in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float x, float y) {
    union {
        T values[2];
        uint32_t bits;
    } pair;
    pair.values[0] = from_float<T>(x);
    pair.values[1] = from_float<T>(y);
    return pair.bits;
}

template <typename T, typename C, int HEAD_DIM>
__device__ void paged_attention_tc(
    T* __restrict__ out,                    // [batch, num_q_heads, HEAD_DIM] (num_splits == 1)
    const T* __restrict__ query,            // [batch, num_q_heads, HEAD_DIM], 16-byte aligned
    const C* __restrict__ key_cache,        // [num_blocks, num_kv_heads, block_size, HEAD_DIM], 16-byte aligned
    const C* __restrict__ value_cache,      // [num_blocks, num_kv_heads, block_size, HEAD_DIM], 16-byte aligned
    const int* __restrict__ block_tables,   // [batch, max_blocks], -1 padded
    const int* __restrict__ seq_lens,       // [batch]
    const float* __restrict__ k_scale,      // [num_kv_heads] (fp8 caches; null otherwise)
    const float* __restrict__ v_scale,      // [num_kv_heads] (fp8 caches; null otherwise)
    float* __restrict__ tmp_out,            // [batch, num_q_heads, num_splits, HEAD_DIM] (num_splits > 1)
    float* __restrict__ tmp_max,            // [batch, num_q_heads, num_splits], natural-log units
    float* __restrict__ tmp_sum,            // [batch, num_q_heads, num_splits]
    float scale, int num_kv_heads, int group, int block_size, int max_blocks, int tokens_per_split,
    int num_splits) {
    constexpr int CHUNKS = HEAD_DIM / 8;      // 16-byte chunks in a K or V row
    constexpr int K_STEPS = HEAD_DIM / 16;    // k-steps of S = Q K^T
    constexpr int N_TILES = HEAD_DIM / 8;     // n-tiles of O = P V
    constexpr int ROWS_PER_PASS = 32 / CHUNKS;  // V rows one cp.async instruction of the warp covers
    constexpr float LOG2E = 1.4426950408889634f;
    static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "head_dim 64 or 128");
    // V tiles, two per warp, swizzled; reused at the end for the warps' merge.
    __shared__ __align__(16) T v_s[TC_WARPS][2][TC_TILE * HEAD_DIM];
    __shared__ int64_t row_s[TC_WARPS][2][TC_TILE];  // element offset of each token's row in the caches
    __shared__ float m_s[TC_WARPS][8], l_s[TC_WARPS][8];

    const int kv_head = blockIdx.x;
    const int64_t seq = blockIdx.y;
    const int split = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;  // the fragment's row (a query head) and column pair
    const int num_q_heads = num_kv_heads * group;
    const int seq_len = seq_lens[seq];
    const int start = split * tokens_per_split;
    const int end = min(seq_len, start + tokens_per_split);
    // A split past the sequence's end has nothing to do: the merge reads only the splits that hold tokens (a
    // sequence of length 0 without splits still writes its zeros below).
    if (num_splits > 1 && start >= seq_len) return;
    const int num_tiles = end > start ? (end - start + TC_TILE - 1) / TC_TILE : 0;
    const float scale_log2 = scale * kv_scale<T, C>(k_scale, kv_head) * LOG2E;
    const int* table = block_tables + seq * max_blocks;

    // Q as A fragments, head_dim permuted as K's chunks are: k-step s reads chunk (s / 2) * 4 + t, words
    // 2 (s % 2) and 2 (s % 2) + 1. Rows g + 8 (a[1], a[3]) are padding: zero.
    uint32_t qa[K_STEPS][2];
    {
        uint4 chunk[K_STEPS / 2];
#pragma unroll
        for (int c = 0; c < K_STEPS / 2; ++c) {
            chunk[c] = make_uint4(0u, 0u, 0u, 0u);
            if (g < group)
                chunk[c] = *reinterpret_cast<const uint4*>(
                    query + (seq * num_q_heads + (int64_t)kv_head * group + g) * HEAD_DIM + (c * 4 + t) * 8);
        }
#pragma unroll
        for (int s = 0; s < K_STEPS; ++s) {
            qa[s][0] = s % 2 ? chunk[s / 2].z : chunk[s / 2].x;
            qa[s][1] = s % 2 ? chunk[s / 2].w : chunk[s / 2].y;
        }
    }

    float acc[N_TILES][4];
#pragma unroll
    for (int j = 0; j < N_TILES; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    float m = -INFINITY, l = 0.0f;  // row g's running max (base 2) and this lane's part of its sum

    // Stage tile i (the warp's n-th): its rows' offsets, its K chunks into registers, its V into v_s[][n % 2].
    uint4 k_next[2][K_STEPS / 2];
    auto stage = [&](int i, int buffer) {
        const int first = start + i * TC_TILE;
        if (lane < TC_TILE) {
            const int token = min(first + lane, end - 1);  // past the end: a row that exists, never used
            const int64_t block = table[token / block_size];
            row_s[warp][buffer][lane] = ((block * num_kv_heads + kv_head) * block_size + token % block_size) * HEAD_DIM;
        }
        __syncwarp();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t row = row_s[warp][buffer][h * 8 + g];
            const bool valid = first + h * 8 + g < end;
#pragma unroll
            for (int c = 0; c < K_STEPS / 2; ++c)
                k_next[h][c] = valid ? load_chunk<T>(key_cache + row + (c * 4 + t) * 8) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int pass = 0; pass < TC_TILE / ROWS_PER_PASS; ++pass) {
            const int r = pass * ROWS_PER_PASS + lane / CHUNKS, c = lane % CHUNKS;
            T* dst = &v_s[warp][buffer][r * HEAD_DIM + ((c ^ (r & 7)) * 8)];
            if constexpr (QUANTIZED<T, C>) {
                *reinterpret_cast<uint4*>(dst) = first + r < end ? load_chunk<T>(value_cache + row_s[warp][buffer][r] + c * 8)
                                                                 : make_uint4(0u, 0u, 0u, 0u);
            } else {
                cp_async_16(dst, value_cache + row_s[warp][buffer][r] + c * 8, first + r < end);
            }
        }
        cp_async_commit();
    };

    int n = 0;
    if (warp < num_tiles) stage(warp, 0);
    for (int i = warp; i < num_tiles; i += TC_WARPS, ++n) {
        const int buffer = n % 2;
        uint4 k_cur[2][K_STEPS / 2];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int c = 0; c < K_STEPS / 2; ++c) k_cur[h][c] = k_next[h][c];
        const bool more = i + TC_WARPS < num_tiles;
        if (more) stage(i + TC_WARPS, buffer ^ 1);  // in flight while this tile computes

        // S = Q K^T: s[h] holds row g, tokens h * 8 + 2t and h * 8 + 2t + 1 of the tile.
        float s[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            s[h][0] = s[h][1] = s[h][2] = s[h][3] = 0.0f;
#pragma unroll
            for (int k = 0; k < K_STEPS; ++k) {
                const uint4& chunk = k_cur[h][k / 2];
                const uint32_t a[4] = {qa[k][0], 0u, qa[k][1], 0u};
                mma_16816<T>(s[h], a, k % 2 ? chunk.z : chunk.x, k % 2 ? chunk.w : chunk.y);
            }
        }
        const int first = start + i * TC_TILE;
        float tile_max = -INFINITY;
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const bool valid = first + h * 8 + 2 * t + e < end;
                s[h][e] = valid ? s[h][e] * scale_log2 : -INFINITY;  // select: stale K may hold NaN
                tile_max = fmaxf(tile_max, s[h][e]);
            }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(m, tile_max);  // finite: every tile holds at least one valid token
        const float correction = exp2f(m - new_max);  // 0 on the first tile (m = -inf)
        m = new_max;
        float p[2][2];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e) p[h][e] = exp2f(s[h][e] - new_max);  // 0 past the end
        l = l * correction + p[0][0] + p[0][1] + p[1][0] + p[1][1];
#pragma unroll
        for (int j = 0; j < N_TILES; ++j) {
            acc[j][0] *= correction;
            acc[j][1] *= correction;
        }

        // O += P V: P's A fragment is S's layout (tokens 2t, 2t + 1 and 8 + 2t, 8 + 2t + 1 of row g).
        const uint32_t pa[4] = {pack2<T>(p[0][0], p[0][1]), 0u, pack2<T>(p[1][0], p[1][1]), 0u};
        if (more)
            cp_async_wait<1>();  // this tile's V has landed; the next tile's may still be in flight
        else
            cp_async_wait<0>();
        __syncwarp();
#pragma unroll
        for (int j = 0; j < N_TILES; j += 2) {
            // Lanes 0-7: rows 0-7 at columns 8j; 8-15: rows 8-15 at 8j; 16-23: rows 0-7 at 8j + 8; 24-31: 8-15.
            const int r = (lane % 16), c = j + lane / 16;
            uint32_t b[4];
            ldmatrix_x4_trans(b, &v_s[warp][buffer][r * HEAD_DIM + ((c ^ (r & 7)) * 8)]);
            mma_16816<T>(acc[j], pa, b[0], b[1]);
            mma_16816<T>(acc[j + 1], pa, b[2], b[3]);
        }
        __syncwarp();  // every lane has read this buffer before the next stage overwrites it
    }

    // Merge the warps: row g's max and sum (the four lanes of a row hold parts of l), then acc through shared
    // memory (v_s, no longer streaming).
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (t == 0) {
        m_s[warp][g] = m;
        l_s[warp][g] = l;
    }
    __syncthreads();
    float* acc_s = reinterpret_cast<float*>(&v_s[0][0][0]);  // [TC_WARPS][8][HEAD_DIM] floats fit in v_s
    const float out_scale = kv_scale<T, C>(v_scale, kv_head);
#pragma unroll
    for (int j = 0; j < N_TILES; ++j) {
        acc_s[(warp * 8 + g) * HEAD_DIM + j * 8 + 2 * t] = acc[j][0] * out_scale;
        acc_s[(warp * 8 + g) * HEAD_DIM + j * 8 + 2 * t + 1] = acc[j][1] * out_scale;
    }
    __syncthreads();
    write_attention_output<T, HEAD_DIM, true>(out, tmp_out, tmp_max, tmp_sum, &m_s[0][0], &l_s[0][0], acc_s,
                                              TC_WARPS, 8, group, seq, kv_head, num_q_heads, split, num_splits);
}

#define MINIPAGED_PAGED_ATTENTION_TC(SUFFIX, T, C, HEAD_DIM)                                                     \
    extern "C" __global__ void __launch_bounds__(32 * TC_WARPS) paged_attention_tc_##SUFFIX##_hd##HEAD_DIM(      \
        T* out, const T* query, const C* key_cache, const C* value_cache, const int* block_tables,               \
        const int* seq_lens, const float* k_scale, const float* v_scale, float* tmp_out, float* tmp_max,        \
        float* tmp_sum, float scale, int num_kv_heads, int group, int block_size, int max_blocks,                \
        int tokens_per_split, int num_splits) {                                                                  \
        paged_attention_tc<T, C, HEAD_DIM>(out, query, key_cache, value_cache, block_tables, seq_lens, k_scale,  \
                                           v_scale, tmp_out, tmp_max, tmp_sum, scale, num_kv_heads, group,       \
                                           block_size, max_blocks, tokens_per_split, num_splits);                \
    }

// The query's own cache type and both fp8 caches.
#define MINIPAGED_PAGED_ATTENTION_TC_CACHES(SUFFIX, T, HEAD_DIM)                                                 \
    MINIPAGED_PAGED_ATTENTION_TC(SUFFIX, T, T, HEAD_DIM)                                                         \
    MINIPAGED_PAGED_ATTENTION_TC(SUFFIX##_e4m3, T, __nv_fp8_e4m3, HEAD_DIM)                                      \
    MINIPAGED_PAGED_ATTENTION_TC(SUFFIX##_e5m2, T, __nv_fp8_e5m2, HEAD_DIM)

MINIPAGED_PAGED_ATTENTION_TC_CACHES(f16, __half, 64)
MINIPAGED_PAGED_ATTENTION_TC_CACHES(f16, __half, 128)
MINIPAGED_PAGED_ATTENTION_TC_CACHES(bf16, __nv_bfloat16, 64)
MINIPAGED_PAGED_ATTENTION_TC_CACHES(bf16, __nv_bfloat16, 128)
