// The page: microphone → AudioWorklet → int16 frames over a WebSocket to asr-bridge, and the
// bridge's JSON events (docs/websocket-protocol.md) → partials and finals on screen.
const $ = (id) => document.getElementById(id);
const FRAME_MS = 50;
const BEHIND_S = 0.5; // unsent audio above this shows "falling behind"
const GIVE_UP_S = 30; // and above this the session is stopped: memory must not grow forever
const WANT_RATE = 16000; // what the recognizer uses; the browser resamples well
const MAX_RATE = 48000; // the highest rate the bridge takes
const SUBPROTOCOL_TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/; // what a subprotocol may hold (RFC 6455)

let session = null;

function setState(state, label = state) {
  document.body.dataset.state = state;
  $("state").textContent = label;
}

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = !text;
}

function setButtons(running) {
  $("start").disabled = running;
  $("stop").disabled = !running;
  $("finalize").disabled = !running;
  $("endpointing").disabled = running; // a session's endpointing is set when it starts
}

async function openAudio() {
  const media = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: false, autoGainControl: true },
  });
  let ctx;
  try {
    let source;
    try {
      // Asking for 16 kHz lets the browser resample with a proper filter and sends 3× less.
      ctx = new AudioContext({ sampleRate: WANT_RATE });
      source = ctx.createMediaStreamSource(media);
    } catch {
      // Some browsers cannot connect a microphone to a context at another rate: take the
      // device rate instead; the server resamples what the worklet brings within its range.
      await ctx?.close();
      ctx = new AudioContext();
      source = ctx.createMediaStreamSource(media);
    }
    const decimation = decimationFor(ctx.sampleRate);
    const rate = Math.round(ctx.sampleRate / decimation);
    await ctx.audioWorklet.addModule("/static/pcm-worklet.js");
    const node = new AudioWorkletNode(ctx, "pcm-capture", {
      processorOptions: { frameSamples: Math.round((rate * FRAME_MS) / 1000), decimation },
    });
    source.connect(node);
    node.connect(ctx.destination); // outputs silence; being connected keeps the node pulled
    return { media, ctx, node, rate };
  } catch (err) {
    // nothing else holds them: a live microphone (and its indicator) would outlast the page's error
    media.getTracks().forEach((t) => t.stop());
    ctx?.close();
    throw err;
  }
}

// The bridge and server take 8–48 kHz: a device rate above (96 kHz, 88.2 kHz, 192 kHz) is
// divided by the smallest whole factor that brings it within, in the worklet.
function decimationFor(deviceRate) {
  return Math.max(1, Math.ceil(deviceRate / MAX_RATE));
}

function closeAudio(audio) {
  if (!audio) return;
  audio.node.port.onmessage = null;
  audio.node.disconnect();
  audio.media.getTracks().forEach((t) => t.stop());
  audio.ctx.close();
  $("level").style.width = "0";
}

function wsUrl() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}/ws`;
}

async function start() {
  showError("");
  setButtons(true);
  setState("connecting");
  // turnEnds: end_of_turn events by utterance, shown on the final that follows them
  // finalizing: finalizes sent and not yet acknowledged
  // shown: this session's finals by utterance (ids start again at 0 in each session, so
  // the page's earlier finals are not looked among)
  const s = { ws: null, audio: null, rate: 0, failed: false, stopping: false, turnEnds: new Map(), shown: new Map(), finalizing: 0 };
  session = s;
  let audio;
  try {
    audio = await openAudio(); // the permission prompt may be open for a long while
  } catch (err) {
    if (current(s)) fail(s, `Microphone unavailable: ${err.message || err}`);
    return;
  }
  if (!current(s)) {
    // Stop (or another Start) came while we waited: this session is over before it began
    closeAudio(audio);
    return;
  }
  s.audio = audio;
  s.rate = audio.rate;
  $("rate").textContent = `${s.rate / 1000} kHz`;
  let ws;
  try {
    ws = openSocket($("token").value.trim());
  } catch (err) {
    fail(s, `Cannot connect: ${err.message || err}`); // (and the microphone goes off)
    return;
  }
  ws.binaryType = "arraybuffer";
  s.ws = ws;
  ws.onopen = () => {
    if (!current(s)) return;
    ws.send(JSON.stringify({ type: "start", sample_rate: s.rate, endpointing: $("endpointing").value }));
    s.audio.node.port.onmessage = (e) => sendFrame(s, e.data);
  };
  ws.onmessage = (e) => current(s) && onEvent(s, JSON.parse(e.data));
  ws.onclose = (e) => current(s) && onClose(s, e);
}

// A session still the page's own: the handlers of one stopped or replaced do nothing.
function current(s) {
  return session === s && !s.failed;
}

function openSocket(token) {
  // The token rides as a subprotocol, so it never appears in a URL or an access log. A
  // subprotocol cannot hold every character ("/", "=" of base64, a space): such a token
  // goes in the query instead, which the bridge takes as well.
  if (!token || SUBPROTOCOL_TOKEN.test(token)) {
    return new WebSocket(wsUrl(), ["streamasr.v1", ...(token ? [`bearer.${token}`] : [])]);
  }
  return new WebSocket(`${wsUrl()}?token=${encodeURIComponent(token)}`, ["streamasr.v1"]);
}

function sendFrame(s, { pcm, level }) {
  $("level").style.width = `${Math.min(100, level * 400)}%`;
  if (s.ws.readyState !== WebSocket.OPEN || s.stopping) return;
  // bufferedAmount is what the browser could not hand to the network yet: the bridge
  // stops reading when the server pushes back, so this is where falling behind shows.
  const behind = s.ws.bufferedAmount / (s.rate * 2);
  s.ws.send(pcm);
  $("buffered").textContent = `${behind.toFixed(1)} s`;
  if (behind > GIVE_UP_S) {
    fail(s, `Cannot keep up: ${behind.toFixed(0)} s of audio waiting to be sent.`);
  } else if (behind > BEHIND_S) {
    setState("behind", `falling behind (${behind.toFixed(1)} s)`);
  } else if (document.body.dataset.state === "behind") {
    setState("listening", "listening");
  }
}

function onEvent(s, ev) {
  if (ev.lag_s !== undefined) $("lag").textContent = `${ev.lag_s.toFixed(2)} s`;
  switch (ev.type) {
    case "ready": // (after a Stop it is "finishing…" until closed)
      if (document.body.dataset.state === "connecting" && !s.stopping) setState("listening");
      break;
    case "speech_started":
      if (!s.stopping) setState("speech", "speech");
      break;
    case "speech_ended":
      if (!s.stopping) setState("listening");
      break;
    case "partial":
      showPartial(ev.stable_text, ev.unstable_text);
      break;
    case "end_of_turn": { // semantic endpointing: the turn's final follows (or came first)
      const shown = s.shown.get(ev.utterance_id);
      if (shown) addBadge(shown, `end of turn · ${turnLabel(ev)}`);
      else s.turnEnds.set(ev.utterance_id, ev);
      $("turn").textContent = turnLabel(ev);
      break;
    }
    case "final":
      s.shown.set(ev.utterance_id, addFinal(ev, s.turnEnds.get(ev.utterance_id)));
      s.turnEnds.delete(ev.utterance_id);
      break;
    case "finalized": // every result for the audio before our finalize is here
      s.finalizing -= 1;
      $("finalized").textContent = s.finalizing > 0 ? "waiting…" : "done";
      break;
    case "no_words":
      showPartial("", ""); // a noise's partial: no final will replace it
      s.turnEnds.delete(ev.utterance_id);
      break;
    case "reconnecting": // the bridge lost the server: results pause, the audio is kept
      if (!s.stopping) setState("reconnecting", "reconnecting…");
      break;
    case "resumed": // on a new server: nothing was lost
      if (!s.stopping && document.body.dataset.state === "reconnecting") setState("listening");
      break;
    case "error":
      fail(s, `${ev.code}: ${ev.message}`);
      break;
    case "closed":
      setState("idle", "finished");
      break;
  }
}

function showPartial(stable, unstable) {
  $("placeholder").hidden = true;
  $("partial").querySelector(".stable").textContent = stable;
  // the server's text is stable_text + " " + unstable_text
  $("partial").querySelector(".unstable").textContent = stable && unstable ? ` ${unstable}` : unstable;
}

function turnLabel(turnEnd) {
  switch (turnEnd.reason) {
    case "model":
      return `model, ${Math.round(turnEnd.probability * 100)} % sure`;
    case "max_silence":
      return "longest pause";
    case "finalize":
      return "finalize";
    case "end_of_audio":
      return "end of audio";
    default:
      return "the server"; // one that predates the reason
  }
}

const UNSURE_BELOW = 0.6; // a final's confidence under which the page marks it

function addFinal(ev, turnEnd) {
  showPartial("", "");
  if (!ev.text.trim()) return null;
  const p = document.createElement("p");
  p.className = "final";
  p.dataset.utterance = ev.utterance_id;
  const t = document.createElement("time");
  t.textContent = `${ev.start_s.toFixed(1)}s`;
  p.append(t, ev.text.trim());
  // how sure the model is of the words: on hover, and finals it doubts are set apart
  // (bench/confidence_bench.py: with tiny.en the least sure quarter, below about 0.6 on
  // clean audio, holds most of the errors)
  if (ev.confidence) {
    p.title = `confidence ${Math.round(ev.confidence * 100)} %`;
    if (ev.confidence < UNSURE_BELOW) p.classList.add("unsure");
  }
  // why it ended, where that says more than a pause: the turn model, or our finalize
  const why = turnEnd ? `end of turn · ${turnLabel(turnEnd)}` : ev.from_finalize ? "finalized" : "";
  if (why) addBadge(p, why);
  $("finals").append(p);
  return p;
}

// A session that ends on an error or a close leaves its last partial without the final
// that would have replaced it: kept with the finals (those words were heard), marked as
// never made final, instead of staying on screen as if still being heard.
function keepUnfinishedPartial() {
  const text = $("partial").innerText.trim();
  if (!text) return; // (and the hint stays, on a page that has shown nothing yet)
  showPartial("", "");
  const p = document.createElement("p");
  p.className = "final unfinished";
  p.append(text);
  addBadge(p, "not final: the session ended");
  $("finals").append(p);
}

function addBadge(paragraph, text) {
  const badge = document.createElement("span");
  badge.className = "turn";
  badge.textContent = text;
  paragraph.append(badge);
}

function finalize() {
  const s = session;
  if (!s || s.stopping || !s.ws || s.ws.readyState !== WebSocket.OPEN) return;
  s.ws.send(JSON.stringify({ type: "finalize" })); // its final, then "finalized", follow
  s.finalizing += 1;
  $("finalized").textContent = "waiting…";
}

function fail(s, text) {
  s.failed = true;
  showError(text);
  setState("error");
  teardown(s);
}

function stop() {
  const s = session;
  if (!s) return;
  s.stopping = true;
  closeAudio(s.audio);
  s.audio = null;
  $("stop").disabled = true;
  if (s.ws && s.ws.readyState === WebSocket.OPEN) {
    setState("connecting", "finishing…");
    s.ws.send(JSON.stringify({ type: "stop" })); // the bridge sends the last finals, then closes
  } else {
    teardown(s);
    setState("idle");
  }
}

function onClose(s, e) {
  // after Stop any close is the end we asked for (1000 once the last finals are in, or
  // 1006 when Stop came before the socket was open)
  if (!s.stopping && e.code !== 1000) {
    fail(s, `Connection closed (${e.code}${e.reason ? `: ${e.reason}` : ""}).`);
    return;
  }
  setState("idle", s.stopping ? "finished" : "closed");
  teardown(s);
}

function teardown(s) {
  keepUnfinishedPartial();
  closeAudio(s.audio);
  s.audio = null;
  if (s.ws && s.ws.readyState <= WebSocket.OPEN) s.ws.close();
  if (session === s) {
    session = null;
    setButtons(false);
  }
}

$("start").addEventListener("click", start);
$("stop").addEventListener("click", stop);
$("finalize").addEventListener("click", finalize);
// A token can be handed over in the URL's fragment (#token=…), which is never sent to a
// server. Read as written (URLSearchParams would turn a "+" into a space), then taken out of
// the address bar and history, where anyone looking over a shoulder or at the history reads it.
function takeTokenFromFragment() {
  const parts = location.hash.slice(1).split("&");
  const at = parts.findIndex((p) => p.startsWith("token="));
  if (at < 0) return;
  const raw = parts[at].slice("token=".length);
  let token = raw;
  try {
    token = decodeURIComponent(raw);
  } catch {
    // a lone "%": the token as it stands
  }
  if (token) $("token").value = token;
  parts.splice(at, 1);
  const rest = parts.join("&");
  history.replaceState(history.state, "", `${location.pathname}${location.search}${rest ? `#${rest}` : ""}`);
}
takeTokenFromFragment();
