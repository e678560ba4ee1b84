// AudioWorklet processor: microphone floats → mono int16 frames of a fixed size, posted to
// the page (which sends each as one binary WebSocket message). Runs on the audio thread.
//
// processorOptions: frameSamples (per frame, at the rate sent) and decimation (1, or the
// whole factor a device rate above the bridge's 48 kHz is divided by: 96 kHz → 48 kHz).

// A windowed-sinc low-pass before keeping every `factor`-th sample, so that what lies above
// the new Nyquist frequency does not fold back into the band kept.
function lowPassTaps(factor) {
  const length = 16 * factor + 1;
  const cutoff = 0.45 / factor; // in cycles per input sample: a little below the new Nyquist
  const middle = (length - 1) / 2;
  const taps = new Float32Array(length);
  let sum = 0;
  for (let i = 0; i < length; i++) {
    const x = i - middle;
    const sinc = x === 0 ? 2 * cutoff : Math.sin(2 * Math.PI * cutoff * x) / (Math.PI * x);
    const blackman =
      0.42 - 0.5 * Math.cos((2 * Math.PI * i) / (length - 1)) + 0.08 * Math.cos((4 * Math.PI * i) / (length - 1));
    taps[i] = sinc * blackman;
    sum += taps[i];
  }
  for (let i = 0; i < length; i++) taps[i] /= sum; // unity gain at 0 Hz
  return taps;
}

class Decimator {
  constructor(factor) {
    this.factor = factor;
    this.taps = lowPassTaps(factor);
    this.history = new Float32Array(this.taps.length); // the last input samples, a ring
    this.at = 0;
    this.phase = 0;
  }

  // one input sample in; an output sample, or null between outputs
  push(sample) {
    const { history, taps } = this;
    history[this.at] = sample;
    this.at = (this.at + 1) % history.length;
    if (++this.phase < this.factor) return null;
    this.phase = 0;
    let acc = 0;
    for (let k = 0, i = this.at; k < taps.length; k++, i = i + 1 === history.length ? 0 : i + 1) {
      acc += taps[k] * history[i];
    }
    return acc;
  }
}

class PcmCapture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { frameSamples, decimation = 1 } = options.processorOptions;
    this.size = frameSamples;
    this.decimator = decimation > 1 ? new Decimator(decimation) : null;
    this.frame = new Int16Array(this.size);
    this.n = 0;
    this.sumSquares = 0;
  }

  process(inputs) {
    const channels = inputs[0];
    if (channels && channels.length) {
      const length = channels[0].length;
      for (let i = 0; i < length; i++) {
        let s = 0;
        for (let c = 0; c < channels.length; c++) s += channels[c][i];
        s /= channels.length;
        if (this.decimator) {
          s = this.decimator.push(s);
          if (s === null) continue;
        }
        this.add(Math.max(-1, Math.min(1, s)));
      }
    }
    return true; // keep running; the page disconnects the node to stop
  }

  add(s) {
    this.sumSquares += s * s;
    // Int16Array is in the platform's byte order: little-endian on every browser platform
    this.frame[this.n++] = s < 0 ? s * 0x8000 : s * 0x7fff;
    if (this.n === this.size) {
      const level = Math.sqrt(this.sumSquares / this.size);
      this.port.postMessage({ pcm: this.frame.buffer, level }, [this.frame.buffer]);
      this.frame = new Int16Array(this.size);
      this.n = 0;
      this.sumSquares = 0;
    }
  }
}

registerProcessor("pcm-capture", PcmCapture);
