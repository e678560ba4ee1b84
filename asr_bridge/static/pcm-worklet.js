// AudioWorklet processor: microphone floats → mono int16 frames of a fixed size, posted to
// the page (which sends each as one binary WebSocket message). Runs on the audio thread.
class PcmCapture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.size = options.processorOptions.frameSamples;
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
        s = Math.max(-1, Math.min(1, s / channels.length));
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
    return true; // keep running; the page disconnects the node to stop
  }
}

registerProcessor("pcm-capture", PcmCapture);
