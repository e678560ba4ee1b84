"""Plot the latency distributions of streaming_bench.py runs (their --json files).

One panel per figure (end of speech → final; the same when the client finalizes at its
own VAD's stop, pipecat's time to final segment; speech onset → first partial; end of a
word → first result showing it), one curve per run that measured it: the share served
within each latency (an empirical CDF), with the targets of issue 10 marked.

Usage: python bench/plot_latency.py OUT.png LABEL=run.json [LABEL=run.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

PANELS = (
    ("final_latency_s", "end of speech → final (s)", (0.25, 0.35)),
    ("ttfs_s", "client finalizes at its VAD stop: time to final segment (s)", (0.25, 0.35)),
    ("ttfp_s", "speech onset → first partial (s)", (0.3,)),
    ("word_emission_s", "end of a word → first result showing it (s)", (0.45,)),
)


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    runs = []
    models = []
    for arg in sys.argv[2:]:
        label, _, path = arg.partition("=")
        run = json.loads(Path(path).read_text())
        runs.append((label, run["samples"]))
        machine = f"{run.get('model') or 'model not recorded'}, " + (
            f"{run['cpu_count']} CPU cores" if run.get("cpu_count") else "cores not recorded"
        )
        if machine not in models:
            models.append(machine)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (key, title, targets) in zip(axes.flat, PANELS, strict=True):
        for label, samples in runs:
            values = np.sort(np.asarray(samples.get(key, [])))
            if values.size:
                share = np.arange(1, values.size + 1) / values.size
                ax.step(values, share, where="post", label=f"{label} (n={values.size})")
        for target in targets:
            ax.axvline(target, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(title)
        ax.set_ylabel("share of words" if key == "word_emission_s" else "share of utterances")
        ax.set_xlim(0, 2.0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    # each run's own model and core count, as streaming_bench recorded them
    fig.suptitle(f"streamasr, {'; '.join(models)}, real-time pace (dotted: targets)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
