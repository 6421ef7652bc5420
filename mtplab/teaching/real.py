"""Notebooks 01, 05 and 09 on a real model: SmolLM2-135M-Instruct (30 x 576, 49,152 byte-level BPE tokens, 513 MiB in fp32)
with the heads the lab trained on its frozen trunk (`python -m mtplab distill`), and the shipped `bench real` record.

What a notebook needs in one call each: whether the model is installed (`missing`), the model with every shipped
head family (`load`), its cost curve beside another model's (`cost_curves`), what a draft's projection costs over
the full and the draft vocabulary against a forward of the trunk (`head_cost`), a short live race through the lab's
one race with the busy-machine guard (`live_race`), the record (`record`), and the steps of a chat answer as
tokens (`steps_markdown`).
"""
from __future__ import annotations

import functools
import importlib.util

import torch

from mtplab import paths
from mtplab.device import machine
from mtplab.decoding import adaptive
from mtplab.decoding.drafters import METHODS, pairs, real_label
from mtplab.errors import MtplabError
from mtplab.files import sha256
from mtplab.hf.prompts import heldout_ids
from mtplab.decoding.generate import decode_with, k_limit
from mtplab.hf.real import REAL_MODELS, chat_ids, end_of_turn, shipped_heads
from mtplab.measuring import timing
from mtplab.measuring.race import race
from mtplab.measuring.choice import choose_k, row_stop, setting
from mtplab.measuring.record import Record, machine_text, speedup_text
from mtplab.teaching.words import fastest_words, overlap, range_words

REAL = next(iter(REAL_MODELS))              # the real model the notebooks use (`hf.real.REAL_MODELS`)
REAL_JSON, RERUN = paths.REAL_JSON, paths.REAL_RERUN  # `bench real`'s record, and what rewrites it
_LOADED: dict = {}


def missing() -> str | None:
    """None when SmolLM2 can be used here; otherwise what to install (the notebooks then skip the real-model cells)."""
    if importlib.util.find_spec("transformers") is None:
        return 'transformers is not installed: pip install -e ".[hf]"'
    if importlib.util.find_spec(REAL_MODELS[REAL].module) is None or importlib.util.find_spec("gguf") is None:
        return f"the real model is not installed: {REAL_MODELS[REAL].install}"
    return None


def load(device="cpu"):
    """SmolLM2 with every head family the lab ships for it, loaded once per session (`hf.study.Heads`)."""
    why = missing()
    if why:
        raise MtplabError(why)
    from mtplab.hf.study import load_heads_all  # transformers
    key = str(device)
    if key not in _LOADED:
        _LOADED[key] = load_heads_all(REAL, device)
    return _LOADED[key]


def cost_curves(models: dict, qs=(1, 2, 4, 8), *, context: int = 128, repeats: int = 5) -> dict:
    """name -> `CostCurve` of each model, measured one after the other on this machine."""
    return {name: timing.measure_cost_curve(m, qs, context=context, repeats=repeats) for name, m in models.items()}


@torch.inference_mode()
def head_cost(heads, *, context: int = 128, repeats: int = 7) -> dict:
    """Milliseconds (medians, interleaved) of: one trunk forward over one new token (t(1), its own projection
    included), one draft's projection over the full vocabulary, and over the draft vocabulary; and each projection
    as a fraction of t(1)."""
    t = heads.target
    dev = t.wte.weight.device
    V = t.config.vocab_size
    g = torch.Generator().manual_seed(0)
    cache = t.new_cache()
    t(torch.randint(V, (1, context), generator=g).to(dev), cache)
    one = torch.randint(V, (1, 1), generator=g).to(dev)
    h = torch.randn(1, t.config.n_embd, generator=g).to(dev)
    vocab = heads.vocab

    def forward():
        t(one, cache)
        cache.crop(context)

    ids = torch.as_tensor(vocab, dtype=torch.long, device=dev) if vocab is not None else None
    rows = t.lm_head.weight.detach()[ids].contiguous() if ids is not None else None  # gathered once, as a decode does

    def full():
        t.unembed(h)

    def reduced():  # what `HFTarget.draft_unembed` does with a draft vocabulary set
        small = torch.nn.functional.linear(t.norm(h), rows)
        small.new_full((*small.shape[:-1], V), float("-inf")).index_copy_(-1, ids, small)

    parts = {"forward": forward, "full": full}
    if vocab is not None:
        parts["reduced"] = reduced
    res = race({n: timing.untimed_output(fn) for n, fn in parts.items()}, [None], baseline="forward", rounds=repeats,
               device=dev)  # the lab's one race
    ms = {k: 1e3 * res.seconds_median(k) for k in parts}
    out = {"t1_ms": ms["forward"], "full_ms": ms["full"], "full_share": ms["full"] / ms["forward"],
           "vocab": V, "draft_vocab": len(vocab) if vocab is not None else None}
    if "reduced" in ms:
        out.update(reduced_ms=ms["reduced"], reduced_share=ms["reduced"] / ms["forward"])
    out["busy"] = res.busy  # why the race was not valid here (None: valid)
    return out


def _cheaper(small_ms: float, big_ms: float, what: str) -> str:
    """'1.8x cheaper than {what}' or '1.3x the time of {what}: dearer', the direction chosen by the numbers."""
    if small_ms < big_ms:
        return f"{big_ms / small_ms:.1f}x cheaper than {what}"
    return f"{small_ms / big_ms:.1f}x the time of {what}: no cheaper"


def projection_lines(hc: dict, train: dict | None = None) -> list[str]:
    """Notebook 01 §6: `head_cost` in words (a draft's projection over the full vocabulary and over the draft
    vocabulary, each as a share of t(1), which is cheaper said from the numbers, a busy timing said so), then the
    draft vocabulary's own study from the heads' record: its size, which branch of the rule chose it (the smallest
    size reaching the coverage goal, else every token counted), and the projection times measured there."""
    lines = [f"one draft through the full {hc['vocab']:,}-row projection: {hc['full_ms']:.2f} ms = "
             f"{hc['full_share']:.0%} of t(1)"]
    if "reduced_ms" in hc:
        lines.append(f"one draft through the {hc['draft_vocab']:,}-row draft vocabulary: {hc['reduced_ms']:.2f} ms = "
                     f"{hc['reduced_share']:.0%} of t(1), " + _cheaper(hc["reduced_ms"], hc["full_ms"], "the full one")
                     + ("" if hc.get("busy") is None else
                        " (timed on a busy machine, not valid here: the record's study below is the figure to read)"))
    train = train if train is not None else (record(TRAIN_JSON) or {})
    dv = train.get("draft_vocab") or {}
    row = next((r for r in dv.get("sizes", []) if r.get("size") == dv.get("chosen")), None)
    if row is None:
        return lines + ["the heads' record holds no draft vocabulary study"]
    goal, cov = dv["goal"], row["coverage_held_out"]
    rule = (f"the smallest size tried whose coverage of the held-out answers' tokens reached the goal of {goal:.0%} "
            f"({cov:.1%})" if cov >= goal else
            f"every distinct token counted in the training answers, since no size tried reached the goal of {goal:.0%} "
            f"of the held-out answers' tokens (this one holds {cov:.1%})")
    where = machine_text(dv["machine"]) if dv.get("machine") else "machine not recorded"
    lines.append(f"the draft vocabulary (data/hf/{REAL}/record.json): {dv['chosen']:,} tokens, {rule}; its projection "
                 f"took {row['projection_ms']:.2f} ms there against {dv['full_projection_ms']:.2f} ms over the full "
                 f"vocabulary, " + _cheaper(row["projection_ms"], dv["full_projection_ms"], "the full one")
                 + f" ({where}" + (")" if dv.get("busy") is None else f"; not valid: {dv['busy']})"))
    return lines + decode_size_lines(dv.get("decode"))


def decode_size_lines(dec: dict | None) -> list[str]:
    """The draft vocabulary's size as decoding chose it after training (`distill.vocab.decode_sizes`, the record's
    `draft_vocab.decode`): every size's speedup with its range, the rule that chose among them, and what the chosen
    size gives up (held-out coverage, first-draft acceptance) and buys (milliseconds a draft) against the trained one."""
    if not dec:
        return []
    rows = {r["size"]: r for r in dec["sizes"]}
    best, trained = rows[dec["chosen"]], rows.get(dec["trained_size"])
    top = max(rows.values(), key=lambda r: r["speedup"])
    where = machine_text(dec["machine"]) + ("" if dec.get("busy") is None else f"; not valid: {dec['busy']}")
    line = (f"then sized by decoding, in a race against AR ({dec['method']}, k={dec['k']}, on {dec['prompts']} held-out "
            f"prompts that bench real does not time, {dec['rounds']} rounds; {where}): "
            + "; ".join(f"{n:,} tokens {speedup_text(r)}" for n, r in sorted(rows.items()))
            + f". The highest median is {top['size']:,}'s ({top['speedup']:.3f}x, its range from "
            f"{top['speedup_min']:.3f}). The heads draft over the {dec['chosen']:,} most frequent of the "
            f"{dec['trained_size']:,} tokens they were trained over, by the rule: {dec['rule']}")
    if trained is not None and trained is not best:
        line += (f". Against the trained size it holds {best['coverage_held_out']:.1%} of the held-out answers' tokens "
                 f"(not {trained['coverage_held_out']:.1%}), first drafts accepted {best['first_draft_acceptance']:.2f} "
                 f"(not {trained['first_draft_acceptance']:.2f}), {best['ms_per_draft']:.2f} ms a draft (not "
                 f"{trained['ms_per_draft']:.2f})")
    return [line + "."]


def prompts_by_category(heads, per_category: int = 1) -> tuple[list[list[int]], list[str]]:
    """The held-out chat prompts (data/prompts/heldout.json), per_category of each, as chat-template ids, and the
    category of each (`hf.prompts.heldout_ids`)."""
    return heldout_ids(heads.target, per_category)


def live_race(heads, rows: list[str], prompts: list[list[int]], cats: list[str], *, m: int = 32,
              rounds: int = 2) -> dict:
    """The rows named (labels of the real model's `PAIRS` rows; AR is always the baseline), raced the lab's way on these
    prompts, with the guard's verdict."""
    from mtplab.hf.study import rows_of_real, study  # transformers
    by = {r.label: r for r in rows_of_real()}
    bad = [r for r in rows if r not in by]
    if bad:
        raise MtplabError(f"no real-model row named {bad[0]!r}; choose among: {'; '.join(by)}")
    want = [by["AR"]] + [by[r] for r in rows if r != "AR"]
    return study(heads, prompts, cats, rows=want, m=m, rounds=rounds)


def record(path=REAL_JSON) -> dict | None:
    """The shipped `bench real` record (`path`: another record, such as the heads' training record `TRAIN_JSON`), or
    None when it is not there."""
    if not path.is_file():
        return None
    return Record.load(path).data


def label_of(spec, rec: dict | None = None) -> str:
    """A real-model row's label, as a notebook's parameters name it: "best" (the record's best exact row with
    trained heads, `best_row`), a label as text, or (method, k, draft vocabulary) of a `PAIRS` row of the real model,
    whose label is made from those fields (`drafters.real_label`; a label holds '=', which papermill cannot parse in a parameters
    cell). fp32 rows only: the bf16 ones are lossy. A label carries no flag: a caller that reads the record's row
    prints `record_heads_note(rec, label)` (the row was measured with other heads than the shipped ones)."""
    if isinstance(spec, str) and spec != "best":
        return spec
    if spec == "best":
        rec = rec if rec is not None else record()
        if rec is None:
            raise MtplabError("no bench real record (docs/bench/real.json) to find the best row in; restore it from git")
        return best_row(rec)["label"]
    rows = pairs(next(iter(REAL_MODELS)))
    if not isinstance(spec, (tuple, list)) or len(spec) != 3 or tuple(spec[:2]) + (spec[2], "fp32") not in {
            (p.method, p.k, p.draft_vocab, p.dtype) for p in rows}:
        names = "; ".join(dict.fromkeys(f"({p.method!r}, {p.k}, {p.draft_vocab!r})" for p in rows
                                        if p.dtype == "fp32" and p.stop is None))
        raise MtplabError(f"name a real-model row as (method, k, draft vocabulary) or by its label (got {spec!r}); "
                          f"the rows are {names}")
    return real_label(spec[0], spec[1], spec[2])


def _rows(rec: dict, threads: str = "1") -> list[dict]:
    """The record's rows measured at one thread count (every row carries `threads`)."""
    return [r for r in rec["rows"] if r["threads"] == int(threads)]


def size_lines(smol, model, name: str, device) -> list[str]:
    """Notebook 01 §6: the real model's shape and its float32 weights beside the classroom model's and this machine's
    last-level cache."""
    size_mib = sum(p.numel() for p in smol.target.hf.parameters()) * 4 / 2**20
    llc = machine(device)["llc_bytes"]
    cfg = smol.target.config
    return [f"SmolLM2-135M-Instruct: {cfg.n_layer} layers x {cfg.n_embd}, vocabulary {cfg.vocab_size:,}",
            f"SmolLM2-135M-Instruct: {size_mib:.0f} MiB of float32 weights; {name}: "
            f"{model.num_params() * 4 / 2**20:.0f} MiB; this machine's last-level cache: "
            + (f"{llc / 2**20:.0f} MiB" if llc else "unknown")]


def record_table(rec: dict) -> tuple[str, list[dict]]:
    """Notebook 01 §6: the shipped record's rows (one thread) as a table, and the caption that says where and how
    they were measured and, where the record has bf16 rows, what their columns mean."""
    m = rec["machine"]
    rows = [{"row": r["label"], "dtype": r.get("dtype", "fp32"), "tokens/forward": r.get("tokens_per_forward") or "-",
             "vs AR": r["speedup"], "range": f"{r['speedup_min']:.2f}-{r['speedup_max']:.2f}",
             "= AR": f"{r['identical_to_ar']}/{r['prompts']}"} for r in _rows(rec)]
    caption = (f"The shipped record, 1 thread, {rec['prompts_per_category'] * 6} prompts, m = {rec['m']}, measured on "
               f"{m['cpu']}, last-level cache {m['llc']}, torch {m['torch']} (another machine: compare its ratios, not "
               "its times)." + (" The bf16 rows give up exactness: their = AR column counts the prompts whose tokens "
                                "still equal float32 AR's, and their vs AR column says whether bf16 was faster at all."
                                if any(r["dtype"] == "bf16" for r in rows) else ""))
    return caption, rows


def _first_draft(row: dict) -> tuple[float, float, float] | None:
    """A record row's first-draft acceptance (rate, low, high) pooled over its prompts, or None."""
    a = (row.get("acceptance") or {}).get("pooled")
    if not a or not a.get("rate"):
        return None
    return a["rate"][0], *a["interval"][0]


def untrained_words(rec: dict, threads: str = "1") -> str:
    """Notebook 01 §6: the record's exact row that needs no training (prompt lookup, n-gram) of the highest median
    against its exact row with trained heads of the highest median (`best_row`, whose flag it prints), and which one
    wins where their ranges lie apart; the reasons are read from the two rows: tokens per forward, drafts a step,
    the first draft's acceptance (95% intervals) and the drafter's time a step."""
    best = best_row(rec, threads)
    flag = f". {best['other_heads']}" if best["other_heads"] else ""  # measured with other heads: said, not hidden
    free = [r for r in _rows(rec, threads) if not r.get("family") and (r.get("tokens_per_forward") or 0) > 1
            and r.get("method") not in ("ar", "hf-generate") and r.get("dtype", "fp32") == "fp32"
            and r.get("kernel", "exact") == "exact"]
    if not free:
        return ("the record has no exact row that drafts without training (n-gram, prompt lookup) to set beside the "
                "heads" + flag)
    ng = max(free, key=lambda r: r["speedup"])
    both = (f"in the record, {ng['label']} (n-gram prompt lookup, no training) ran {ng['speedup']:.2f}x AR (range "
            f"{ng['speedup_min']:.2f}-{ng['speedup_max']:.2f}) with {ng['tokens_per_forward']:.2f} tokens per forward; "
            f"the exact chain row with trained heads of the highest median, {best['label']}, {best['speedup']:.2f}x with "
            f"{best['tokens_per_forward']:.2f} (range {best['speedup_min']:.2f}-{best['speedup_max']:.2f})")
    if overlap(ng, best):
        return both + ": their ranges overlap, so the record does not rank the two" + flag
    win, lose = (ng, best) if ng["speedup"] > best["speedup"] else (best, ng)
    why = []
    if win["tokens_per_forward"] > lose["tokens_per_forward"]:
        more = "more tokens per forward"
        dw, dl = (win["k"] or 1) - 1, (lose["k"] or 1) - 1
        aw, al = _first_draft(win), _first_draft(lose)
        if dw > dl and aw and al:
            apart = not overlap(aw[1:], al[1:])
            more += (f", from {dw} drafts a step against {dl} (first draft kept {aw[0]:.2f}, 95% interval "
                     f"{aw[1]:.2f}-{aw[2]:.2f}, against {al[0]:.2f}, {al[1]:.2f}-{al[2]:.2f}: "
                     + ("the intervals lie apart)" if apart else
                        "the intervals overlap, so it is the number of drafts, not a higher acceptance)"))
        why.append(more)
    dm_w, dm_l = (win.get("split") or {}).get("draft_ms"), (lose.get("split") or {}).get("draft_ms")
    if dm_w is not None and dm_l is not None and dm_w < dm_l:
        why.append(f"a cheaper drafter, {dm_w:.1f} ms a step against {dm_l:.1f}")
    reason = f". Why, from the two rows: {'; and '.join(why)}" if why else ""
    if win is ng:  # above the best row; every other trained row too only where none of their ranges reaches its own
        rivals = [r for r in exact_rows(rec, threads) if r["label"] != best["label"] and overlap(r, ng) and _same_heads(r, best)]
        if not rivals:
            return both + f": in this record the drafter that needs no training beats the trained heads{reason}{flag}"
        tie = (". Beside the other trained rows: " + " and ".join(
            f"{r['label']} ({r['speedup']:.2f}x, range {r['speedup_min']:.2f}-{r['speedup_max']:.2f})" for r in rivals)
            + f" reach{'es' if len(rivals) == 1 else ''} into the n-gram row's range, so the record does not rank the "
            "drafter that needs no training above every trained row")
        return both + f": in this record the drafter that needs no training beats that row{reason}{tie}{flag}"
    return both + f": the trained heads beat the drafter that needs no training{reason}{flag}"


def k_sweep(rec: dict) -> tuple[list[dict], list[dict]]:
    """Notebook 09 §5: the record's exact rows of the DeepSeek heads over the draft vocabulary that draft k-1 tokens
    every step, by k (the bf16 rows are lossy, their tokens may differ from fp32 AR's, so they are left out; the rows
    with a confidence stop are `stop_lines`'), and the table the notebook shows of them."""
    ks = [r for r in exact_rows(rec) if r["family"] == "deepseek" and r["draft_vocab"] == "reduced"]
    table = [{"k": r["k"], "row": r["label"], "tokens per forward": r["tokens_per_forward"], "vs AR": r["speedup"],
              "range": f"{r['speedup_min']:.2f}-{r['speedup_max']:.2f}"} for r in ks]
    return ks, table


def stop_lines(rec: dict, ks: list[dict]) -> list[str]:
    """The record's DeepSeek rows with a confidence stop (exact, fp32, a chain over the draft vocabulary) against
    the best of `ks` (k-1 drafts every step): each one's median and range, and whether the ranges lie apart; nothing
    where the record has no such row."""
    stops = [r for r in stop_rows(rec) if r["family"] == "deepseek" and r.get("draft_vocab") == "reduced"]
    if not stops or not ks:
        return []
    best = max(ks, key=lambda r: r["speedup"])
    out = []
    for r in stops:
        side = ("above" if r["speedup_min"] > best["speedup_max"] else "below" if r["speedup_max"] < best["speedup_min"]
                else None)
        out.append(f"{setting(r['k'], row_stop(r))} (drafts end at the first below that probability): {speedup_text(r)}, "
                   f"{r['tokens_per_forward']:.2f} tokens per forward; "
                   + (f"its range lies {side} the best fixed k's ({speedup_text(best)})" if side else
                      f"its range overlaps the best fixed k's ({speedup_text(best)}), so the record does not separate "
                      "them"))
    return out


def k_sweep_lines(rec: dict, ks: list[dict]) -> list[str]:
    """The record's cost curve of the real model, its best k (and the k whose range overlaps it: a tie), and the k
    with the most tokens per forward, said slower only where the ranges lie apart, with both steps' time split."""
    curve = rec["cost_curves"]["1"][next(iter(REAL_MODELS))]["ratio"]
    best = max(ks, key=lambda r: r["speedup"])
    most = max(ks, key=lambda r: r["tokens_per_forward"])
    ties = [r for r in ks if r is not best and overlap(r, best)]
    line = (f"best k in the record (the highest median): {best['k']} ({best['speedup']:.2f}x, range {best['speedup_min']:.2f}-"
            f"{best['speedup_max']:.2f})")
    if ties:
        line += ("; " + ", ".join(f"k = {r['k']} ({r['speedup']:.2f}x, {r['speedup_min']:.2f}-{r['speedup_max']:.2f})"
                                  for r in ties)
                 + " overlap" + ("s" if len(ties) == 1 else "") + " it, so the record does not separate them")
    if most is best:
        line += f"; it also makes the most tokens per forward ({most['tokens_per_forward']:.2f})"
    else:
        a, b = most.get("split") or {}, best.get("split") or {}
        steps = (f"verify {a.get('target_ms', 0):.0f} + drafter {a.get('draft_ms', 0):.0f} ms a step, against "
                 f"{b.get('target_ms', 0):.0f} + {b.get('draft_ms', 0):.0f}")
        rng = f"range {most['speedup_min']:.2f}-{most['speedup_max']:.2f}"
        verdict = (f"{rng}, apart from the best's): more tokens per forward, yet slower, because its step costs more "
                   f"({steps})" if most["speedup_max"] < best["speedup_min"] else
                   f"{rng}, overlapping the best's): more tokens per forward bought no measured speed, its step "
                   f"costing more ({steps})")
        line += (f"; the most tokens per forward: k = {most['k']} ({most['tokens_per_forward']:.2f} against "
                 f"{best['tokens_per_forward']:.2f}), at {most['speedup']:.2f}x ({verdict}")
    return ["the record's cost curve of SmolLM2: " + ", ".join(f"t({q})/t(1) = {v:.2f}" for q, v in curve.items()
                                                              if q != "1"), line]


def study_row(rec: dict, label: str) -> tuple[dict | None, str]:
    """The record's acceptance-study row for `label` (with its label), and a note. The study decodes a few rows only;
    for another k of a method it did decode (same method and draft vocabulary), its nearest k is given, and the note
    says so. (None, why) when the study has neither."""
    study, rows = rec.get("acceptance_all", {}), rec.get("rows", [])
    if label in study:
        return {**study[label], "label": label}, ""
    row = next((r for r in rows if r["label"] == label), {})

    def same(r):  # the same heads, vocabulary and kernel as `row`, at some k
        return all(r.get(f) == row.get(f) for f in ("method", "draft_vocab", "kernel"))
    near = min(((abs(r["k"] - row["k"]), r["k"], r["label"]) for r in rows
                if r["label"] in study and r.get("k") and row.get("k") and same(r)), default=None)
    if near is None:
        return None, f"{label!r} is not in the record's acceptance study; it has {list(study)}"
    _, k, other = near
    stopped = (f" and k-1 drafts every step, not the row's confidence stop {row_stop(row):g}"
               if row_stop(row) is not None else "")
    return {**study[other], "label": other}, (
        f"the acceptance study decoded {other}, not {label}: the same heads and draft vocabulary at k={k}{stopped}; the "
        f"first draft comes from the same module either way, but the steps start at other positions, so the rates can "
        f"differ a little")


def category_acceptance(row: dict, position: int = 0) -> list[dict]:
    """Per category and pooled: the acceptance of the draft at `position` (0: the first draft), with n and
    the 95% interval."""
    return [{"category": cat, "accepted": a["accepted"][position], "steps": a["steps"], "rate": a["rate"][position],
             "low": a["interval"][position][0], "high": a["interval"][position][1]}
            for cat, a in row.get("acceptance", {}).items() if len(a["rate"]) > position]


def steps_markdown(trace, target, *, limit: int = 8) -> str:
    """The first `limit` steps of a decode as a table of tokens: accepted, rejected, discarded, the bonus."""
    def piece(i):
        return "`" + target.token_repr(i).replace("`", "'") + "`"
    lines = ["| step | accepted | rejected | discarded | target's token |", "|---|---|---|---|---|"]
    for n, s in enumerate(trace.steps[1:limit + 1], start=1):
        acc = " ".join(piece(d) for d in s.drafted[:s.accepted]) or "-"
        rej = piece(s.drafted[s.accepted]) if s.accepted < len(s.drafted) else "-"
        dis = " ".join(piece(d) for d in s.drafted[s.accepted + 1:]) or "-"
        bonus = piece(s.bonus) if s.bonus is not None else "-"
        lines.append(f"| {n} | {acc} | {rej} | {dis} | {bonus} |")
    return "\n".join(lines)


def live_words(live: dict, row: dict) -> str:
    """The live race in words: when the busy guard marks it not valid, that first and no verdict; otherwise the
    verdict from the row's own range (`words.range_words`)."""
    if not live["valid"]:
        return live["verdict"] + f" (measured {row['speedup']:.2f}x, not read as a verdict)"
    return ("live, on this machine: " + range_words(row["speedup"], row["speedup_min"], row["speedup_max"])
            + f" ({live['verdict']})")


# ---------------------------------------------------------------------------------- the result explained
TRAIN_JSON = REAL_MODELS[REAL].heads_dir / "record.json"  # how the heads were trained (`distill`)
# DeepSeek-V3 Technical Report §5.4.3: with its one MTP module (D = 1), the second token is accepted "between 85% and
# 90% across various generation topics" (1.8x tokens per second). The low end is the what-if below.
DEEPSEEK_V3_SECOND_TOKEN = 0.85
DEEPSEEK_V3_CITE = ("DeepSeek-V3 Technical Report §5.4.3: one MTP module, second-token acceptance 85-90% "
                    "across generation topics")


def exact_rows(rec: dict, threads: str = "1") -> list[dict]:
    """The record's exact rows that draft with trained heads k-1 tokens every step (fp32, a head family, the exact
    kernel, a chain): the lab's MTP rows, whose tokens per step and costs the notebooks take apart. The stock-kernel,
    token-tree and confidence-stop rows are comparisons beside them (`stop_lines`)."""
    return [r for r in _head_chains(rec, threads) if row_stop(r) is None]


def stop_rows(rec: dict, threads: str = "1") -> list[dict]:
    """The record's exact chains with trained heads whose drafts end at a confidence stop (`exact_rows`' siblings)."""
    return [r for r in _head_chains(rec, threads) if row_stop(r) is not None]


def _head_chains(rec: dict, threads: str) -> list[dict]:
    return [r for r in _rows(rec, threads) if r.get("family") and r.get("dtype", "fp32") == "fp32"
            and r.get("kernel", "exact") == "exact" and not r.get("widths")]


def best_row(rec: dict, threads: str = "1") -> dict:
    """The exact MTP row with the highest median wall clock against AR in the record, among the rows of the heads
    the lab ships now (by the heads file's sha256, `measuring.choice.heads_sha256`). When no row is of those heads (they were
    retrained and the record not rerun, or the record names no heads), the highest among the rows the record has,
    flagged: the returned copy's `other_heads` is `heads_note`'s line (None for a row of the shipped heads), and
    every caller prints it. `best_words` says whether the ranges make it the fastest."""
    rows = exact_rows(rec, threads)
    if not rows:
        raise MtplabError(f"the bench real record has no exact row with trained heads; rerun {RERUN}")
    ours = [r for r in rows if heads_note(r) is None]
    best = max(ours or rows, key=lambda r: r["speedup"])
    return {**best, "other_heads": heads_note(best)}


def heads_note(row: dict) -> str | None:
    """None when a record row decoded with no heads or with the heads file the lab ships now for its family (by
    sha256); else one line saying that it measured other heads (or heads the record does not name), so its numbers
    are not the shipped heads', and how to measure those."""
    family = row.get("family")
    if not family:
        return None
    ours, theirs = shipped_sha256(family), row.get("heads_sha256")
    if theirs and theirs == ours:
        return None
    measured = f"sha256 {theirs[:12]}" if theirs else "the record does not name them"
    now = f"the lab ships {ours[:12]}" if ours else f"the lab ships no {family} heads now"
    return f"{row['label']} was measured with other heads ({measured}; {now}): re-run {RERUN} to measure the shipped ones"


def record_heads_note(rec: dict, label: str) -> str | None:
    """`heads_note` of the record's row `label` (None when the record has no such row)."""
    return next((heads_note(r) for r in rec.get("rows", []) if r.get("label") == label), None)


def best_words(rec: dict, threads: str = "1") -> str:
    """`best_row` in words the record carries: the fastest exact row with trained heads only when its range lies
    apart from every other's (`words.fastest_words`), else the fastest by median within the rows it overlaps; a token
    tree or a confidence stop with a higher median, beside it; and `best_row`'s flag when it was measured with other
    heads than the shipped ones."""
    best = best_row(rec, threads)
    others = [r for r in exact_rows(rec, threads) if r["label"] != best["label"] and _same_heads(r, best)]
    words = (f"in {REAL_JSON.name}, " + fastest_words(best, others, lambda r: r["label"],
                                                       among=f"exact chain row with trained heads at {threads} thread"
                                                       + ("s" if str(threads) != "1" else "")))
    trees = [r for r in _rows(rec, threads) if r.get("family") and r.get("widths") and r.get("kernel", "exact") == "exact"]
    # above the chains by median, said with its range: a token tree (several drafts a position), and drafts ended at
    # the first unsure one (`stop_lines`)
    for what, rows in (("a token tree beside the chains", trees), ("with a confidence stop", stop_rows(rec, threads))):
        above = [r for r in rows if r["speedup"] > best["speedup"] and _same_heads(r, best)]
        if above:
            t = max(above, key=lambda r: r["speedup"])
            words += (f"; {what}, {t['label']}, has a higher median: {speedup_text(t)}, "
                      + ("overlapping the chain's range" if overlap(t, best) else "above the chain's range"))
    return words + (f". {best['other_heads']}" if best["other_heads"] else "")


def _same_heads(row: dict, best: dict) -> bool:
    """Whether `row` measured the shipped heads exactly when `best` (a `best_row`) did: rows are ranked only
    against rows of the same heads."""
    return (heads_note(row) is None) == (best["other_heads"] is None)


def k_words(choice) -> str:
    """`measuring.choice.choose_k`'s choice in words: its `why` (every compared row's median and range), and, when the record
    compared several k, whether their ranges make the chosen k the fastest (`words.fastest_words`)."""
    if choice.source != "record" or len(choice.rows) < 2:
        return choice.why
    best, *others = choice.rows
    return choice.why + ": " + fastest_words(best, others, lambda r: setting(r["k"], row_stop(r)), among="k")


def shipped_sha256(family: str | None) -> str | None:
    """The sha256 of the heads file the lab ships for the real model and this family (None: none ships); each file
    is read once a session."""
    path = shipped_heads(REAL, family) if family else None
    return _sha256_once(path) if path is not None else None


_sha256_once = functools.cache(sha256)


def _step_ms(row: dict) -> float:
    sp = row["split"]
    return sp["target_ms"] + sp["draft_ms"] + sp["overhead_ms"]


def speedup_parts(rec: dict, label: str | None = None, *, threads: str = "1",
                  other_acceptance: float = DEEPSEEK_V3_SECOND_TOKEN) -> dict:
    """One record row's speedup taken apart: tokens per step over the step's cost in AR steps (target verify,
    drafter, the rest, each measured in the record's time split), beside the measured ratio; and what-if rows that
    change one side: this acceptance with a verify that costs at most one AR step (a flat cost curve; a verify that
    measured less keeps its cost), the same with a free drafter too (the acceptance's own ceiling), and
    `other_acceptance` per draft (DeepSeek-V3's second-token figure) on this row's measured cost. Everything is
    read from the record, so new heads change it without code. `other_heads`: `heads_note`'s line when the row
    measured other heads than the shipped ones (`parts_words` prints it first), else None."""
    rows = {r["label"]: r for r in _rows(rec, threads)}
    row = rows[label] if label is not None else best_row(rec, threads)
    ar = rows["AR"]
    ar_ms = _step_ms(ar)
    # every figure as printed (2 decimals), the parts summing to the printed cost, and each quotient taken of the
    # printed figures: a reader who divides them gets the printed result
    tps = round(row["tokens_per_forward"], 2)  # overlapped schedule: one target forward a step
    sp = row["split"]
    verify, draft, rest = _cents([sp["target_ms"] / ar_ms, sp["draft_ms"] / ar_ms, sp["overhead_ms"] / ar_ms])
    cost = round(verify + draft + rest, 2)
    drafts = (row["k"] or 1) - 1
    other_tps = round(sum(other_acceptance ** i for i in range(drafts + 1)), 2)  # 1 + a + a^2 + ...: i.i.d. per draft
    flat = min(verify, 1.0)  # a flat cost curve: the verify costs t(1), or what it measured where that was less
    what_if = [
        {"case": "as measured", "tokens_per_step": tps, "step_cost": cost, "speedup": tps / cost},
        {"case": "this acceptance, a flat verify (t(k) = t(1))" if verify > 1 else
         "this acceptance, a flat verify (already at most t(1): as measured)", "tokens_per_step": tps,
         "step_cost": round(flat + draft + rest, 2), "speedup": tps / round(flat + draft + rest, 2)},
        {"case": "this acceptance, flat verify and free drafter", "tokens_per_step": tps, "step_cost": flat,
         "speedup": tps / flat},
        {"case": f"acceptance {other_acceptance:.2f} per draft" + (" (each draft alike)" if drafts > 1 else "")
         + ", this cost", "tokens_per_step": other_tps,
         "step_cost": cost, "speedup": other_tps / cost},
    ]
    return {"label": row["label"], "k": row["k"], "measured": row["speedup"], "measured_range":
            (row["speedup_min"], row["speedup_max"]), "tokens_per_step": tps, "verify": verify, "draft": draft,
            "rest": rest, "step_cost": cost, "predicted": tps / cost, "what_if": what_if,
            "ar_step_ms": ar_ms, "other_acceptance": other_acceptance,
            "where": _machine_at(rec, threads).machine_text().removeprefix("measured on "),
            "kernel": row.get("kernel") or Record("real", REAL_JSON, rec).kernel(), "other_heads": heads_note(row)}


def _machine_at(rec: dict, threads: str = "1") -> Record:
    """The record as a `Record` whose machine is the one its rows at `threads` threads ran on (each thread count
    keeps its own: '1 of 2 cores' for the one-thread rows, not the top level's '2 of 2')."""
    m = ((rec.get("threads") or {}).get(str(threads)) or {}).get("machine")
    return Record("real", REAL_JSON, {**rec, "machine": m} if isinstance(m, dict) else rec)


def _cents(parts: list[float]) -> list[float]:
    """Parts rounded to 2 decimals so that they sum to their total rounded to 2 decimals (largest remainders)."""
    want = round(100 * sum(parts))
    low = [int(100 * p // 1) for p in parts]
    order = sorted(range(len(parts)), key=lambda i: 100 * parts[i] - low[i], reverse=True)
    for i in order[:max(0, want - sum(low))]:
        low[i] += 1
    return [c / 100 for c in low]


def parts_words(parts: dict) -> str:
    """`speedup_parts` in words, each claim chosen from its numbers: which side holds the speedup back more."""
    p = parts
    flat, ceiling, other = (w["speedup"] for w in p["what_if"][1:])
    cost_gain = flat / p["predicted"]
    acc_gain = other / p["predicted"]
    side = ("acceptance holds it back more than the cost" if acc_gain > cost_gain else
            "the cost of a step holds it back more than acceptance")
    verify, draft, rest = p["verify"], p["draft"], p["rest"]  # as printed: they add up to the total
    flat_words = (f"A verify that costs one AR step (a flat cost curve) would give {flat:.2f}x" if p["verify"] > 1
                  else f"The verify already costs less than one AR step ({p['verify']:.2f}), so a flat cost curve "
                  f"would change nothing ({flat:.2f}x)")
    rec_race = "the record's race"
    if p.get("where"):
        rec_race += f" ({p['where']}, {p.get('kernel', 'stock')} kernel)"
    flag = f"{p['other_heads']}. " if p.get("other_heads") else ""  # before any number of those other heads
    return (flag + f"{p['label']}: {p['tokens_per_step']:.2f} tokens per step over a step that costs {p['step_cost']:.2f} "
            f"AR steps (verify {verify:.2f} + drafter {draft:.2f} + the rest {rest:.2f}) predicts "
            f"{p['predicted']:.2f}x; {rec_race} measured {p['measured']:.2f}x (range {p['measured_range'][0]:.2f}-"
            f"{p['measured_range'][1]:.2f}). {flat_words}, and even a free drafter "
            f"{ceiling:.2f}x: that is all this acceptance allows{'' if p['verify'] > 1 else ' at this verify'}. "
            f"Acceptance {p['other_acceptance']:.2f} per draft on "
            f"this cost would give {other:.2f}x. So {side}.")


def training_gap(rec: dict, train: dict | None = None, label: str | None = None) -> dict | None:
    """The first draft's agreement with the target at the end of training, teacher forced (`record.json`: on the
    held-back prompts, of the training data's kind but never trained on, its `agreement` or else its last
    validation; and on the hand-written held-out prompts, where the record has it), against its acceptance when
    decoding the held-out prompts (the record's untimed acceptance study). None when either record lacks it."""
    train = train if train is not None else (record(TRAIN_JSON) or {})
    study = rec.get("acceptance_all") or {}
    label = label or next((lab for lab in study if ", k=2" in lab), None) or next(iter(study), None)
    if label is None or label not in study:
        return None
    family = "deepseek" if label.startswith("DeepSeek") else "stern"
    heads = next((h for n, h in train.get("heads", {}).items() if n.startswith(family)), {})
    agree, hist = heads.get("agreement") or {}, heads.get("history")
    if not agree.get("held_back") and not hist:
        return None
    pooled = study[label]["acceptance"]["pooled"]
    out = {"label": label, "train_agreement": (agree.get("held_back") or hist[-1]["val_agree_depth"])[0],
           "heldout_rate": pooled["rate"][0], "heldout_interval": tuple(pooled["interval"][0]),
           "steps": pooled["steps"], "prompts": study[label]["prompts"]}
    if agree.get("held_out"):
        out.update(heldout_agreement=agree["held_out"][0], held_back_prompts=agree.get("held_back_prompts"),
                   held_out_prompts=agree.get("held_out_prompts"))
    row = study[label]
    if "rejected_outside_vocab" in row:
        out.update(rejections=row["rejections"], outside=row["rejected_outside_vocab"])
    decoded = next((r.get("heads_sha256") for r in rec.get("rows", []) if r.get("label") == label), None)
    shipped = shipped_sha256(family) if decoded else None
    if decoded and shipped and decoded != shipped:  # the bench record decoded heads trained before the shipped ones
        out.update(decoded_sha256=decoded, shipped_sha256=shipped)
    return out


SAME_AGREEMENT = 0.02  # teacher-forced rates closer than this (2 points) are called the same in words


def gap_words(gap: dict | None) -> str:
    """`training_gap` in words, each direction chosen from the numbers: the teacher-forced agreement on held-back
    prompts (the training data's kind) against the hand-written held-out ones (a gap there is prompts unlike the
    training data; none means the heads agree this rarely on either), then the acceptance decoding the held-out
    prompts, with its interval, against the teacher-forced figure. The two teacher-forced figures are printed to a
    tenth of a point and their gap is the gap of the printed figures (55.5% and 52.4%: 3.1 points; whole percents
    printed 56% and 52% beside '3 points')."""
    if gap is None:
        return "the records hold no training agreement and held-out acceptance to compare"
    g = gap
    lo, hi = g["heldout_interval"]
    n_back = f"{g['held_back_prompts']} " if g.get("held_back_prompts") else ""
    pct = ".1%" if "heldout_agreement" in g else ".0%"  # two figures compared: a tenth of a point, as their gap
    words = (f"{g['label']}: teacher forced (data/hf/{REAL}/record.json), the first draft agreed with the target on "
             f"{g['train_agreement']:{pct}} of the positions of {n_back}held-back prompts (of the training data's kind, "
             "never trained on)")
    ref = g["train_agreement"]
    if "heldout_agreement" in g:
        diff = (round(1000 * g["train_agreement"]) - round(1000 * g["heldout_agreement"])) / 1000  # as printed
        n_out = f"the {g['held_out_prompts']} " if g.get("held_out_prompts") else "the "
        words += f" and on {g['heldout_agreement']:{pct}} of {n_out}hand-written held-out prompts' answers: " + (
            f"a gap of {100 * abs(diff):.1f} points, so the heads do as well on prompts unlike their training data's "
            "as on its kind, and what keeps acceptance low is how rarely they agree with the target at all"
            if abs(diff) < SAME_AGREEMENT else
            f"{100 * diff:.1f} points lower on the held-out prompts, so part of the shortfall is prompts unlike the "
            "training data" if diff > 0 else
            f"{100 * -diff:.1f} points higher on the held-out prompts than on the held-back ones")
        ref = g["heldout_agreement"]
    if "decoded_sha256" in g:
        return words + (f"; docs/bench/real.json decoded other heads (sha256 {g['decoded_sha256'][:12]}) than the "
                        f"ones shipped now ({g['shipped_sha256'][:12]}), so its acceptance is not set against these "
                        f"figures: re-run {RERUN}")
    where = "those held-out prompts" if "heldout_agreement" in g else f"{g['prompts']} held-out prompts"
    words += (f"; decoding {where} (docs/bench/real.json, {g['prompts']} prompts), it was accepted in "
              f"{g['heldout_rate']:.0%} of {g['steps']} drafting steps (95% interval {lo:.0%}-{hi:.0%}): "
              + (f"below the teacher-forced figure ({g['heldout_rate'] / max(1e-9, ref):.0%} of it)" if hi < ref else
                 "above the teacher-forced figure" if lo > ref else
                 "the teacher-forced figure lies within the interval"))
    if "outside" in g:
        words += (f"; {g['outside']} of {g['rejections']} rejections were at a position whose token lies outside the "
                  "draft vocabulary, where no draft could be kept")
    return words


def settings_problem(method: str, k, row, device="cpu") -> str | None:
    """None when notebook 05's real-model settings (REAL_METHOD, REAL_K, REAL_RECORD_ROW) name what the lab ships
    for the real model; else one line naming the setting to change, which the notebook prints before it skips the
    section and runs on. A method is "best" or one with a reduced-vocabulary row in `pairs` (`chat_answer` drafts
    over that vocabulary); k fits what the shipped heads support for it (`generate.k_limit`, loading the model)."""
    try:
        rec = record()
    except MtplabError as e:
        return str(e)
    if method == "best" and rec is None:
        return ("REAL_METHOD = 'best' reads docs/bench/real.json, which is not there: restore it from git, or name a "
                "method in the parameters cell")
    if method != "best":
        methods = sorted({p.method for p in pairs(REAL) if p.draft_vocab == "reduced"})
        if method not in methods:
            return (f"REAL_METHOD = {method!r} has no heads the lab ships for {REAL}; set it to 'best' or one of "
                    f"{', '.join(methods)} in the parameters cell")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            return f"REAL_K = {k!r} is not a number of tokens per step; set it to an integer >= 1 in the parameters cell"
        try:
            most = k_limit(method, load(device).use(METHODS[method].family, "reduced"))
        except MtplabError as e:
            return str(e)
        if k > most:
            return (f"REAL_K = {k} is more than the shipped heads support for {method} on {REAL} (at most {most}); "
                    "lower it in the parameters cell")
    try:
        label_of(row, rec)
    except MtplabError as e:
        return f"REAL_RECORD_ROW: {e}"
    return None


def chat_answer(smol, method: str, k: int, prompt: str, *, max_new_tokens: int, stop: float | None = None):
    """One chat turn answered by `method` at k with the reduced draft vocabulary's heads, to its end of turn (at
    most `max_new_tokens`); `stop`: a confidence stop (None: k-1 drafts every step). Returns (the target, the Trace)."""
    target = smol.use("deepseek" if method.startswith("deepseek") else "stern", "reduced")
    trace = decode_with(method, target, chat_ids(target, prompt), max_new_tokens=max_new_tokens, k=k,
                        stop=end_of_turn(target),  # the answer ends at the end of its turn
                        **adaptive.stop_at(stop))
    return target, trace


def default_k(smol, method: str):
    """k and confidence stop for `method` on the real model as `generate --hf` takes them with no --k
    (`measuring.choice.choose_k`): the record's exact row of the heads that ship now with the highest median, else the
    documented default; its `why` says which (`k_words` adds whether the ranges make it the fastest)."""
    family = METHODS[method].family
    target = smol.use(family, "reduced" if family and smol.vocab is not None else "full")
    return choose_k(REAL, method, heads=shipped_heads(REAL, family) if family else None,
                    draft_vocab="reduced" if target.draft_vocab is not None else "full", kernel=target.kernel,
                    limit=k_limit(method, target))


def answer_line(trace, vocab, method: str, k: int, *, from_record: bool, stop: float | None = None) -> str:
    """A chat answer's decode in one line: tokens, forwards, drafts accepted, and how many rejections fell at a
    token outside the draft vocabulary (which no draft could match)."""
    outside, rejections = outside_vocab(trace, vocab)
    best = " (as generate --hf takes them: the record’s exact row of this method with the highest median)" if from_record else ""
    return (f"{method}, {setting(k, stop)}{best}: {len(trace.tokens)} tokens "
            f"in {trace.forwards} target forwards ({trace.tokens_per_forward:.2f} per forward); "
            f"{trace.num_accepted_tokens} of {trace.num_draft_tokens} drafts accepted "
            f"({trace.num_accepted_tokens / max(1, trace.num_draft_tokens):.0%}); {outside} of {rejections} "
            "rejections were at a token outside the draft vocabulary, which no draft could match")


def outside_vocab(trace, vocab) -> tuple[int, int]:
    """(rejections whose target token lies outside the draft vocabulary, rejections) in one decode
    (`hf.study.rejections_outside`)."""
    from mtplab.hf.study import rejections_outside  # transformers
    return rejections_outside([trace], vocab)


def two_readings(what: str, here: float, there: float, where: str, *, unit: str = "") -> str:
    """One quantity measured twice in a notebook (one forward's time, one ratio): both, how far apart, and which to
    read, in words chosen from the gap (the student's finding: two t(1) of one model 18% apart, unexplained)."""
    gap = abs(here - there) / min(here, there)
    fmt = (lambda v: f"{v:.1f}{unit}") if unit else (lambda v: f"{v:.2f}")
    head = f"{what}: {fmt(here)} here, {fmt(there)} {where}"
    if gap <= 0.05:
        return f"{head}: within 5%, the two readings agree"
    return (f"{head}: {gap:.0%} apart. The same forward, timed in two runs on this machine, moved that much; read each "
            "measurement's ratios within itself, and the shipped record (run alone) for the number to quote")
