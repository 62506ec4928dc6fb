"""Small matplotlib figures the notebooks show (all notebooks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure


def show_digits(images: np.ndarray, labels: Sequence[int], cols: int = 8,
                title: str | None = None, predictions: Sequence[int] | None = None) -> Figure:
    """A grid of digits with their labels (and predictions, red where wrong) (notebooks 01, 03, 04)."""
    count = len(images)
    rows = max(1, -(-count // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 1.1, rows * 1.25))
    for i, ax in enumerate(np.atleast_1d(axes).ravel()):
        ax.axis("off")
        if i >= count:
            continue
        ax.imshow(np.asarray(images[i]).reshape(28, 28), cmap="gray_r")
        text, color = str(int(labels[i])), "black"
        if predictions is not None:
            text = f"{int(labels[i])}→{int(predictions[i])}"
            color = "black" if int(labels[i]) == int(predictions[i]) else "crimson"
        ax.set_title(text, fontsize=9, color=color)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def bar_chart(values: Mapping[str, float], title: str, ylabel: str, fmt: str = "{:,.0f}",
              highlight: str | None = None, errors: Mapping[str, tuple[float, float]] | None = None) -> Figure:
    """Bars with their values written on top: every timing comparison (notebooks 01-03).

    With ``errors``, each bar's ``(low, high)`` interval is drawn as an error bar: accuracies (notebook 06).
    """
    fig, ax = plt.subplots(figsize=(min(10.0, max(4.0, 0.9 * len(values) + 1.5)), 3.2))
    names = list(values)
    colors = ["tab:orange" if name == highlight else "tab:blue" for name in names]
    spread = None if errors is None else np.array([[values[n] - errors[n][0] for n in names],
                                                   [errors[n][1] - values[n] for n in names]])
    bars = ax.bar(names, [values[n] for n in names], color=colors, yerr=spread, capsize=4 if errors else 0)
    ax.bar_label(bars, labels=[fmt.format(values[n]) for n in names], fontsize=8, padding=2,
                 label_type="center" if errors else "edge", color="white" if errors else "black")  # clear of the bars
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.margins(y=0.15)
    ax.spines[["top", "right"]].set_visible(False)
    crowded = len(names) > 6 or sum(len(n) for n in names) > 8 * len(names) + 10  # labels wider than their bars
    plt.setp(ax.get_xticklabels(), rotation=25 if crowded else 0, ha="right" if crowded else "center")
    fig.tight_layout()
    return fig


def confusion_matrix_figure(matrix: np.ndarray, title: str = "Confusion matrix (test set)") -> Figure:
    """A 10x10 confusion matrix with counts in the cells (notebook 04)."""
    fig, ax = plt.subplots(figsize=(4.6, 4.0))
    ax.imshow(matrix, cmap="Blues")
    for (i, j), count in np.ndenumerate(matrix):
        if count:
            ax.text(j, i, str(count), ha="center", va="center", fontsize=7,
                    color="white" if count > matrix.max() / 2 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_xticks(range(matrix.shape[1]))
    ax.set_yticks(range(matrix.shape[0]))
    ax.set_title(title)
    fig.tight_layout()
    return fig


def curves(series: Mapping[str, Sequence[tuple[int, float]]], title: str, xlabel: str = "epoch") -> Figure:
    """One small panel per metric, each a line over steps (notebooks 04-05)."""
    fig, axes = plt.subplots(1, len(series), figsize=(3.6 * len(series), 2.8), squeeze=False)
    for ax, (name, points) in zip(axes[0], series.items(), strict=True):
        steps, values = zip(*points, strict=True) if points else ((), ())
        ax.plot(steps, values, marker="o")
        ax.set_title(name)
        ax.set_xlabel(xlabel)
        ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def trial_curves(history: Mapping[str, Sequence[tuple[int, float]]], title: str) -> Figure:
    """Validation accuracy over epochs, one line per trial (notebook 05)."""
    fig, ax = plt.subplots(figsize=(6.0, 3.4))
    for trial, points in sorted(history.items()):
        steps, values = zip(*points, strict=True) if points else ((), ())
        ax.plot(steps, values, marker="o", markersize=3, label=trial.split("_")[-1])
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation accuracy")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncols=2, title="trial", title_fontsize=7)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def scatter_panels(table, columns: Sequence[str], metric: str, title: str, group_by: str | None = None,
                   group_label: str = "") -> Figure:
    """The metric against each column of a results table, one panel per column (notebook 05).

    ``group_by`` colours the points by another column (05: the epochs each trial ran), so points
    that are not comparable (a trial stopped after one epoch, one that ran six) are told apart.
    """
    from matplotlib.ticker import LogLocator, NullFormatter

    fig, axes = plt.subplots(1, len(columns), figsize=(3.3 * len(columns), 2.8), sharey=True, squeeze=False)
    groups = sorted(table[group_by].unique()) if group_by else [None]
    for ax, column in zip(axes[0], columns, strict=True):
        for i, group in enumerate(groups):
            rows = table if group is None else table[table[group_by] == group]
            ax.scatter(rows[column], rows[metric], s=18, color=plt.cm.viridis(i / max(len(groups) - 1, 1)),
                       label=None if group is None else str(group))
        ax.set_xlabel(column.removeprefix("config/"))
        if column.endswith("lr"):
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(numticks=4))  # decades only: no overlapping tick labels
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.spines[["top", "right"]].set_visible(False)
    axes[0][0].set_ylabel(metric)
    if group_by:
        axes[0][-1].legend(fontsize=7, title=group_label or group_by, title_fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def per_worker(series: Mapping[str, Mapping[str, Sequence[tuple[float, float]]]], title: str) -> Figure:
    """One panel per metric, one line per worker (``helpers.worker_metrics.per_worker``), over seconds (04, 05)."""
    fig, axes = plt.subplots(1, len(series), figsize=(3.8 * len(series), 2.8), squeeze=False)
    for ax, (name, by_worker) in zip(axes[0], series.items(), strict=True):
        for worker, points in by_worker.items():
            seconds, values = zip(*points, strict=True) if points else ((), ())
            ax.plot(seconds, values, marker="o", markersize=3, label=worker)
        ax.set_title(name.removeprefix("process_").replace("_", " "), fontsize=9)
        ax.set_xlabel("seconds")
        ax.spines[["top", "right"]].set_visible(False)
    axes[0][0].legend(fontsize=7, title="worker", title_fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
