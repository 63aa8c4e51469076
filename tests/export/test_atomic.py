"""Replacing an artifact folder: a real `kill -9` at each step leaves the old or the new folder
whole, and the next export sweeps what was left (issue 19: re-export deleted the old folder
before renaming the new one in, and killed exports left `.NAME.xxxx` folders forever)."""

import json
import os
import subprocess
import sys

import pytest
from keras_attn_export.atomic import replace, sweep, temporary_folder

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Writes the new folder, then replaces `out` with it, SIGKILLing itself at step `where`.
_CHILD = """
import os, pathlib, shutil, signal, sys
from keras_attn_export import atomic
out, where = pathlib.Path(sys.argv[1]), sys.argv[2]
def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
tmp = atomic.temporary_folder(out)
(tmp / "manifest.json").write_text('{"version": "new"}')
if where == "while_writing":
    die()
real_rename = pathlib.Path.rename
def rename(self, target):
    result = real_rename(self, target)
    if where == "after_old_aside" and pathlib.Path(target).name.startswith(f".{out.name}.old-"):
        die()
    return result
pathlib.Path.rename = rename
if where == "before_old_deleted":
    shutil.rmtree = die
atomic.replace(tmp, out)
"""


def version(folder):
    return json.loads((folder / "manifest.json").read_text())["version"]


def leftovers(root):
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("where", ["while_writing", "after_old_aside", "before_old_deleted"])
def test_kill_9_during_replace_leaves_a_whole_folder(tmp_path, where):
    out = tmp_path / "model"
    out.mkdir()
    (out / "manifest.json").write_text('{"version": "old"}')
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(out), where],
        env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert child.returncode == -9, child.stderr
    if where == "after_old_aside":
        assert not out.exists()  # between the renames: the old one is whole beside it
        (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith(".model.old-")]
        assert version(aside) == "old"
    else:
        assert version(out) == ("new" if where == "before_old_deleted" else "old")
    assert leftovers(tmp_path)  # the crash left something behind
    # The next export sweeps it: a set-aside old folder goes back first, temporaries go.
    done = sweep(out)
    assert version(out) == ("new" if where == "before_old_deleted" else "old")
    assert leftovers(tmp_path) == [] and done


def test_replace_swaps_and_a_failed_rename_puts_the_old_folder_back(tmp_path, monkeypatch):
    out = tmp_path / "model"
    out.mkdir()
    (out / "manifest.json").write_text('{"version": "old"}')
    tmp = temporary_folder(out)
    (tmp / "manifest.json").write_text('{"version": "new"}')
    replace(tmp, out)
    assert version(out) == "new" and leftovers(tmp_path) == []
    tmp = temporary_folder(out)
    (tmp / "manifest.json").write_text('{"version": "newer"}')
    real_rename = type(tmp).rename

    def failing(self, target):
        if self == tmp:
            raise OSError("disk full")
        return real_rename(self, target)

    monkeypatch.setattr(type(tmp), "rename", failing)
    with pytest.raises(OSError, match="disk full"):
        replace(tmp, out)
    assert version(out) == "new"


@pytest.mark.tf_only
def test_export_model_sweeps_a_crashed_export_and_replaces_in_place(tmp_path):
    import keras
    from keras_attn_export import export_model

    ids = keras.Input((None,), dtype="int32", name="token_ids")
    model = keras.Model(ids, keras.layers.Embedding(10, 4, name="logits")(ids))
    for name in (".model.tmp-crashed", ".model.old-crashed"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text('{"version": "old"}')
    export_model(model, tmp_path / "model", formats=["onnx"], verbose=False)
    assert (tmp_path / "model" / "model.onnx").is_file() and leftovers(tmp_path) == []
    first = (tmp_path / "model" / "manifest.json").read_text()
    export_model(model, tmp_path / "model", formats=["onnx"], verbose=False)  # replaces
    assert (tmp_path / "model" / "manifest.json").read_text() != first  # a new `created`
    assert leftovers(tmp_path) == []
