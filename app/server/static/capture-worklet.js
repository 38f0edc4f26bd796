// Microphone capture: collects 128-sample render quanta into ~20 ms frames and posts them to the
// page (Float32, at the AudioContext's rate). Runs on the audio thread, so it only copies.
class VoxlaneCapture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.frameSize = Math.round(sampleRate / 50); // 20 ms: small frames keep the VAD responsive
    this.buffer = new Float32Array(this.frameSize);
    this.filled = 0;
  }
  process(inputs) {
    const input = inputs[0];
    if (input && input.length > 0) {
      const channel = input[0];
      let offset = 0;
      while (offset < channel.length) {
        const n = Math.min(channel.length - offset, this.frameSize - this.filled);
        this.buffer.set(channel.subarray(offset, offset + n), this.filled);
        this.filled += n;
        offset += n;
        if (this.filled === this.frameSize) {
          this.port.postMessage(this.buffer.slice(0));
          this.filled = 0;
        }
      }
    }
    return true;
  }
}
registerProcessor("voxlane-capture", VoxlaneCapture);
