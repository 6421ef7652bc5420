"""The README's measured tables, drawn from the shipped benchmark records (docs/bench/*.json), each with the machine
it was measured on, so that no number in the README can drift from its record.

    python -m tools.bench_tables          # print the section
    python -m tools.bench_tables --write  # put it into README.md between the markers

tests/ground/test_layout.py checks that README.md holds what this prints.
"""
from __future__ import annotations

import sys

from mtplab.errors import MtplabError
from mtplab.measuring.choice import STOP_NOTE
from mtplab.measuring.record import Record, machine_text
from tools import readme_section

START, END = "<!-- bench: drawn by tools/bench_tables.py from docs/bench/*.json -->", "<!-- /bench -->"


def _f(v, digits=2) -> str:
    if v is None:
        return "-"
    if isinstance(v, list):
        return " / ".join(_f(x, digits) for x in v)
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _record(name: str) -> Record | str:
    """docs/bench/NAME.json, or the line that says which command writes it."""
    try:
        return Record.load(name)
    except MtplabError as e:
        return f"({e})"


def _table(intro: str, columns: list[str], rows: list[str]) -> str:
    """An intro line, then a markdown table of the given header and already formatted rows."""
    return "\n".join([intro, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns), *rows])


def decode_table(name: str) -> str:
    d = _record(name)
    if isinstance(d, str):
        return d
    lines = [f"`docs/bench/{name}.md`: {d['prompts']} held-out prompts, m = {d['max_new_tokens']}, {d['repeats']} "
             f"interleaved repeats, medians, {d['dtype']}, {d.kernel()} kernels; {d.machine_text()}; t(1) = "
             f"{d['t1_ms']:.2f} ms" + (f" at {d['cost_curve_context']} cached tokens" if d.get("cost_curve_context")
                                     else "") + ".", "",
             "| method | k | tokens per forward | acceptance by position | drafter ms / step | wall clock vs AR | "
             "predicted | efficiency | greedy mismatches |", "|---|---|---|---|---|---|---|---|---|"]
    for r in d.rows:
        lines.append(f"| {r['label']} | {r['k']} | {_f(r['tokens_per_forward'])} | {_f(r['acceptance_per_position'])} | "
                     f"{_f(r['step_ms_drafter'])} | {_f(r['speedup_wall'])}x | {_f(r['speedup_predicted'])}x | "
                     f"{_f(r['efficiency'])} | {r['greedy_mismatches']} |")
    return "\n".join(lines)


def regime_table() -> str:
    d = _record("regime")
    if isinstance(d, str):
        return d
    lines = [f"`docs/bench/regime.md`, {d.machine_text()}, {d.kernel()} kernels: random models, one cached forward "
             "over q tokens.", "",
             "| layers x width | weights (MB, fp32) | fits in the last-level cache | t(1) ms | t(4)/t(1) | t(8)/t(1) |",
             "|---|---|---|---|---|---|"]
    for r in d["by_size"]:
        lines.append(f"| {r['n_layer']} x {r['n_embd']} | {r['weight_mb']:.1f} | {'yes' if r['fits_in_llc'] else 'no'} | "
                     f"{r['t1_ms']:.2f} | {r['ratio']['4']:.2f} | {_f(r['ratio'].get('8'))} |")
    lines += ["", "The 4-layer family's heads on trunks grown with identity blocks (same output, same acceptance):", "",
              "| heads | trunk layers | tokens per forward | AR ms per token | wall clock vs AR (range) | identical |",
              "|---|---|---|---|---|---|"]
    for r in d.table("by_depth"):
        lines.append(f"| {r['label']} | {r['n_layer']} | {r['tokens_per_forward']:.2f} | {r['ar_ms_per_token']:.2f} | "
                     f"{r['speedup']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f}) | "
                     f"{r['identical']}/{r['prompts']} |")
    return "\n".join(lines)


def k_table() -> str:
    d = _record("k")
    if isinstance(d, str):
        return d
    intro = (f"`docs/bench/k.md`: greedy, {d.get('dtype', 'fp32')}, {d.kernel()} kernels, m = {d['max_new_tokens']}, "
             f"{d['prompts']} held-out prompts, {d['repeats']} interleaved rounds against AR of the same checkpoint, "
             f"medians (range); {d.machine_text()}; t(q)/t(1): "
             + " ".join(f"{q}:{v:.2f}" for q, v in d["cost_curve"].items()) + ". The best fixed k of each row:")
    best = [r for r in d.rows if r["adapt"] == "fixed" and d["best"].get(r["label"], {}).get("k") == r["k"]]
    return _table(intro, ["drafter", "checkpoint", "best k", "tokens per step", "wall clock vs AR (range)",
                          "predicted", "identical"],
                  [f"| {r['label']} | {r['checkpoint']} | {r['k']} | {r['tokens_per_step']:.2f} | {r['speedup']:.2f}x "
                   f"({r['speedup_min']:.2f}-{r['speedup_max']:.2f}) | {r['speedup_predicted']:.2f}x | "
                   f"{r['identical']}/{r['prompts']} |" for r in best])


def batch_tables() -> str:
    b, t = _record("batch-quick"), _record("tree-quick")
    if isinstance(b, str) or isinstance(t, str):
        return b if isinstance(b, str) else str(t)
    spec = [r for r in b.rows if r["method"] != "ar"]
    ar = {(r["checkpoint"], r["batch_size"]): r.get("kernel", "-") for r in b.rows if r["method"] == "ar"}
    batch = _table(f"`docs/bench/batch-quick.md`: {b['max_new_tokens']} new tokens a row, median of {b['repeats']}, "
                   f"{b['dtype']}; {b.machine_text()}; each method against batched AR of its own checkpoint; the "
                   "kernels of AR's forwards (B rows) and of the verify's (B x k rows: exact up to 16, stock above):",
                   ["method", "checkpoint (layers)", "k", "batch", "kernels: AR / verify", "tokens per row-forward",
                    "wall clock vs AR", "t(k)/t(1) at this batch"],
                   [f"| {r['method']} | {r['checkpoint']} ({_f(r.get('n_layer'))}) | {r['k']} | {r['batch_size']} | "
                    f"{ar.get((r['checkpoint'], r['batch_size']), '-')} / {r.get('kernel', '-')} | "
                    f"{r['tokens_per_forward']:.2f} | {r['speedup']:.2f}x | {r['t_q_over_t1']:.2f} |" for r in spec])
    tree = _table(f"`docs/bench/tree-quick.md`: {t['prompts']} held-out prompts, {t['max_new_tokens']} new tokens, "
                  f"median of {t['repeats']}, {t['dtype']}, {t.kernel()} kernels; {t.machine_text()}:",
                  ["method", "checkpoint (layers)", "draft", "verify width", "tokens per forward", "wall clock vs AR"],
                  [f"| {r['method']} | {r['checkpoint']} ({_f(r.get('n_layer'))}) | {r['tree']} | {r['verify_width']} "
                   f"| {r['tokens_per_forward']:.2f} | {r['speedup']:.2f}x |" for r in t.rows])
    return batch + "\n\n" + tree


def peers_table() -> str:
    d = _record("peers")
    if isinstance(d, str):
        return d
    intro = (f"`docs/bench/peers.md`: `{d['hf']}` (draft `{d['draft_hf']}`), greedy, m = {d['max_new_tokens']}, "
             f"{d['prompts']} held-out prompts, {d['repeats']} interleaved rounds, medians against HF's plain greedy "
             f"`generate`; {d.machine_text()}.")
    return _table(intro, ["row", "tokens per forward", "wall clock vs HF greedy (range)", "share in the target's forward",
                          "identical to HF greedy"],
                  [f"| {r['method']} | {r['tokens_per_forward']:.2f} | {r['speedup_vs_hf_greedy']:.2f}x "
                   f"({r['speedup_min']:.2f}-{r['speedup_max']:.2f}) | {_f(r.get('forward_share'))} | "
                   f"{r['identical_to_hf_greedy']}/{r['prompts']} |" for r in d["rows"]])


def domain_table() -> str:
    d = _record("domain")
    if isinstance(d, str):
        return d
    intro = (f"`docs/bench/domain.md`: two 4-layer trunks, one recipe, only the corpus differs, DeepSeek D = 1 heads; "
             f"greedy, m = {d['max_new_tokens']}, {d['prompts']} held-out prompts of each text, {d['repeats']} "
             f"interleaved rounds against AR of the same trunk; {d.machine_text()}.")
    return _table(intro, ["trunk", "text", "bits per byte", "teacher-forced agreement", "method", "k",
                          "acceptance by position", "tokens per forward", "wall clock vs AR (range)", "identical"],
                  [f"| {r['trained_on']} | {r['text']} | {r['bpb']:.2f} | {r['teacher_forced_agree']:.2f} | "
                   f"{r['method']} | {r['k']} | {_f(r['acceptance_by_position'])} | {r['tokens_per_forward']:.2f} | "
                   f"{r['speedup']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f}) | "
                   f"{r['identical']}/{r['prompts']} |" for r in d["rows"]])


def real_table() -> str:
    d = _record("real")
    if isinstance(d, str):
        return d
    parts = []
    for n, st in d["threads"].items():
        intro = (f"`docs/bench/real.md`, {n} thread{'s' if n != '1' else ''}: SmolLM2-135M-Instruct, greedy, fp32, "
                 f"{st['prompts']} held-out chat prompts ({d['prompts_per_category']} per category), m = {d['m']}, "
                 f"{st['rounds']} interleaved rounds, medians; {st['verdict'].split(':')[0]}; "
                 f"{machine_text(st['machine'])}; AR: {st['ar_ms_per_token']:.1f} ms per token.")
        rows = []
        at = [r for r in d["rows"] if r["threads"] == int(n)]  # flat rows, each with its thread count
        for r in at:
            acc = r.get("acceptance", {}).get("pooled")
            first = (f"{acc['rate'][0]:.2f} ({acc['interval'][0][0]:.2f}-{acc['interval'][0][1]:.2f}), n = "
                     f"{acc['steps']}" if acc else "-")
            sp = r.get("split")
            rows.append(f"| {r['label']} | {_f(r.get('tokens_per_forward'))} | {r['speedup']:.2f}x "
                        f"({r['speedup_min']:.2f}-{r['speedup_max']:.2f}) | {first} | "
                        + (f"{sp['target_ms']:.0f} / {sp['draft_ms']:.1f} / {sp['overhead_ms']:.1f}" if sp else "-")
                        + f" | {r['looping']} | {r['identical_to_ar']}/{r['prompts']} | "
                        f"{r.get('identical_to_generate', '-')}/{r['prompts']} |")
        parts.append(_table(intro, ["row", "tokens per forward", "wall clock vs AR (range)",
                                    "1st draft accepted (95%)", "step ms: target / drafter / rest", "looping",
                                    "= AR", "= generate"], rows))
        if any(r.get("adapt") == "confidence" for r in at):
            parts.append(STOP_NOTE)
        low = [r for r in at if "vs_ar_same_dtype" in r]
        if low:
            parts.append("The bf16 rows are lossy (their tokens may differ from fp32 AR's) and their speed is "
                         "measured, not assumed: " + "; ".join(
                f"{r['label']} is {r['speedup']:.2f}x fp32 AR, {r['vs_ar_same_dtype']:.2f}x AR in bf16, and gives "
                "AR's fp32 tokens on "
                f"{r['identical_to_ar']} of {r['prompts']} prompts (AR in bf16's on {r['identical_to_ar_same_dtype']})"
                for r in low) + ".")
    every = d.get("acceptance_all", {})
    if every:
        lines = []
        for label, a in every.items():
            per = "; ".join(f"{c} {v['rate'][0]:.2f} ({v['interval'][0][0]:.2f}-{v['interval'][0][1]:.2f})"
                            for c, v in a["acceptance"].items() if c != "pooled")
            pooled = a["acceptance"]["pooled"]
            lines.append(f"- {label}: first draft accepted {pooled['rate'][0]:.2f} ({pooled['interval'][0][0]:.2f}-"
                         f"{pooled['interval'][0][1]:.2f}, n = {pooled['steps']} steps); by position "
                         + " / ".join(f"{x:.2f}" for x in pooled["rate"]) + f"; per category: {per}; "
                         f"{a['looping']} of {a['prompts']} continuations looping; identical to AR on "
                         f"{a['identical_to_ar']} of {a['prompts']}.")
        parts.append("Acceptance on every held-out prompt (untimed decodes, m = " + str(d["m"]) + "):\n\n"
                     + "\n".join(lines))
    curves = []
    for n, by in d.get("cost_curves", {}).items():
        for name, c in by.items():
            curves.append(f"| {n} | {name} | {c['t1_ms']:.1f} | " + " | ".join(
                _f(c["ratio"].get(q)) for q in ("2", "4", "8")) + " |")
    if curves:
        parts.append(_table("Its cost curve beside the classroom model's (`ntp`, 12 x 256), same machine:",
                            ["threads", "model", "t(1) ms", "t(2)/t(1)", "t(4)/t(1)", "t(8)/t(1)"], curves))
    return "\n\n".join(parts)


def section() -> str:
    parts = [START, "#### Decoding, one thread", "", decode_table("decode"), "", "#### Decoding, two threads", "",
             decode_table("decode-2threads"), "", "#### The best k", "", k_table(), "", "#### Batches and trees",
             "", batch_tables(), "", "#### The regime map", "", regime_table(), "",
             "#### Beside Hugging Face's generate", "", peers_table(), "", "#### Code against prose", "",
             domain_table(), "", "#### A real model: SmolLM2-135M-Instruct", "", real_table(), END]
    return "\n".join(parts)


def main(argv=None) -> int:
    return readme_section.main(argv, START, END, section)


if __name__ == "__main__":
    sys.exit(main())
