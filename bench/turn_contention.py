"""What a turn-model question costs a final decoded beside it, per int8 kernel. Prints figures.

A SEMANTIC stream asks the turn model (150 ms into a pause) while the pause's early final
(begun 60 ms in) is being decoded on the same cores. In one idle process this decodes a
final of ``--seconds`` of LibriSpeech (the server's engine and settings) alone, and with
a question started ``--start-ms`` into it, once with each of onnxruntime's int8 kernels
(``u8u8``: ``session.x64quantprecision``, which CPUs without VNNI need; ``default``: the
u8s8 kernels, which the server uses on CPUs with VNNI; asr_server/vad/turn.py), rotating
which goes first; then the question alone. Medians of ``--runs``.

On a CPU without VNNI the ``default`` row is the overflowing arithmetic the server avoids
there: its timing is shown, its answers are not used.

Usage: python bench/turn_contention.py [--start-ms 20] [--runs 9] [--seconds 5.5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from asr_server.engine.base import DecodeKind, DecodeRequest  # noqa: E402
from asr_server.engine.factory import create_engine  # noqa: E402
from asr_server.settings import Settings  # noqa: E402
from asr_server.vad.turn import TurnModel, default_model_path  # noqa: E402
from tests.helpers import corpus, first_channel  # noqa: E402

RECORDING = "libri_2412-153948-0000"


def ms(seconds: list[float]) -> str:
    each = ", ".join(f"{s * 1000:.0f}" for s in seconds)
    return f"{statistics.median(seconds) * 1000:.0f} ms ({each})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--start-ms", type=float, default=20)
    p.add_argument("--runs", type=int, default=9)
    p.add_argument("--seconds", type=float, default=5.5)
    a = p.parse_args()

    settings = Settings()
    engine = create_engine(settings)
    audio = first_channel(corpus()[RECORDING].path)
    audio = audio[: int(a.seconds * 16_000)]
    request = DecodeRequest(audio, DecodeKind.FINAL, language="en")
    path = default_model_path(settings.engine.cache_dir)
    models = {
        "u8u8": TurnModel(path, frozenset()),  # (no flags known: the exact kernels)
        "default": TurnModel(path, frozenset({"avx512_vnni"})),
    }
    heard = np.concatenate([audio, np.zeros(3200, np.float32)])  # 200 ms into the pause

    def final(model: TurnModel | None) -> float:
        asker = None
        if model is not None:

            def ask() -> None:
                time.sleep(a.start_ms / 1000)
                model.predict(heard)

            asker = threading.Thread(target=ask)
        start = time.perf_counter()
        if asker is not None:
            asker.start()
        engine.transcribe([request])
        took = time.perf_counter() - start
        if asker is not None:
            asker.join()
        return took

    for _ in range(2):  # warm-up
        final(None)
        for model in models.values():
            model.predict(heard)
    names = ["alone", *models]
    times: dict[str, list[float]] = {name: [] for name in names}
    for run in range(a.runs):
        for name in names[run % len(names) :] + names[: run % len(names)]:
            times[name].append(final(models.get(name)))
    print(f"a {a.seconds:g} s final, the question started {a.start_ms:g} ms into it")
    for name in names:
        print(
            f"  final, {'alone' if name == 'alone' else 'beside a ' + name + ' question'}: "
            f"{ms(times[name])}"
        )
    for name, model in models.items():
        alone = []
        for _ in range(a.runs):
            start = time.perf_counter()
            model.predict(heard)
            alone.append(time.perf_counter() - start)
        print(f"  the question alone, {name}: {ms(alone)}")


if __name__ == "__main__":
    main()
