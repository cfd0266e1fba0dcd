"""Multi-head latent attention over the paged latent cache (dataplane/mla.py) against a dense MLA written naively
(per-head K and V materialised from the latent, ordinary softmax attention, in float64) and against Hugging Face's
DeepseekV3Attention; and the bytes a decode step reads per token against ModelSpec's.

Tolerance (fp32). Both forms compute the same exact function of the same fp32 inputs and differ only in rounding:
a logit is a nested sum of at most n = kv_lora_rank + qk_nope_head_dim + qk_rope_head_dim rounded products, so it
is off by at most gamma(n) = n u / (1 - n u) (u = 2^-24) times the sum of its terms' magnitudes (Higham, Accuracy
and Stability of Numerical Algorithms, 3.1); logits each off by <= E move every probability by a factor within
exp(+-2E), which moves the output by <= expm1(2E) max|v|; the softmax's own exp, sum and division cost
gamma(seq_len + 3) relative per probability; and the value path (a sum over tokens and latent dimensions) costs
gamma(seq_len + kv_lora_rank) times its terms' magnitudes, bounded by max_t |kv_c_t| |W_UV|. ``error_bound`` is that
worst case computed from the test's own tensors: a bound, not a fitted number. Measured: errors <= 2.6e-7 against
bounds of 1.3e-4 to 6.6e-4 on outputs of magnitude ~1 (worst cases add every rounding up with no cancellation);
a logit scale off by 0.1 %, a dropped rotary term or a causal mask one position off fail it.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from minipaged_cli.apps.qwen3 import scramble_free_blocks
from minipaged_cli.dataplane.block_tables import append_slots, block_table_tensor
from minipaged_cli.dataplane.cuda import CudaBackend, cuda_backend_unavailable_reason
from minipaged_cli.dataplane.emulation import EmulatedBackend
from minipaged_cli.dataplane.kernel_backend import KernelBackend
from minipaged_cli.dataplane.mla import (
    MLAWeights,
    PagedLatentCache,
    emulated_library,
    latent_cache_write,
    mla_decode,
    mla_prefill,
)
from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.workloads.presets import model_from_hf_config
from tests.conftest import REQUIRE_GPU, skip_unless_required

UNIT_ROUNDOFF = 2.0 ** -24  # fp32


def gamma(n: int) -> float:
    return n * UNIT_ROUNDOFF / (1 - n * UNIT_ROUNDOFF)


def error_bound(q_nope: torch.Tensor, q_pe: torch.Tensor, latents: torch.Tensor, weights: MLAWeights,
                scale: float) -> torch.Tensor:
    """[num_queries, num_heads, v_head_dim]: how far an fp32 MLA of these queries over these latent rows [seq_len,
    L + R] may be from the exact result, absorbed or expanded (the module docstring derives it)."""
    rank, seq_len = weights.kv_lora_rank, len(latents)
    c, k_pe = latents[:, :rank].double().abs(), latents[:, rank:].double().abs()
    logit_terms = scale * (torch.einsum("qnp,lnp,tl->qnt", q_nope.double().abs(), weights.w_uk.double().abs(), c)
                           + torch.einsum("qnr,tr->qnt", q_pe.double().abs(), k_pe))
    n = latents.shape[1] + weights.qk_nope_head_dim  # L + R + P
    logit_error = gamma(n) * logit_terms.amax(dim=-1, keepdim=True)  # [num_queries, num_heads, 1]
    return (torch.expm1(2 * logit_error) + gamma(seq_len + 3) + gamma(seq_len + rank)) * value_magnitude(latents,
                                                                                                       weights)


def value_magnitude(latents: torch.Tensor, weights: MLAWeights) -> torch.Tensor:
    """[num_heads, v_head_dim]: max over tokens of sum_l |kv_c_l| |W_UV[l]|, >= every |v| and so every |output|."""
    c = latents[:, :weights.kv_lora_rank].double().abs()
    return torch.einsum("tl,lnv->tnv", c, weights.w_uv.double().abs()).amax(dim=0)


# -- the independent reference ---------------------------------------------------------------------------------

def dense_mla(q_nope: torch.Tensor, q_pe: torch.Tensor, latents: torch.Tensor, weights: MLAWeights, scale: float,
              first_position: int) -> torch.Tensor:
    """MLA as the DeepSeek-V2 paper writes it, on one sequence's contiguous latent rows [seq_len, L + R], in
    float64, head by head and query by query: K_h = [kv_c W_UK[:, h] ; k_pe], V_h = kv_c W_UV[:, h]; query i sits
    at position first_position + i and sees positions 0..itself. -> [num_queries, num_heads, v_head_dim]."""
    rank = weights.kv_lora_rank
    c, k_pe = latents[:, :rank].double(), latents[:, rank:].double()
    out = torch.zeros(q_nope.shape[0], weights.num_heads, weights.v_head_dim, dtype=torch.float64)
    for head in range(weights.num_heads):
        key = torch.cat((c @ weights.w_uk[:, head].double(), k_pe), dim=1)  # [seq_len, P + R]
        value = c @ weights.w_uv[:, head].double()  # [seq_len, V]
        for i in range(q_nope.shape[0]):
            visible = first_position + i + 1
            query = torch.cat((q_nope[i, head], q_pe[i, head])).double()
            probs = torch.softmax(key[:visible] @ query * scale, dim=0)
            out[i, head] = probs @ value[:visible]
    return out


# -- a paged batch ---------------------------------------------------------------------------------------------

KV_LORA_RANK, ROPE, NOPE, V_HEAD, NUM_HEADS, BLOCK_SIZE = 32, 8, 16, 12, 4, 8
SEQ_LENS = [1, 13, 37, 24]  # one token, non-multiples of the block size, an exact multiple


def empty_paged(num_blocks: int, seed: int,
                dtype: torch.dtype = torch.float32) -> tuple[KVBlockManager, PagedLatentCache]:
    """A block manager whose free blocks come out scrambled and a one-layer latent cache full of NaN (stale
    memory that must never be read)."""
    manager = KVBlockManager(num_blocks, BLOCK_SIZE)
    scramble_free_blocks(manager, seed)
    cache = PagedLatentCache(1, num_blocks, BLOCK_SIZE, KV_LORA_RANK, ROPE, dtype=dtype)
    cache.latent_cache[0].fill_(float("nan"))
    return manager, cache


def paged_batch(seq_lens: list[int], seed: int, dtype: torch.dtype = torch.float32):
    """Random latents written through the block manager's slots into an ``empty_paged`` cache with spare blocks.
    Returns (cache, block_tables, latents per sequence, as stored)."""
    generator = torch.Generator().manual_seed(seed)
    manager, cache = empty_paged(sum(-(-n // BLOCK_SIZE) for n in seq_lens) + 3, seed, dtype)
    latents = []
    for seq, length in enumerate(seq_lens):
        manager.create_sequence(seq)
        slots = torch.tensor(append_slots(manager, seq, length), dtype=torch.int64)
        rows = torch.randn(length, KV_LORA_RANK + ROPE, generator=generator).to(dtype)
        latent_cache_write(rows[:, :KV_LORA_RANK], rows[:, KV_LORA_RANK:], cache.latent_cache[0], slots)
        latents.append(rows)
    return cache, block_table_tensor(manager, range(len(seq_lens)), as_torch=True), latents


def random_weights(seed: int, num_heads: int = NUM_HEADS) -> MLAWeights:
    generator = torch.Generator().manual_seed(seed)
    # Scaled like a trained projection (variance 1 / fan-in), so that logits are O(1) and no softmax is one-hot.
    w_uk = torch.randn(KV_LORA_RANK, num_heads, NOPE, generator=generator) / math.sqrt(KV_LORA_RANK)
    w_uv = torch.randn(KV_LORA_RANK, num_heads, V_HEAD, generator=generator) / math.sqrt(KV_LORA_RANK)
    return MLAWeights(w_uk=w_uk, w_uv=w_uv)


def random_queries(num_queries: int, seed: int, num_heads: int = NUM_HEADS) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(num_queries, num_heads, NOPE, generator=generator),
            torch.randn(num_queries, num_heads, ROPE, generator=generator))


SCALE = (NOPE + ROPE) ** -0.5


def test_cache_write_puts_each_token_in_its_slot():
    cache, block_tables, latents = paged_batch(SEQ_LENS, seed=1)
    for seq, rows in enumerate(latents):
        for position, row in enumerate(rows):
            block = int(block_tables[seq, position // BLOCK_SIZE])
            assert torch.equal(cache.latent_cache[0][block, position % BLOCK_SIZE], row)


def decode_errors(seed: int, dtype: torch.dtype = torch.float32, num_heads: int = NUM_HEADS,
                  backend: KernelBackend | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(|absorbed paged decode - dense|, error_bound) of each sequence of a paged batch. The cache's dtype only
    rounds the stored latents, which the dense reference and the bound then read as they are."""
    cache, block_tables, latents = paged_batch(SEQ_LENS, seed, dtype)
    weights = random_weights(seed + 1, num_heads)
    q_nope, q_pe = random_queries(len(SEQ_LENS), seed + 2, num_heads)
    device = backend.device if backend is not None else torch.device("cpu")
    out = mla_decode(q_nope.to(device), q_pe.to(device), cache.latent_cache[0].to(device), block_tables.to(device),
                     torch.tensor(SEQ_LENS, dtype=torch.int32, device=device),
                     MLAWeights(weights.w_uk.to(device), weights.w_uv.to(device)), SCALE, backend).cpu()
    assert out.shape == (len(SEQ_LENS), num_heads, V_HEAD) and out.dtype == torch.float32
    pairs = []
    for seq, rows in enumerate(latents):
        one = slice(seq, seq + 1)
        expected = dense_mla(q_nope[one], q_pe[one], rows, weights, SCALE, len(rows) - 1)
        pairs.append(((out[one].double() - expected).abs(), error_bound(q_nope[one], q_pe[one], rows, weights, SCALE)))
    return pairs


def within_bounds(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    return all(bool((error <= bound).all()) for error, bound in pairs)


def test_decode_absorbed_matches_dense():
    assert within_bounds(decode_errors(seed=2))


@pytest.fixture(scope="module")
def emulated() -> EmulatedBackend:
    """cuda/mla_decode.cu run on the CPU under the emulation's GPU rules."""
    return EmulatedBackend(library=emulated_library())


@pytest.mark.native_build
@pytest.mark.parametrize("num_heads", [NUM_HEADS, 12])  # part of one thread block's 8 heads; a full block and part
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_emulated_kernel_matches_dense(emulated: EmulatedBackend, dtype: torch.dtype, num_heads: int):
    assert within_bounds(decode_errors(seed=22, dtype=dtype, num_heads=num_heads, backend=emulated))


@pytest.mark.gpu
def test_cuda_kernel_matches_dense():
    reason = cuda_backend_unavailable_reason()
    if reason is not None:
        skip_unless_required(reason, REQUIRE_GPU)
    assert within_bounds(decode_errors(seed=23, dtype=torch.bfloat16, num_heads=12, backend=CudaBackend()))


@pytest.mark.native_build
@pytest.mark.parametrize("kernel", [False, True], ids=["torch", "emulated"])
def test_decode_of_an_empty_sequence_is_zero(emulated: EmulatedBackend, kernel: bool):
    cache, block_tables, _ = paged_batch([0, 5], seed=5)
    q_nope, q_pe = random_queries(2, seed=6)
    out = mla_decode(q_nope, q_pe, cache.latent_cache[0], block_tables, torch.tensor([0, 5], dtype=torch.int32),
                     random_weights(7), SCALE, emulated if kernel else None)
    assert torch.equal(out[0], torch.zeros(NUM_HEADS, V_HEAD)) and bool(out[1].isfinite().all())


def prefill_errors(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(|expanded paged prefill - dense|, error_bound) of each sequence: whole prompts and a chunk (the last 9
    positions of 37, the first 28 already cached)."""
    cache, block_tables, latents = paged_batch(SEQ_LENS, seed)
    query_lens = [1, 13, 9, 24]
    weights = random_weights(seed + 1)
    q_nope, q_pe = random_queries(sum(query_lens), seed + 2)
    out = mla_prefill(q_nope, q_pe, cache.latent_cache[0], block_tables, torch.tensor(SEQ_LENS, dtype=torch.int32),
                      torch.tensor(query_lens, dtype=torch.int32), weights, SCALE)
    pairs, start = [], 0
    for rows, num_queries in zip(latents, query_lens, strict=True):
        queries = slice(start, start + num_queries)
        start += num_queries
        expected = dense_mla(q_nope[queries], q_pe[queries], rows, weights, SCALE, len(rows) - num_queries)
        pairs.append(((out[queries].double() - expected).abs(),
                      error_bound(q_nope[queries], q_pe[queries], rows, weights, SCALE)))
    return pairs


def test_prefill_matches_dense_causal():
    assert within_bounds(prefill_errors(seed=8))


def test_decode_equals_prefill_of_the_last_position():
    """The absorbed and the expanded forms are one function: a decode query is a prefill's last query."""
    cache, block_tables, latents = paged_batch(SEQ_LENS, seed=11)
    weights = random_weights(12)
    q_nope, q_pe = random_queries(len(SEQ_LENS), seed=13)
    lens = torch.tensor(SEQ_LENS, dtype=torch.int32)
    decode = mla_decode(q_nope, q_pe, cache.latent_cache[0], block_tables, lens, weights, SCALE)
    prefill = mla_prefill(q_nope, q_pe, cache.latent_cache[0], block_tables, lens,
                          torch.ones(len(SEQ_LENS), dtype=torch.int32), weights, SCALE)
    for seq, rows in enumerate(latents):
        bound = 2 * error_bound(q_nope[seq:seq + 1], q_pe[seq:seq + 1], rows, weights, SCALE)
        assert bool(((decode[seq] - prefill[seq]).double().abs() <= bound[0]).all())


def test_kv_b_proj_split_matches_the_linear_layer():
    """kv_b_proj's output rows, per head, are the non-rotary key's then the value's: W_UK[l, h, p] is
    weight[h * (P + V) + p, l] and W_UV[l, h, v] is weight[h * (P + V) + P + v, l]."""
    weight = torch.randn(NUM_HEADS * (NOPE + V_HEAD), KV_LORA_RANK, generator=torch.Generator().manual_seed(14))
    weights = MLAWeights.from_kv_b_proj(weight, NUM_HEADS, NOPE, V_HEAD)
    for head in range(NUM_HEADS):
        first = head * (NOPE + V_HEAD)
        assert torch.equal(weights.w_uk[:, head].t(), weight[first:first + NOPE])
        assert torch.equal(weights.w_uv[:, head].t(), weight[first + NOPE:first + NOPE + V_HEAD])


# -- Hugging Face's DeepSeek-V3 attention ----------------------------------------------------------------------

def hugging_face_errors(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(|ours - Hugging Face|, tolerance) of each sequence. A tiny random DeepseekV3Attention (fixed seed): its own
    projections, layernorm and RoPE make q_nope, q_pe, kv_c and k_pe; ours writes the latents to the paged cache,
    prefills every prompt but its last token, decodes the last one absorbed, and HF's o_proj maps both; HF's eager
    forward over the whole prompt is the reference. Tolerance: our error bound and HF's (the same bound: its
    expanded form has the same sums) through o_proj, plus o_proj's own rounding on both sides."""
    modeling = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
    from transformers import DeepseekV3Config

    config = DeepseekV3Config(hidden_size=48, num_attention_heads=NUM_HEADS, num_key_value_heads=NUM_HEADS,
                              q_lora_rank=24, kv_lora_rank=KV_LORA_RANK, qk_rope_head_dim=ROPE,
                              qk_nope_head_dim=NOPE, v_head_dim=V_HEAD, max_position_embeddings=128,
                              attn_implementation="eager")
    torch.manual_seed(seed)
    attention = modeling.DeepseekV3Attention(config, layer_idx=0).eval()
    rotary = modeling.DeepseekV3RotaryEmbedding(config)
    weights = MLAWeights.from_kv_b_proj(attention.kv_b_proj.weight.detach(), NUM_HEADS, NOPE, V_HEAD)
    rope = modeling.apply_rotary_pos_emb_interleave if config.rope_interleave else modeling.apply_rotary_pos_emb
    manager, cache = empty_paged(sum(-(-n // BLOCK_SIZE) for n in SEQ_LENS) + 3, seed + 1)
    generator = torch.Generator().manual_seed(seed + 2)
    pairs = []
    with torch.no_grad():
        for seq, length in enumerate(SEQ_LENS):
            hidden = torch.randn(1, length, config.hidden_size, generator=generator)
            mask = torch.full((length, length), float("-inf")).triu(1)[None, None]
            position_embeddings = rotary(hidden, torch.arange(length)[None])
            expected, _ = attention(hidden, position_embeddings, mask)  # [1, length, hidden]

            q = attention.q_b_proj(attention.q_a_layernorm(attention.q_a_proj(hidden)))
            q = q.view(1, length, NUM_HEADS, NOPE + ROPE).transpose(1, 2)  # [1, heads, length, P + R]
            q_nope, q_pe = q.split((NOPE, ROPE), dim=-1)
            kv_c, k_pe = attention.kv_a_proj_with_mqa(hidden).split((KV_LORA_RANK, ROPE), dim=-1)
            kv_c = attention.kv_a_layernorm(kv_c)
            q_pe, k_pe = rope(q_pe, k_pe[:, None], *position_embeddings)
            q_nope, q_pe = q_nope[0].transpose(0, 1), q_pe[0].transpose(0, 1)  # [length, heads, *]
            kv_c, k_pe = kv_c[0], k_pe[0, 0]  # [length, L], [length, R]

            manager.create_sequence(seq)
            slots = torch.tensor(append_slots(manager, seq, length), dtype=torch.int64)
            latent_cache_write(kv_c, k_pe, cache.latent_cache[0], slots)
            table = block_table_tensor(manager, [seq], as_torch=True)
            ours = torch.cat((
                mla_prefill(q_nope[:-1], q_pe[:-1], cache.latent_cache[0], table,
                            torch.tensor([length - 1], dtype=torch.int32),
                            torch.tensor([length - 1], dtype=torch.int32), weights, attention.scaling),
                mla_decode(q_nope[-1:], q_pe[-1:], cache.latent_cache[0], table,
                           torch.tensor([length], dtype=torch.int32), weights, attention.scaling),
            ))  # [length, heads, V]
            actual = attention.o_proj(ours.reshape(length, -1))

            latents = torch.cat((kv_c, k_pe), dim=1)
            bound = error_bound(q_nope, q_pe, latents, weights, attention.scaling).reshape(length, -1)
            o_proj = attention.o_proj.weight.detach().double().abs()  # [hidden, heads * V]
            magnitude = value_magnitude(latents, weights).reshape(-1)  # >= |o| per head and dim
            tolerance = 2 * bound @ o_proj.t() + 2 * gamma(NUM_HEADS * V_HEAD) * (magnitude @ o_proj.t())
            pairs.append(((actual.double() - expected[0].double()).abs(), tolerance))
    return pairs


def test_matches_hugging_face_deepseek_v3_attention():
    assert within_bounds(hugging_face_errors(seed=15))


# -- bytes per token -------------------------------------------------------------------------------------------

class CacheReads(TorchDispatchMode):
    """Counts the bytes every operator copies out of one tensor's storage (a view reads nothing; a gather,
    index, slice copy or conversion of the cache reads what it returns)."""

    def __init__(self, cache: torch.Tensor) -> None:
        super().__init__()
        self.storage = cache.untyped_storage().data_ptr()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [a for a in tree_flatten((args, kwargs or {}))[0] if isinstance(a, torch.Tensor)]
        if any(a.untyped_storage().data_ptr() == self.storage for a in inputs):
            for result in tree_flatten(out)[0]:
                if isinstance(result, torch.Tensor) and result.untyped_storage().data_ptr() != self.storage:
                    self.bytes += result.numel() * result.element_size()
        return out


# DeepSeek-V3's config.json (huggingface.co/deepseek-ai/DeepSeek-V3), the fields ModelSpec reads.
DEEPSEEK_V3 = {"num_hidden_layers": 61, "hidden_size": 7168, "intermediate_size": 18432, "num_attention_heads": 128,
               "num_key_value_heads": 128, "vocab_size": 129280, "max_position_embeddings": 163840,
               "kv_lora_rank": 512, "qk_rope_head_dim": 64, "tie_word_embeddings": False, "model_type": "deepseek_v3"}


@pytest.mark.parametrize("dtype, torch_dtype", [("bfloat16", torch.bfloat16), ("float32", torch.float32)])
def test_decode_reads_the_bytes_model_spec_counts(dtype, torch_dtype):
    """A decode step reads each context token's latent row once for all heads: (512 + 64) * 2 = 1,152 bytes per
    token and layer for DeepSeek-V3 in bf16, what ModelSpec (and the simulator's MLA capacity) counts. Measured
    on the operators the decode runs, not computed from the code's arithmetic."""
    spec = model_from_hf_config({**DEEPSEEK_V3, "torch_dtype": dtype}, name="deepseek-v3", source="test")
    assert spec.kv_bytes_per_token_per_layer == (512 + 64) * torch.tensor([], dtype=torch_dtype).element_size()
    seq_lens = [3, 17, 40]
    cache = PagedLatentCache(1, 8, 16, spec.kv_lora_rank, spec.qk_rope_head_dim, dtype=torch_dtype)
    assert cache.bytes_per_token_per_layer == spec.kv_bytes_per_token_per_layer
    cache.latent_cache[0].normal_()
    block_tables = torch.tensor([[5, -1, -1], [0, 7, -1], [2, 6, 1]], dtype=torch.int32)
    generator = torch.Generator().manual_seed(18)
    nope, heads = 128, 4  # DeepSeek-V3's nope dim; fewer heads (the bytes per token must not depend on them)
    weights = MLAWeights(w_uk=torch.randn(512, heads, nope, generator=generator) / 512 ** 0.5,
                         w_uv=torch.randn(512, heads, nope, generator=generator) / 512 ** 0.5)
    q_nope = torch.randn(3, heads, nope, generator=generator).to(torch_dtype)
    q_pe = torch.randn(3, heads, 64, generator=generator).to(torch_dtype)
    with CacheReads(cache.latent_cache[0]) as reads:
        out = mla_decode(q_nope, q_pe, cache.latent_cache[0], block_tables, torch.tensor(seq_lens, dtype=torch.int32),
                         weights, (nope + 64) ** -0.5)
    assert bool(out.isfinite().all())
    assert reads.bytes == sum(seq_lens) * spec.kv_bytes_per_token_per_layer


# -- bad arguments ---------------------------------------------------------------------------------------------

def test_bad_arguments_are_refused_before_any_read_or_write():
    cache, block_tables, _ = paged_batch([5, 9], seed=19)
    weights = random_weights(20)
    q_nope, q_pe = random_queries(2, seed=21)
    lens = torch.tensor([5, 9], dtype=torch.int32)
    before = cache.latent_cache[0].clone()
    with pytest.raises(ValueError, match="slot_mapping holds"):
        latent_cache_write(torch.zeros(1, KV_LORA_RANK), torch.zeros(1, ROPE), cache.latent_cache[0],
                           torch.tensor([cache.num_blocks * BLOCK_SIZE]))
    with pytest.raises(ValueError, match="must fill a row"):
        latent_cache_write(torch.zeros(1, KV_LORA_RANK), torch.zeros(1, ROPE + 1), cache.latent_cache[0],
                           torch.tensor([0]))
    with pytest.raises(ValueError, match=r"k_pe torch\.float16"):
        latent_cache_write(torch.zeros(1, KV_LORA_RANK), torch.zeros(1, ROPE, dtype=torch.float16),
                           cache.latent_cache[0], torch.tensor([0]))
    assert torch.equal(before.nan_to_num(), cache.latent_cache[0].nan_to_num())
    bad_tables = block_tables.clone()
    bad_tables[1, 1] = cache.num_blocks
    with pytest.raises(ValueError, match="block_tables"):
        mla_decode(q_nope, q_pe, cache.latent_cache[0], bad_tables, lens, weights, SCALE)
    with pytest.raises(ValueError, match="q_pe must be"):
        mla_decode(q_nope, q_pe[..., :-1], cache.latent_cache[0], block_tables, lens, weights, SCALE)
    with pytest.raises(ValueError, match="query_lens must be in"):
        mla_prefill(q_nope, q_pe, cache.latent_cache[0], block_tables, lens, torch.tensor([6, -4], dtype=torch.int32),
                    weights, SCALE)


if __name__ == "__main__":  # python -m tests.dataplane.test_mla: the measured errors the README quotes
    emulated_kernel = EmulatedBackend(library=emulated_library())
    for name, pairs in (("decode, absorbed, paged", decode_errors(2)), ("prefill, expanded, paged", prefill_errors(8)),
                        ("Hugging Face DeepseekV3Attention", hugging_face_errors(15)),
                        ("mla_decode.cu emulated, fp32 cache", decode_errors(22, num_heads=12,
                                                                             backend=emulated_kernel)),
                        ("mla_decode.cu emulated, bf16 cache", decode_errors(22, torch.bfloat16, 12,
                                                                             emulated_kernel))):
        errors = torch.cat([e.reshape(-1) for e, _ in pairs])
        bounds = torch.cat([b.expand_as(e).reshape(-1) for e, b in pairs])
        print(f"{name:36} max abs err {float(errors.max()):.2e}   bound {float(bounds.min()):.2e} to "
              f"{float(bounds.max()):.2e}   max err / bound {float((errors / bounds).max()):.1e}")
