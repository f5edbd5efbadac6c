"""Matplotlib for the reports: headless (Agg) and written atomically."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # reports are written on machines without a display
import matplotlib.pyplot as plt  # noqa: E402

from nlq.fileio import atomic_write  # noqa: E402


def save_figure(fig, path: Path) -> None:
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)
