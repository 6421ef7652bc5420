"""`train-hf-model`: a Llama of your own in a Hugging Face folder. Its memory is checked before anything is built, its
folder is swapped in whole (what a cut save leaves is named, and --resume repairs it), and nothing planted beside the
folder is followed."""
import shutil

import pytest

from mtplab.errors import MtplabError

pytest.importorskip("transformers")
OWN = dict(preset="hf-draft", batch_size=2, seq_len=32, log=None)


def test_train_hf_model_checks_memory_first(tmp_path):
    pytest.importorskip("transformers")
    from scripts.train_hf_model import train_own
    with pytest.raises(MtplabError, match="lower --batch-size|--seq-len"):
        train_own(preset="hf-draft", steps=2, batch_size=100000, seq_len=256, out=str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()  # refused before the folder or the lock were made


def test_a_save_cut_between_the_two_renames_names_resume_and_the_old_folder(tmp_path):
    """fault-own: killed after OUT/NAME -> .NAME.old and before .NAME.writing -> OUT/NAME; generate --hf said
    'not a Hugging Face model directory (no config.json)'."""
    from scripts.train_hf_model import train_own
    from mtplab.hf.target import load_hf
    out = tmp_path / "o"
    train_own(steps=2, save_every=1, out=str(out), **OWN)
    (out / "hf-draft").rename(out / ".hf-draft.old")
    shutil.copytree(out / ".hf-draft.old", out / ".hf-draft.writing")
    with pytest.raises(MtplabError, match=r"hf-draft is missing: a save of train-hf-model was cut between its two "
                                          r"renames and .*\.hf-draft\.old holds the last complete save; continue the run "
                                          r"with the same command plus --resume"):
        load_hf(out / "hf-draft")
    train_own(steps=3, save_every=1, out=str(out), resume=True, **OWN)
    assert load_hf(out / "hf-draft").config.n_layer == 2
    assert not (out / ".hf-draft.old").exists() and not (out / ".hf-draft.writing").exists()


@pytest.mark.parametrize("planted", [".hf-draft.writing", ".hf-draft.old", "hf-draft"])
@pytest.mark.parametrize("kind", ["link", "file"])
def test_what_is_planted_beside_the_folder_is_removed_or_refused_never_followed(tmp_path, planted, kind):
    """n-own-writing-symlink, n-own-old-file, n-own-outname-symlink-overwrite: 'Cannot call rmtree on a symbolic link'
    without the path, at every save."""
    from scripts.train_hf_model import train_own
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("keep me")
    out = tmp_path / "o"
    out.mkdir()
    if kind == "link":
        (out / planted).symlink_to(victim)
    else:
        (out / planted).write_text("x")
    if planted == "hf-draft":  # the folder itself: refused before training, with --overwrite too
        with pytest.raises(MtplabError, match=f"hf-draft is a {'symlink' if kind == 'link' else 'file'}, not the model "
                                              "folder a run writes; remove it"):
            train_own(steps=2, out=str(out), overwrite=True, **OWN)
    else:
        train_own(steps=2, out=str(out), **OWN)
        assert not (out / planted).exists() and not (out / planted).is_symlink() and (out / "hf-draft").is_dir()
    assert (victim / "keep").read_text() == "keep me"
