"""The web page in a real browser: headless Debian Chromium, its fake microphone playing a
LibriSpeech recording, through asr-bridge to the real server with the real tiny.en model
and the real turn model (the page's "when the speaker is done" endpointing). The page's
own edge cases (Stop at any moment, a failing audio setup, odd tokens, a 96 kHz device)
run on the fake engine, in one browser shared by those tests.

scripts/test.sh installs what this needs (Debian's ``chromium``, PyPI's ``playwright``;
no browser download); without them the test fails rather than pass unseen. The screenshot
lands in ``test-artifacts/bridge.png``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from asr_bridge.app import RunningBridge
from asr_server.app import RunningServer
from tests.helpers import ROOT, eventually, fake_factory, running_server, silence, tone
from tests.integration.test_client_cli_real import normalized_words, reference

pytestmark = pytest.mark.timeout(120)

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = ROOT / "test-artifacts" / "bridge.png"
SAMPLE_ID = "libri_1089-134691-0001"  # "for a full hour he had paced up and down waiting …"
TOKEN = "browser-test-token"


def playwright_or_fail() -> object:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        async_playwright = None
    if async_playwright is None or not CHROMIUM.exists():
        pytest.fail("needs Debian's chromium and PyPI's playwright (scripts/test.sh installs both)")
    return async_playwright


def fake_microphone_wav(source: Path, out: Path) -> Path:
    """The recording as the 16-bit 48 kHz WAV Chromium's fake capture reads, with silence
    around it so the endpointer finalizes before the file (played once) runs out."""
    import soundfile as sf
    import soxr

    audio, rate = sf.read(str(source), dtype="float32", always_2d=True)
    mono = soxr.resample(audio.mean(axis=1), rate, 48_000)
    padded = np.concatenate([np.zeros(24_000, np.float32), mono, np.zeros(96_000, np.float32)])
    sf.write(str(out), padded, 48_000, subtype="PCM_16")
    return out


async def launch(pw, wav: Path, loop: bool = False):  # type: ignore[no-untyped-def]
    """Headless Chromium whose microphone plays ``wav`` once, or over and over with ``loop``
    (a fresh temporary profile)."""
    return await pw.chromium.launch(
        executable_path=str(CHROMIUM),
        headless=True,
        args=[
            "--no-sandbox",  # CI runs as root
            "--headless",
            "--disable-gpu",
            # the network is closed: keep Chromium from reaching out (and logging refusals)
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--use-fake-ui-for-media-stream",  # grant the microphone without asking
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={wav}" + ("" if loop else "%noloop"),
        ],
    )


@pytest.mark.model
async def test_page_shows_the_words_spoken_into_the_fake_microphone(
    make_server,  # type: ignore[no-untyped-def]
    make_bridge,
    tmp_path: Path,
) -> None:
    async_playwright = playwright_or_fail()
    path, transcript = reference(SAMPLE_ID)
    wav = fake_microphone_wav(path, tmp_path / "mic.wav")
    server = await make_server()  # the real tiny.en model
    bridge = await make_bridge(server.port, token=TOKEN)

    async with async_playwright() as pw:  # type: ignore[operator]
        browser = await launch(pw, wav)
        try:
            page = await browser.new_page(viewport={"width": 900, "height": 640})
            problems: list[str] = []
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.on(
                "console",
                lambda m: (
                    problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None
                ),
            )
            # the token rides in the fragment, which the page sends as a subprotocol
            await page.goto(f"http://127.0.0.1:{bridge.port}/#token={TOKEN}")
            await page.select_option("#endpointing", "semantic")
            await page.click("#start")
            await page.wait_for_function(
                "() => ['listening', 'speech'].includes(document.body.dataset.state)",
                timeout=15_000,
            )
            # the last word of the recording heard: the Finalize button ends the turn there,
            # unless the turn model already has (read sentences often sound unfinished to it)
            await page.wait_for_function(
                "() => /longer/i.test(document.querySelector('#transcript').innerText)",
                timeout=45_000,
            )
            await page.click("#finalize")
            # every finalize is acknowledged, after the results for the audio before it
            await page.wait_for_function(
                "() => document.querySelector('#finalized').innerText === 'done'",
                timeout=30_000,
            )
            finals = await page.inner_text("#finals")
            # the turn's final says how the turn ended (the model, the longest pause, or us)
            badges = await page.eval_on_selector_all(
                ".final .turn", "els => els.map(e => e.innerText)"
            )
            # and how sure the model is of it, on hover
            hovers = await page.eval_on_selector_all(".final", "els => els.map(e => e.title)")
            SCREENSHOT.parent.mkdir(exist_ok=True)
            await page.screenshot(path=str(SCREENSHOT), full_page=True)
            print(f"\nscreenshot: {SCREENSHOT}")

            await page.click("#stop")
            await page.wait_for_function(
                "() => document.body.dataset.state === 'idle'", timeout=15_000
            )
            state_label = await page.inner_text("#state")
            error_shown = await page.is_visible("#error")
        finally:
            await browser.close()

    heard = set(normalized_words(re.sub(r"\d+\.\ds", " ", finals)))  # drop the time stamps
    expected = [w for w in normalized_words(transcript) if len(w) >= 4]
    missing = [w for w in expected if w not in heard]
    assert len(missing) <= 1, f"missing {missing} in {finals!r}"
    assert badges and all(b == "finalized" or b.startswith("end of turn") for b in badges), badges
    assert hovers and all(re.fullmatch(r"confidence \d{1,3} %", h) for h in hovers), hovers
    assert state_label == "finished" and not error_shown
    assert not problems, problems
    assert server.servicer.active == 0


#: Deepgram's browser example, as its documentation and most pages built on it have it:
#: the key as subprotocols, no query, MediaRecorder's WebM/Opus a piece every 250 ms.
#: Only the URL differs. Resolves with what the socket said, once the recording is over.
DEEPGRAM_BROWSER_EXAMPLE = """
async ([url, key, lastWord]) => {
  const mic = await navigator.mediaDevices.getUserMedia({ audio: true });
  const socket = new WebSocket(url, ["token", key]);
  const recorder = new MediaRecorder(mic, { mimeType: "audio/webm" });
  const finals = [];
  const kinds = [];
  return await new Promise((resolve, reject) => {
    recorder.addEventListener("dataavailable", (event) => {
      if (event.data.size > 0 && socket.readyState === 1) socket.send(event.data);
    });
    socket.onopen = () => recorder.start(250);
    socket.onerror = () => reject(new Error("socket error"));
    socket.onmessage = (message) => {
      const received = JSON.parse(message.data);
      kinds.push(received.type);
      if (received.type === "Results" && received.is_final) {
        const transcript = received.channel.alternatives[0].transcript;
        finals.push(transcript);
        if (new RegExp(lastWord, "i").test(transcript)) {
          recorder.stop();  // its last piece goes out, then the stream is closed
          recorder.addEventListener("stop", () =>
            setTimeout(() => socket.send(JSON.stringify({ type: "CloseStream" })), 100));
        }
      }
    };
    socket.onclose = (event) =>
      resolve({ finals, kinds, protocol: socket.protocol, code: event.code,
                mime: recorder.mimeType });
  });
}
"""


@pytest.mark.model
async def test_deepgram_browser_example_streams_webm_from_the_microphone(
    make_server,  # type: ignore[no-untyped-def]
    make_bridge,
    tmp_path: Path,
) -> None:
    """Deepgram's browser example, unchanged but for the URL, in Debian's Chromium: its
    MediaRecorder's WebM/Opus from the fake microphone through /v1/listen to tiny.en."""
    async_playwright = playwright_or_fail()
    path, transcript = reference(SAMPLE_ID)
    wav = fake_microphone_wav(path, tmp_path / "mic.wav")
    server = await make_server()
    bridge = await make_bridge(server.port, token=TOKEN)
    async with async_playwright() as pw:  # type: ignore[operator]
        browser = await launch(pw, wav)
        try:
            page = await browser.new_page()
            problems: list[str] = []
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            # a page of the bridge's own origin (the bridge refuses others by default)
            await page.goto(f"http://127.0.0.1:{bridge.port}/")
            said = await page.evaluate(
                DEEPGRAM_BROWSER_EXAMPLE,
                [f"ws://127.0.0.1:{bridge.port}/v1/listen", TOKEN, "longer"],
            )
        finally:
            await browser.close()
    assert said["protocol"] == "token" and said["code"] == 1000, said
    assert said["mime"].startswith("audio/webm"), said["mime"]
    assert said["kinds"][-1] == "Metadata", said["kinds"]
    heard = set(normalized_words(" ".join(said["finals"])))
    expected = [w for w in normalized_words(transcript) if len(w) >= 4]
    missing = [w for w in expected if w not in heard]
    assert len(missing) <= 1, f"missing {missing} in {said['finals']!r}"
    assert not problems, problems
    await eventually(lambda: server.servicer.active == 0)


# -- the page's edge cases, on the fake engine, one browser for all --------------------------


@dataclass
class Stack:
    server: RunningServer
    bridge: RunningBridge
    browser: Any  # playwright's Browser

    async def page(
        self, init_script: str = "", bridge: RunningBridge | None = None, fragment: str = ""
    ) -> tuple[Any, list[str]]:
        """A new page of the bridge (``bridge`` or the shared one), with ``SPY`` and
        ``init_script`` run before the page's own; and the list its script errors go to."""
        page = await self.browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.add_init_script(SPY + init_script)
        await page.goto(f"http://127.0.0.1:{(bridge or self.bridge).port}/{fragment}")
        return page, errors


#: records the page's microphone tracks and sockets, and how each socket closed
SPY = """
  window.__tracks = [];
  window.__sockets = [];
  const realGetUserMedia = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
  navigator.mediaDevices.getUserMedia = async (c) => {
    const m = await realGetUserMedia(c);
    window.__tracks.push(...m.getTracks());
    return m;
  };
  const RealWebSocket = window.WebSocket;
  window.WebSocket = class extends RealWebSocket {
    constructor(...args) {
      super(...args);
      window.__sockets.push(this);
      this.addEventListener("close", (e) => { this.closedWith = e.code; });
    }
  };
"""
MIC_OFF = "() => window.__tracks.length > 0 && window.__tracks.every(t => t.readyState === 'ended')"
SHORT_MS = 5_000  # what the page does takes well under a second; this is only a bound


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    """A fake-engine server, a bridge without a token and one Chromium whose microphone
    plays a tone over and over, shared by the page's edge cases."""
    import soundfile as sf

    from asr_bridge.app import BridgeConfig, start_bridge
    from asr_client import ConnectionOptions

    async_playwright = playwright_or_fail()
    wav = tmp_path_factory.mktemp("mic") / "tone.wav"
    sf.write(str(wav), np.concatenate([silence(0.5, 48_000), tone(1.0, 48_000)]), 48_000)
    server = await running_server(fake_factory())
    bridge = await start_bridge(
        BridgeConfig(server=ConnectionOptions(f"127.0.0.1:{server.port}")), port=0
    )
    try:
        async with async_playwright() as pw:  # type: ignore[operator]
            browser = await launch(pw, wav, loop=True)
            try:
                yield Stack(server, bridge, browser)
            finally:
                await browser.close()
    finally:
        await bridge.close()
        await server.close()


async def healthz(page: Any) -> dict[str, Any]:
    return await page.evaluate("fetch('/healthz').then(r => r.json())")  # type: ignore[no-any-return]


@pytest.mark.asyncio(loop_scope="module")
async def test_stop_while_the_microphone_prompt_is_open_ends_the_session(stack: Stack) -> None:
    """Stop pressed while the permission prompt is open: once it is answered, the page
    lets the microphone go and opens no socket (it used to start a session nothing could stop)."""
    page, errors = await stack.page(
        """
        const asked = navigator.mediaDevices.getUserMedia;
        navigator.mediaDevices.getUserMedia = (c) =>
          new Promise((resolve) => { window.__answer = () => resolve(asked(c)); });
        """
    )
    await page.click("#start")
    await page.wait_for_function("() => window.__answer !== undefined", timeout=SHORT_MS)
    await page.click("#stop")
    await page.evaluate("window.__answer()")  # the user allows the microphone
    await page.wait_for_function(MIC_OFF, timeout=SHORT_MS)
    assert await page.evaluate("window.__sockets.length") == 0
    assert await page.inner_text("#state") == "idle"
    assert await page.is_enabled("#start") and not await page.is_enabled("#stop")
    assert (await healthz(page))["sessions"] == 0
    await page.close()
    assert not errors, errors


#: presses Stop as soon as the page shows the rate, which it does as the socket is created
#: (still CONNECTING), and Start again at once when asked
STOP_WHILE_CONNECTING = """(restart) => {
  new MutationObserver((_, observer) => {
    observer.disconnect();
    document.querySelector('#stop').click();
    if (restart) document.querySelector('#start').click();
  }).observe(document.querySelector('#rate'),
             {childList: true, characterData: true, subtree: true});
  document.querySelector('#start').click();
}"""


@pytest.mark.asyncio(loop_scope="module")
async def test_stop_while_connecting_is_a_quiet_end_and_spares_the_next_session(
    stack: Stack,
) -> None:
    """Stop while the socket connects is no error; and that socket's late close (1006)
    does not mark the session started right after it as failed."""
    page, errors = await stack.page()
    await page.evaluate(STOP_WHILE_CONNECTING, False)
    await page.wait_for_function(
        "() => window.__sockets[0]?.closedWith !== undefined", timeout=SHORT_MS
    )
    assert await page.inner_text("#state") == "idle"
    assert not await page.is_visible("#error")

    await page.evaluate("window.__sockets = []")
    await page.evaluate(STOP_WHILE_CONNECTING, True)
    # the old socket has closed, and the new session is listening
    await page.wait_for_function(
        "() => window.__sockets.length === 2 && window.__sockets[0].closedWith !== undefined"
        " && document.body.dataset.state === 'listening'",
        timeout=SHORT_MS,
    )
    assert not await page.is_visible("#error")
    assert await page.is_enabled("#stop")
    await page.click("#stop")
    await page.wait_for_function("() => document.body.dataset.state === 'idle'", timeout=SHORT_MS)
    assert await page.inner_text("#state") == "finished"
    await page.close()
    assert not errors, errors
    await eventually(lambda: stack.server.servicer.active == 0)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_failing_audio_setup_lets_the_microphone_go(stack: Stack) -> None:
    """The worklet cannot be made (after the microphone was granted): the page says so
    and the microphone is off again, not left live behind the error."""
    page, errors = await stack.page(
        "window.AudioWorkletNode = class { constructor() {"
        " throw new DOMException('AudioWorklet failed', 'InvalidStateError'); } };"
    )
    await page.click("#start")
    await page.wait_for_function("() => document.body.dataset.state === 'error'", timeout=SHORT_MS)
    assert "AudioWorklet failed" in await page.inner_text("#error")
    await page.wait_for_function(MIC_OFF, timeout=SHORT_MS)
    assert await page.is_enabled("#start")
    await page.close()
    assert not errors, errors


#: a browser that cannot connect the microphone to a 16 kHz context (as Firefox), on a
#: 96 kHz device: the page falls back to the device's rate
DEVICE_AT_96K = """
  const RealAudioContext = window.AudioContext;
  window.AudioContext = class extends RealAudioContext {
    constructor(o) {
      super(o && o.sampleRate ? o : { sampleRate: 96000 });
      this.asked = !!(o && o.sampleRate);
    }
    createMediaStreamSource(m) {
      if (this.asked) throw new DOMException('different sample-rate', 'NotSupportedError');
      return super.createMediaStreamSource(m);
    }
  };
"""

#: the worklet's processor run on a sine at 96 kHz: the RMS of what it sends
WORKLET_ON_A_SINE = """async ([frequency, decimation]) => {
  const source = await (await fetch('/static/pcm-worklet.js')).text();
  let Processor;
  const port = { frames: [], postMessage(m) { this.frames.push(new Int16Array(m.pcm)); } };
  new Function('AudioWorkletProcessor', 'registerProcessor', source)(
    class { constructor() { this.port = port; } }, (_, P) => { Processor = P; });
  const processor = new Processor({ processorOptions: { frameSamples: 480, decimation } });
  for (let block = 0; block < 96000 / 128; block++) {  // one second, in render quanta
    const input = new Float32Array(128);
    for (let i = 0; i < 128; i++)
      input[i] = 0.5 * Math.sin((2 * Math.PI * frequency * (block * 128 + i)) / 96000);
    processor.process([[input]]);
  }
  const samples = port.frames.flatMap((f) => Array.from(f)).slice(480);  // past the filter's start
  return { count: port.frames.length * 480,
           rms: Math.sqrt(samples.reduce((a, s) => a + s * s, 0) / samples.length) / 32768 };
}"""


@pytest.mark.asyncio(loop_scope="module")
async def test_a_96khz_device_is_sent_at_48khz(stack: Stack) -> None:
    """The fallback capture path on a 96 kHz device: the worklet halves the rate (with a
    low-pass first) and the page declares 48 kHz, which the bridge takes; it used to
    declare 96 kHz, which the bridge refuses."""
    page, errors = await stack.page(DEVICE_AT_96K)
    await page.click("#start")
    await page.wait_for_function(
        "() => ['listening', 'speech'].includes(document.body.dataset.state)", timeout=SHORT_MS
    )
    assert await page.inner_text("#rate") == "48 kHz"
    await page.click("#stop")
    await page.wait_for_function("() => document.body.dataset.state === 'idle'", timeout=SHORT_MS)
    assert not await page.is_visible("#error")
    # what the worklet sends: 48 000 samples a second; speech passes, and what lies above
    # the new Nyquist frequency (30 kHz would fold onto 18 kHz) is filtered out first
    passed = await page.evaluate(WORKLET_ON_A_SINE, [1000, 2])
    folded = await page.evaluate(WORKLET_ON_A_SINE, [30000, 2])
    assert passed["count"] == 48_000
    assert passed["rms"] == pytest.approx(0.5 / 2**0.5, rel=0.02)
    assert folded["rms"] < 0.005
    await page.close()
    assert not errors, errors


@pytest.mark.asyncio(loop_scope="module")
async def test_any_token_the_bridge_takes_can_be_handed_to_the_page(stack: Stack) -> None:
    """A base64 token in the fragment: read as written ("+" stays "+"), taken out of the
    address bar, and sent in the query, as a subprotocol cannot hold "/" or "=" (the page
    used to throw and hang in "connecting" with the microphone live)."""
    from asr_bridge.app import BridgeConfig, start_bridge
    from asr_client import ConnectionOptions

    token = "ab+cd/ef=="
    bridge = await start_bridge(
        BridgeConfig(server=ConnectionOptions(f"127.0.0.1:{stack.server.port}"), token=token),
        port=0,
    )
    try:
        page, errors = await stack.page(bridge=bridge, fragment=f"#token={token}&view=1")
        assert await page.input_value("#token") == token
        assert await page.evaluate("location.hash") == "#view=1"
        await page.click("#start")
        await page.wait_for_function(
            "() => ['listening', 'speech'].includes(document.body.dataset.state)",
            timeout=SHORT_MS,
        )
        # a token a subprotocol can hold still goes as one, out of the URL
        await page.click("#stop")
        await page.wait_for_function(
            "() => document.body.dataset.state === 'idle'", timeout=SHORT_MS
        )
        await page.fill("#token", "ab+cd")
        await page.click("#start")
        await page.wait_for_function("() => window.__sockets.length === 2", timeout=SHORT_MS)
        second_url = await page.evaluate("window.__sockets[1].url")
        await page.wait_for_function(
            "() => document.body.dataset.state === 'error'", timeout=SHORT_MS
        )  # (not this bridge's token)
        assert "token=" not in second_url
        assert "wrong token" in await page.inner_text("#error")
        await page.close()
        assert not errors, errors
    finally:
        await bridge.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_second_sessions_turn_ends_go_on_its_own_finals(stack: Stack) -> None:
    """Utterance ids start again at 0 in each session: the end-of-turn badge of the
    second session's first final went onto the first session's final 0."""
    page, errors = await stack.page()
    await page.select_option("#endpointing", "semantic")
    for _ in range(2):
        await page.click("#start")
        # words heard (a partial shows them): the finalize then makes a final that has some
        await page.wait_for_function("() => document.querySelector('#partial').innerText.trim()")
        await page.click("#finalize")
        await page.wait_for_function(
            "() => document.querySelector('#finalized').innerText === 'done'"
        )
        await page.click("#stop")
        await page.wait_for_function("() => document.body.dataset.state === 'idle'")
    badges = await page.eval_on_selector_all(
        ".final", "ps => ps.map(p => p.querySelectorAll('.turn').length)"
    )
    assert badges == [1, 1], badges
    await page.close()
    assert not errors, errors


#: the user presses Stop just after the page sent `start`: the socket is open, `ready` not in
STOP_BEFORE_READY = """
  window.__states = [];
  const BeforeReady = window.WebSocket;
  window.WebSocket = class extends BeforeReady {
    constructor(...args) {
      super(...args);
      const stop = () => document.querySelector("#stop").click();
      this.addEventListener("open", () => setTimeout(stop, 0));
      this.addEventListener("message", () => window.__states.push(document.body.dataset.state));
    }
  };
"""


@pytest.mark.asyncio(loop_scope="module")
async def test_stop_before_ready_stays_finishing(stack: Stack) -> None:
    """A `ready` that came after Stop showed "listening" again, with the microphone off."""
    page, errors = await stack.page(STOP_BEFORE_READY)
    await page.click("#start")
    await page.wait_for_function("() => window.__sockets[0]?.closedWith !== undefined")
    states = await page.evaluate("window.__states")
    assert "listening" not in states and "speech" not in states, states
    assert await page.inner_text("#state") == "finished"
    # nothing was shown: the hint stays (the session's end hid it, partial or not)
    assert await page.is_visible("#placeholder")
    await page.close()
    assert not errors, errors


@pytest.mark.asyncio(loop_scope="module")
async def test_the_page_says_it_is_reconnecting_while_the_bridge_resumes(stack: Stack) -> None:
    """The server goes away mid-session: results stop, and the page went on saying
    "listening" (or "speech") until the stream resumed or failed 30 s later."""
    from asr_bridge.app import BridgeConfig, start_bridge
    from asr_client import ConnectionOptions
    from tests.faultproxy import FaultProxy
    from tests.processes import free_port

    proxy = await FaultProxy(stack.server.port).start()
    bridge = await start_bridge(
        BridgeConfig(server=ConnectionOptions(f"127.0.0.1:{proxy.port}")), port=0
    )
    try:
        page, errors = await stack.page(bridge=bridge)
        await page.click("#start")
        await page.wait_for_function(
            "() => ['listening', 'speech'].includes(document.body.dataset.state)",
            timeout=SHORT_MS,
        )
        proxy.upstream_port = free_port()  # nothing there: every new call fails
        proxy.cut()
        await page.wait_for_function(
            "() => document.body.dataset.state === 'reconnecting'", timeout=SHORT_MS
        )
        assert await page.inner_text("#state") == "reconnecting…"
        proxy.upstream_port = stack.server.port  # the server is back
        await page.wait_for_function(
            "() => ['listening', 'speech'].includes(document.body.dataset.state)",
            timeout=3 * SHORT_MS,
        )
        await page.click("#stop")
        await page.wait_for_function(
            "() => document.body.dataset.state === 'idle'", timeout=SHORT_MS
        )
        assert await page.inner_text("#state") == "finished"
        assert not await page.is_visible("#error")
        await page.close()
        assert not errors, errors
    finally:
        await bridge.close()
        await proxy.close()


#: the finals never reach the page, so whatever partial it shows is still there at the break
NO_FINALS = """
  const WithFinals = window.WebSocket;
  window.WebSocket = class extends WithFinals {
    set onmessage(handler) {
      super.onmessage = (e) => {
        if (!['final', 'no_words'].includes(JSON.parse(e.data).type)) handler(e);
      };
    }
    get onmessage() { return super.onmessage; }
  };
"""


@pytest.mark.asyncio(loop_scope="module")
async def test_a_partial_cut_off_by_an_error_is_kept_as_not_final(stack: Stack) -> None:
    """A session that ended on an error left its last partial on screen, shown as if the
    words were still being heard; it goes with the finals now, marked as never final."""
    from asr_bridge.app import BridgeConfig, start_bridge
    from asr_client import ConnectionOptions
    from tests.faultproxy import FaultProxy

    proxy = await FaultProxy(stack.server.port).start()
    bridge = await start_bridge(  # without resume the break is the session's end
        BridgeConfig(server=ConnectionOptions(f"127.0.0.1:{proxy.port}"), resume=False), port=0
    )
    try:
        page, errors = await stack.page(NO_FINALS, bridge=bridge)
        await page.click("#start")
        await page.wait_for_function(
            "() => document.querySelector('#partial').innerText.trim()", timeout=SHORT_MS
        )
        proxy.cut()
        await page.wait_for_function(
            "() => document.body.dataset.state === 'error'", timeout=SHORT_MS
        )
        assert not (await page.inner_text("#partial")).strip()
        kept = await page.eval_on_selector_all(
            ".final", "ps => ps.map(p => [p.className, p.innerText])"
        )
        assert len(kept) == 1 and kept[0][0] == "final unfinished", kept
        # the fake engine's words are w0, w1, …; the badge follows them
        assert kept[0][1].startswith("w0") and kept[0][1].endswith("not final: the session ended")
        await page.close()
        assert not errors, errors
    finally:
        await bridge.close()
        await proxy.close()
