"""Speech recognition with faster-whisper (CTranslate2, int8 on CPU), guarded against phantoms.

Short-context decoding: Whisper pads every input to 30 s, so the encoder costs ~0.9 s on this
2-core machine whatever the length. CTranslate2 accepts a shorter encoder input, so a 2 s
question is encoded as 2 s + ``context_pad_s`` of silence (~0.1 s). The silence pad keeps the
decoder from looping (measured here: 3 loops in 15 clips with 1 s of pad, none with 3 s), but
not always: which clip loops depends on the exact buffer, to a frame ("Give me a tip for sleeping
better." loops with 3.0 s of pad, not with 2.5 or 3.5 s). The usual loop reads the whole utterance
twice ("Give me a tip for sleeping better. Give me a tip for sleeping better."): one copy is kept.
Any other loop is decoded once more with ``loop_retry_pad_s`` more pad (~0.1 s), and only a loop
that survives that takes the standard 30 s way (~0.9 s quiet, seconds under load: it was the 2.1 s
final transcript of that question in ``voxlane bench latency``).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.asr.guard import Segment, keep_segments
from pipeline.config import ASRConfig


@dataclass
class ASRResult:
    """The guarded text of one buffer, and what was dropped (for logs and tests)."""

    text: str
    segments: list[Segment] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    alignment: PendingAlignment | None = None  # kept with ``with_last_word`` (short-context reads with text)


@dataclass(frozen=True)
class PendingAlignment:
    """What timing a read's last word needs, kept from the read itself: the decoder's tokens and the
    encoder's output (``WhisperTranscriber.time_last_word`` runs the pass later, so the words can be
    sent first)."""

    tokenizer: object
    ids: list[int]
    encoded: object  # ctranslate2.StorageView
    frames: int


@dataclass(frozen=True)
class WordTiming:
    """Where Whisper's cross-attention puts one word in the buffer it read (seconds from its start,
    20 ms steps), and the word's mean token probability."""

    word: str
    start_s: float
    end_s: float
    probability: float


def last_spoken_word(alignment: list[dict]) -> WordTiming | None:
    """The last entry of a faster-whisper alignment with a letter or digit in it (Whisper's final
    "?" or "." is a word of its own there)."""
    for entry in reversed(alignment):
        if any(ch.isalnum() for ch in entry["word"]):
            return WordTiming(entry["word"].strip(), float(entry["start"]), float(entry["end"]),
                              float(entry["probability"]))
    return None


def repeats_itself(text: str, n: int = 4) -> bool:
    """True when some run of ``n`` words occurs twice: the signature of a decoder loop, and too
    short for the compression-ratio test to catch."""
    words = text.lower().split()
    seen = set()
    for i in range(len(words) - n + 1):
        gram = tuple(words[i:i + n])
        if gram in seen:
            return True
        seen.add(gram)
    return False


def one_copy(text: str, min_words: int = 4) -> str | None:
    """The utterance when ``text`` is it read two or more times over (at least ``min_words`` words
    each, as ``repeats_itself`` counts), else None: "A b c d. A b c d." -> "A b c d."."""
    words = text.split()
    for size in range(min_words, len(words) // 2 + 1):
        if len(words) % size == 0 and all(words[i:i + size] == words[:size] for i in range(size, len(words), size)):
            return " ".join(words[:size])
    return None


class WhisperTranscriber:
    """One loaded Whisper model, shared by many sessions. At most ``config.num_workers`` calls
    run at once (CTranslate2 keeps that many model replicas, ``inter_threads``, sharing the
    weights); more wait their turn, so a burst of sessions ending their turns together does not
    oversubscribe the cores."""

    def __init__(self, model_dir: str | Path, config: ASRConfig | None = None):
        from faster_whisper import WhisperModel

        self.config = config or ASRConfig()
        self.model = WhisperModel(str(model_dir), device="cpu", compute_type=self.config.compute_type,
                                  cpu_threads=self.config.cpu_threads, num_workers=self.config.num_workers,
                                  local_files_only=True)
        self.is_english_only = not self.model.model.is_multilingual
        self._slots = threading.BoundedSemaphore(self.config.num_workers)
        self._tokenizers_lock = threading.Lock()
        self._tokenizers: dict[str, object] = {}
        # The first call is slow (allocations): front ends run one before the first turn
        # (pipeline.models.warm_transcriber, in PipelineModels.warm_up and the parallel loader).

    def _prompt(self, language: str | None) -> tuple[object, list[int]]:
        from faster_whisper.tokenizer import Tokenizer

        key = language or "en"
        with self._tokenizers_lock:  # calls may run in parallel (num_workers)
            if key not in self._tokenizers:
                self._tokenizers[key] = Tokenizer(self.model.hf_tokenizer, not self.is_english_only,
                                                  task="transcribe", language=None if self.is_english_only else key)
            tokenizer = self._tokenizers[key]
        return tokenizer, list(tokenizer.sot_sequence) + [tokenizer.no_timestamps]

    def _short_context(self, audio: np.ndarray, language: str | None, is_partial: bool = False,
                       with_last_word: bool = False) -> tuple[Segment, PendingAlignment | None] | None:
        """Decodes (audio + pad) only; a whole-utterance repeat keeps one copy, another loop is
        decoded once more with more pad (not for a partial: it is just skipped); None when that
        loops too (the caller falls back)."""
        read = self._decode_padded(audio, language, self.config.context_pad_s, with_last_word)
        if read is None and not is_partial and self.config.loop_retry_pad_s > 0:
            read = self._decode_padded(audio, language, self.config.context_pad_s + self.config.loop_retry_pad_s,
                                       with_last_word)
        return read

    def _decode_padded(self, audio: np.ndarray, language: str | None, pad_s: float,
                       with_last_word: bool = False) -> tuple[Segment, PendingAlignment | None] | None:
        """One decode over audio + ``pad_s`` of silence; None when it looks like a loop. With
        ``with_last_word``, also what timing the text's last word needs (``time_last_word``)."""
        import ctranslate2
        from faster_whisper.transcribe import get_compression_ratio

        padded = np.concatenate([audio, np.zeros(int(16000 * pad_s), np.float32)])
        features = self.model.feature_extractor(padded)[:, :-1]
        frames = min(3000, features.shape[1] + features.shape[1] % 2)  # the encoder halves it: keep it even
        batch = np.zeros((1, features.shape[0], frames), np.float32)
        batch[0, :, : min(frames, features.shape[1])] = features[:, :frames]
        encoded = self.model.model.encode(ctranslate2.StorageView.from_array(batch))
        tokenizer, prompt = self._prompt(language)
        max_new = 16 + int(6 * len(audio) / 16000)  # people say < 4 words (~6 tokens) a second
        result = self.model.model.generate(encoded, [prompt], beam_size=self.config.beam_size, return_scores=True,
                                           return_no_speech_prob=True, max_length=len(prompt) + max_new,
                                           suppress_blank=True, suppress_tokens=[-1])[0]
        ids = [t for t in result.sequences_ids[0] if t < tokenizer.eot]
        text = tokenizer.decode(ids).strip()
        if len(ids) < max_new and repeats_itself(text):
            text = one_copy(text) or text
        ratio = get_compression_ratio(text) if text else 0.0
        if len(ids) >= max_new or ratio > self.config.max_compression_ratio or repeats_itself(text):
            return None
        avg_logprob = result.scores[0] * len(ids) / (len(ids) + 1)  # scores are length-normalized
        alignment = PendingAlignment(tokenizer, ids, encoded, frames) if with_last_word and ids else None
        return Segment(text, float(result.no_speech_prob), float(avg_logprob), float(ratio)), alignment

    def time_last_word(self, result: ASRResult) -> WordTiming | None:
        """Where the last word of a read made ``with_last_word`` lies: one alignment pass of the
        decoder over the read's encoder output, as faster-whisper's ``word_timestamps`` does
        (~12 ms quiet, ~40 at load 5). Separate from ``transcribe`` so that the words go out first."""
        pending = result.alignment
        if pending is None:
            return None
        with self._slots:
            alignment = self.model.find_alignment(pending.tokenizer, [pending.ids], pending.encoded, pending.frames)
        return last_spoken_word(alignment[0])

    def transcribe(self, audio: np.ndarray, language: str | None = "en", is_partial: bool = False,
                   with_last_word: bool = False) -> ASRResult:
        """``audio``: 16 kHz mono float32. Greedy (or beam) decoding, no timestamps, no context.
        A partial never takes the slow 30 s fallback: audio cut mid-word loops more often, and a
        partial that costs 0.8 s would delay the final behind it. It is just skipped.
        ``with_last_word``: also keep what timing the last word needs (``ASRResult.alignment``,
        short-context reads; ``time_last_word`` does it)."""
        if len(audio) < 1600:  # under 0.1 s: nothing a person says fits
            return ASRResult("")
        with self._slots:
            if self.config.is_short_context and len(audio) < 16000 * (30 - self.config.context_pad_s):
                read = self._short_context(audio.astype(np.float32, copy=False), language, is_partial, with_last_word)
                if read is not None:
                    segment, alignment = read
                    text, dropped = keep_segments([segment], self.config)
                    return ASRResult(text, [segment], dropped, alignment if text else None)
                if is_partial:
                    return ASRResult("", [], ["partial skipped: looked like a decoder loop"])
            segments, _ = self.model.transcribe(
                audio.astype(np.float32, copy=False),
                language=None if self.is_english_only else language,
                beam_size=self.config.beam_size,
                temperature=0.0,  # no temperature fallback: it re-decodes exactly the doubtful cases, slowly
                without_timestamps=True,
                condition_on_previous_text=False,
                vad_filter=False,  # our own VAD already cut the turn
                no_speech_threshold=None,  # the guard below applies it (and says why it dropped)
                log_prob_threshold=None,
            )
            found = [Segment(s.text, s.no_speech_prob, s.avg_logprob, s.compression_ratio) for s in segments]
        text, dropped = keep_segments(found, self.config)
        return ASRResult(text, found, dropped)
