"""Figures of barrier runs (matplotlib, Agg; no pyplot state, safe in scripts and servers).

:func:`plot_barriers` draws loss vs λ (and accuracy vs λ for classifiers, in a second panel)
for every method of one or several :class:`~glmc.barrier.BarrierReport`: one line per method
with its own colour and marker, the endpoints' straight line for reference, a vertical bar
showing where each barrier sits, and the barrier value in the legend. A curve that coincides
with an earlier one is drawn dashed with hollow markers and says so in the legend.
:func:`plot_iterations` and :func:`plot_moves` draw the two findings of :mod:`glmc.findings`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg", force=False)

from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from glmc.barrier import BarrierReport, MethodResult  # noqa: E402
from glmc.errors import GlmcError  # noqa: E402
from glmc.io.atomic import atomic_path  # noqa: E402
from glmc.io.outputs import check_plot_path  # noqa: E402

#: Okabe-Ito colours (colour-blind safe) and markers of the known methods; others cycle.
STYLES: dict[str, tuple[str, str]] = {
    "none": ("#D55E00", "o"),
    "canonical": ("#56B4E9", "P"),
    "weight": ("#0072B2", "s"),
    "weight-perm": ("#E69F00", "^"),
    "learned": ("#009E73", "D"),
    "learned-perm": ("#CC79A7", "v"),
}
_EXTRA = [("#000000", "X"), ("#F0E442", "*"), ("#882255", "h"), ("#44AA99", "p")]
_LINESTYLES = ["-", "--", ":", "-."]
def _style(name: str, extra: dict[str, tuple[str, str]]) -> tuple[str, str]:
    if name in STYLES:
        return STYLES[name]
    if name not in extra:
        extra[name] = _EXTRA[len(extra) % len(_EXTRA)]
    return extra[name]


#: At λ = 0 every method computes B's function (an aligned B is B under a symmetry).
ENDPOINT_B = "B\n(λ=0)"


def _short(s: str) -> str:
    return Path(s).name or s


def _default_title(reports: Sequence[BarrierReport]) -> str:
    r = reports[0]
    if len(reports) == 1:
        return f"Barrier between {_short(r.a)} (A) and {_short(r.b)} (B) on " \
               f"{_short(r.data)} ({r.split})"
    return f"Barriers on {_short(r.data)} ({r.split})"


def _fmt_barrier(value: float | None, percent: bool) -> str:
    if value is None:
        return "n/a"
    return f"{100 * value:.1f} pts" if percent else f"{value:.3f}"


def _panel(ax, reports: Sequence[BarrierReport], metric: str, extra: dict) -> None:
    """One metric ("loss" or "accuracy") vs λ for every method of every report."""
    percent = metric == "accuracy"
    scale = 100.0 if percent else 1.0
    drew_line = False
    for j, report in enumerate(reports):
        prefix = (f"{report.label or f'pair {j + 1}'} · ") if len(reports) > 1 else ""
        ls = _LINESTYLES[j % len(_LINESTYLES)]
        drawn: dict[str, list[float]] = {}
        for k, (name, m) in enumerate(report.methods.items()):
            values = m.losses if not percent else m.accuracies
            if values is None:
                continue
            lam = m.lambdas
            ys = [v * scale for v in values]
            colour, marker = _style(name, extra)
            same = _same_curve(ys, drawn)
            drawn[name] = ys
            if k == 0:  # the endpoints' straight line (the same for every method)
                y0, y1 = ys[lam.index(0.0)], ys[lam.index(1.0)]
                ax.plot([0, 1], [y0, y1], color="0.55", lw=1.0, ls=(0, (4, 3)), zorder=1,
                        label=None if drew_line else "straight line between endpoints")
                drew_line = True
            b = m.loss_barrier if not percent else m.acc_barrier
            b_lam = m.loss_barrier_lambda if not percent else m.acc_barrier_lambda
            label = f"{prefix}{name}: barrier {_fmt_barrier(b, percent)}"
            if same is None:
                ax.plot(lam, ys, color=colour, marker=marker, ms=5.5, lw=2.0, ls=ls, zorder=3,
                        label=label, markeredgecolor="white", markeredgewidth=0.6)
            else:  # (on top of an identical curve: dashed, hollow, and said so)
                ax.plot(lam, ys, color=colour, marker=marker, ms=8, lw=1.6, ls=(0, (3, 2)),
                        zorder=4, label=f"{label} (same curve as {same})",
                        markerfacecolor="none", markeredgewidth=1.4)
            if b is not None and b > 0 and b_lam is not None and 0.0 < b_lam < 1.0:
                i = lam.index(b_lam)
                base = ys[lam.index(1.0)] * b_lam + ys[lam.index(0.0)] * (1 - b_lam)
                ax.plot([b_lam, b_lam], [base, ys[i]], color=colour, lw=1.3, alpha=0.8,
                        ls=(0, (1, 1.5)), zorder=2)
    ax.set_xlim(-0.03, 1.03)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_xticklabels([ENDPOINT_B, "0.25", "0.5", "0.75", "A\n(λ=1)"])
    ax.set_xlabel("λ (weight of model A)")
    split = reports[0].split
    ax.set_ylabel(f"{split} accuracy (%)" if percent else f"{split} loss (cross-entropy)")
    ax.grid(True, color="0.9", lw=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1, frameon=False,
              fontsize=9)


def _same_curve(ys: list[float], drawn: dict[str, list[float]]) -> str | None:
    """The name of an earlier curve that ``ys`` coincides with (to 1e-6 of its scale)."""
    scale = max(1e-12, max(abs(y) for y in ys))
    for name, other in drawn.items():
        if len(other) == len(ys) and all(abs(x - y) <= 1e-6 * scale
                                         for x, y in zip(ys, other, strict=True)):
            return name
    return None


def plot_barriers(
    reports: BarrierReport | Sequence[BarrierReport],
    path: str | Path,
    *,
    title: str | None = None,
    dpi: int = 150,
) -> Path:
    """Draw the barrier curves of ``reports`` into ``path`` (PNG, or PDF/SVG by suffix).

    One panel for the loss and, when the reports are classifiers, a second for the accuracy.
    Each method has a fixed colour and marker; with several reports the line style tells the
    pairs apart (their ``label``, or "pair k"). The file is written atomically.

    Returns:
        ``path`` as a Path.
    """
    fmt = check_plot_path(path)
    reps = [reports] if isinstance(reports, BarrierReport) else list(reports)
    if not reps or not any(r.methods for r in reps):
        raise GlmcError("nothing to plot: no barrier results")
    with_acc = any(isinstance(m, MethodResult) and m.accuracies is not None
                   for r in reps for m in r.methods.values())
    n_entries = sum(len(r.methods) for r in reps) + 1
    height = 4.3 + 0.22 * n_entries
    fig = Figure(figsize=(11.5 if with_acc else 6.6, height), layout="constrained")
    axes = fig.subplots(1, 2 if with_acc else 1, squeeze=False)[0]
    extra: dict[str, tuple[str, str]] = {}
    _panel(axes[0], reps, "loss", extra)
    axes[0].set_title("loss (lower is better)", fontsize=10)
    if with_acc:
        _panel(axes[1], reps, "accuracy", extra)
        axes[1].set_title("accuracy (higher is better)", fontsize=10)
    fig.suptitle(title or _default_title(reps), fontsize=11)
    out = Path(path)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format=fmt, dpi=dpi)
    return out


def _save(fig: Figure, path: str | Path, dpi: int) -> Path:
    fmt = check_plot_path(path)
    out = Path(path)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format=fmt, dpi=dpi)
    return out


def _tidy(ax) -> None:
    ax.grid(True, color="0.9", lw=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def plot_iterations(studies: dict[str, dict], path: str | Path, *, title: str | None = None,
                    dpi: int = 150) -> Path:
    """The barrier after k weight-matching iterations, one panel per pair.

    ``studies``: pair label -> {residual group -> :class:`glmc.findings.IterationStudy`}.
    """
    if not studies:
        raise GlmcError("nothing to plot: no iteration studies")
    fig = Figure(figsize=(4.6 * len(studies), 3.9), layout="constrained")
    axes = fig.subplots(1, len(studies), squeeze=False)[0]
    styles = {"orthogonal": ("#0072B2", "s", "orthogonal residual map"),
              "permutation": ("#E69F00", "^", "permutations only")}
    for ax, (label, by_group) in zip(axes, studies.items(), strict=True):
        for group, st in by_group.items():
            colour, marker, name = styles.get(group, ("#000000", "o", group))
            ax.plot(st.iterations, st.midpoint_barrier, color=colour, marker=marker, ms=4.5,
                    lw=1.8, label=name)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("weight-matching iterations k (0: the start)")
        ax.set_ylabel("midpoint loss barrier (test)")
        _tidy(ax)
        ax.legend(frameon=False, fontsize=9)
    fig.suptitle(title or "Barrier after k iterations of weight matching", fontsize=11)
    return _save(fig, path, dpi)


def plot_moves(moves: dict[str, dict], path: str | Path, *, title: str | None = None,
               dpi: int = 150) -> Path:
    """How far learned matching moved from weight matching, one panel per pair: the
    fraction of units reassigned per space, and ‖O_learned − O_WM‖_F in the title.

    ``moves``: pair label -> :func:`glmc.findings.learned_moves` output.
    """
    if not moves:
        raise GlmcError("nothing to plot: no learned matching")
    fig = Figure(figsize=(4.8 * len(moves), 3.9), layout="constrained")
    axes = fig.subplots(1, len(moves), squeeze=False)[0]
    for ax, (label, mv) in zip(axes, moves.items(), strict=True):
        spaces = list(mv["reassigned"])
        ax.bar(range(len(spaces)), [100 * mv["reassigned"][s] for s in spaces],
               color=["#0072B2" if s.startswith("mlp") else "#009E73" for s in spaces])
        ax.set_xticks(range(len(spaces)))
        ax.set_xticklabels(spaces, rotation=60, fontsize=8)
        ax.set_ylabel("units reassigned (%)")
        top = max([100 * v for v in mv["reassigned"].values()] + [1.0])
        ax.set_ylim(0, max(5.0, 1.2 * top))
        frob = mv.get("residual_frobenius")
        extra = (f"\n‖O_learned − O_WM‖_F = {frob:.2f} ({100 * mv['residual_relative']:.0f}% "
                 "of ‖O‖_F)") if frob is not None else ""
        ax.set_title(f"{label}{extra}", fontsize=9)
        _tidy(ax)
    fig.legend(handles=[Patch(color="#0072B2", label="MLP units"),
                        Patch(color="#009E73", label="heads")],
               loc="outside lower center", ncols=2, frameon=False, fontsize=8)
    fig.suptitle(title or "How far learned matching moves from weight matching", fontsize=11)
    return _save(fig, path, dpi)
