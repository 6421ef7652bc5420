"""`bench real` (review 2026-12-02-reliability-3, b-*): the one case that was not ok, b-hf-llama, told a command that
has no --chat to 'drop --chat'. In this process, through the CLI: one line that names a chat model, nothing written."""
from mtplab import paths
from tests.reliability.helpers import refused
from tests.reliability.realcases import snapshot


def test_a_model_without_a_chat_template_names_a_chat_model(capsys, tmp_path):
    out = tmp_path / "out"
    before = snapshot(paths.BENCH_DIR)
    err = refused(capsys, "has no chat template, so a prompt cannot become a chat turn; use a chat model (smollm2)",
                  "bench", "real", "--quick", "--hf", paths.HF_DIR / "mtplab-llama", "--out", out)
    assert "drop --chat and" not in err.split("smollm2")[0]
    assert (not out.exists() or not any(out.iterdir())) and snapshot(paths.BENCH_DIR) == before  # its --out probe
