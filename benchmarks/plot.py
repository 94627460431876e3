"""Plot a benchmark JSON: ``python -m benchmarks.plot [results.json] [-o docs/benchmarks.png]``.

Needs matplotlib (``pip install 'dbexecutor[bench]'``). One panel per
scenario group; dbexecutor per database beside ProcessPoolExecutor (and loky,
pebble), measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATABASES = ["sqlite", "postgresql", "mariadb"]
COLORS = {"sqlite": "#4C72B0", "postgresql": "#55A868", "mariadb": "#C44E52",
          "ppe": "#555555", "loky": "#999999", "pebble": "#CCCCCC"}
LABELS = {"ppe": "ProcessPoolExecutor", "loky": "loky", "pebble": "pebble"}


def _rows(data: dict[str, Any], scenario: str) -> list[dict[str, Any]]:
    return [r for r in data["results"] if r["scenario"] == scenario]


def _metrics(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["metric"] for r in rows))


def _grouped(ax: Any, groups: list[str], series: dict[str, list[float | None]], *, log: bool = False,
             labels: str | None = None) -> None:
    """Bars: one group per x label, one bar per series (a database or a baseline); ``labels``: value format."""
    width = 0.8 / max(1, len(series))
    for k, (name, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(groups))]
        bars = ax.bar(xs, [v if v is not None else 0 for v in values], width,
                      label=LABELS.get(name, f"dbexecutor/{name}"), color=COLORS.get(name))
        if labels:
            ax.bar_label(bars, fmt=labels, fontsize=7)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)


def _series(rows: list[dict[str, Any]], metrics: list[str], baselines: list[str], dbs: list[str],
            key: str = "dbexecutor") -> dict[str, list[float | None]]:
    """Per database its value for each metric; per baseline the mean over the databases' runs."""
    out: dict[str, list[float | None]] = {}
    for db in dbs:
        out[db] = [next((r[key] for r in rows if r["metric"] == m and r["database"] == db), None) for m in metrics]
    for b in baselines:
        vals = []
        for m in metrics:
            found = [r["baselines"].get(b) for r in rows if r["metric"] == m and r["baselines"].get(b) is not None]
            vals.append(statistics.fmean(found) if found else None)
        if any(v is not None for v in vals):
            out[b] = vals
    return out


def plot(data: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dbs = [d for d in DATABASES if any(r["database"] == d for r in data["results"])]
    baselines = data.get("baselines", ["ppe"])
    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5))
    m = data["machine"]
    fig.suptitle(f"dbexecutor vs ProcessPoolExecutor, {data.get('workers', 2)} workers — {m['cpu']}, {m['cores']} cores, "
                 f"Python {m['python']}, {m['date'][:10]}{' (quick sizes)' if data.get('quick') else ''}", fontsize=11)

    # 1-2: rates, log scale
    ax = axes[0][0]
    rows = [r for r in _rows(data, "throughput") + _rows(data, "map") if r["unit"] == "/s"]  # rates only (not the server CPU row)
    metrics = _metrics(rows)
    if metrics:
        _grouped(ax, [t.replace(", ", "\n") for t in metrics], _series(rows, metrics, baselines, dbs), log=True)
        for i, mt in enumerate(metrics):
            ratios = [r["ratio"] for r in rows if r["metric"] == mt and r["ratio"] is not None]
            if ratios:
                ax.annotate(f"{min(ratios):.0%}–{max(ratios):.0%} of PPE", (i, 1), xycoords=("data", "axes fraction"),
                            xytext=(0, -12), textcoords="offset points", ha="center", fontsize=7)
        ax.set_title("1–2. jobs per second (higher is better)")
        ax.legend(fontsize=7, loc="lower right")

    # 3: efficiency
    ax = axes[0][1]
    rows = _rows(data, "efficiency")
    if rows:
        metrics = _metrics(rows)
        _grouped(ax, metrics, _series(rows, metrics, baselines, dbs), labels="%.2f")
        ideal = rows[0]["raw"]["ideal_s"]
        ax.axhline(ideal, color="black", ls="--", lw=1)
        ax.text(-0.45, ideal, f"ideal {ideal:g} s", va="bottom", fontsize=7)
        text = "\n".join(f"{r['database']}: {r['ratio']:.2f}x PPE" for r in rows if r["ratio"] is not None)
        ax.text(0.98, 0.98, text, transform=ax.transAxes, ha="right", va="top", fontsize=8,
                bbox={"facecolor": "white", "alpha": 0.8})
        ax.set_title("3. efficiency: wall time of 10 ms jobs (lower is better; target 1.10x PPE)")
        ax.set_ylabel("s")

    # 4: DAG times
    ax = axes[0][2]
    rows = [r for r in _rows(data, "dag") if r["unit"] == "s"]
    if rows:
        metrics = _metrics(rows)
        _grouped(ax, [t.replace(": time", "") for t in metrics], _series(rows, metrics, baselines, dbs), log=True)
        scale = {(r["database"], r["metric"].split(":")[0]): r["dbexecutor"] for r in _rows(data, "dag") if r["unit"] == "x"}
        for i, mt in enumerate(metrics):
            text = " ".join(f"{scale.get((db, mt.split(':')[0]), 0):.1f}" for db in dbs)
            ax.annotate(f"t(N)/t(N/10): {text}", (i, 1), xycoords=("data", "axes fraction"), xytext=(0, -12),
                        textcoords="offset points", ha="center", fontsize=7)
        ax.set_title("4. DAGs: seconds (lower is better; PPE runs waves)")
        ax.set_ylabel("s")

    # 5: claim
    ax = axes[1][0]
    rows = _rows(data, "claim")
    if rows:
        metrics = _metrics(rows)
        labels = [t.split(", ", 1)[1].replace(" + ", "\n+ ") for t in metrics]
        _grouped(ax, labels, _series(rows, metrics, [], dbs))
        ax.set_title("5. one claim, median ms (should stay flat)")
        ax.set_ylabel("ms")
        ax.legend(fontsize=7)

    # 6: latency
    ax = axes[1][1]
    rows = _rows(data, "latency")
    if rows:
        metrics = _metrics(rows)
        _grouped(ax, [t.replace(" p", "\np") for t in metrics], _series(rows, metrics, baselines, dbs), log=True)
        ax.axhline(5, color="black", ls=":", lw=1)
        ax.axhline(20, color="black", ls="--", lw=1)
        ax.set_title("6. submit-to-start latency, ms (dotted 5 ms, dashed 20 ms)")
        ax.set_ylabel("ms")

    # 7: memory
    ax = axes[1][2]
    rows = _rows(data, "memory")
    if rows:
        metrics = _metrics(rows)
        _grouped(ax, [t.replace(", ", "\n") for t in metrics], _series(rows, metrics, ["ppe"], dbs), labels="%.2f")
        ax.set_title("7. RSS growth, MB (target for the parent: < 20 MB)")
        ax.set_ylabel("MB")
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", nargs="?", default=str(ROOT / "benchmarks" / "results" / "latest.json"))
    parser.add_argument("-o", "--output", default=str(ROOT / "docs" / "benchmarks.png"))
    args = parser.parse_args(argv)
    with open(args.json) as f:
        plot(json.load(f), Path(args.output))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
