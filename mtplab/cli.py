"""Command line: python -m mtplab {train, generate, bench} ...

Bad input ends with a one-line error that names the fix (exit status 2), never a traceback.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import stat
import sys
from pathlib import Path

from mtplab.errors import MtplabError
from mtplab import platform_compat as compat
from mtplab.hf.real import REAL_MODELS, convert
from mtplab import bench
from mtplab.bench.preflight import run_preflight
from mtplab.device import pick
from mtplab.decoding.drafters import METHODS
from mtplab.decoding.generate import run_generate
from mtplab.files import os_reason
from mtplab.model import kernels
from mtplab.model.checkpoint import check_path
from mtplab.training.fit import fit
from mtplab.training.runs import probe_folder

MAX_PROMPT_BYTES = 1 << 16  # more than any preset's context window (byte tokens), so the answer is the window's
HEAD_METHODS = ", ".join(n for n, m in METHODS.items() if m.family)  # the methods that draft with heads
# the real models as the help strings name them (name, model, package), from their one table
REAL_HELP = ", ".join(f"{n} ({m.about.split(' (')[0]} from the package {m.package})" for n, m in REAL_MODELS.items())


def _finite(x):
    """NaN and infinities become null, so that strict JSON parsers read --json output."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _print_json(obj) -> None:
    print(json.dumps(_finite(obj), allow_nan=False))


def _train(a):
    if a.hf:
        return _train_hf(a)

    hist = fit(preset=a.preset, corpus=a.corpus, steps=a.steps, out=a.out, name=a.name, seed=a.seed,
               resume=a.resume, overwrite=a.overwrite, heads=a.heads, n_depths=a.depths, n_modules=a.modules,
               freeze_trunk=a.freeze_trunk, from_checkpoint=a.from_,
               lam=a.lam, batch_size=a.batch_size, lr=a.lr, eval_every=a.eval_every, device=a.device,
               dropout=a.dropout, save_dtype=a.save_dtype, progress=not a.no_progress,
               memory_efficient=not a.naive_backward, max_seconds=a.max_seconds, labels=a.labels,
               autocast=a.autocast, warmup=a.warmup, deepen=a.deepen, heads_from=a.heads_from,
               save_every=a.save_every)
    last = hist[-1] if hist else {}
    if a.json:
        _print_json(hist)
    elif last:
        print(f"done: {last['step']} steps, {last['tokens']} tokens, val bpb {last['val_bpb']:.3f}, "
              "per-depth top-1 acc " + " ".join(f"{x:.3f}" for x in last["val_acc_depth"]))
    else:
        print("done: nothing left to train (the run had already reached --steps)")


def _train_hf(a):
    """train --hf PATH: self-distilled heads on a local Hugging Face model (mtplab.distill.live)."""
    from mtplab.distill.live import run_hf_train

    if a.from_ is not None:
        raise MtplabError("--hf trains heads on the model at that path with its trunk frozen; drop --from")
    labels = "self" if a.labels == "corpus" else a.labels  # --hf heads always learn the model's own predictions
    res = run_hf_train(hf=a.hf, heads=a.heads, n_depths=a.depths, n_modules=a.modules, out=a.out, name=a.name,
                       device=a.device, resume=a.resume, overwrite=a.overwrite, save_every=a.save_every,
                       corpus=a.corpus, steps=a.steps, batch_size=a.batch_size,
                       seq_len=a.seq_len, lr=a.lr, warmup=a.warmup, lam=a.lam, labels=labels, seed=a.seed,
                       max_seconds=a.max_seconds, log=None if a.no_progress or a.json else print)
    if a.json:
        _print_json(res)
        return
    if not res["history"]:
        print(f"done: nothing left to train (the run had already reached --steps); heads in {res['checkpoint']}")
        return
    last = res["history"][-1]
    print(f"done: {last['step']} steps; heads saved to {res['checkpoint']}; agreement with the target by "
          "depth " + " ".join(f"{x:.3f}" for x in last["val_agree_depth"]))


def _script(name: str):
    """A module of the checkout's scripts/ folder: trainers whose model ships as data rather than as a part of the
    lab (scripts/train_hf_model.py). Loaded once, under the name a test imports it by (scripts.NAME)."""
    import importlib.util
    if f"scripts.{name}" in sys.modules:
        return sys.modules[f"scripts.{name}"]
    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    if not path.is_file():
        raise MtplabError(f"this command runs scripts/{name}.py, which only a checkout of mtplab has (not an installed "
                          "package); run it from a git clone")
    spec = importlib.util.spec_from_file_location(f"scripts.{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _train_hf_model(a):
    """train-hf-model: a small Llama of your own in a Hugging Face folder (scripts/train_hf_model.py)."""
    train_own = _script("train_hf_model").train_own
    rec = train_own(preset=a.preset, corpus=a.corpus, out=a.out, name=a.name, steps=a.steps, batch_size=a.batch_size,
                    seq_len=a.seq_len, lr=a.lr, warmup=a.warmup, seed=a.seed, max_seconds=a.max_seconds,
                    resume=a.resume, overwrite=a.overwrite, save_every=a.save_every, eval_every=a.eval_every,
                    autocast=a.autocast, device=a.device, save_dtype=a.save_dtype,
                    log=None if a.no_progress or a.json else print)
    if a.json:
        _print_json({k: v for k, v in rec.items() if k != "history"})
    else:
        print(f"done: {rec['steps']} steps, {rec['tokens']} tokens in {rec['train_seconds']:.0f} s, val bpb "
              f"{rec['val_bpb']:.3f}; the model folder is {Path(a.out) / (a.name or a.preset)}")


def _read_prompt(a) -> str:
    if a.prompt_file:
        try:
            # O_NONBLOCK: open() of a FIFO without a writer would wait forever; reads block again once it is open
            fd = os.open(a.prompt_file, os.O_RDONLY | compat.O_NONBLOCK | compat.O_BINARY)
            compat.set_blocking(fd)
            with os.fdopen(fd, "rb") as f:
                pipe = stat.S_ISFIFO(os.fstat(f.fileno()).st_mode)
                raw = f.read(MAX_PROMPT_BYTES + 1)  # never more: /dev/zero would fill the memory
        except OSError as e:
            raise MtplabError(f"cannot read prompt file {a.prompt_file}: {e.strerror}") from None
        if pipe and not raw:
            raise MtplabError(f"prompt file {a.prompt_file} is a pipe (FIFO) that nobody writes to; give a regular "
                              "file, or pass the text with --prompt")
        if len(raw) > MAX_PROMPT_BYTES:
            raise MtplabError(f"prompt file {a.prompt_file} is longer than {MAX_PROMPT_BYTES} bytes, more than any "
                              "context window holds; give a shorter file")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MtplabError(f"prompt file {a.prompt_file} is not valid UTF-8 (byte {e.start}); "
                              "save it as UTF-8 or pass --prompt") from None
    if a.prompt is None:
        raise MtplabError("give a prompt with --prompt TEXT or --prompt-file PATH")
    try:
        a.prompt.encode("utf-8")  # bytes that are not UTF-8 reach Python as lone surrogates
    except UnicodeEncodeError as e:
        raise MtplabError(f"--prompt is not valid UTF-8 (character {e.start}); pass UTF-8 text, or put the "
                          "bytes in a file and use --prompt-file") from None
    return a.prompt


# options that name a file or folder the lab hands to safetensors (Rust opens UTF-8 paths only)
PATH_OPTIONS = {"out": "--out", "checkpoint": "--checkpoint", "draft_checkpoint": "--draft-checkpoint",
                "from_": "--from", "heads_from": "--heads-from", "hf": "--hf", "heads_checkpoint": "--heads-checkpoint",
                "draft_hf": "--draft-hf", "work": "--work", "corpus": "--corpus"}


# --seed of each command: generate takes what torch's generators take; the trainers what fit, train_heads and
# train_own check (they refuse the same values in the API)
SEEDS = {"generate": (-(2 ** 63), 2 ** 64, "[-2**63, 2**64)")}
TRAIN_SEEDS = (0, 2 ** 63, "[0, 2**63)")


def _check_args(a) -> None:
    """What every command's options share, checked once before any command runs: a seed torch can take, and
    paths the weights library can open."""
    seed = getattr(a, "seed", None)
    lo, hi, span = SEEDS.get(a.cmd, TRAIN_SEEDS)
    if seed is not None and not lo <= seed < hi:
        raise MtplabError(f"--seed must be an integer in {span} (got {seed}); any seed in range gives a "
                          "reproducible run")
    for dest, flag in PATH_OPTIONS.items():
        if isinstance(getattr(a, dest, None), str):
            check_path(flag, getattr(a, dest))


def _generate(a):
    if (a.draft_checkpoint or a.draft_hf) and a.method != "draft-model":
        raise MtplabError(f"--draft-checkpoint and --draft-hf name the draft model of --method draft-model; --method "
                          f"{a.method} does not use one: drop it or choose --method draft-model")
    method = METHODS.get(a.method)  # None: a method run_generate names as unknown
    headless = method is not None and method.family is None
    one_token = method is not None and not method.speculative
    if a.hf and headless and (a.heads_checkpoint or a.draft_vocab == "reduced"):  # the record would name them, unused
        raise MtplabError(f"--heads-checkpoint and --draft-vocab reduced go with the heads of a head method; --method "
                          f"{a.method} drafts without heads: drop them or choose a head method ({HEAD_METHODS})")
    if a.alpha is not None and a.method != "oracle":
        raise MtplabError(f"--alpha is the oracle drafter's acceptance rate; --method {a.method} does not use it: drop "
                          "it or choose --method oracle")
    a.alpha = 0.8 if a.alpha is None else a.alpha

    if a.k is not None and one_token:
        raise MtplabError("--k is tokens per step of a speculative method; --method ar makes one token a "
                          "forward: drop --k or choose a speculative --method")
    if a.confidence_stop is not None and one_token:
        raise MtplabError("--confidence-stop ends the drafts of a speculative method's step; --method ar drafts "
                          "nothing: drop it or choose a speculative --method")
    if a.confidence_stop is not None and headless:
        raise MtplabError(f"--confidence-stop reads the heads' own confidence; --method {a.method} drafts without heads "
                          f"and reports none, so the stop would change nothing: drop it or choose a head method ({HEAD_METHODS})")
    if a.confidence_stop is not None and not 0 < a.confidence_stop <= 1:
        raise MtplabError(f"--confidence-stop is a probability in (0, 1] (got {a.confidence_stop}); 0.3 ends a step's "
                          "drafts at the first the drafter gives less than 30%")
    if not a.hf and (a.heads_checkpoint or a.draft_hf):
        raise MtplabError("--heads-checkpoint and --draft-hf go with --hf PATH; the lab's own models take --checkpoint")
    if a.hf and (a.checkpoint or a.draft_checkpoint):
        raise MtplabError("with --hf the model is PATH and its heads come from --heads-checkpoint; drop --checkpoint")
    if a.hf:
        res = _generate_hf(a)
    elif a.chat or a.draft_vocab is not None:
        raise MtplabError("--chat and --draft-vocab go with --hf (a model with a chat template, e.g. --hf "
                          f"{next(iter(REAL_MODELS))})")
    else:
        with kernels.use_stock(a.kernel == "stock"):
            res = run_generate(method=a.method, checkpoint=a.checkpoint, prompt=_read_prompt(a),
                               max_new_tokens=a.max_new_tokens, k=a.k, temperature=a.temperature, top_k=a.top_k,
                               seed=a.seed, alpha=a.alpha, draft_checkpoint=a.draft_checkpoint, device=a.device,
                               dtype=a.dtype, confidence=a.confidence_stop)
    if a.json:
        _print_json(res)
    else:
        print(res["text"])
        print(f"\n[{res['method']} on {res['checkpoint']}: {len(res['tokens'])} tokens in {res['forwards']} forwards "
              f"({res['tokens_per_forward']:.2f} tokens/forward), {res['wall_s']:.2f}s on {res['device']}]")
        if res.get("k_why"):
            print(f"[{res['k_why']}; draft vocabulary: {res['draft_vocab']}, {res['draft_vocab_why']}]")
        if res.get("num_drafts"):
            acc = " ".join(f"{x:.2f}" for x in res["acceptance_rate_per_position"])
            print(f"[drafts {res['num_drafts']}, draft tokens {res['num_draft_tokens']}, accepted "
                  f"{res['num_accepted_tokens']}; acceptance by position: {acc}]")


def _generate_hf(a) -> dict:
    """generate --hf: the heads file's draft vocabulary and, unless --k is given, the best k and confidence stop of
    the record for these heads (`measuring.choice.choose_k`); the output says where each came from (`k_source`,
    `k_why`, `draft_vocab_why`)."""
    from mtplab.hf.run import run_hf_generate
    from mtplab.hf.study import generate_defaults
    d = generate_defaults(a.hf, a.method, heads=a.heads_checkpoint, draft_vocab=a.draft_vocab, k=a.k,
                          kernel=a.kernel, dtype=a.dtype, stop=a.confidence_stop)
    res = run_hf_generate(hf=a.hf, heads_checkpoint=a.heads_checkpoint, method=a.method, prompt=_read_prompt(a),
                          max_new_tokens=a.max_new_tokens, k=d["k"], temperature=a.temperature, top_k=a.top_k,
                          seed=a.seed, alpha=a.alpha, draft_hf=a.draft_hf, device=a.device, dtype=a.dtype,
                          chat=a.chat, draft_vocab=d["draft_vocab"], kernel=a.kernel, confidence=d["stop"])
    res.update({key: d[key] for key in ("k_source", "k_why", "draft_vocab_why")})
    return res


def _convert(a):
    if a.model not in REAL_MODELS:
        raise MtplabError(f"convert knows {', '.join(REAL_MODELS)} (got {a.model!r})")
    print(convert(REAL_MODELS[a.model], log=lambda m: print(m, file=sys.stderr)))


def _distill(a):
    import time
    from mtplab.distill.pipeline import run_distill
    stages = tuple(s.strip() for s in a.stages.split(",") if s.strip())
    res = run_distill(a.model, a.work, stages=stages, resume=a.resume, steps=a.steps, max_seconds=a.max_seconds,
                      device=a.device, data=a.data, overwrite=a.overwrite, answers=a.answers,
                      log=lambda m: print(time.strftime("%H:%M:%S"), m, flush=True))
    print(f"done: {', '.join(stages)} in {res['seconds']:.0f} s ({res['cpu_seconds']:.0f} CPU s); work in {res['work']}")


def _preflight(a):
    rec = run_preflight(out=a.out, quick=a.quick, device=a.device, log=None if a.json else print)
    if a.json:
        _print_json(rec)


def _check_bench_out(out: str) -> None:
    """bench --out must take the results: checked before the benchmark runs, not after."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise MtplabError(f"--out {out} is a file, not a directory; choose a directory for the results")
    try:
        probe_folder(p, ".bench.probe.")
    except OSError as e:
        raise MtplabError(f"cannot write to --out {out} ({os_reason(e)}); choose a writable directory for the "
                          "results") from None


def _bench(a):
    pick(a.device)  # an unknown or absent device is named here, not in a child process's traceback
    _check_bench_out(a.out)
    bench.main(a)


def _train_parser(sub) -> None:
    t = sub.add_parser("train", help="train a model (next-token or multi-token)")
    t.add_argument("--preset", default="classroom")
    t.add_argument("--corpus", default="code")
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--name", default=None, help="checkpoint file stem (default: ntp, stern-k4, ...)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--resume", action="store_true", help="continue the run in --out (same settings; --steps, "
                   "--max-seconds, --eval-every, --save-dtype, --device may change)")
    t.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    t.add_argument("--heads", default="none", help="none | stern | meta | deepseek")
    t.add_argument("--depths", type=int, default=None, help="stern, meta: prediction depths K (default 4)")
    t.add_argument("--modules", type=int, default=None, help="deepseek: sequential MTP modules D (default 1)")
    t.add_argument("--k", type=int, default=None, help=argparse.SUPPRESS)
    t.add_argument("--freeze-trunk", action="store_true")
    t.add_argument("--from", dest="from_", default=None, help="start from this next-token checkpoint")
    t.add_argument("--deepen", type=int, default=None, metavar="N",
                   help="grow the --from trunk to N layers with identity blocks first (the function is unchanged)")
    t.add_argument("--heads-from", default=None, metavar="CHECKPOINT",
                   help="start the heads from this heads checkpoint (same family and depths; with --freeze-trunk)")
    t.add_argument("--lambda", dest="lam", type=float, default=0.3)
    t.add_argument("--batch-size", type=int, default=16)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--eval-every", type=int, default=None)
    t.add_argument("--save-every", type=int, default=None,
                   help="steps between saves (default: --eval-every); a run also saves every 5 minutes and at "
                        "Ctrl-C or SIGTERM")
    t.add_argument("--dropout", type=float, default=None)
    t.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: steps/20, at most 200)")
    t.add_argument("--labels", default="corpus", help="corpus | self | self-argmax (self-distilled heads; needs --freeze-trunk)")
    t.add_argument("--autocast", default="auto", help="auto | bf16 | off (auto: bf16 where it pays)")
    t.add_argument("--save-dtype", default=None, choices=["fp32", "fp16", "bf16"])
    t.add_argument("--device", default="auto")
    t.add_argument("--naive-backward", action="store_true", help="meta: one joint backward instead of head by head")
    t.add_argument("--max-seconds", type=float, default=None, help="stop (and save) after this much wall time")
    t.add_argument("--no-progress", action="store_true")
    t.add_argument("--json", action="store_true")
    t.add_argument("--hf", default=None, help="a local Hugging Face causal LM directory: train heads on its frozen trunk")
    t.add_argument("--seq-len", type=int, default=128, help="--hf: tokens per training window")
    t.set_defaults(func=_train)


def _train_hf_model_parser(sub) -> None:
    h = sub.add_parser("train-hf-model", help="train a small Hugging Face Llama of your own (byte-level tokenizer)")
    h.add_argument("--preset", default="hf-target", help="hf-target | hf-draft")
    h.add_argument("--corpus", default="code")
    h.add_argument("--steps", type=int, required=True)
    h.add_argument("--out", required=True)
    h.add_argument("--name", default=None, help="the model folder's name in --out (default: the preset)")
    h.add_argument("--batch-size", type=int, default=16)
    h.add_argument("--seq-len", type=int, default=256)
    h.add_argument("--lr", type=float, default=3e-3)
    h.add_argument("--warmup", type=int, default=None)
    h.add_argument("--seed", type=int, default=0)
    h.add_argument("--max-seconds", type=float, default=None)
    h.add_argument("--save-every", type=int, default=100)
    h.add_argument("--eval-every", type=int, default=None)
    h.add_argument("--autocast", default="auto")
    h.add_argument("--save-dtype", default="bf16", choices=["fp32", "bf16"])
    h.add_argument("--device", default="auto")
    h.add_argument("--resume", action="store_true")
    h.add_argument("--overwrite", action="store_true")
    h.add_argument("--no-progress", action="store_true")
    h.add_argument("--json", action="store_true")
    h.set_defaults(func=_train_hf_model)


def _real_model_parsers(sub) -> None:
    """convert, distill and preflight: the real model and this laptop."""
    c = sub.add_parser("convert", help=f"convert a real model's GGUF once into the lab's cache ({', '.join(REAL_MODELS)})")
    c.add_argument("model", help=", ".join(REAL_MODELS))
    c.set_defaults(func=_convert)

    d = sub.add_parser("distill", help="a real model's heads: self-distillation data, a trunk cache, training")
    d.add_argument("model", help=", ".join(REAL_MODELS))
    d.add_argument("--work", required=True, help="the work folder (prompts, answers, cache, save sets)")
    d.add_argument("--stages", default="answers,heldout,cache,vocab,deepseek,stern",
                   help="comma-separated: answers, grow (the data's other answers added to a trained folder; then "
                        "cache, trim and --resume), heldout, cache, trim (keep the answers a cut cache reached), "
                        "vocab (times the projection: run it alone), "
                        "deepseek, stern, ship (ship writes data/hf/MODEL)")
    d.add_argument("--resume", action="store_true", help="continue the head trainings saved in --work")
    d.add_argument("--overwrite", action="store_true", help="replace the head trainings saved in --work")
    d.add_argument("--data", default=None, help="the data folder whose answers the answers stage imports (default "
                                                "data/chat/MODEL; python scripts/make_chat_data.py DIR writes one)")
    d.add_argument("--answers", type=int, default=None, help="import this many of the data's answers, spread over "
                                                             "prompt lengths and categories (default all)")
    d.add_argument("--steps", type=int, default=None, help="head training steps (default: the recipe's)")
    d.add_argument("--max-seconds", type=float, default=None, help="stop each stage after this long (resumable)")
    d.add_argument("--device", default="cpu", help="cpu, cuda, mps or auto (a GPU trains on more data in minutes)")
    d.set_defaults(func=_distill)

    f = sub.add_parser("preflight", help="check the install, time this laptop, predict its speedups")
    f.add_argument("--out", default=None, help="the JSON record (default build/preflight.json)")
    f.add_argument("--quick", action="store_true")
    f.add_argument("--json", action="store_true")
    f.add_argument("--device", default="cpu")
    f.set_defaults(func=_preflight)


def _generate_parser(sub):
    g = sub.add_parser("generate", help="generate text, autoregressively or speculatively")
    g.add_argument("--method", default="ar",
                   help=" | ".join(METHODS) + " (deepseek-reuse: the DeepSeek module applied again for each "
                   "further draft)")
    g.add_argument("--checkpoint", default=None, help="file stem in data/checkpoints/ or a path")
    g.add_argument("--prompt", default=None)
    g.add_argument("--prompt-file", default=None)
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--k", type=int, default=None,
                   help="tokens per step: at most k tokens a step (k-1 drafts + 1); "
                        "default: the most the checkpoint supports, 4 otherwise")
    g.add_argument("--confidence-stop", type=float, default=None, metavar="P",
                   help="end a step's drafts at the first whose drafter probability is below P (it changes the "
                        "speed, never the output); default with --hf and no --k: the record's best row's, else "
                        "none")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--alpha", type=float, default=None,
                   help="oracle: probability a draft is the target's token (default 0.8)")
    g.add_argument("--draft-checkpoint", default=None)
    g.add_argument("--device", default="auto")
    g.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    g.add_argument("--kernel", default="exact", choices=["exact", "stock"],
                   help="exact: every verify row computed as the one-token forward computes it (the default); stock: "
                        "F.linear and, with --hf, transformers' forward (the old path, to compare)")
    g.add_argument("--json", action="store_true")
    g.add_argument("--hf", default=None, help="a local Hugging Face causal LM directory as the target, or "
                                              f"{REAL_HELP}, with shipped heads")
    g.add_argument("--chat", action="store_true", help="--hf: wrap the prompt as one user turn of the chat template; "
                                                        "the decode ends with the model's end of turn (at most "
                                                        "--max-new-tokens)")
    g.add_argument("--draft-vocab", default=None, choices=["full", "reduced"],
                   help="--hf: draft over the full vocabulary or the one saved with the heads (default: the heads')")
    g.add_argument("--heads-checkpoint", default=None, help="--hf: heads trained with train --hf")
    g.add_argument("--draft-hf", default=None, help="--hf, method draft-model: a smaller model with the same tokenizer")
    g.set_defaults(func=_generate)


def _bench_parser(sub):
    b = sub.add_parser("bench", help="benchmarks (run alone: they time things)")
    b.add_argument("what", choices=["train", "cost-curve", "decode", "crossover", "batch", "tree", "regime", "k",
                                    "peers", "domain", "real"])
    b.add_argument("--prompts", type=int, default=None, help="decode: held-out prompts (default 20, --quick 4)")
    b.add_argument("--hf", default=None, help=f"peers: a local Hugging Face causal LM folder; real: {', '.join(REAL_MODELS)}")
    b.add_argument("--rows", default=None, help="real: grids (default, baselines, vocab, k, kernels, tree, stop, bf16, all) or "
                                                 "row labels, separated by ';' (AR always); the time is estimated first")
    b.add_argument("--draft-hf", default=None, help="peers: a smaller model with the same tokenizer (assisted rows)")
    b.add_argument("--heads-checkpoint", default=None, help="peers: heads trained on --hf with train --hf")
    b.add_argument("--preset", default="classroom")
    b.add_argument("--quick", action="store_true")
    b.add_argument("--json", action="store_true")
    b.add_argument("--device", default="auto")
    b.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    b.add_argument("--out", default="build/bench")
    b.set_defaults(func=_bench)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mtplab", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    _train_parser(sub)
    _train_hf_model_parser(sub)
    _generate_parser(sub)
    _real_model_parsers(sub)
    _bench_parser(sub)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "cmd", None) == "train" and args.k is not None:
            raise MtplabError("train takes --depths K (stern, meta) or --modules D (deepseek); "
                              "k is tokens per step, an option of generate")
        _check_args(args)
        args.func(args)
    except MtplabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the last resort: what no command turned into its own line (a full disk, a lost folder)
        where = f" ({e.filename})" if e.filename else ""
        print(f"error: {os_reason(e)}{where}; free space or fix the path, then run the command again (a training "
              "run continues with --resume)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 0
