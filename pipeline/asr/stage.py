"""ASR stage: a turn's audio in, partial transcripts while the user speaks, one final per turn.

Partials re-transcribe the growing buffer every ``partial_interval_ms`` of audio, skipped when
the stage has fallen behind. The final is taken at the first pause (pause_ms of silence), not
at the end of the turn: the answer can start while the VAD still waits for silence_ms, and the
pipeline only plays it once the turn is committed. If the user resumes, the VAD re-opens the
utterance under a new gen and this stage carries the audio over to it. Silence inside an utterance
is kept up to ``MAX_GAP_MS`` only: after a long thinking pause ("What is the capital of ... Spain?")
Whisper often ends its text at the pause and never reads the rest ("How many legs does?"), so
after a longer pause the words before it are kept as heard at that pause and only the audio after
it is transcribed (forcing them as Whisper's prefix was tried: it then repeats them).

The transcript is ready when the pause comes: at the first silent frame after speech the buffer is
transcribed at once as a partial (the LLM stage prefills and probes it meanwhile), and the final at
the pause reuses the last partial when no voiced audio came after that partial's buffer (Whisper
would read the same words again, ~160 ms later). Speech going on after that partial only costs the
one call a periodic partial would.

A final read at the pause (or reused from the read at the first silent frame) also times its last
word against the voice (``endpointing/last_word.py``), but after the final is sent: the answer
starts from the words, and only the end-of-turn verdict needs the timing, which goes to the
endpointer on its own (``Endpointer.add_last_word``) one alignment pass later.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Iterable

import numpy as np

from pipeline.asr.whisper import ASRResult, WhisperTranscriber
from pipeline.config import ASRConfig
from pipeline.endpointing.endpointer import Endpointer
from pipeline.endpointing.last_word import LastWord, timed_last_word
from pipeline.frames import Frame, Interrupt, SpeechPaused, Transcript, TurnAudioEnd, TurnDone, UserAudio
from pipeline.stage import Stage
from pipeline.waterfall import WaterfallBook

log = logging.getLogger(__name__)
RATE = 16000
MAX_GAP_MS = 320  # the longest silence Whisper is given inside an utterance (the rest is not buffered)


def join_words(head: str, tail: str) -> str:
    """Text heard before a pause + text heard after it, as one sentence: "What is the capital of?"
    + "Spain?" -> "What is the capital of Spain?" (the head's final punctuation was Whisper's guess)."""
    if not head:
        return tail
    return f"{head.rstrip().rstrip('.?!,;:…')} {tail.strip()}"


def joined_confidence(head: str, head_logprob: float | None, tail: str, tail_logprob: float | None) -> float | None:
    """Whisper's confidence (avg log-probability) in ``join_words(head, tail)``: the two parts' own,
    weighted by their words. A tail read alone after a pause is short ("Spain"), and Whisper is
    rarely sure of one word without its sentence (-0.4 to -0.8 for a clear "Spain"): taken alone it
    would make the whole sentence look misheard to the end-of-turn decision."""
    if head_logprob is None or tail_logprob is None:
        return tail_logprob if head_logprob is None else head_logprob
    num_head, num_tail = len(head.split()), len(tail.split())
    return (num_head * head_logprob + num_tail * tail_logprob) / max(1, num_head + num_tail)


class ASRStage(Stage):
    """Buffers each turn's audio and transcribes it (see module docstring)."""

    name = "asr"

    def __init__(self, transcriber: WhisperTranscriber, config: ASRConfig, language: Callable[[], str],
                 book: WaterfallBook, queue_size: int = 2000, endpointer: Endpointer | None = None):
        super().__init__(queue_size)
        self.endpointer = endpointer  # told each final's last word (None: it is only logged)
        self.transcriber = transcriber
        self.config = config
        self.language = language
        self.book = book
        self._gen = -1
        self._carry = (-1, -1)  # (old gen, new gen) of an utterance resumed after a pause
        self._chunks: list[np.ndarray] = []
        self._num_samples = 0  # the utterance's audio, as heard (silences included)
        self._silent_run = 0  # samples of silence since the last voiced frame
        self._last_partial_at = 0
        self._is_final_sent = False
        self._head = ""  # the utterance's words as heard at its last pause (the text of that final)
        self._head_logprob: float | None = None  # Whisper's confidence in them
        self._head_text = ""  # words before a long pause, kept as heard; the buffer holds what follows
        self._head_text_logprob: float | None = None
        self._voiced_end = 0  # _num_samples at the end of the last voiced frame
        self._buffered = 0  # samples in the buffer Whisper reads (long silences are not kept)
        self._buffered_voiced_end = 0  # _buffered at the end of the last voiced frame
        self._partial: tuple[int, ASRResult] | None = None
        # (_num_samples it covered, the read: its last word is timed if it becomes the final)

    def before_purge(self, interrupt: Interrupt, queued) -> None:
        if interrupt.reason == "resume":
            # The user went on after a pause: the audio still queued belongs to the same utterance.
            self._carry = (interrupt.resumes_gen, interrupt.gen)
            for frame in queued:
                if isinstance(frame, UserAudio) and frame.gen == interrupt.resumes_gen:
                    frame.gen = interrupt.gen

    def _reset(self, gen: int) -> None:
        self._gen, self._chunks, self._num_samples, self._silent_run = gen, [], 0, 0
        self._head, self._head_text, self._head_logprob, self._head_text_logprob = "", "", None, None
        self._last_partial_at, self._is_final_sent = 0, False
        self._voiced_end, self._partial = 0, None
        self._buffered, self._buffered_voiced_end = 0, 0

    def _buffer(self) -> np.ndarray:
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0] if self._chunks else np.zeros(0, np.float32)

    def process(self, frame: Frame) -> Iterable[Frame]:
        if isinstance(frame, UserAudio):
            if frame.gen != self._gen:
                resumed, continued = self._carry
                if frame.gen == continued and self._gen == resumed:
                    # the same utterance, resumed after a pause: keep its audio
                    self._gen, self._is_final_sent = frame.gen, False
                    if self._silent_run > MAX_GAP_MS * RATE // 1000 and self._head:
                        # After a thinking pause Whisper tends to end its text at the pause and never
                        # read the rest ("How many legs does?"): the words before the pause stay as
                        # heard, and only what follows is transcribed (with a gap's worth of silence).
                        self._head_text, self._head_text_logprob = self._head, self._head_logprob
                        self._chunks = [np.zeros(MAX_GAP_MS * RATE // 1000, np.float32)]
                        self._buffered, self._buffered_voiced_end = len(self._chunks[0]), 0
                        self._partial = None  # it read the old buffer
                else:
                    self._reset(frame.gen)
            is_silence_onset = not frame.is_speech and self._silent_run == 0 and self._voiced_end > 0
            self._silent_run = 0 if frame.is_speech else self._silent_run + len(frame.samples)
            if self._silent_run <= MAX_GAP_MS * RATE // 1000:
                self._chunks.append(frame.samples)
                self._buffered += len(frame.samples)
            self._num_samples += len(frame.samples)
            if frame.is_speech:
                self._voiced_end, self._buffered_voiced_end = self._num_samples, self._buffered
            if is_silence_onset and self.config.is_partial_enabled and not self._is_read_to_the_end():
                # the words so far, ready before the pause; read as a final would be (a decode that
                # loops is tried again, not skipped: the final would only have to read it again)
                yield from self._partial_now(frame.gen, is_final_read=True)
            else:
                yield from self._maybe_partial(frame)
        elif isinstance(frame, SpeechPaused):
            if frame.gen == self._gen and not self._is_final_sent:
                yield from self._final(frame.gen, is_end=False)
        elif isinstance(frame, TurnAudioEnd):
            if frame.gen == self._gen and not self._is_final_sent:
                yield from self._final(frame.gen, is_end=True)
            self.book.set(frame.gen, "user_audio_ms", round(1000 * self._num_samples / RATE))
        else:
            yield frame

    def _maybe_partial(self, frame: UserAudio) -> Iterable[Frame]:
        due = self._num_samples - self._last_partial_at >= self.config.partial_interval_ms * RATE // 1000
        # Behind on audio (more than ~3 frames queued): skip, the final matters more than a partial.
        if not (self.config.is_partial_enabled and due and frame.is_speech and self._inbox.qsize() <= 3):
            return
        yield from self._partial_now(frame.gen)

    def _partial_now(self, gen: int, is_final_read: bool = False) -> Iterable[Frame]:
        self._last_partial_at = self._num_samples
        result = self.transcriber.transcribe(self._buffer(), self.language(), is_partial=not is_final_read,
                                             with_last_word=is_final_read)
        self._partial = (self._num_samples, result) if result.text else None
        if result.text and not self.is_stale(gen):
            yield Transcript(gen=gen, text=join_words(self._head_text, result.text), is_final=False,
                             is_at_silence=is_final_read)

    def _final(self, gen: int, is_end: bool) -> Iterable[Frame]:
        if self._is_read_to_the_end():
            # The last partial read every voiced frame of this buffer: its words are the final's.
            result = self._partial[1]
            self.book.set(gen, "asr_final_reused", 1)
        else:
            result = self.transcriber.transcribe(self._buffer(), self.language(), with_last_word=True)
            if result.dropped:
                log.info("ASR dropped: %s", "; ".join(result.dropped))
        text, confidence = result.text, min((seg.avg_logprob for seg in result.segments), default=None)
        voiced_end = self._buffered_voiced_end  # of the buffer that read (the stage goes on after the final)
        if self.config.is_last_word_timed_first:  # as before: the final waits for the alignment (A/Bs)
            last_word = self._last_word(result, voiced_end)
            yield from self._send_final(gen, is_end, text, confidence)
            self._tell_last_word(gen, text, last_word)
            return
        yield from self._send_final(gen, is_end, text, confidence)
        if self._is_final_sent and not self.is_stale(gen):
            # the words are out (the answer starts); now the timing, for the verdict only
            self._tell_last_word(gen, text, self._last_word(result, voiced_end) if text else None)

    def _last_word(self, result: ASRResult, voiced_end: int) -> LastWord | None:
        """The read's last word against the voice in the buffer it read (None: not timed)."""
        timing = self.transcriber.time_last_word(result)
        if timing is None:
            return None
        return timed_last_word(timing.word, timing.start_s, timing.end_s, timing.probability, voiced_end)

    def _tell_last_word(self, gen: int, text: str, last_word: LastWord | None) -> None:
        """The final's last word to the endpointer (None: not timed, or the final's words are the
        ones kept from before a long pause), and to the waterfall."""
        if not self._is_final_sent or not (text or self._head_text):
            return
        if not text:
            last_word = None  # the final is the words before the pause: their last word was not timed here
        self.book.mark(gen, "last_word_timed", time.monotonic())
        if last_word is not None:
            self.book.set(gen, "last_word", f"{last_word.word} {last_word.start_ms:.0f}-{last_word.end_ms:.0f}"
                          f"/{last_word.voiced_end_ms:.0f} p{last_word.probability:.2f}")
        if self.endpointer is not None:
            self.endpointer.add_last_word(gen, last_word)

    def _is_read_to_the_end(self) -> bool:
        """Whether the last partial's buffer held every voiced frame heard so far."""
        return self._partial is not None and self._partial[0] >= self._voiced_end

    def _send_final(self, gen: int, is_end: bool, text: str, confidence: float | None) -> Iterable[Frame]:
        if self._head_text and text:
            confidence = joined_confidence(self._head_text, self._head_text_logprob, text, confidence)
            text = join_words(self._head_text, text)
        elif self._head_text:
            # Nothing kept of the words after the pause (the guard dropped a lone, noisy "computer"):
            # the words before it are still what was said, not nothing (the turn would go unanswered).
            text, confidence = self._head_text, self._head_text_logprob
        log.debug("final of turn %d (%s, %.2f s of audio): %r (avg log-prob %s)", gen, "end" if is_end else "pause",
                  self._num_samples / RATE, text, confidence)
        if text:
            self._is_final_sent, self._head, self._head_logprob = True, text, confidence
            self.book.mark(gen, "asr_final", time.monotonic())
            if confidence is not None:
                self.book.set(gen, "words_logprob", round(confidence, 3))
            yield Transcript(gen=gen, text=text, is_final=True, avg_logprob=confidence)
        elif is_end:  # VAD heard something, Whisper found no words in it: no turn
            self._is_final_sent = True
            self.book.set(gen, "dropped", "no words recognized")
            yield TurnDone(gen=gen, waterfall=self.book.get(gen))
