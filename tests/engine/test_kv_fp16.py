"""An fp16 KV cache (``EngineConfig.kv_cache_dtype``, engine/kv_element.h): the one-call step and the
attention ops over an fp16 cache against pure-torch twins, for prompt chunks, decoding batches and a
mixed step at batch 1, 3 and 8; and "auto" really giving the one-call step an fp16 cache (dtype, bytes).

How the comparison stays tight. The step computes each new key and value in fp32 in another summation
order than torch (~1e-5 of their range apart, as the fp32 cache's tests allow), and where such a value
lies near the midpoint of two fp16 numbers the two round it to neighbours (~0.07 % of the elements of
SmolLM2's cache). A whole forward of torch over its own fp16 cache (rounding where it stores) then
drifts from the step's through the 30 layers: measured 0.5-5e-4 of the logits' range at batch 1, 3 and 8,
against 2-7e-4 between either and an fp32 cache, and 1e-6 between the step and torch with fp32 caches.
So the reference here is teacher-forced: the model's own torch modules compute every row of a step,
their attention reading the keys and values 0..position of the row's slot that the step stored (fp16,
widened), and (1) the step's logits equal theirs within fp32 tolerance, (2) each key and value the step
stored is the reference's fp32 one rounded to nearest, within the fp32 tolerance and one fp16 step. (1)
fails if the step reads anything but what it stored, (2) if it stores anything but the rounded values."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import kernels as K
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.kv_cache import KVCache
from engine.model import apply_rope
from engine.runner import ModelRunner
from tests.engine.test_kernels import SCATTERED_SLOTS
from tests.engine.test_native_weights import ops, smollm2_native  # noqa: F401 (fixtures)


def assert_within_one_fp16_step(got: torch.Tensor, expected: torch.Tensor, fp32_tolerance: float = 0.0) -> None:
    """got (fp16) is expected (fp32, or fp16 itself) rounded to nearest, up to fp32_tolerance of its range:
    apart by at most that and one fp16 step of the element (2^-10 of it, or a subnormal's 2^-24)."""
    assert got.dtype == torch.float16
    a, b = got.float(), expected.float()
    apart = (a - b).abs()
    bound = fp32_tolerance * (1 + b.abs().max().item()) + torch.maximum(b.abs() * 2.0 ** -10, torch.full_like(b, 2.0 ** -24))
    assert (apart <= bound).all(), f"{(apart - bound).max().item()} beyond, {(apart > 0).float().mean().item():.4f} apart"


def fresh_cache(model, slots: int, positions: int, dtype=torch.float16) -> KVCache:
    """A cache whose storage is zeroed (torch.empty's bytes may be anything, NaN patterns included)."""
    cache = KVCache(model.args, slots, positions, dtype)
    cache.tensors.k.zero_()
    cache.tensors.v.zero_()
    return cache


def prompt_ids(slot: int, n: int) -> list[int]:
    return [(slot * 37 + i * 11) % 4000 + 100 for i in range(n)]


@torch.inference_mode()
def teacher_forced(model, cache: KVCache, tokens: list[int], positions: list[int], slots: list[int]):
    """Rows (token, position, slot) of steps that ran, by the pure-torch modules, each row's attention over
    keys and values 0..position of its slot as the cache holds them -> (logits [T, V], the new keys and
    values per layer in fp32, each [T, Hkv, d], before any rounding)."""
    T = len(tokens)
    pos = torch.tensor(positions)
    x = model.embed(torch.tensor(tokens)[None])  # [1, T, D]
    cos, sin = model.rope_cos[pos][None, :, None], model.rope_sin[pos][None, :, None]  # [1, T, 1, d]
    new_k, new_v = [], []
    for layer, block in enumerate(model.layers):
        attn = block.attn
        H, Hkv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        qkv = attn.qkv(block.input_norm(x))  # [1, T, (H + 2 Hkv) d]
        qk = apply_rope(qkv[..., : (H + Hkv) * d].unflatten(-1, (H + Hkv, d)), cos, sin)[0]  # [T, H + Hkv, d]
        new_k.append(qk[:, H:])
        new_v.append(qkv[0, :, (H + Hkv) * d:].unflatten(-1, (Hkv, d)))
        rows = []
        for t in range(T):
            keys = cache.tensors.k[layer, slots[t], :, : positions[t] + 1].float().repeat_interleave(H // Hkv, 0)
            values = cache.tensors.v[layer, slots[t], :, : positions[t] + 1].float().repeat_interleave(H // Hkv, 0)
            rows.append(F.scaled_dot_product_attention(qk[t, :H, None], keys, values)[:, 0].reshape(H * d))
        x = x + attn.o_proj(torch.stack(rows)[None])
        x = x + block.mlp(block.post_attn_norm(x))
    return model.logits(model.norm(x))[0], new_k, new_v


def check_against_teacher_forced(model, cache: KVCache, rows: list[tuple[int, int, int]], logits: dict[int, torch.Tensor]):
    """rows: (token, position, slot) of the steps that ran; logits: the step's logits by row index."""
    tokens, positions, slots = (list(c) for c in zip(*rows))
    expected, new_k, new_v = teacher_forced(model, cache, tokens, positions, slots)
    got = torch.stack(list(logits.values()))
    want = expected[list(logits)]
    assert (got - want).abs().max().item() < 1e-5 * want.abs().max().item()
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    for layer in range(len(new_k)):
        stored_k = torch.stack([cache.tensors.k[layer, s, :, p] for p, s in zip(positions, slots)])  # [T, Hkv, d]
        stored_v = torch.stack([cache.tensors.v[layer, s, :, p] for p, s in zip(positions, slots)])
        assert_within_one_fp16_step(stored_k, new_k[layer], 1e-5)
        assert_within_one_fp16_step(stored_v, new_v[layer], 1e-5)


@pytest.mark.parametrize("B", [1, 3, 8])
def test_one_call_step_over_an_fp16_cache_equals_torch(smollm2_native, B):
    """Prompt chunks (6-41 rows: row by row, and 16 rows at a time: attend_rows16 reading widened keys)
    each in a step, then a decoding batch of B rows in scattered slots: every row's logits and stored k/v
    against the teacher-forced torch reference; and a whole torch forward over its own fp16 cache gives
    the same tokens, its logits within 1e-3 of the range (the rounding drift above)."""
    slots, lengths = SCATTERED_SLOTS[B], [6 + 5 * b for b in range(B)]
    results = []
    for fused in (True, False):
        cache = fresh_cache(smollm2_native, 9, 128)
        runner = ModelRunner(smollm2_native, cache)
        assert runner.fused_decode and runner.decoder.half_kv()
        runner.fused_decode = fused
        prompt_logits = [runner.prefill(slot, prompt_ids(slot, n), 0) for slot, n in zip(slots, lengths)]
        decode_logits = runner.decode(slots, [1000 + b for b in range(B)], lengths)
        results.append((torch.stack(prompt_logits), decode_logits, cache))
    (p1, d1, cache), (p2, d2, _) = results
    rows, logits = [], {}
    for slot, n, logit in zip(slots, lengths, p1):
        rows += [(t, i, slot) for i, t in enumerate(prompt_ids(slot, n))]
        logits[len(rows) - 1] = logit
    for b, (slot, n) in enumerate(zip(slots, lengths)):
        rows.append((1000 + b, n, slot))
        logits[len(rows) - 1] = d1[b]
    check_against_teacher_forced(smollm2_native, cache, rows, logits)
    assert (p1 - p2).abs().max().item() < 1e-3 * p2.abs().max().item()
    assert (d1 - d2).abs().max().item() < 1e-3 * d2.abs().max().item()
    assert torch.equal(d1.argmax(-1), d2.argmax(-1)) and torch.equal(p1.argmax(-1), p2.argmax(-1))


@pytest.mark.parametrize("B", [1, 3, 8])
def test_mixed_step_over_an_fp16_cache_equals_torch(smollm2_native, B):
    """A 21-token prompt arriving while B sequences decode: its chunk and the decode rows in one native
    call, every row against the teacher-forced torch reference."""
    slots, lengths = SCATTERED_SLOTS[B], [6 + 5 * b for b in range(B)]
    new_slot = 0 if 0 not in slots else 5
    chunk_ids = [(i * 13) % 3000 + 200 for i in range(21)]
    cache = fresh_cache(smollm2_native, 9, 128)
    runner = ModelRunner(smollm2_native, cache)
    for slot, n in zip(slots, lengths):
        runner.prefill(slot, prompt_ids(slot, n), 0, want_logits=False)
    (prompt_logits,), decode_logits = runner.prefill_and_decode([(new_slot, chunk_ids, 0, True)], slots,
                                                                [1000 + b for b in range(B)], lengths)
    rows = [(t, i, new_slot) for i, t in enumerate(chunk_ids)] + [(1000 + b, n, s) for b, (s, n) in
                                                                  enumerate(zip(slots, lengths))]
    logits = {20: prompt_logits, **{21 + b: decode_logits[b] for b in range(B)}}
    check_against_teacher_forced(smollm2_native, cache, rows, logits)


@pytest.mark.parametrize("d", [64, 128])
def test_attention_ops_over_fp16_caches_equal_torch(ops, d):
    """decode_attention (a row per sequence; key counts ending inside and on blocks of 16) and
    prompt_attention (a 43-row chunk after 37 keys: rows 16 at a time over widened keys, then a decode row
    of another slot) over fp16 caches: torch's output over the same caches, and the same stored bytes
    (the new values bit-equal: both round the same fp32 to nearest even)."""
    H, Hkv, S, L = 6, 2, 8, 128
    g = torch.Generator().manual_seed(d)
    for kind in ("decode", "prompt"):
        k_cache = torch.randn(S, Hkv, L, d, generator=g).half()
        v_cache = torch.randn(S, Hkv, L, d, generator=g).half()
        if kind == "decode":
            positions = torch.tensor([14, 15, 16, 30, 32, 46, 99, 127])
            slots = torch.arange(len(positions))
        else:
            positions = torch.tensor(list(range(37, 80)) + [7])
            slots = torch.tensor([1] * 43 + [2])
        qkv = torch.randn(len(positions), (H + 2 * Hkv) * d, generator=g) * 2
        cos, sin = torch.randn(len(positions), d, generator=g), torch.randn(len(positions), d, generator=g)
        k_ref, v_ref = k_cache.clone(), v_cache.clone()
        op = ops.decode_attention if kind == "decode" else ops.prompt_attention
        got = op(qkv, cos, sin, k_cache, v_cache, slots, positions, H, Hkv, 0)
        expected = K.decode_attention_reference(qkv, cos, sin, k_ref, v_ref, slots, positions, H, Hkv, 0)
        assert_within_one_fp16_step(k_cache, k_ref, 1e-6)
        assert torch.equal(v_cache, v_ref), kind
        # torch over the caches as the op wrote them (a key rounded the other way counts the same for both)
        again = K.decode_attention_reference(qkv, cos, sin, k_cache, v_cache, slots, positions, H, Hkv, 0, write=False)
        assert (got - again).abs().max().item() < 1e-5 * (1 + again.abs().max().item()), kind
        assert (got - expected).abs().max().item() < 1e-2 * (1 + expected.abs().max().item()), kind


def test_fp16_rounding_of_the_cache_write_is_torchs(ops):
    """The cache write rounds to nearest even as torch's .half() does, ties, subnormals, overflow to
    infinity and negative zero included: values copied into the cache (v) are torch's bits exactly."""
    d, H, Hkv = 64, 1, 1
    halves = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    finite = halves[torch.isfinite(halves)]
    step = torch.cat([finite.sort().values.diff(), torch.ones(1)]) / 2
    ties = finite.sort().values + step  # midpoints between neighbouring halves: the ties
    values = torch.cat([finite, ties, torch.tensor([65519.0, 65520.0, 1e6, -1e6, -0.0, 1e-9, 6e-8, 3e-8])])
    values = values[torch.isfinite(values)]
    values = torch.cat([values, torch.zeros((-len(values)) % d)]).view(-1, d)
    rows = len(values)
    cache = torch.zeros(1, Hkv, rows, d, dtype=torch.float16)
    qkv = torch.zeros(rows, (H + 2 * Hkv) * d)
    qkv[:, 2 * d:] = values  # the new values: copied into the cache, rounded
    rope = torch.ones(rows, d)
    ops.prompt_attention(qkv, rope, rope, torch.zeros_like(cache), cache, torch.zeros(rows, dtype=torch.long),
                         torch.arange(rows), H, Hkv, 0)
    assert torch.equal(cache[0, 0].view(torch.int16), values.half().view(torch.int16))


def test_auto_gives_the_one_call_step_an_fp16_cache(smollm2_dir):
    """``kv_cache_dtype = "auto"`` (the default) makes the one-call step's cache fp16: half the bytes of
    "float32"'s, and the decoder reads it as fp16; the pure-torch path (no kernels) keeps the activations'
    fp32. The quality report's one-slot runners (bench.quality.engine_kv_dtype) give a model the cache the
    engine gives it under "auto"."""
    from bench.quality import engine_kv_dtype

    made = {}
    for name, config in {"auto": EngineConfig(quant="native", max_seq_len=256, num_slots=2, max_batch_size=2),
                         "float32": EngineConfig(quant="native", max_seq_len=256, num_slots=2, max_batch_size=2,
                                                 kv_cache_dtype="float32"),
                         "torch": EngineConfig(quant="none", kernels=False, max_seq_len=256, num_slots=2,
                                               max_batch_size=2)}.items():
        engine = LLMEngine(smollm2_dir, config, background=False)
        tensors, decoder = engine.kv_cache.tensors, engine.runner.decoder
        if config.kv_cache_dtype == "auto":
            assert engine_kv_dtype(engine.model) == tensors.k.dtype, name
        made[name] = (tensors.k.dtype, tensors.v.dtype, engine.kv_cache.nbytes,
                      None if decoder is None else decoder.half_kv())
        engine.close()
    args_bytes = made["float32"][2]
    assert made["auto"] == (torch.float16, torch.float16, args_bytes // 2, True)
    assert made["float32"][:2] == (torch.float32, torch.float32) and made["float32"][3] is False
    assert made["torch"] == (torch.float32, torch.float32, args_bytes, None)


def test_kv_cache_dtype_setting():
    assert EngineConfig().kv_cache_dtype == "auto"
    assert EngineConfig(kv_cache_dtype="float16").kv_torch_dtype(False) == torch.float16
    assert EngineConfig(kv_cache_dtype="float32").kv_torch_dtype(True) == torch.float32
    assert EngineConfig().kv_torch_dtype(True) == torch.float16
    assert EngineConfig(dtype="bfloat16").kv_torch_dtype(False) == torch.bfloat16
    with pytest.raises(ValueError, match="kv_cache_dtype: must be one of"):
        EngineConfig(kv_cache_dtype="bfloat16")


def test_portable_fp16_rounding_is_torchs(tmp_path):
    """kv_element.h's routines without F16C (a machine without them: engine/kv_element.h's portable
    to_half and gguf's half_to_float), compiled with -march=x86-64 in a small harness
    (tests/engine/kv_half_portable_check.cpp): torch's .half() bits for every half, every midpoint of two
    neighbouring halves (ties to even), values between, overflow, subnormals, infinities and NaN; the
    widened value is the half's."""
    import shutil
    import subprocess
    from pathlib import Path

    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++")
    here = Path(__file__).parent
    exe = tmp_path / "kv_half"
    subprocess.run([compiler, "-std=c++17", "-O2", "-march=x86-64", f"-I{here.parent.parent / 'engine'}",
                    str(here / "kv_half_portable_check.cpp"), "-o", str(exe)], check=True)
    halves = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    finite = halves[torch.isfinite(halves)].unique().sort().values  # -65504 .. 65504, one zero
    middles = (finite[:-1] + finite.diff() / 2)  # ties (exact in fp32)
    nudged = torch.cat([middles.nextafter(torch.tensor(float("inf"))), middles.nextafter(torch.tensor(-float("inf")))])
    values = torch.cat([halves, middles, nudged, torch.tensor([65519.0, 65520.0, 65536.0, 1e9, -1e9, 3e-8, 2.9e-8,
                                                                1e-30, -0.0, float("inf"), -float("inf"), float("nan")])])
    bits = values.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    done = subprocess.run([str(exe)], input="\n".join(map(str, bits.tolist())), check=True, capture_output=True, text=True)
    got = torch.tensor([[int(x) for x in line.split()] for line in done.stdout.splitlines()])
    assert len(got) == len(values) > 200000
    expected = values.half()
    is_nan = torch.isnan(values)
    got_half = got[:, 0].to(torch.int16).view(torch.float16)
    assert torch.equal(got[~is_nan, 0].to(torch.int16), expected[~is_nan].view(torch.int16))
    assert torch.isnan(got_half[is_nan]).all()
    widened = (got[:, 1] & 0xFFFFFFFF).to(torch.int64)
    widened = torch.where(widened >= 1 << 31, widened - (1 << 32), widened).to(torch.int32).view(torch.float32)
    assert torch.equal(widened[~is_nan], expected[~is_nan].float())
