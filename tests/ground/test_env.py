"""environment.yml (for conda users; conda is not reachable here) must list what pyproject.toml asks for."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONDA_NAMES = {"torch": "pytorch"}


def names(reqs):
    return {re.split(r"[<>=!~\[ ;]", r.strip(), maxsplit=1)[0].lower() for r in reqs}


def conda_env():
    conda, pip, in_pip = set(), set(), False
    text = (ROOT / "environment.yml").read_text()
    for line in text.split("dependencies:", 1)[1].splitlines():
        s = line.split("#", 1)[0].rstrip()
        if not s.strip():
            continue
        if s.strip() == "- pip:":
            in_pip = True
            continue
        m = re.match(r"^(\s*)- ([A-Za-z0-9_.\-]+)", s)
        if not m:
            in_pip = False if not s.startswith(" ") else in_pip
            continue
        (pip if in_pip and len(m.group(1)) > 4 else conda).add(m.group(2).lower())
    return conda, pip


def test_environment_yml_matches_pyproject():
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = names(proj["dependencies"])
    for extra in proj["optional-dependencies"].values():  # every extra: notebooks, dev, hf, ...
        wanted |= names(extra)
    conda, pip = conda_env()
    have = {n for n in conda | pip} | {k for k, v in CONDA_NAMES.items() if v in conda}
    missing = sorted(n for n in wanted if n not in have and CONDA_NAMES.get(n) not in conda)
    assert not missing, f"environment.yml lacks {missing}"
    extra = sorted(n for n in (conda | pip) - {"python", "pip"} - set(CONDA_NAMES.values()) if n not in wanted)
    assert not extra, f"environment.yml lists {extra}, which pyproject.toml does not"


def test_readme_install_without_make_names_what_the_makefile_installs():
    """README's "Install without make" pins the torch and real-model versions the Makefile pins, and asks only for
    extras that pyproject.toml defines (the real model needs hf: transformers and gguf read its GGUF)."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Install without make"):]
    section = section[:section.index("\n## ")]
    make = (ROOT / "Makefile").read_text()
    torch_pin = re.search(r"^TORCH_SPEC \?= (\S+)", make, re.M).group(1)
    real_pin = re.search(r"^REAL_MODEL_SPEC \?= (\S+)", make, re.M).group(1)
    assert f"pip install {torch_pin} --index-url https://download.pytorch.org/whl/cpu" in section
    assert f"pip install --no-deps {real_pin}" in section
    extras = re.search(r'pip install -e "\.\[([a-z,]+)\]"', section).group(1).split(",")
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras) <= set(proj) and "hf" in extras and "dev" not in extras
    assert {"transformers", "gguf"} <= names(proj["hf"])
    for step in ("python -m venv .venv", "python -m mtplab convert smollm2", "python -m mtplab preflight", "jupyter lab"):
        assert step in section, step
