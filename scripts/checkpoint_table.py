"""Print the markdown table of data/README.md from the shipped checkpoints' JSON (nothing typed by hand)."""
import json
from pathlib import Path

CK = Path(__file__).resolve().parent.parent / "data" / "checkpoints"
ORDER = ["ntp", "draft", "stern-k4", "meta-k4", "deepseek-d1", "deepseek-d3"]


def main():
    print("| checkpoint | regime | steps | tokens seen | wall time | val bpb (depth 1) | top-1 accuracy by depth | size |")
    print("|---|---|---|---|---|---|---|---|")
    for name in ORDER:
        info = json.loads((CK / f"{name}.json").read_text())
        m, cfg = info["meta"], info["config"]
        regime = ("heads on the frozen ntp trunk" if m.get("freeze_trunk") else
                  f"from scratch, preset {m.get('preset')}") + f", {cfg['heads']} k={m['k']}" * (cfg["heads"] != "none")
        val = m["val"]
        acc = " / ".join(f"{a:.3f}" for a in val["val_acc_depth"])
        size = (CK / f"{name}.safetensors").stat().st_size / 2**20
        stop = " (time cap)" if m.get("stopped_early") else ""
        print(f"| `{name}` | {regime} | {m['step']} of {m['steps']}{stop} | {m['tokens']:,} | "
              f"{m.get('wall_s', 0) / 60:.1f} min | {val['val_bpb']:.3f} | {acc} | {size:.1f} MiB |")


if __name__ == "__main__":
    main()
