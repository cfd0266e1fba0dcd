// Decode paged attention: one query token per sequence over its K/V, read through its block table.
//
// Grid (num_kv_heads, batch, num_splits), NUM_THREADS threads. A thread block owns one kv head of one sequence
// (of one split of its tokens) and ALL the query heads of that GQA group: every K/V byte is read once, not once
// per query head as in vLLM's v1/v2 kernels.
//
// Inside, a "token group" of LANES = HEAD_DIM / VEC lanes handles one token at a time, each lane 16 bytes
// (VEC elements) of the token's K and V row, so a group reads whole rows, coalesced; a warp holds 32 / LANES
// groups and the block NUM_THREADS / LANES of them, taking every (number of groups)-th token of the split. Each
// group keeps, in registers, the single-pass online softmax state of every query head of the GQA group: running
// max m, running sum l, and its lanes' VEC-wide slice of the unnormalised output acc. Per token:
//   logit = q . k (each lane's VEC products, summed across the group's lanes with shuffles),
//   m' = max(m, logit), l = l e^(m - m') + e^(logit - m'), acc = acc e^(m - m') + e^(logit - m') v.
// No array of every logit exists, so the context length is unbounded; positions >= seq_len are never loaded
// (stale cache memory may hold NaN: it is selected out, never multiplied by zero). At the end the groups merge
// their states through shared memory. With num_splits > 1 each split writes its unnormalised (acc, m, l) and
// paged_attention_merge combines them. The block table is read in chunks staged in shared memory. int64 addresses.
// An fp8 cache (C an fp8 type): a lane loads the same VEC elements, VEC bytes instead of 16, widens them exactly,
// and the kv head's scales are folded in: k_scale into the query's scale, v_scale into the accumulators.
#include "common.cuh"

#define NUM_THREADS 128
#define TABLE_CHUNK 128  // block-table entries staged in shared memory at a time

template <typename T>
struct Vec {
    static constexpr int SIZE = 16 / sizeof(T);  // elements of the query's type in one 16-byte load
};

// One load instruction of that many bytes.
template <int BYTES>
struct Load;
template <>
struct Load<16> {
    using type = uint4;
};
template <>
struct Load<8> {
    using type = uint2;
};
template <>
struct Load<4> {
    using type = uint32_t;
};

// N consecutive elements at p (aligned to their N * sizeof(C) bytes) as floats, in one load.
template <typename C, int N>
__device__ __forceinline__ void load_vec(const C* p, float (&out)[N]) {
    using Raw = typename Load<N * sizeof(C)>::type;
    union {
        Raw raw;
        C values[N];
    } chunk;
    chunk.raw = *reinterpret_cast<const Raw*>(p);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(chunk.values[i]);
}

template <int LANES>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
    for (int mask = LANES / 2; mask > 0; mask >>= 1) x += __shfl_xor_sync(0xffffffffu, x, mask, LANES);
    return x;
}

// MAX_G: query heads per kv head this instantiation holds (1, 2, 4 or 8; `group` <= MAX_G at run time). The
// online-softmax state lives in registers sized by it, so a small group leaves room for more blocks per SM.
template <typename T, typename C, int HEAD_DIM, int MAX_G>
__device__ void paged_attention(
    T* __restrict__ out,                    // [batch, num_q_heads, HEAD_DIM] (num_splits == 1)
    const T* __restrict__ query,            // [batch, num_q_heads, HEAD_DIM]
    const C* __restrict__ key_cache,        // [num_blocks, num_kv_heads, block_size, HEAD_DIM]
    const C* __restrict__ value_cache,      // [num_blocks, num_kv_heads, block_size, HEAD_DIM]
    const int* __restrict__ block_tables,   // [batch, max_blocks], -1 padded
    const int* __restrict__ seq_lens,       // [batch]
    const float* __restrict__ k_scale,      // [num_kv_heads] (fp8 caches; null otherwise)
    const float* __restrict__ v_scale,      // [num_kv_heads] (fp8 caches; null otherwise)
    float* __restrict__ tmp_out,            // [batch, num_q_heads, num_splits, HEAD_DIM] (num_splits > 1)
    float* __restrict__ tmp_max,            // [batch, num_q_heads, num_splits]
    float* __restrict__ tmp_sum,            // [batch, num_q_heads, num_splits]
    float scale, int num_kv_heads, int group, int block_size, int max_blocks, int tokens_per_split,
    int num_splits) {
    constexpr int VEC = Vec<T>::SIZE;
    constexpr int LANES = HEAD_DIM / VEC;  // lanes per token group
    constexpr int GROUPS = NUM_THREADS / LANES;  // token groups in the block
    static_assert(HEAD_DIM % VEC == 0 && LANES <= 32 && 32 % LANES == 0, "head_dim must split into lanes");
    __shared__ int table_s[TABLE_CHUNK];
    __shared__ float m_s[GROUPS][MAX_G];
    __shared__ float l_s[GROUPS][MAX_G];
    __shared__ float acc_s[GROUPS][MAX_G][HEAD_DIM];

    const int kv_head = blockIdx.x;
    const int64_t seq = blockIdx.y;
    const int split = blockIdx.z;
    const int tid = threadIdx.x;
    const int token_group = tid / LANES;
    const int lane = tid % LANES;  // which VEC-wide slice of head_dim this thread holds
    const int num_q_heads = num_kv_heads * group;
    const int seq_len = seq_lens[seq];
    const int start = split * tokens_per_split;
    const int end = min(seq_len, start + tokens_per_split);
    // A split past the sequence's end has nothing to do: the merge reads only the splits that hold tokens (a
    // sequence of length 0 without splits still writes its zeros below).
    if (num_splits > 1 && start >= seq_len) return;
    const float q_scale = scale * kv_scale<T, C>(k_scale, kv_head);

    float q[MAX_G][VEC];
    float m[MAX_G], l[MAX_G], acc[MAX_G][VEC];
#pragma unroll
    for (int g = 0; g < MAX_G; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            acc[g][v] = 0.0f;
            q[g][v] = 0.0f;
        }
        if (g < group) {
            load_vec(query + (seq * num_q_heads + (int64_t)kv_head * group + g) * HEAD_DIM + lane * VEC, q[g]);
#pragma unroll
            for (int v = 0; v < VEC; ++v) q[g][v] *= q_scale;
        }
    }

    // The split's tokens, in chunks whose block ids are staged in shared memory first.
    const int first_block = start / block_size;
    for (int chunk_block = first_block; chunk_block * block_size < end; chunk_block += TABLE_CHUNK) {
        __syncthreads();  // the previous chunk's table is no longer read
        for (int i = tid; i < TABLE_CHUNK && (chunk_block + i) * block_size < end; i += NUM_THREADS)
            table_s[i] = block_tables[seq * max_blocks + chunk_block + i];
        __syncthreads();
        const int chunk_start = max(start, chunk_block * block_size);
        const int chunk_end = min(end, (chunk_block + TABLE_CHUNK) * block_size);
        // Every lane runs the same rounds, so that the shuffles inside see the whole warp; a group past the
        // chunk's end loads nothing and changes nothing.
        for (int round = chunk_start; round < chunk_end; round += GROUPS) {
            const int t = round + token_group;
            const bool valid = t < chunk_end;
            float k[VEC], v[VEC];
            if (valid) {
                const int64_t block = table_s[t / block_size - chunk_block];
                const int64_t row = ((block * num_kv_heads + kv_head) * block_size + t % block_size) * HEAD_DIM;
                load_vec(key_cache + row + lane * VEC, k);
                load_vec(value_cache + row + lane * VEC, v);
            }
#pragma unroll
            for (int g = 0; g < MAX_G; ++g) {
                if (g >= group) break;
                float partial = 0.0f;
                if (valid) {
#pragma unroll
                    for (int e = 0; e < VEC; ++e) partial += q[g][e] * k[e];
                }
                const float logit = group_sum<LANES>(partial);
                if (valid) {
                    const float new_max = fmaxf(m[g], logit);
                    const float correction = expf(m[g] - new_max);  // 0 for the group's first token (m = -inf)
                    const float p = expf(logit - new_max);
                    l[g] = l[g] * correction + p;
#pragma unroll
                    for (int e = 0; e < VEC; ++e) acc[g][e] = acc[g][e] * correction + p * v[e];
                    m[g] = new_max;
                }
            }
        }
    }

    // Merge the token groups' states: each writes its own, then threads combine per (query head, dim).
    const float out_scale = kv_scale<T, C>(v_scale, kv_head);
#pragma unroll
    for (int g = 0; g < MAX_G; ++g) {  // constant indices keep q, m, l, acc in registers
        if (g >= group) break;
        if (lane == 0) {
            m_s[token_group][g] = m[g];
            l_s[token_group][g] = l[g];
        }
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc_s[token_group][g][lane * VEC + e] = acc[g][e] * out_scale;
    }
    __syncthreads();
    write_attention_output<T, HEAD_DIM, false>(out, tmp_out, tmp_max, tmp_sum, &m_s[0][0], &l_s[0][0],
                                               &acc_s[0][0][0], GROUPS, MAX_G, group, seq, kv_head, num_q_heads,
                                               split, num_splits);
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
    out[(seq * num_q_heads + blockIdx.x) * HEAD_DIM + d] = from_float<T>(total > 0.0f ? value / total : 0.0f);
}

#define MINIPAGED_PAGED_ATTENTION_G(SUFFIX, T, C, HEAD_DIM, MAX_G)                                               \
    extern "C" __global__ void paged_attention_##SUFFIX##_hd##HEAD_DIM##_g##MAX_G(                               \
        T* out, const T* query, const C* key_cache, const C* value_cache, const int* block_tables,               \
        const int* seq_lens, const float* k_scale, const float* v_scale, float* tmp_out, float* tmp_max,        \
        float* tmp_sum, float scale, int num_kv_heads, int group, int block_size, int max_blocks,                \
        int tokens_per_split, int num_splits) {                                                                  \
        paged_attention<T, C, HEAD_DIM, MAX_G>(out, query, key_cache, value_cache, block_tables, seq_lens,      \
                                               k_scale, v_scale, tmp_out, tmp_max, tmp_sum, scale, num_kv_heads, \
                                               group, block_size, max_blocks, tokens_per_split, num_splits);     \
    }

// Every GQA-group instantiation of one (query type, cache type, head_dim).
#define MINIPAGED_PAGED_ATTENTION_GROUPS(SUFFIX, T, C, HEAD_DIM)                                                  \
    MINIPAGED_PAGED_ATTENTION_G(SUFFIX, T, C, HEAD_DIM, 1)                                                       \
    MINIPAGED_PAGED_ATTENTION_G(SUFFIX, T, C, HEAD_DIM, 2)                                                       \
    MINIPAGED_PAGED_ATTENTION_G(SUFFIX, T, C, HEAD_DIM, 4)                                                       \
    MINIPAGED_PAGED_ATTENTION_G(SUFFIX, T, C, HEAD_DIM, 8)

// The query's own cache type, both fp8 caches, and the merge (which reads only fp32 scratch).
#define MINIPAGED_PAGED_ATTENTION(SUFFIX, T, HEAD_DIM)                                                           \
    MINIPAGED_PAGED_ATTENTION_GROUPS(SUFFIX, T, T, HEAD_DIM)                                                     \
    MINIPAGED_PAGED_ATTENTION_GROUPS(SUFFIX##_e4m3, T, __nv_fp8_e4m3, HEAD_DIM)                                  \
    MINIPAGED_PAGED_ATTENTION_GROUPS(SUFFIX##_e5m2, T, __nv_fp8_e5m2, HEAD_DIM)                                  \
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
