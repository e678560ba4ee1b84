"""Plot the latency distributions of streaming_bench.py runs (their --json files).

One panel per figure (end of speech → final, speech onset → first partial), one curve
per run: the share of utterances served within each latency (an empirical CDF), with
the hosted-API targets of issue 10 marked.

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
    ("ttfp_s", "speech onset → first partial (s)", (0.3,)),
)


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    runs = []
    for arg in sys.argv[2:]:
        label, _, path = arg.partition("=")
        runs.append((label, json.loads(Path(path).read_text())["samples"]))
    fig, axes = plt.subplots(1, len(PANELS), figsize=(11, 4))
    for ax, (key, title, targets) in zip(axes, PANELS, strict=True):
        for label, samples in runs:
            values = np.sort(np.asarray(samples[key]))
            if values.size:
                share = np.arange(1, values.size + 1) / values.size
                ax.step(values, share, where="post", label=f"{label} (n={values.size})")
        for target in targets:
            ax.axvline(target, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(title)
        ax.set_ylabel("share of utterances")
        ax.set_xlim(0, 2.0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("streamasr, tiny.en int8, 2 CPU cores, real-time pace (dotted: targets)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
