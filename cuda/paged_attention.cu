// Decode paged attention: one query token per sequence over its K/V, read through its block table.
//
// Grid (num_kv_heads, batch, num_splits), NUM_THREADS threads. A thread block owns one kv head of one sequence
// (of one split of its tokens) and ALL the query heads of that GQA group: every K/V byte is read once, not once
// per query head as in vLLM's v1/v2 kernels. It walks its tokens a tile of TILE at a time:
//   1. the tile's block ids (the block-table slice) into shared memory;
//   2. the tile's K and V rows into shared memory, converted to fp32 (coalesced; only positions < seq_len);
//   3. logits q . k for every (query head, token) of the tile;
//   4. single-pass online softmax, a warp per query head: tile max, m_new = max(m, tile max),
//      p = exp(logit - m_new), l = l * exp(m - m_new) + sum p;
//   5. each thread's slice of the accumulators: acc = acc * exp(m - m_new) + sum_t p_t v_t.
// No array of every logit exists, so the context length is unbounded. Positions >= seq_len are never loaded:
// they are selected out, never multiplied by zero (stale cache memory may hold NaN). With num_splits > 1 each
// split writes its unnormalised (acc, m, l) and paged_attention_merge combines them. Address math in int64.
#include "common.cuh"

#define NUM_THREADS 128
#define NUM_WARPS (NUM_THREADS / 32)
#define TILE 32  // tokens per tile: one per lane in the softmax step
#define MAX_GROUP 8  // query heads per kv head

__device__ __forceinline__ float warp_max(float x) {
    for (int mask = 16; mask > 0; mask >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, mask, 32));
    return x;
}

__device__ __forceinline__ float warp_sum(float x) {
    for (int mask = 16; mask > 0; mask >>= 1) x += __shfl_xor_sync(0xffffffffu, x, mask, 32);
    return x;
}

template <typename T, int HEAD_DIM>
__device__ void paged_attention(
    T* __restrict__ out,                    // [batch, num_q_heads, HEAD_DIM] (num_splits == 1)
    const T* __restrict__ query,            // [batch, num_q_heads, HEAD_DIM]
    const T* __restrict__ key_cache,        // [num_blocks, num_kv_heads, block_size, HEAD_DIM]
    const T* __restrict__ value_cache,      // [num_blocks, num_kv_heads, block_size, HEAD_DIM]
    const int* __restrict__ block_tables,   // [batch, max_blocks], -1 padded
    const int* __restrict__ seq_lens,       // [batch]
    float* __restrict__ tmp_out,            // [batch, num_q_heads, num_splits, HEAD_DIM] (num_splits > 1)
    float* __restrict__ tmp_max,            // [batch, num_q_heads, num_splits]
    float* __restrict__ tmp_sum,            // [batch, num_q_heads, num_splits]
    float scale, int num_kv_heads, int group, int block_size, int max_blocks, int tokens_per_split,
    int num_splits) {
    constexpr int OUTPUTS = MAX_GROUP * HEAD_DIM / NUM_THREADS;  // accumulator slots per thread
    __shared__ float q_s[MAX_GROUP][HEAD_DIM];
    __shared__ float k_s[TILE][HEAD_DIM + 1];  // +1: lanes reading one d of 32 tokens hit 32 different banks
    __shared__ float v_s[TILE][HEAD_DIM];
    __shared__ float p_s[MAX_GROUP][TILE];
    __shared__ float m_s[MAX_GROUP];
    __shared__ float l_s[MAX_GROUP];
    __shared__ float correction_s[MAX_GROUP];
    __shared__ int blocks_s[TILE];

    const int kv_head = blockIdx.x;
    const int64_t seq = blockIdx.y;
    const int split = blockIdx.z;
    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int num_q_heads = num_kv_heads * group;
    const int seq_len = seq_lens[seq];
    const int start = split * tokens_per_split;
    const int end = min(seq_len, start + tokens_per_split);

    for (int i = tid; i < group * HEAD_DIM; i += NUM_THREADS) {
        const int64_t q_head = (int64_t)kv_head * group + i / HEAD_DIM;
        q_s[i / HEAD_DIM][i % HEAD_DIM] = to_float(query[(seq * num_q_heads + q_head) * HEAD_DIM + i % HEAD_DIM]) * scale;
    }
    if (tid < group) {
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.0f;
    }
    float acc[OUTPUTS];
    for (int k = 0; k < OUTPUTS; ++k) acc[k] = 0.0f;
    __syncthreads();

    for (int tile_start = start; tile_start < end; tile_start += TILE) {
        const int n = min(TILE, end - tile_start);
        if (tid < n) blocks_s[tid] = block_tables[seq * max_blocks + (tile_start + tid) / block_size];
        __syncthreads();
        for (int i = tid; i < n * HEAD_DIM; i += NUM_THREADS) {
            const int t = i / HEAD_DIM;
            const int64_t row = ((int64_t)blocks_s[t] * num_kv_heads + kv_head) * block_size + (tile_start + t) % block_size;
            k_s[t][i % HEAD_DIM] = to_float(key_cache[row * HEAD_DIM + i % HEAD_DIM]);
            v_s[t][i % HEAD_DIM] = to_float(value_cache[row * HEAD_DIM + i % HEAD_DIM]);
        }
        __syncthreads();
        for (int i = tid; i < group * TILE; i += NUM_THREADS) {
            const int g = i / TILE;
            const int t = i % TILE;
            float dot = -INFINITY;
            if (t < n) {
                dot = 0.0f;
                for (int d = 0; d < HEAD_DIM; ++d) dot += q_s[g][d] * k_s[t][d];
            }
            p_s[g][t] = dot;
        }
        __syncthreads();
        for (int g = warp; g < group; g += NUM_WARPS) {
            const float logit = p_s[g][lane];
            const float new_max = fmaxf(m_s[g], warp_max(logit));  // finite: the tile has a token
            const float p = lane < n ? expf(logit - new_max) : 0.0f;
            const float tile_sum = warp_sum(p);
            p_s[g][lane] = p;
            if (lane == 0) {
                const float correction = expf(m_s[g] - new_max);  // 0 on the first tile (m = -inf)
                correction_s[g] = correction;
                l_s[g] = l_s[g] * correction + tile_sum;
                m_s[g] = new_max;
            }
        }
        __syncthreads();
        for (int k = 0; k < OUTPUTS; ++k) {
            const int o = tid + k * NUM_THREADS;
            const int g = o / HEAD_DIM;
            if (g >= group) break;
            float a = acc[k] * correction_s[g];
            for (int t = 0; t < n; ++t) a += p_s[g][t] * v_s[t][o % HEAD_DIM];
            acc[k] = a;
        }
        __syncthreads();  // the next tile overwrites the shared tiles
    }

    for (int k = 0; k < OUTPUTS; ++k) {
        const int o = tid + k * NUM_THREADS;
        const int g = o / HEAD_DIM;
        if (g >= group) break;
        const int64_t q_head = (int64_t)kv_head * group + g;
        const int d = o % HEAD_DIM;
        if (num_splits == 1) {
            out[(seq * num_q_heads + q_head) * HEAD_DIM + d] = from_float<T>(acc[k] / l_s[g]);
        } else {
            const int64_t part = (seq * num_q_heads + q_head) * num_splits + split;
            tmp_out[part * HEAD_DIM + d] = acc[k];
            if (d == 0) {
                tmp_max[part] = m_s[g];  // -inf and 0 for a split past the sequence's end
                tmp_sum[part] = l_s[g];
            }
        }
    }
}

// Combine the splits of each (sequence, query head): out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
// Grid (num_q_heads, batch), HEAD_DIM threads.
template <typename T, int HEAD_DIM>
__device__ void paged_attention_merge(
    T* __restrict__ out,                  // [batch, num_q_heads, HEAD_DIM]
    const float* __restrict__ tmp_out,    // [batch, num_q_heads, num_splits, HEAD_DIM]
    const float* __restrict__ tmp_max,    // [batch, num_q_heads, num_splits]
    const float* __restrict__ tmp_sum,    // [batch, num_q_heads, num_splits]
    const int* __restrict__ seq_lens,     // [batch]
    int num_q_heads, int num_splits, int tokens_per_split) {
    const int64_t seq = blockIdx.y;
    const int64_t head = (seq * num_q_heads + blockIdx.x) * num_splits;
    const int d = threadIdx.x;
    const int used = min(num_splits, (seq_lens[seq] + tokens_per_split - 1) / tokens_per_split);
    float global_max = -INFINITY;
    for (int s = 0; s < used; ++s) global_max = fmaxf(global_max, tmp_max[head + s]);
    float total = 0.0f;
    float value = 0.0f;
    for (int s = 0; s < used; ++s) {
        const float weight = expf(tmp_max[head + s] - global_max);
        total += weight * tmp_sum[head + s];
        value += weight * tmp_out[(head + s) * HEAD_DIM + d];
    }
    out[(seq * num_q_heads + blockIdx.x) * HEAD_DIM + d] = from_float<T>(value / total);
}

#define MINIPAGED_PAGED_ATTENTION(SUFFIX, T, HEAD_DIM)                                                           \
    extern "C" __global__ void paged_attention_##SUFFIX##_hd##HEAD_DIM(                                          \
        T* out, const T* query, const T* key_cache, const T* value_cache, const int* block_tables,               \
        const int* seq_lens, float* tmp_out, float* tmp_max, float* tmp_sum, float scale, int num_kv_heads,     \
        int group, int block_size, int max_blocks, int tokens_per_split, int num_splits) {                       \
        paged_attention<T, HEAD_DIM>(out, query, key_cache, value_cache, block_tables, seq_lens, tmp_out,       \
                                     tmp_max, tmp_sum, scale, num_kv_heads, group, block_size, max_blocks,      \
                                     tokens_per_split, num_splits);                                             \
    }                                                                                                            \
    extern "C" __global__ void paged_attention_merge_##SUFFIX##_hd##HEAD_DIM(                                    \
        T* out, const float* tmp_out, const float* tmp_max, const float* tmp_sum, const int* seq_lens,          \
        int num_q_heads, int num_splits, int tokens_per_split) {                                                 \
        paged_attention_merge<T, HEAD_DIM>(out, tmp_out, tmp_max, tmp_sum, seq_lens, num_q_heads, num_splits,   \
                                           tokens_per_split);                                                    \
    }

MINIPAGED_PAGED_ATTENTION(f32, float, 64)
MINIPAGED_PAGED_ATTENTION(f32, float, 128)
MINIPAGED_PAGED_ATTENTION(f16, __half, 64)
MINIPAGED_PAGED_ATTENTION(f16, __half, 128)
MINIPAGED_PAGED_ATTENTION(bf16, __nv_bfloat16, 64)
MINIPAGED_PAGED_ATTENTION(bf16, __nv_bfloat16, 128)
