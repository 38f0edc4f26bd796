"""The pipeline's settings: plain dataclasses, every field with a default, validated on creation.

``AppConfig`` composes ``PipelineConfig`` (``[pipeline.asr]``, ``[pipeline.vad]`` ... in
voxlane.toml). Per-persona settings (silence threshold, speaking rate, sampling) live in the
persona, not here: these are the machine's and the models' settings.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.schema import check

COMPUTE_TYPES = ("int8", "int8_float32", "int8_float16", "float32", "float16", "default")
TTS_FALLBACKS = ("piper", "coqui", "flite", "espeak")


@dataclass(frozen=True)
class VADConfig:
    """Silero VAD on 32 ms frames at 16 kHz, and how its probabilities become turns."""

    threshold: float = 0.5  # speech probability that starts speech
    pause_threshold: float = 0.25  # probability that already pauses playback (tentatively: a blip resumes it)
    neg_threshold: float = 0.35  # below this a frame is silence (hysteresis against flicker)
    pre_roll_ms: int = 256  # audio kept from before the onset: Whisper needs the first phoneme
    onset_gap_ms: int = 160  # silence that ends a not-yet-confirmed onset (a cough, a click)
    pause_ms: int = 192  # silence after which the end-of-turn signals are read ("semantic" endpointing)
    answer_pause_ms: int = 96  # silence after which the speculative answer starts (ASR final, LLM, TTS); <= pause_ms

    def __post_init__(self) -> None:
        check(0.05 <= self.threshold <= 0.95, "threshold", f"must be in [0.05, 0.95], got {self.threshold}")
        check(0.0 < self.neg_threshold <= self.threshold, "neg_threshold",
              f"must be in (0, threshold], got {self.neg_threshold}")
        check(0.0 < self.pause_threshold <= self.threshold, "pause_threshold",
              f"must be in (0, threshold], got {self.pause_threshold}")
        check(0 <= self.pre_roll_ms <= 2000, "pre_roll_ms", f"must be in [0, 2000], got {self.pre_roll_ms}")
        check(32 <= self.onset_gap_ms <= 1000, "onset_gap_ms", f"must be in [32, 1000], got {self.onset_gap_ms}")
        check(32 <= self.pause_ms <= 3000, "pause_ms", f"must be in [32, 3000], got {self.pause_ms}")
        check(32 <= self.answer_pause_ms <= 3000, "answer_pause_ms",
              f"must be in [32, 3000], got {self.answer_pause_ms} (a value above pause_ms acts as pause_ms)")


@dataclass(frozen=True)
class ASRConfig:
    """How faster-whisper runs, and the guards against invented text. (Which model: ``[models] asr``.)"""

    compute_type: str = "int8"
    cpu_threads: int = 2  # threads inside one transcription
    num_workers: int = 1  # transcriptions at once (sessions ending turns together); 1 serializes them
    beam_size: int = 1
    is_short_context: bool = True  # encode only the audio + context_pad_s, not 30 s (see pipeline/asr/whisper.py)
    context_pad_s: float = 3.0
    loop_retry_pad_s: float = 1.5  # a short-context loop is decoded again with this much more pad (0: straight to 30 s)
    partial_interval_ms: int = 700  # re-transcribe the growing buffer this often while the user speaks
    is_partial_enabled: bool = True
    # The final transcript is sent only once its last word is timed, as the last-word check first did
    # (for A/Bs): the answer then waits for the alignment pass too. Off: the final goes out first.
    is_last_word_timed_first: bool = False
    no_speech_threshold: float = 0.6  # a segment is dropped when no_speech_prob is above this ...
    logprob_threshold: float = -1.0  # ... and its avg_logprob is below this (Whisper's own rule)
    min_logprob: float = -1.5  # a segment below this is dropped whatever no_speech_prob says
    max_compression_ratio: float = 2.4  # repetition loops ("the the the ...")
    phantom_no_speech: float = 0.15  # a known phantom phrase survives only below this no_speech_prob
    phantom_phrases: tuple[str, ...] = (
        "thank you", "thank you very much", "thanks for watching", "thank you for watching",
        "you", "bye", "so", "okay", "please subscribe", "subtitles by the amara org community",
    )

    def __post_init__(self) -> None:
        check(self.compute_type in COMPUTE_TYPES, "compute_type",
              f"must be one of {', '.join(COMPUTE_TYPES)}, got {self.compute_type!r}")
        check(1 <= self.cpu_threads <= 256, "cpu_threads", f"must be in [1, 256], got {self.cpu_threads}")
        check(1 <= self.num_workers <= 64, "num_workers", f"must be in [1, 64], got {self.num_workers}")
        check(1 <= self.beam_size <= 10, "beam_size", f"must be in [1, 10], got {self.beam_size}")
        check(0.5 <= self.context_pad_s <= 20.0, "context_pad_s", f"must be in [0.5, 20], got {self.context_pad_s}")
        check(0.0 <= self.loop_retry_pad_s <= 20.0, "loop_retry_pad_s", f"must be in [0, 20], got {self.loop_retry_pad_s}")
        check(200 <= self.partial_interval_ms <= 10000, "partial_interval_ms",
              f"must be in [200, 10000], got {self.partial_interval_ms}")
        check(0.0 <= self.no_speech_threshold <= 1.0, "no_speech_threshold", "must be in [0, 1]")
        check(self.min_logprob <= self.logprob_threshold <= 0.0, "logprob_threshold",
              "must be in [min_logprob, 0]")
        check(self.max_compression_ratio > 1.0, "max_compression_ratio", "must be > 1")
        check(0.0 <= self.phantom_no_speech <= 1.0, "phantom_no_speech", "must be in [0, 1]")


@dataclass(frozen=True)
class ChunkerConfig:
    """Where the token stream is cut for speech: short first chunk (fast first audio), longer later."""

    # The first chunk is short: its synthesis (and the tokens before it) is what the user waits for;
    # the next ones grow (3, 6, 12, 24, 30 words) and are made while the one before plays.
    first_min_words: int = 2  # the first chunk ends at the first clause/sentence boundary after this many words
    first_max_words: int = 3  # ... or at a word boundary after this many, punctuation or not
    min_words: int = 6  # later chunks end at a sentence boundary after this many words
    clause_words: int = 14  # ... or at a clause boundary (, ; :) after this many
    max_words: int = 30  # ... or at a word boundary after this many

    def __post_init__(self) -> None:
        check(1 <= self.first_min_words <= self.first_max_words, "first_min_words",
              "must be in [1, first_max_words]")
        check(self.first_max_words <= 100, "first_max_words", "must be at most 100")
        check(1 <= self.min_words <= self.clause_words <= self.max_words, "clause_words",
              "must satisfy 1 <= min_words <= clause_words <= max_words")
        check(self.max_words <= 200, "max_words", "must be at most 200")


@dataclass(frozen=True)
class LLMStageConfig:
    """How the LLM stage builds prompts and keeps the history inside the model's context."""

    history_token_budget: int = 1536  # prompt tokens (system + history + new turn); also capped by the context
    max_history_turns: int = 20
    is_prewarm_enabled: bool = True  # prefill the system prompt when the session starts (see LLMStage.setup)
    is_partial_prefill_enabled: bool = True  # prefill the user's words so far at each partial transcript
    is_early_answer_enabled: bool = True  # answer a partial whose words read as finished (semantic endpointing)
    early_answer_min_p: float = 0.2  # ... when the engine's P(sentence ends after them) is at least this
    early_answer_tokens: int = 8  # tokens it writes before the final adopts it (then it waits; 0 = no wait)
    is_first_audio_first: bool = True  # the answer waits while its first chunk is synthesized (TTS has the cores)

    def __post_init__(self) -> None:
        check(128 <= self.history_token_budget <= 1_000_000, "history_token_budget",
              f"must be in [128, 1000000], got {self.history_token_budget}")
        check(0 <= self.max_history_turns <= 1000, "max_history_turns", "must be in [0, 1000]")
        check(0 <= self.early_answer_tokens <= 4096, "early_answer_tokens",
              f"must be in [0, 4096], got {self.early_answer_tokens}")
        check(0.0 <= self.early_answer_min_p <= 1.0, "early_answer_min_p",
              f"must be in [0, 1], got {self.early_answer_min_p}")


@dataclass(frozen=True)
class TTSConfig:
    """Which backends to fall back on, and the sample rate the front end wants."""

    fallback: tuple[str, ...] = ("piper", "flite", "espeak")  # tried after the persona's backend
    output_sample_rate: int = 0  # 0 = each voice's own rate (carried on every AudioOut frame)

    def __post_init__(self) -> None:
        for name in self.fallback:
            check(name in TTS_FALLBACKS, "fallback", f"unknown backend {name!r} (known: {', '.join(TTS_FALLBACKS)})")
        check(self.output_sample_rate == 0 or 8000 <= self.output_sample_rate <= 96000, "output_sample_rate",
              f"must be 0 or in [8000, 96000], got {self.output_sample_rate}")


@dataclass(frozen=True)
class QueueConfig:
    """Bounds on the queues between stages: memory stays flat when a consumer stalls."""

    stage_queue_size: int = 2000  # frames waiting for one stage (~64 s of 32 ms audio frames)
    output_queue_size: int = 5000  # frames waiting for the front end

    def __post_init__(self) -> None:
        check(10 <= self.stage_queue_size <= 1_000_000, "stage_queue_size", "must be in [10, 1000000]")
        check(10 <= self.output_queue_size <= 1_000_000, "output_queue_size", "must be in [10, 1000000]")


@dataclass(frozen=True)
class PipelineConfig:
    """All pipeline settings; ``[pipeline]`` in voxlane.toml."""

    vad: VADConfig = field(default_factory=VADConfig)
    asr: ASRConfig = field(default_factory=ASRConfig)
    chunker: ChunkerConfig = field(default_factory=ChunkerConfig)
    llm: LLMStageConfig = field(default_factory=LLMStageConfig)
    tts: TTSConfig = field(default_factory=TTSConfig)
    queues: QueueConfig = field(default_factory=QueueConfig)
    stop_timeout_s: float = 5.0  # close() waits this long for each stage thread

    def __post_init__(self) -> None:
        check(0.1 <= self.stop_timeout_s <= 120, "stop_timeout_s", "must be in [0.1, 120]")
