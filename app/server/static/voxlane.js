// Voxlane's talking widget: speaks the /ws protocol (docs/protocol.md) from the Gradio page.
// Audio (capture and playback AudioWorklets) lives in voxlane-audio.js; audio moves in 20 ms
// frames instead of Gradio's 100+ ms streaming chunks.
// window.voxlaneStats exposes what happened (for the browser test and for curious users).
(function () {
  "use strict";

  const stats = (window.voxlaneStats = {
    connected: false, state: "idle", ready: null, errors: [], turns: [],
    playedSamples: 0, nonSilentSamples: 0, peak: 0, firstSoundMs: {}, audioChunks: 0,
    interruptions: [], heard: {}, flushAcks: 0,
    pauses: [], // each "playback: pause": the state shown, the samples heard of each turn and the turns finished at that moment
    audio: [], // the last 200 "audio" headers (gen, chunk_index, start_sample, samples, text, sample_rate)
  });
  const MAX_AUDIO_HEADERS = 200;

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // The access token, when the server has one, comes in the page's fragment (#token=…): never
  // sent to the server in a URL, so never in a log. It is taken once and dropped from the address
  // bar; the server's cookie (set by its token page) authorizes the page's own requests.
  const fragmentToken = new URLSearchParams(location.hash.slice(1)).get("token") || "";
  if (fragmentToken) history.replaceState(null, "", location.pathname + location.search);
  function pageToken() { return fragmentToken; }

  class Widget {
    constructor(root) {
      this.root = root;
      this.personas = JSON.parse(root.dataset.personas || "[]");
      this.persona = root.dataset.defaultPersona || this.personas[0] || "";
      this.ws = null;
      this.audio = null; // VoxlaneAudio (voxlane-audio.js), made at the first connect
      this.started = null; // a Promise while connecting/connected
      this.talking = false;
      this.handsFree = false;
      this.serverState = "idle";
      this.buffered = 0;
      this.paused = false;
      this.minGen = 0;
      this.pendingAudio = null; // the "audio" header whose PCM is the next binary message
      this.userBubbles = {};
      this.botBubbles = {};
      this.pendingTyped = null;
      this.endOfSpeechAt = {}; // gen -> performance.now() when the user's turn ended
      this.lastHeard = {};
      this.build();
    }

    build() {
      this.root.textContent = "";
      const box = el("div", { class: "vx" });
      const top = el("div", { class: "vx-top" });
      this.stateEl = el("span", { id: "vx-state", class: "vx-state", "data-state": "idle" }, "idle");
      const label = el("label", { class: "vx-persona-label" }, "Persona ");
      this.select = el("select", { id: "vx-persona" });
      for (const name of this.personas) {
        const option = el("option", { value: name }, name);
        if (name === this.persona) option.selected = true;
        this.select.appendChild(option);
      }
      label.appendChild(this.select);
      top.append(this.stateEl, label);
      this.chat = el("div", { id: "vx-chat", class: "vx-chat", "aria-live": "polite" });
      const controls = el("div", { class: "vx-controls" });
      this.talkBtn = el("button", { id: "vx-talk", class: "vx-btn vx-primary", type: "button" }, "Hold to talk");
      this.handsBtn = el("button", { id: "vx-hands", class: "vx-btn", type: "button", "aria-pressed": "false" }, "Hands-free: off");
      this.stopBtn = el("button", { id: "vx-stop", class: "vx-btn", type: "button" }, "Stop");
      controls.append(this.talkBtn, this.handsBtn, this.stopBtn);
      const form = el("form", { class: "vx-text" });
      this.input = el("input", { id: "vx-input", type: "text", placeholder: "…or type a message", autocomplete: "off" });
      form.append(this.input, el("button", { class: "vx-btn", type: "submit" }, "Send"));
      this.status = el("div", { id: "vx-status", class: "vx-status" }, "Press “Hold to talk”, “Hands-free” or type to start.");
      const latency = el("div", { class: "vx-latency" });
      latency.append(el("div", { class: "vx-latency-title" }, "Latency (last turn)"));
      this.waterfall = el("div", { id: "vx-waterfall", class: "vx-waterfall" }, "no turn yet");
      latency.append(this.waterfall);
      box.append(top, this.chat, controls, form, this.status, latency);
      this.root.appendChild(box);

      const press = (e) => { e.preventDefault(); this.startTalking(); };
      const release = () => this.stopTalking();
      this.talkBtn.addEventListener("pointerdown", press);
      this.talkBtn.addEventListener("pointerup", release);
      this.talkBtn.addEventListener("pointerleave", release);
      document.addEventListener("keydown", (e) => {
        if (e.code === "Space" && !e.repeat && document.activeElement === document.body) press(e);
      });
      document.addEventListener("keyup", (e) => { if (e.code === "Space") release(); });
      this.handsBtn.addEventListener("click", () => this.toggleHandsFree());
      this.stopBtn.addEventListener("click", () => this.interrupt());
      this.select.addEventListener("change", () => this.setPersona(this.select.value));
      form.addEventListener("submit", (e) => { e.preventDefault(); this.sendText(this.input.value); });
    }

    // --- connection --------------------------------------------------------------------------
    ensureStarted() {
      if (!this.started) this.started = this.connect().catch((err) => {
        this.started = null;
        this.showError("connect", String(err && err.message || err));
        throw err;
      });
      return this.started;
    }

    async connect() {
      this.setStatus("Starting audio…");
      this.audio = new window.VoxlaneAudio((frame) => this.onMicFrame(frame), (m) => this.onPlayback(m));
      if (!(await this.audio.start())) this.setStatus("No microphone (" + this.audio.micError + "): you can still type.");
      const token = pageToken();
      const scheme = location.protocol === "https:" ? "wss://" : "ws://";
      this.ws = new WebSocket(scheme + location.host + "/ws");
      this.ws.binaryType = "arraybuffer";
      await new Promise((resolve, reject) => {
        this.ws.onopen = () => this.ws.send(JSON.stringify({
          type: "start", version: 1, sample_rate: this.audio.sampleRate, format: "pcm16",
          persona: this.persona, token: token }));
        this.ws.onerror = () => reject(new Error("WebSocket error"));
        this.ws.onclose = (e) => { this.onClose(e); reject(new Error("closed: " + e.code + " " + e.reason)); };
        this.ws.onmessage = (e) => {
          if (typeof e.data === "string" && JSON.parse(e.data).type === "ready") resolve();
          this.onMessage(e);
        };
      });
      this.setStatus("Connected.");
    }

    onClose(e) {
      stats.connected = false;
      this.started = null;
      this.setState("idle");
      this.setStatus("Disconnected (" + e.code + (e.reason ? ": " + e.reason : "") + "). Press a button to reconnect.");
    }

    // --- input ---------------------------------------------------------------------------------
    onMicFrame(floats) {
      if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return;
      // Frames flow all the time: silence (zeros) when not capturing, so the server's VAD sees the
      // end of a held-to-talk turn at once and its clock never stalls.
      const live = this.talking || this.handsFree;
      const frame = live ? window.VoxlaneAudio.toPcm16(floats) : { pcm: new Int16Array(floats.length), rms: 0 };
      // The browser's own "the user stopped talking" clock, for voice-to-voice latency: the
      // server's speech_ended message arrives only after its silence wait and transcription.
      if (frame.rms > 0.01) this.lastVoiceAt = performance.now();
      this.ws.send(frame.pcm.buffer);
    }

    async startTalking() {
      await this.ensureStarted();
      if (this.isSpeaking()) this.interrupt(); // pressing to talk is a barge-in
      this.talking = true;
      this.talkBtn.classList.add("vx-active");
      this.render();
    }

    stopTalking() {
      if (!this.talking) return;
      this.talking = false;
      this.talkBtn.classList.remove("vx-active");
      this.render();
    }

    async toggleHandsFree() {
      await this.ensureStarted();
      this.handsFree = !this.handsFree;
      this.handsBtn.textContent = "Hands-free: " + (this.handsFree ? "on" : "off");
      this.handsBtn.setAttribute("aria-pressed", String(this.handsFree));
      this.handsBtn.classList.toggle("vx-active", this.handsFree);
      this.render();
    }

    interrupt() {
      if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify({ type: "interrupt" }));
      this.flush(Infinity);
    }

    async sendText(text) {
      text = (text || "").trim();
      if (!text) return;
      await this.ensureStarted();
      this.input.value = "";
      this.pendingTyped = this.bubble("user", text);
      this.typedAt = performance.now();
      this.ws.send(JSON.stringify({ type: "text", text: text }));
    }

    setPersona(name) {
      this.persona = name;
      if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify({ type: "persona", persona: name }));
    }

    // --- output --------------------------------------------------------------------------------
    onMessage(e) {
      if (typeof e.data !== "string") return this.onAudio(e.data);
      const m = JSON.parse(e.data);
      switch (m.type) {
        case "ready":
          stats.connected = true; stats.ready = m;
          break;
        case "state":
          this.serverState = m.state; this.render();
          break;
        case "vad":
          if (m.event === "speech_started") this.userBubble(m.gen, "…", true);
          if (m.event === "speech_ended") this.endOfSpeechAt[m.gen] = this.lastVoiceAt || performance.now();
          break;
        case "end_of_turn":
          // "semantic" endpointing read a pause: an unfinished sentence is waited for, so say so.
          stats.lastEndOfTurn = m;
          if (!m.complete) this.setStatus("Sounds unfinished: listening for the rest (up to " + (m.end_silence_ms / 1000).toFixed(1) + " s).");
          break;
        case "transcript": {
          const b = this.userBubble(m.gen, m.text, !m.final);
          if (m.final) stats.lastTranscript = m.text;
          if (m.final && !m.text) b.classList.add("vx-empty");
          break;
        }
        case "assistant_delta": {
          const b = this.botBubble(m.gen);
          b.textContent += m.text;
          stats.lastReply = b.textContent;
          this.chat.scrollTop = this.chat.scrollHeight;
          break;
        }
        case "assistant_done":
          if (m.interrupted) this.botBubble(m.gen).classList.add("vx-interrupted");
          break;
        case "audio":
          this.pendingAudio = m;
          stats.audio.push(m);
          if (stats.audio.length > MAX_AUDIO_HEADERS) stats.audio.shift();
          break;
        case "interrupted":
          stats.interruptions.push({ gen: m.gen, reason: m.reason, hadAudio: this.buffered > 0 }); // paused or playing
          // An interruption ends any pause: the old turn's audio is dropped, the new turn's plays.
          this.paused = false;
          this.audio.setPaused(false);
          this.flush(m.gen);
          for (const gen of Object.keys(this.botBubbles)) if (+gen < m.gen) this.botBubbles[gen].classList.add("vx-interrupted");
          break;
        case "playback":
          if (m.action === "pause") stats.pauses.push({ gen: m.gen, state: stats.state, heard: Object.assign({}, stats.heard),
                                                 finished: stats.turns.map(t => t.gen) });
          this.paused = m.action === "pause";
          this.audio.setPaused(this.paused);
          this.render();
          break;
        case "turn":
          // A spoken notice (the apology for a stalled turn) has no timings of its own: keep the last turn's.
          if (!((m.waterfall || {}).counts || {}).notice) this.showWaterfall(m.gen, m.waterfall);
          break;
        case "persona":
          this.setStatus("Persona " + m.persona + " from your next turn.");
          break;
        case "error":
          this.showError(m.code, m.message);
          break;
      }
    }

    onAudio(buffer) {
      const header = this.pendingAudio;
      this.pendingAudio = null;
      if (!header || header.gen < this.minGen) return; // a turn that was interrupted: never play it
      if (this.typedAt && this.endOfSpeechAt[header.gen] === undefined) {
        this.endOfSpeechAt[header.gen] = this.typedAt; this.typedAt = null;
      }
      stats.audioChunks++;
      this.audio.push(buffer, header.sample_rate, header.gen);
    }

    flush(keepGen) {
      this.minGen = Math.max(this.minGen, keepGen === Infinity ? (this.lastGen || 0) + 1 : keepGen);
      if (this.audio) this.audio.flush(this.minGen);
      this.buffered = 0;
      this.render();
    }

    onPlayback(m) {
      if (m.type === "sound") {
        const t0 = this.endOfSpeechAt[m.gen];
        if (t0 !== undefined) stats.firstSoundMs[m.gen] = Math.round(performance.now() - t0);
        // The turn's waterfall usually arrives before its sound is heard: redraw it with this.
        if (this.lastTurn && this.lastTurn.gen === m.gen) this.showWaterfall(m.gen, this.lastTurn.waterfall, true);
        return;
      }
      Object.assign(stats, { playedSamples: m.stats.playedSamples, nonSilentSamples: m.stats.nonSilentSamples,
                             peak: m.stats.peak, heard: m.heard });
      if (m.flushed) stats.flushAcks++; // the worklet has dropped the audio: heard is final for old turns
      this.buffered = m.buffered;
      // Tell the server what the user actually heard: the history keeps only that if they interrupt.
      for (const [gen, samples] of Object.entries(m.heard)) {
        const heard = Math.round(samples);
        if (this.lastHeard[gen] !== heard && this.ws && this.ws.readyState === WebSocket.OPEN) {
          this.lastHeard[gen] = heard;
          this.ws.send(JSON.stringify({ type: "played", gen: +gen, samples: heard }));
        }
      }
      this.render();
    }

    isSpeaking() { return this.buffered > 0 && !this.paused; }

    // --- view ----------------------------------------------------------------------------------
    render() {
      let state = this.serverState;
      if (!stats.connected) state = "idle";
      else if (this.isSpeaking()) state = "speaking";
      else if (this.talking) state = "listening";
      else if (state === "speaking") state = "listening"; // the server sent it all and we played it all
      this.setState(state);
    }

    setState(state) {
      if (stats.state === state) return;
      stats.state = state;
      this.stateEl.dataset.state = state;
      const labels = { idle: "idle", listening: this.handsFree || this.talking ? "listening…" : "ready",
                       thinking: "thinking…", speaking: "speaking" };
      this.stateEl.textContent = labels[state] || state;
    }

    bubble(role, text, partial) {
      const b = el("div", { class: "vx-msg vx-" + role + (partial ? " vx-partial" : "") }, text);
      this.chat.appendChild(b);
      this.chat.scrollTop = this.chat.scrollHeight;
      return b;
    }

    userBubble(gen, text, partial) {
      this.lastGen = Math.max(this.lastGen || 0, gen);
      let b = this.userBubbles[gen];
      if (!b && this.pendingTyped) { b = this.pendingTyped; this.pendingTyped = null; return (this.userBubbles[gen] = b); }
      if (!b) {
        // The user went on after a pause (a new gen, reason "resume"): the same utterance, so the
        // same bubble — never leave an abandoned "…" behind.
        for (const [old, bubble] of Object.entries(this.userBubbles)) {
          if (+old < gen && bubble.classList.contains("vx-partial")) { b = bubble; delete this.userBubbles[old]; }
        }
        if (b) this.userBubbles[gen] = b;
      }
      if (!b) b = this.userBubbles[gen] = this.bubble("user", "", true);
      b.textContent = text;
      b.classList.toggle("vx-partial", !!partial);
      return b;
    }

    botBubble(gen) {
      this.lastGen = Math.max(this.lastGen || 0, gen);
      if (this.pendingTyped) { this.userBubbles[gen] = this.pendingTyped; this.pendingTyped = null; }
      if (!this.botBubbles[gen]) this.botBubbles[gen] = this.bubble("assistant", "");
      return this.botBubbles[gen];
    }

    showWaterfall(gen, w, isRedraw) {
      const row = { gen: gen, waterfall: w, browser_first_sound_ms: stats.firstSoundMs[gen] };
      if (isRedraw && stats.turns.length) stats.turns[stats.turns.length - 1] = row;
      else stats.turns.push(row);
      this.lastTurn = row;
      this.waterfall.textContent = "";
      // w.ms: milliseconds of each stage mark from the turn's origin (end of speech, or the typed text)
      const marks = Object.entries((w && w.ms) || {}).filter(([k, v]) => typeof v === "number" && v >= 0);
      if (row.browser_first_sound_ms !== undefined) marks.push(["first sound here (browser)", row.browser_first_sound_ms]);
      const max = Math.max(1, ...marks.map(([, v]) => v));
      for (const [name, value] of marks) {
        const line = el("div", { class: "vx-bar-row" });
        const bar = el("div", { class: "vx-bar" });
        bar.style.width = Math.max(1, (100 * value) / max) + "%";
        line.append(el("span", { class: "vx-bar-label" }, name.replace(/_/g, " ")),
                    el("span", { class: "vx-bar-track" }), el("span", { class: "vx-bar-value" }, Math.round(value) + " ms"));
        line.children[1].appendChild(bar);
        this.waterfall.appendChild(line);
      }
      if (!marks.length) this.waterfall.textContent = "no timings for this turn";
    }

    setStatus(text) { this.status.textContent = text; }

    showError(code, message) {
      stats.errors.push({ code: code, message: message });
      this.setStatus("Error (" + code + "): " + message);
    }
  }

  function mount() {
    const root = document.getElementById("vx-root");
    if (!root) return setTimeout(mount, 100); // Gradio renders the page after this script loads
    if (root.dataset.mounted) return;
    root.dataset.mounted = "1";
    window.voxlaneWidget = new Widget(root);
  }
  mount();
})();
