#!/usr/bin/python3
"""Combine kiln-inspect --json reports and bench/pytorch_activation_memory.py's results into the
activation-memory table that bench/memory.sh prints, and write them together as one JSON file.

Usage: bench/memory_report.py --kiln fp32:none=A.json --kiln fp32:cheap=B.json ...
                              --pytorch pytorch.json [--pytorch more.json] [--json memory.json]
"""
from __future__ import annotations

import argparse
import json
from collections import OrderedDict

GIB = float(1 << 30)
LABEL = {"eager": "eager attention (saves T*T)", "flash": "flash-style attention (no T*T)",
         "fused": "flash-style attention + fused F.* ops"}


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def table(rows, header) -> str:
    cols = list(zip(*([header] + rows)))
    width = [max(len(str(c)) for c in col) for col in cols]
    fmt = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                              for i, (c, w) in enumerate(zip(r, width)))
    line = "  ".join("-" * w for w in width)
    return "\n".join([fmt(header), line] + [fmt(r) for r in rows])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", action="append", required=True,
                    help="PRECISION:RECOMPUTE=kiln-inspect.json (e.g. fp32:none=report.json)")
    ap.add_argument("--pytorch", action="append", required=True,
                    help="pytorch_activation_memory.py --json output (repeatable: runs are merged)")
    ap.add_argument("--json", help="write the combined results here")
    args = ap.parse_args()

    kiln = OrderedDict()
    for item in args.kiln:
        key, _, path = item.partition("=")
        with open(path) as f:
            d = json.load(f)
        kiln[key] = OrderedDict(
            report=path, precision=d["model"]["precision"], recompute=d["recompute"]["mode"],
            activation_bytes=d["activation_bytes"], naive_bytes=d["naive_bytes"],
            param_bytes=d["param_bytes"], accounting=d["accounting"], flops=d["flops"],
            recompute_report=d["recompute"],
            peak=OrderedDict(program=d["peak"]["program"], live_bytes=d["peak"]["live_bytes"],
                             largest=d["peak"]["largest"][:4]))
    pt = None
    for path in args.pytorch:              # several files: their runs are merged
        with open(path) as f:
            d = json.load(f)
        if pt is None:
            pt = d
        else:
            if (d["target_batch"], d["seq_len"], d["batches"][:2]) != (
                    pt["target_batch"], pt["seq_len"], pt["batches"][:2]):
                raise SystemExit(f"{path}: measured for another B/T than {args.pytorch[0]}")
            pt["runs"] += [r for r in d["runs"] if (r["precision"], r["attention"]) not in
                           {(q["precision"], q["attention"]) for q in pt["runs"]}]
    pt["runs"].sort(key=lambda r: (["fp32", "bf16"].index(r["precision"]),
                                   list(LABEL).index(r["attention"])))
    Bt, T = pt["target_batch"], pt["seq_len"]
    model = pt["model"]
    runs = {(r["precision"], r["attention"]): r for r in pt["runs"]}

    out = []
    say = out.append
    say(f"Activation memory of one training micro-step: {model.get('name', 'model')} "
        f"(L={model['n_layer']}, H={model['n_head']}, C={model['n_embd']}, V={model['vocab_size']}), "
        f"B={Bt}, T={T}.  GiB = 2^30 bytes.")
    say("")

    # 1. Kiln's plan.
    say("Kiln: planned activation arena (kilnc --emit=module [--recompute=cheap]; kiln-inspect --json)")
    rows = []
    for key, k in kiln.items():
        rows.append([f"{k['precision']} recompute={k['recompute']}", f"{k['activation_bytes']:,}",
                     gib(k["activation_bytes"]), f"{k['naive_bytes']:,}", gib(k["naive_bytes"]),
                     f"{k['activation_bytes'] / k['naive_bytes']:.3f}", gib(k["param_bytes"])])
    say(table(rows, ["kiln config", "activation_bytes", "", "naive_bytes", "",
                     "arena/naive", "param_bytes"]))
    say("")

    # 2. Recompute.
    say("Kiln --recompute=cheap vs none (saved = activation_bytes(none) - activation_bytes(cheap); "
        "extra = kiln-inspect recompute.flops)")
    rows, recompute = [], OrderedDict()
    for prec in ("fp32", "bf16"):
        a, b = kiln.get(f"{prec}:none"), kiln.get(f"{prec}:cheap")
        if not a or not b:
            continue
        saved = a["activation_bytes"] - b["activation_bytes"]
        extra = b["recompute_report"]["flops"]
        step = b["flops"]["forward"] + b["flops"]["backward"]
        recompute[prec] = OrderedDict(bytes_saved=saved, fraction_saved=saved / a["activation_bytes"],
                                      extra_flops=extra, step_flops=step,
                                      extra_fraction=extra / step,
                                      kernels=b["recompute_report"]["kernels"])
        rows.append([prec, gib(a["activation_bytes"]), gib(b["activation_bytes"]),
                     f"{saved:,} ({gib(saved)}, {100 * saved / a['activation_bytes']:.1f}%)",
                     f"{extra:.4g} ({100 * extra / step:.3f}% of fwd+bwd {step:.4g})",
                     str(b["recompute_report"]["kernels"])])
    say(table(rows, ["precision", "arena none", "arena cheap", "bytes saved",
                     "extra FLOPs per micro-step", "recompute kernels"]))
    say("")

    # 3. PyTorch.
    bs = pt["batches"]
    say(f"PyTorch eager {pt['torch']} (CPU): {pt['method']['model']}.")
    say(f"  peak  = {pt['method']['peak']}.")
    say(f"  saved = {pt['method']['saved']}.")
    say(f"  Run at B={bs[0]} and B={bs[1]} (the full B={Bt} eager step does not fit in this "
        f"machine's RAM) and extrapolated to B={Bt}: M({Bt}) = M0 + {Bt}*dM.")
    rows = []
    for (prec, att), r in runs.items():
        e = r["extrapolated"]
        m = {x["B"]: x for x in r["measured"]}
        label = f"{prec} {LABEL.get(att, att)}"
        rows.append([label, gib(m[bs[0]]["peak_bytes"]), gib(m[bs[1]]["peak_bytes"]),
                     f"{e['peak_bytes']['ratio']:.4f}", gib(e["peak_bytes"]["intercept"]),
                     gib(e["peak_bytes"]["estimate"]), gib(e["saved_bytes"]["estimate"]),
                     gib(e["saved_tt_bytes"]["estimate"]),
                     gib(r["meta_saved_bytes"]) if "meta_saved_bytes" in r else "-"])
    say(table(rows, ["pytorch config", f"peak B={bs[0]}", f"peak B={bs[1]}",
                     f"B{bs[1]}/B{bs[0]}", "M0 (B-indep.)", f"PEAK B={Bt}", f"SAVED B={Bt}",
                     f"of it [B,H,T,T]", f"saved B={Bt} (meta, exact)"]))
    for (prec, att), r in runs.items():
        for b, c in r["extrapolated"]["peak_bytes"].get("checks", {}).items():
            say(f"  linearity check {prec} {att}: peak at B={b} measured {gib(c['measured'])}, "
                f"fit predicts {gib(c['predicted'])} ({100 * c['rel_err']:+.2f}%)")
    say("")

    # 4. Kiln / PyTorch.
    pyt = OrderedDict()
    for (prec, att), r in runs.items():
        e = r["extrapolated"]
        pyt[f"{prec}:{att}:peak"] = e["peak_bytes"]["estimate"]
        pyt[f"{prec}:{att}:saved"] = e["saved_bytes"]["estimate"]
        if att == "eager":
            pyt[f"{prec}:eager:saved-minus-TT"] = (e["saved_bytes"]["estimate"]
                                                   - e["saved_tt_bytes"]["estimate"])
    variants = list(OrderedDict.fromkeys(att for _, att in runs))
    cols = [(f"{v}:peak", f"{v} peak") for v in variants]
    for v in variants:
        cols.append((f"{v}:saved", f"{v} saved"))
        if v == "eager":
            cols.append(("eager:saved-minus-TT", "eager saved - [B,H,T,T]"))
    say(f"Kiln activation_bytes / PyTorch (B={Bt}); like for like is the PEAK columns (both are the "
        "peak of live activation bytes over forward+backward, activation gradients included); "
        "'saved' (what autograd keeps for backward) is a lower bound for PyTorch")
    rows, ratios = [], OrderedDict()
    for key, k in kiln.items():
        prec = k["precision"]
        row = [f"{prec} recompute={k['recompute']}", gib(k["activation_bytes"])]
        for c, _ in cols:
            v = pyt.get(f"{prec}:{c}")
            if v:
                ratios[f"{key} / pytorch {prec}:{c}"] = k["activation_bytes"] / v
                row.append(f"{k['activation_bytes'] / v:.3f} (of {gib(v)})")
            else:
                row.append("-")
        rows.append(row)
    say(table(rows, ["kiln config", "kiln arena"] + [h for _, h in cols]))

    text = "\n".join(out)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(OrderedDict(kiln=kiln, recompute=recompute, pytorch=pt,
                                  pytorch_b16=pyt, kiln_over_pytorch=ratios, table=text),
                      f, indent=1)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
