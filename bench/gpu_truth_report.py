"""The GPU truth's targets and table: pure functions of the results dictionary.

Targets (issue 16), judged only on a GPU (a CPU dry run reports `pass: null`):
- a level-1 wake moves the weights at 80% or more of the measured pinned host-to-device bandwidth;
- a stopped trainer's memory shows as released in NVML within its grace + 1 s;
- across each sleep and wake, NVML's change in used memory and torch's change in reserved memory
  agree within 1%.
"""

from __future__ import annotations

from typing import Any

GIB = 1024**3
WAKE_FRACTION_TARGET = 0.80
RELEASE_MARGIN_S = 1.0
AGREEMENT_TARGET = 0.01


def agreement(row: dict[str, Any]) -> float | None:
    """|ΔNVML − Δtorch| / |Δtorch|, or None when torch moved nothing."""
    torch_delta = row.get("torchDeltaBytes")
    if not torch_delta:
        return None
    return abs(row["nvmlDeltaBytes"] - torch_delta) / abs(torch_delta)


def judge(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target with its measured value; `pass` is None where it cannot be judged."""
    on_gpu = results.get("device") == "cuda"
    out: list[dict[str, Any]] = []

    def add(name: str, value: Any, target: str, ok: bool | None) -> None:
        out.append({"name": name, "value": value, "target": target, "pass": ok if on_gpu else None})

    for e in results.get("engines", []):
        weights = size(e["weightsMiB"])
        if e["level"] == 1:
            fraction = e.get("wakeFractionOfPinned")
            add(
                f"wake bandwidth, {weights}",
                fraction,
                f">= {WAKE_FRACTION_TARGET:.0%} of pinned H2D",
                fraction is not None and fraction >= WAKE_FRACTION_TARGET,
            )
        add(f"bit-exact wake, {weights} level {e['level']}", e["bitExact"], "true", e["bitExact"])
        for row in e["stages"]:
            if row.get("judged"):
                a = agreement(row)
                add(
                    f"NVML vs torch, {weights} {row['stage']}",
                    a,
                    f"<= {AGREEMENT_TARGET:.0%}",
                    a is not None and a <= AGREEMENT_TARGET,
                )
    for t in results.get("trainer", []):
        limit = t["graceMs"] / 1000 + RELEASE_MARGIN_S
        released = t.get("releasedS")
        add(
            f"trainer memory released, {t['path']}",
            released,
            f"<= {limit:g} s",
            released is not None and released <= limit,
        )
    promotion = results.get("promotion")
    if promotion:
        add("promotion probe", promotion.get("probeOk"), "true", promotion.get("probeOk") is True)
    return out


def size(mib: int) -> str:
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib} MiB"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def render_table(results: dict[str, Any]) -> str:
    """A short plain-text report: the figures that matter, then every target."""
    gpu = results.get("gpu", {})
    lines = [
        f"GPU truth: {gpu.get('name')} ({results.get('device')}, memory from {gpu.get('source')})"
        f", torch {results.get('torch')}, {results.get('startedAt')}, "
        f"{results.get('durationS', 0):.0f} s",
    ]
    bw = results.get("bandwidth")
    if bw:
        pinned, pageable = bw["pinnedH2DBytesPerS"] / 1e9, bw["pageableH2DBytesPerS"] / 1e9
        lines.append(
            f"bandwidth GB/s: pinned H2D {pinned:.1f}, pageable H2D {pageable:.1f}, "
            f"pinned D2H {bw['pinnedD2HBytesPerS'] / 1e9:.1f}"
        )
    lines.append("")
    lines.append(
        f"{'engine':<14} {'sleep s':>8} {'wake s':>8} {'wake GB/s':>10} {'of pinned':>10} "
        f"{'residue MiB':>12} {'exact':>6}"
    )
    for e in results.get("engines", []):
        rate = e.get("wakeBytesPerS")
        lines.append(
            f"{size(e['weightsMiB']) + ' L' + str(e['level']):<14} {_fmt(e.get('sleepS')):>8} "
            f"{_fmt(e.get('wakeWeightsS')):>8} {(rate or 0) / 1e9:>10.1f} "
            f"{_fmt(e.get('wakeFractionOfPinned')):>10} "
            f"{e['residueWhileAsleepBytes'] / 2**20:>12.0f} {_fmt(e['bitExact']):>6}"
        )
    trainers = results.get("trainer", [])
    if trainers:
        lines.append("")
        lines.append(
            f"{'trainer stop':<14} {'held MiB':>9} {'exit s':>8} {'released s':>11} {'killed':>7}"
        )
        for t in trainers:
            lines.append(
                f"{t['path']:<14} {t['heldBytes'] / 2**20:>9.0f} {_fmt(t['exitS']):>8} "
                f"{_fmt(t['releasedS']):>11} {_fmt(t['killed']):>7}"
            )
    promotion = results.get("promotion")
    if promotion:
        steps = ", ".join(f"{k} {v:.3f}" for k, v in promotion["stepsS"].items())
        lines.append("")
        lines.append(f"promotion (s): {steps}; total {promotion['totalS']:.3f}")
    lines.append("")
    lines.append(f"{'target':<44} {'value':>10} {'wanted':>24} {'pass':>5}")
    for t in results.get("targets", []):
        verdict = {True: "PASS", False: "FAIL", None: "n/a"}[t["pass"]]
        lines.append(f"{t['name']:<44} {_fmt(t['value']):>10} {t['target']:>24} {verdict:>5}")
    return "\n".join(lines)
