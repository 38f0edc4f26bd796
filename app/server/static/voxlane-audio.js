// Voxlane's browser audio: microphone capture and assistant playback in AudioWorklets
// (capture-worklet.js, playback-worklet.js) and the PCM16 conversions the /ws protocol needs.
// No protocol and no DOM here: voxlane.js is the widget that uses it.
(function () {
  "use strict";

  class VoxlaneAudio {
    // onMicFrame(Float32Array of ~20 ms at sampleRate); onPlayback(message from the playback worklet)
    constructor(onMicFrame, onPlayback) {
      this.onMicFrame = onMicFrame;
      this.onPlayback = onPlayback;
      this.ctx = null;
      this.player = null;
    }

    get sampleRate() { return this.ctx.sampleRate; }

    // Starts the audio graph; resolves to false when there is no usable microphone (typing and
    // listening still work).
    async start() {
      this.ctx = new AudioContext({ latencyHint: "interactive" });
      await this.ctx.resume();
      await this.ctx.audioWorklet.addModule("/static/capture-worklet.js");
      await this.ctx.audioWorklet.addModule("/static/playback-worklet.js");
      this.player = new AudioWorkletNode(this.ctx, "voxlane-playback", { outputChannelCount: [1] });
      this.player.connect(this.ctx.destination);
      this.player.port.onmessage = (e) => this.onPlayback(e.data);
      let stream;
      try {
        stream = await navigator.mediaDevices.getUserMedia({
          // The browser's echo canceller uses what this page plays as its reference: with open
          // speakers the assistant does not hear (and answer) itself.
          audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
        });
      } catch (err) {
        this.micError = err.name;
        return false;
      }
      const source = this.ctx.createMediaStreamSource(stream);
      const capture = new AudioWorkletNode(this.ctx, "voxlane-capture", { numberOfOutputs: 1 });
      const mute = this.ctx.createGain();
      mute.gain.value = 0; // keeps the capture node pulled by the graph without making a sound
      source.connect(capture).connect(mute).connect(this.ctx.destination);
      capture.port.onmessage = (e) => this.onMicFrame(e.data);
      return true;
    }

    // Queue a chunk of assistant audio (PCM16 LE mono at sourceRate) of turn gen.
    push(buffer, sourceRate, gen) {
      const pcm = new Int16Array(buffer);
      const ratio = this.ctx.sampleRate / sourceRate;
      // Linear interpolation to the context's rate: the playback rate always matches the data's.
      const n = Math.floor(pcm.length * ratio);
      const out = new Float32Array(n);
      for (let i = 0; i < n; i++) {
        const x = i / ratio, j = Math.floor(x), f = x - j;
        const a = pcm[j] / 32768, b = (j + 1 < pcm.length ? pcm[j + 1] : pcm[j]) / 32768;
        out[i] = a + (b - a) * f;
      }
      this.player.port.postMessage({ type: "push", samples: out, gen: gen, ratio: ratio }, [out.buffer]);
    }

    // Drop all queued audio of turns older than keepGen, at once (barge-in).
    flush(keepGen) { if (this.player) this.player.port.postMessage({ type: "flush", keepGen: keepGen }); }

    setPaused(isPaused) { if (this.player) this.player.port.postMessage({ type: isPaused ? "pause" : "resume" }); }
  }

  // Float samples -> PCM16 (clipped) and their RMS level.
  VoxlaneAudio.toPcm16 = function (floats) {
    const pcm = new Int16Array(floats.length);
    let energy = 0;
    for (let i = 0; i < floats.length; i++) {
      const s = Math.max(-1, Math.min(1, floats[i]));
      pcm[i] = s < 0 ? s * 32768 : s * 32767;
      energy += s * s;
    }
    return { pcm: pcm, rms: Math.sqrt(energy / Math.max(1, floats.length)) };
  };

  window.VoxlaneAudio = VoxlaneAudio;
})();
