"""Print the markdown table of data/README.md from the shipped checkpoints' JSON (nothing typed by hand)."""
import json
from pathlib import Path

CK = Path(__file__).resolve().parent.parent / "data" / "checkpoints"
ORDER = ["ntp", "stern-k4", "meta-k4", "deepseek-d1", "deepseek-d3", "draft",
         "ntp-l4", "stern-k4-l4", "meta-k4-l4", "deepseek-d1-l4", "deepseek-d3-l4",
         "domain-code", "domain-code-d1", "domain-prose", "domain-prose-d1"]


def regime(m: dict, cfg: dict, name: str = "") -> str:
    if cfg["heads"] == "none":
        phases = len(m.get("lineage", [])) or 1
        on = "" if m.get("corpus", "code") == "code" else f" on {m['corpus']}"
        return (f"preset {m.get('preset')}{on}" + (f", {phases} phases (see lineage)" if phases > 1 else
                                                    ", from scratch"))
    depths = cfg.get("n_depths", cfg.get("k"))
    size = f"D={depths - 1}" if cfg["heads"] == "deepseek" else f"K={depths}"
    trunk = name.removesuffix("-d1") if name.startswith("domain-") else "ntp-l4" if name.endswith("-l4") else "ntp"
    start = f", started from {m['heads_from']}" if m.get("heads_from") else ""
    return f"{cfg['heads']} {size} on the frozen {trunk} trunk, labels {m.get('labels', 'corpus')}{start}"


def main():
    print("| checkpoint | layers x width | regime | steps | tokens seen | wall time | val bpb (depth 1) "
          "| top-1 accuracy by depth | agreement with the target by depth | size |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in ORDER:
        info = json.loads((CK / f"{name}.json").read_text())
        m, cfg = info["meta"], info["config"]
        val = m["val"]
        acc = " / ".join(f"{a:.3f}" for a in val["val_acc_depth"])
        agree = " / ".join(f"{a:.3f}" for a in val.get("val_agree_depth", [])[1:]) or "-"
        size = (CK / f"{name}.safetensors").stat().st_size / 2**20
        stop = " (time cap)" if m.get("stopped_early") else ""
        tokens = m.get("tokens_total", m["tokens"])
        wall = sum(p["wall_s"] for p in m["lineage"]) if m.get("lineage") else m.get("wall_s", 0)
        steps = sum(p["steps"] for p in m["lineage"]) if m.get("lineage") else m["step"]
        planned = "" if m.get("lineage") else f" of {m['steps']}"
        layers = f"{cfg['n_layer']} x {cfg['n_embd']}"
        print(f"| `{name}` | {layers} | {regime(m, cfg, name)} | {steps}{planned}{stop} | {tokens:,} | {wall / 60:.1f} min | "
              f"{val['val_bpb']:.3f} | {acc} | {agree} | {size:.1f} MiB |")


def hf_table():
    """data/hf: the lab's own Hugging Face models, from each folder's mtplab_record.json."""
    root = CK.parent / "hf"
    print("| model folder | layers x width | parameters | corpus | steps | tokens seen | wall time | val bpb | "
          "val top-1 | size |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        r = json.loads((folder / "mtplab_record.json").read_text())
        cfg = json.loads((folder / "config.json").read_text())
        size = sum(f.stat().st_size for f in folder.iterdir()) / 2**20
        print(f"| `{folder.name}` | {cfg['num_hidden_layers']} x {cfg['hidden_size']} | {r['parameters']:,} | "
              f"{r['corpus']} | {r['steps']} | {r['tokens']:,} | {r['train_seconds'] / 60:.1f} min | "
              f"{r['val_bpb']:.3f} | {r['val_top1']:.3f} | {size:.1f} MiB |")


if __name__ == "__main__":
    main()
    print()
    hf_table()
