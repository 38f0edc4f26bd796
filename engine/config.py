"""``EngineConfig``: every knob of the engine, with defaults and validation."""
from __future__ import annotations

from dataclasses import dataclass, replace

DTYPES = ("float32", "bfloat16")
QUANTS = ("auto", "none", "int8", "native")
ACTIVATIONS = ("float32", "int8", "int16")
KV_CACHE_DTYPES = ("auto", "float32", "float16")


@dataclass(frozen=True)
class WeightSetting:
    """One setting ``quant = "auto"`` can become for a model: the weights' format and, for the GGUF's
    native blocks, the precision their matmuls give the activations (``int8_activations`` /
    ``int16_activations``; "float32": neither)."""

    quant: str = "int8"
    activations: str = "float32"

    def __post_init__(self) -> None:
        if self.quant not in QUANTS[1:]:
            raise ValueError(f"quant: must be one of {QUANTS[1:]}, got {self.quant!r}")
        if self.activations not in ACTIVATIONS or (self.activations != "float32" and self.quant != "native"):
            raise ValueError(f"activations: {self.activations!r} is not a setting of quant {self.quant!r}")


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs. Errors read ``"field: message"`` so the app's config loader can key them.

    The default (int8 weights, fp32 activations) is the fast mode whose quality was measured to hold
    (docs/engine.md); ``quant="none"`` is the exact reference mode.
    """

    dtype: str = "float32"  # activations (and the KV cache, unless kv_cache_dtype says): "float32" | "bfloat16"
    # weights: "none" (fp32) | "int8" (weight-only, per-output-channel scales) | "native" (the GGUF's
    # own quantized blocks, engine.native_weights; needs the model's GGUF and fp32 activations) |
    # "auto": the model's measured best, chosen by whoever knows the model (the app's model store,
    # app/backends.py); the engine on its own reads it as "int8"
    quant: str = "auto"
    # native only: the GGUF blocks' matmuls quantize each activation row to Q8 blocks of 32 and
    # multiply in integers, as llama.cpp does (engine/q8_matmul.h); false: fp32 activations
    int8_activations: bool = False
    # native only: prompt chunks (16+ rows) round the inputs of Q4_0 / Q5_0 / Q4_1 matmuls to bf16 and
    # multiply the file's weights exactly in AMX tiles (engine/prefill_gemm.h); other formats, decoding
    # batches and machines without AMX keep fp32 activations
    bf16_activations: bool = False
    # native only: decoding batches (<= 8 rows) quantize the inputs of Q4_0 / Q4_1 / Q8_0 matmuls to int16
    # per block of 32 (finer than bf16) and multiply them through VNNI, those weights rewritten in place
    # in a 16-row interleaved layout (engine/r16_matmul.h; no extra memory); where AMX runs, prompt chunks
    # (9+ rows) quantize them to 12-bit blocks for AMX int8 tiles (engine/r16_tiles.h); without AMX prompt
    # chunks, and other formats, keep their activations
    int16_activations: bool = False
    # The KV cache's element: "float16" halves the bytes attention reads (a decoding batch of 8 rows read
    # ~40-60 MB of fp32 keys and values a step against ~80 MB of SmolLM2's weights), keys and values then
    # carrying 11 significant bits (llama.cpp's default cache is f16 too); "float32" is exact; "auto":
    # float16 where the one-call step runs (engine/decode_step.cpp: fp32 activations with the kernels),
    # else the activations' dtype (the pure-torch path). Quality measured: docs/engine.md, twelfth session.
    kv_cache_dtype: str = "auto"
    max_batch_size: int = 8  # sequences decoded together in one step
    num_slots: int = 8  # KV-cache slots (running sequences + idle conversations kept warm)
    num_shared_prefixes: int = 4  # read-only cache rows for prompt starts shared by sessions (system prompts)
    max_seq_len: int = 2048  # positions per slot (capped by the model's max_position_embeddings)
    admission_window_ms: float = 10.0  # an idle engine waits this long for more requests to batch
    prefill_chunk_tokens: int = 256  # prompt tokens per step, so a long prompt never stalls streams
    num_threads: int = 0  # torch.set_num_threads; 0 = leave torch's setting alone
    compile: bool = False  # torch.compile the decode step (measured: see docs/engine.md)
    kernels: bool = True  # fused C++ decode kernels (engine/kernels.cpp), built once; falls back to torch

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {DTYPES}, got {self.dtype!r}")
        if self.quant not in QUANTS:
            raise ValueError(f"quant: must be one of {QUANTS}, got {self.quant!r}")
        if self.quant == "native" and self.dtype != "float32":
            raise ValueError(f"quant: 'native' runs with float32 activations, got dtype {self.dtype!r}")
        if self.int8_activations not in (True, False):
            raise ValueError(f"int8_activations: must be true or false, got {self.int8_activations!r}")
        if self.int8_activations and self.quant != "native":  # with "auto" the model chooses them
            raise ValueError(f"int8_activations: needs quant 'native' (the GGUF's block formats), got {self.quant!r}")
        if self.bf16_activations not in (True, False):
            raise ValueError(f"bf16_activations: must be true or false, got {self.bf16_activations!r}")
        if self.bf16_activations and self.quant != "native":
            raise ValueError(f"bf16_activations: needs quant 'native' (the GGUF's block formats), got {self.quant!r}")
        if self.bf16_activations and self.int8_activations:
            raise ValueError("bf16_activations: not with int8_activations (one activation precision at a time)")
        if self.int16_activations not in (True, False):
            raise ValueError(f"int16_activations: must be true or false, got {self.int16_activations!r}")
        if self.int16_activations and self.quant != "native":
            raise ValueError(f"int16_activations: needs quant 'native' (the GGUF's block formats), got {self.quant!r}")
        if self.int16_activations and (self.int8_activations or self.bf16_activations):
            raise ValueError("int16_activations: not with int8_activations or bf16_activations "
                             "(one activation precision at a time)")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype: must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if not 1 <= self.max_batch_size <= 256:
            raise ValueError(f"max_batch_size: must be in [1, 256], got {self.max_batch_size}")
        if not 1 <= self.num_slots <= 1024:
            raise ValueError(f"num_slots: must be in [1, 1024], got {self.num_slots}")
        if self.num_slots < self.max_batch_size:
            raise ValueError(f"num_slots: must be >= max_batch_size ({self.max_batch_size}), got {self.num_slots}")
        if not 0 <= self.num_shared_prefixes <= 64:
            raise ValueError(f"num_shared_prefixes: must be in [0, 64], got {self.num_shared_prefixes}")
        if not 16 <= self.max_seq_len <= 131072:
            raise ValueError(f"max_seq_len: must be in [16, 131072], got {self.max_seq_len}")
        if not 0.0 <= self.admission_window_ms <= 1000.0:
            raise ValueError(f"admission_window_ms: must be in [0, 1000], got {self.admission_window_ms}")
        if not 1 <= self.prefill_chunk_tokens <= 65536:
            raise ValueError(f"prefill_chunk_tokens: must be in [1, 65536], got {self.prefill_chunk_tokens}")
        if not 0 <= self.num_threads <= 512:
            raise ValueError(f"num_threads: must be in [0, 512], got {self.num_threads}")
        for name in ("compile", "kernels"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: must be true or false, got {getattr(self, name)!r}")

    def with_weights(self, setting: WeightSetting) -> "EngineConfig":
        """This config with ``quant="auto"`` made the given weight setting (a model's measured best);
        any other ``quant`` is the user's choice and stays. Native blocks need float32 activations,
        so with ``dtype="bfloat16"`` auto means int8."""
        if self.quant != "auto":
            return self
        if setting.quant == "native" and self.dtype != "float32":
            setting = WeightSetting("int8")
        return replace(self, quant=setting.quant, int8_activations=setting.activations == "int8",
                       int16_activations=setting.activations == "int16")

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)

    def kv_torch_dtype(self, one_call_step: bool):
        """The KV cache's torch dtype, given whether the model runs the one-call step (``"auto"``: float16
        there, else the activations' dtype)."""
        import torch

        if self.kv_cache_dtype == "auto":
            return torch.float16 if one_call_step else self.torch_dtype
        return getattr(torch, self.kv_cache_dtype)
