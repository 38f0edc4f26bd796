// Assistant playback: a queue of chunks (already at the AudioContext's rate) played back to back.
// "flush" drops everything queued at once (barge-in); "pause"/"resume" hold playback while the
// server decides whether a sound was the user speaking or a blip. Reports what was played, so the
// page can tell the server what the user actually heard and measure first-audio latency.
class VoxlanePlayback extends AudioWorkletProcessor {
  constructor() {
    super();
    this.queue = []; // {samples: Float32Array, gen, sourceSamples, offset}
    this.paused = false;
    this.stats = { playedSamples: 0, nonSilentSamples: 0, peak: 0 };
    this.heard = {}; // gen -> samples played, in the source (TTS) rate
    this.lastReport = 0;
    this.announced = new Set();
    this.port.onmessage = (event) => {
      const m = event.data;
      if (m.type === "push") this.queue.push({ samples: m.samples, gen: m.gen, ratio: m.ratio, offset: 0 });
      else if (m.type === "flush") {
        this.queue = m.keepGen === undefined ? [] : this.queue.filter((c) => c.gen >= m.keepGen);
        this.flushed = true; // report at once: the page learns exactly what was heard before the stop
      }
      else if (m.type === "pause") this.paused = true;
      else if (m.type === "resume") this.paused = false;
    };
  }
  process(inputs, outputs) {
    const out = outputs[0][0];
    out.fill(0);
    let written = 0;
    let firstGen = null;
    while (!this.paused && written < out.length && this.queue.length > 0) {
      const chunk = this.queue[0];
      const n = Math.min(out.length - written, chunk.samples.length - chunk.offset);
      out.set(chunk.samples.subarray(chunk.offset, chunk.offset + n), written);
      chunk.offset += n;
      written += n;
      this.heard[chunk.gen] = (this.heard[chunk.gen] || 0) + n / chunk.ratio;
      if (firstGen === null) firstGen = chunk.gen;
      if (chunk.offset >= chunk.samples.length) this.queue.shift();
    }
    for (let i = 1; i < outputs[0].length; i++) outputs[0][i].set(out);
    let nonSilent = 0;
    for (let i = 0; i < written; i++) {
      const a = Math.abs(out[i]);
      if (a > 1e-3) nonSilent++;
      if (a > this.stats.peak) this.stats.peak = a;
    }
    this.stats.playedSamples += written;
    this.stats.nonSilentSamples += nonSilent;
    if (nonSilent > 0 && firstGen !== null && !this.announced.has(firstGen)) {
      this.announced.add(firstGen); // once per turn: the moment its first sound reached the speakers
      this.port.postMessage({ type: "sound", gen: firstGen });
    }
    if (this.flushed || currentTime - this.lastReport > 0.1) {
      this.lastReport = currentTime;
      let buffered = 0;
      for (const c of this.queue) buffered += c.samples.length - c.offset;
      this.port.postMessage({ type: "stats", stats: this.stats, heard: this.heard, buffered: buffered,
                              paused: this.paused, flushed: this.flushed });
      this.flushed = false;
    }
    return true;
  }
}
registerProcessor("voxlane-playback", VoxlanePlayback);
