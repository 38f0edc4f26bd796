"""The benchmark's quality section: our native GGUF weights, our INT8 and transformers' ``quantize_dynamic``
against fp32 (the fp32 model is the GGUF dequantized, so the native row should agree exactly)."""
from __future__ import annotations

import warnings
from dataclasses import asdict

import torch

from bench.quality import QUALITY_PROMPTS, compare
from engine.kernels import load_kernels
from engine.loader import chat_prompt_ids, load_model, load_tokenizer
from engine.native_weights import load_native_model
from engine.quant import quantize_int8


def quality_report(model_dir, num_prompts: int = 5, num_tokens: int = 48) -> dict:
    """{"engine native GGUF": QualityReport dict (when the model has a GGUF), "engine native GGUF, int8
    activations": ..., "engine native GGUF, bf16 activations": ..., "engine native GGUF, int16
    activations": ..., "... int16 activations, fp32 KV cache": ..., "engine int8": ...,
    "engine int8, pure-torch path": ..., "quantize_dynamic int8": ...}
    on the fixed prompt set."""
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(model_dir)
    prompts = [chat_prompt_ids(tokenizer, [{"role": "user", "content": p}]) for p in QUALITY_PROMPTS[:num_prompts]]
    stop = {tokenizer.eos_token_id}
    reference = load_model(model_dir, torch.float32)
    report = {}
    kernels = load_kernels()
    try:
        native = load_native_model(model_dir, None, kernels)
    except FileNotFoundError:  # a model that does not come as GGUF
        native = None
    if native is not None:
        report["engine native GGUF"] = asdict(compare(reference, native, prompts, num_tokens, stop))
        if kernels is not None:  # the one-call step is where int8 and bf16 activations run
            native.int8_activations = True
            report["engine native GGUF, int8 activations"] = asdict(compare(reference, native, prompts, num_tokens,
                                                                            stop))
            native.int8_activations = False
            native.bf16_activations = True  # the prompts' Q4_0/Q5_0/Q4_1 inputs in bf16 (where AMX runs)
            report["engine native GGUF, bf16 activations"] = asdict(compare(reference, native, prompts, num_tokens,
                                                                            stop))
            native.bf16_activations = False
            native.int16_activations = True  # decoding batches' Q4_0/Q4_1/Q8_0 inputs as int16 blocks (VNNI)
            report["engine native GGUF, int16 activations"] = asdict(compare(reference, native, prompts, num_tokens,
                                                                             stop))
            # the rows above over the engine's default cache (fp16 where the one-call step runs); this one fp32
            report["engine native GGUF, int16 activations, fp32 KV cache"] = asdict(compare(
                reference, native, prompts, num_tokens, stop, kv_dtype=torch.float32))
        del native  # None on a machine without them: the pure-torch row is then the engine's
    paths = ([("engine int8", kernels)] if kernels is not None else []) + [("engine int8, pure-torch path", None)]
    for name, kernels in paths:
        ours = load_model(model_dir, torch.float32)
        ours.kernels = kernels
        report[name] = asdict(compare(reference, quantize_int8(ours), prompts, num_tokens, stop))
        del ours
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dynamic = torch.ao.quantization.quantize_dynamic(hf, {torch.nn.Linear}, dtype=torch.qint8)
    report["quantize_dynamic int8"] = asdict(compare(reference, lambda ids: dynamic(torch.tensor([ids])).logits[0],
                                                     prompts, num_tokens, stop))
    return report
