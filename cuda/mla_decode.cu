// Decode multi-head latent attention over the paged latent cache, in the absorbed form (minipaged_cli/dataplane/
// mla.py): the query is already in latent space, [q_nope W_UK ; q_pe], so attention is multi-query with one K row
// per token, the latent row [kv_c ; k_pe] (row_width = kv_lora_rank + qk_rope_head_dim), and V = kv_c, its first
// kv_lora_rank elements. The output stays in latent space (fp32); W_UV maps it to each head's V afterwards.
//
// One thread block per (sequence, tile of MLA_HEADS heads). It walks the sequence MLA_TOKENS tokens at a time:
// the tile's latent rows are read once into shared memory for all of the block's heads (the point of MLA: the
// cache holds one row per token, not one per head), then logits, an online-softmax update per head (running max
// m, sum l; the accumulators rescaled by exp(m_old - m_new)) and the accumulation of p * kv_c. Positions at or
// past seq_len are never read. Address math in int64.
#include "common.cuh"

constexpr int MLA_THREADS = 128;
constexpr int MLA_HEADS = 8;      // query heads per thread block
constexpr int MLA_TOKENS = 4;     // tokens per tile: q_s, rows_s and acc_s fill 44 of the 48 KiB of shared memory
constexpr int MLA_MAX_RANK = 512;  // kv_lora_rank (DeepSeek-V2/V3: 512)
constexpr int MLA_MAX_ROW = 576;   // kv_lora_rank + qk_rope_head_dim (512 + 64)

template <typename T>
__device__ void mla_decode(
    float* __restrict__ out,                // [batch, num_heads, kv_lora_rank]
    const float* __restrict__ query,        // [batch, num_heads, row_width]
    const T* __restrict__ latent_cache,     // [num_blocks, block_size, row_width]
    const int* __restrict__ block_tables,   // [batch, max_blocks]
    const int* __restrict__ seq_lens,       // [batch]
    float scale, int num_heads, int kv_lora_rank, int row_width, int block_size, int max_blocks) {
    __shared__ float q_s[MLA_HEADS][MLA_MAX_ROW];
    __shared__ float rows_s[MLA_TOKENS][MLA_MAX_ROW];
    // Element i = (head, latent dim) = divmod(i, kv_lora_rank) belongs to thread i % blockDim.x for the whole
    // kernel: only its owner reads and writes it, so it needs no barrier of its own.
    __shared__ float acc_s[MLA_HEADS * MLA_MAX_RANK];
    __shared__ float p_s[MLA_HEADS][MLA_TOKENS];  // logits, then probabilities
    __shared__ float m_s[MLA_HEADS];
    __shared__ float l_s[MLA_HEADS];
    __shared__ float correction_s[MLA_HEADS];

    const int64_t seq = blockIdx.y;
    const int first_head = blockIdx.x * MLA_HEADS;
    const int num_here = min(MLA_HEADS, num_heads - first_head);
    const int seq_len = seq_lens[seq];
    const int* table = block_tables + seq * max_blocks;

    for (int i = threadIdx.x; i < num_here * row_width; i += blockDim.x) {
        q_s[i / row_width][i % row_width] = query[(seq * num_heads + first_head) * row_width + i];
    }
    if (threadIdx.x < MLA_HEADS) {
        m_s[threadIdx.x] = -INFINITY;
        l_s[threadIdx.x] = 0.0f;
    }
    for (int i = threadIdx.x; i < num_here * kv_lora_rank; i += blockDim.x) acc_s[i] = 0.0f;
    __syncthreads();

    for (int first = 0; first < seq_len; first += MLA_TOKENS) {
        const int num_tokens = min(MLA_TOKENS, seq_len - first);
        for (int i = threadIdx.x; i < num_tokens * row_width; i += blockDim.x) {
            const int t = i / row_width, d = i % row_width, position = first + t;
            const int64_t slot = (int64_t)table[position / block_size] * block_size + position % block_size;
            rows_s[t][d] = to_float(latent_cache[slot * row_width + d]);
        }
        __syncthreads();
        for (int i = threadIdx.x; i < num_here * num_tokens; i += blockDim.x) {
            const int h = i / num_tokens, t = i % num_tokens;
            float dot = 0.0f;
            for (int d = 0; d < row_width; ++d) dot += q_s[h][d] * rows_s[t][d];
            p_s[h][t] = dot * scale;
        }
        __syncthreads();
        if (threadIdx.x < num_here) {
            const int h = threadIdx.x;
            float tile_max = -INFINITY;
            for (int t = 0; t < num_tokens; ++t) tile_max = fmaxf(tile_max, p_s[h][t]);
            const float new_max = fmaxf(m_s[h], tile_max);  // finite: the tile has a token
            float sum = 0.0f;
            for (int t = 0; t < num_tokens; ++t) {
                p_s[h][t] = expf(p_s[h][t] - new_max);
                sum += p_s[h][t];
            }
            correction_s[h] = expf(m_s[h] - new_max);  // 0 on the first tile (m = -inf), when acc is still 0
            l_s[h] = l_s[h] * correction_s[h] + sum;
            m_s[h] = new_max;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < num_here * kv_lora_rank; i += blockDim.x) {
            const int h = i / kv_lora_rank, c = i % kv_lora_rank;
            float sum = 0.0f;
            for (int t = 0; t < num_tokens; ++t) sum += p_s[h][t] * rows_s[t][c];
            acc_s[i] = acc_s[i] * correction_s[h] + sum;
        }
        __syncthreads();  // the next tile overwrites rows_s and p_s
    }
    for (int i = threadIdx.x; i < num_here * kv_lora_rank; i += blockDim.x) {
        const float l = l_s[i / kv_lora_rank];
        // l is 0 only for a sequence of length 0: its output is 0 (not 0/0)
        out[(seq * num_heads + first_head) * kv_lora_rank + i] = l > 0.0f ? acc_s[i] / l : 0.0f;
    }
}

#define MINIPAGED_MLA_DECODE(SUFFIX, T)                                                                          \
    extern "C" __global__ void __launch_bounds__(MLA_THREADS)                                                    \
        mla_decode_##SUFFIX(float* out, const float* query, const T* latent_cache, const int* block_tables,       \
                            const int* seq_lens, float scale, int num_heads, int kv_lora_rank, int row_width,    \
                            int block_size, int max_blocks) {                                                    \
        mla_decode<T>(out, query, latent_cache, block_tables, seq_lens, scale, num_heads, kv_lora_rank,         \
                      row_width, block_size, max_blocks);                                                        \
    }

MINIPAGED_MLA_DECODE(f32, float)
MINIPAGED_MLA_DECODE(f16, __half)
MINIPAGED_MLA_DECODE(bf16, __nv_bfloat16)
