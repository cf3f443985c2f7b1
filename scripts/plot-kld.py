#!/usr/bin/env python3
"""Plot mean KL divergence against bits per value, one point per KV type.

Reads the --json output of one or more `turbokv-lab kld` runs, or their
stderr progress logs (the last "window i/n: ..." line of each type: a run
stopped early still plots), and writes a PNG. Runs over the same text,
--ctx and windows share the f32 reference, so their points are comparable;
the first run that has a type wins:

    scripts/plot-kld.py [-o docs/kld-vs-bits.png] run1.json [run2.json ...]

Log y axis; error bars are the standard error of the mean KLD. Markers:
ggml block formats (q8_0, q4_0, +h), uniform TurboQuant types (tqB), and
mixed TurboQuant specs (K:V pairs, layer overrides). Needs matplotlib
(pip install matplotlib).
"""
import argparse
import json
import math
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def family(kv):
    if kv.startswith("q") or kv.startswith("f16"):
        return "block"
    if ":" in kv or "," in kv:
        return "mixed"
    return "tq"


PROGRESS = re.compile(r"window (\d+)/(\d+): (\S+) +bits ([\d.]+) KLD ([\d.eE+-]+) \+- ([\d.eE+-]+) "
                      r"p99 ([\d.eE+-]+) top-1 ([\d.]+) PPL ratio ([\d.]+)")


def load_run(path, ctx=None, window=None):
    """A run as the --json object, from JSON or from a progress log (lines of
    window `window` only, when given: cumulative over windows 1..window)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text)
    except ValueError:
        pass
    types, windows = {}, 0
    for m in PROGRESS.finditer(text):
        if window and int(m.group(1)) != window:
            continue
        windows = max(windows, int(m.group(1)))
        types[m.group(3)] = dict(kv=m.group(3), bits_per_value=float(m.group(4)),
                                 kld_mean=float(m.group(5)), kld_stderr=float(m.group(6)),
                                 kld_p99=float(m.group(7)), top1=float(m.group(8)),
                                 ppl_ratio=float(m.group(9)))
    return dict(ctx=ctx or "?", windows=windows, types=list(types.values()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default="docs/kld-vs-bits.png")
    ap.add_argument("--ctx", type=int, help="context of progress logs (not in them)")
    ap.add_argument("--window", type=int, help="progress logs: use the numbers after this window")
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args()

    points, ctxs = {}, set()
    for path in args.runs:
        run = load_run(path, args.ctx, args.window)
        ctxs.add((run["ctx"], run["windows"]))
        for t in run["types"]:
            if "error" in t or t["kv"] in points:
                continue
            points[t["kv"]] = t
    if not points:
        sys.exit("plot-kld: no types in the runs")

    style = {
        "block": dict(marker="s", color="tab:orange", label="ggml blocks (q8_0, q4_0, +h)"),
        "tq": dict(marker="o", color="tab:blue", label="TurboQuant tqB / tqB.5"),
        "mixed": dict(marker="^", color="tab:green", label="TurboQuant K:V pairs, layer rules"),
    }
    fig, ax = plt.subplots(figsize=(12, 7.5), dpi=110)
    seen = set()
    placed = []  # label positions (x, log y) so far, to step labels apart
    for kv, t in sorted(points.items(), key=lambda p: (p[1]["bits_per_value"], p[1]["kld_mean"])):
        if kv == "f16":  # the noise floor: a line, not a point at 16 bits
            ax.axhline(t["kld_mean"], color="gray", linestyle="--", linewidth=1,
                       label=f"f16 (noise floor), {t['kld_mean']:.4f}")
            continue
        fam = family(kv)
        st = dict(style[fam])
        if fam in seen:
            st.pop("label")
        seen.add(fam)
        y = max(t["kld_mean"], 1e-6)
        ax.errorbar(t["bits_per_value"], y, yerr=t.get("kld_stderr", 0), linestyle="none",
                    capsize=2, markersize=6, **st)
        x, ly = t["bits_per_value"], math.log10(y)
        near = sum(1 for px, py in placed if abs(px - x) < 0.3 and abs(py - ly) < 0.06)
        placed.append((x, ly))
        arrow = dict(arrowstyle="-", lw=0.4, color="gray") if near else None
        ax.annotate(kv, (x, y), textcoords="offset points", xytext=(5 + 62 * near, -3),
                    fontsize=6.5, arrowprops=arrow)
    ax.set_yscale("log")
    ax.set_xticks([x / 2 for x in range(4, 19)])
    ax.set_xlabel("bits per value (every stored byte, turboquant.md section 6)")
    ax.set_ylabel("mean KL divergence vs f32 KV (log)")
    runs = ", ".join(f"ctx {c}, {w} window(s)" for c, w in sorted(ctxs))
    ax.set_title(f"KV cache fidelity, SmolLM2-135M-Instruct Q4_1 ({runs}, second half scored)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(args.output)
    print(args.output)


if __name__ == "__main__":
    main()
