"""The PNG timeline of a profile: one call of each side, one row per rank and stream (or thread),
coloured by category (docs/measurement.md, "Profile"). Needs matplotlib (the `plots` extra); without
it, `draw` says so instead of drawing."""

from __future__ import annotations

from pathlib import Path

from pkb_mcp.profiling.traces import Bar

COLOURS = {"comm": "#d62728", "compute": "#1f77b4", "both": "#9467bd", "other": "#7f7f7f"}
LABELS = {
    "comm": "communication",
    "compute": "compute",
    "both": "both (a kernel counted communicating that computes)",
    "other": "other (memset, host copies)",
}
MAX_ROWS = 48


def draw(sides: dict[str, tuple[list[Bar], str]], path: Path) -> str | None:
    """Draw each side's bars (microseconds, from the call's start) under its title into `path`;
    None when drawn, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        return "no timeline: matplotlib is not installed (pip install 'pkb-mcp[plots]')"
    shown = {side: v for side, v in sides.items() if v[0]}
    if not shown:
        return "no timeline: no profiled work to draw"
    heights = [min(len({b.row for b in bars}), MAX_ROWS) + 1 for bars, _ in shown.values()]
    fig, axes = plt.subplots(
        len(shown),
        1,
        figsize=(11, 1.2 + 0.32 * sum(heights)),
        sharex=True,
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    for ax, (side, (bars, title)) in zip(axes[:, 0], shown.items(), strict=True):
        rows = sorted({b.row for b in bars}, key=_row_key)[:MAX_ROWS]
        index = {row: i for i, row in enumerate(rows)}
        for cat, colour in COLOURS.items():
            for b in bars:
                y = index.get(b.row)
                if b.category == cat and y is not None:
                    ax.broken_barh(
                        [(b.start / 1e3, max(b.end - b.start, 1e-3) / 1e3)], (y - 0.4, 0.8), color=colour
                    )
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_title(f"{side}: {title}", fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("ms from the call's start (the first rank's first work)")
    fig.legend(
        handles=[Patch(color=c, label=LABELS[k]) for k, c in COLOURS.items()],
        loc="upper right",
        fontsize=8,
        ncols=4,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def _row_key(row: str) -> tuple[int, str]:
    parts = row.split(" ", 2)
    rank = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    return rank, parts[2] if len(parts) > 2 else ""
