import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from keras_attn_serving import ArtifactError, Predictor
from keras_attn_serving.generation import greedy

_NO_TF = """
import json, sys
from keras_attn_serving import Predictor
p = Predictor(sys.argv[1])
out = p.generate_ids([[5, 6, 7]], max_new_tokens=4)
text = p.generate("to be", max_new_tokens=2)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "tf2onnx"))
print("RESULT " + json.dumps({"heavy": heavy, "ids": out, "text": text}))
"""


def test_predictor_imports_neither_tensorflow_nor_keras(toy_artifact):
    folder, _ = toy_artifact
    proc = subprocess.run(
        [sys.executable, "-c", _NO_TF, str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(li for li in proc.stdout.splitlines() if li.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert result["heavy"] == []
    assert len(result["ids"][0]) == 4 and result["text"].startswith("to be")


def test_tampered_file_is_refused(toy_artifact, tmp_path):
    folder, _ = toy_artifact
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    with open(copy / "tokenizer/vocab.txt", "a", encoding="utf-8") as f:
        f.write("extra\n")
    with pytest.raises(ArtifactError, match=r"vocab\.txt"):
        Predictor(copy)
    with pytest.raises(ArtifactError, match="manifest"):
        Predictor(tmp_path)


def test_run_checks_input_names_and_ranks(toy_artifact):
    predictor = Predictor(toy_artifact[0])
    with pytest.raises(ValueError, match="token_ids"):
        predictor.run({"ids": np.zeros((1, 3), "int32")})
    with pytest.raises(ValueError, match="rank"):
        predictor.run({"token_ids": np.zeros((3,), "int32")})
    out = predictor.run({"token_ids": np.array([[5, 6, 0]], "int64")})  # cast to int32
    assert out["logits"].shape == (1, 3, predictor.tokenizer.vocabulary_size)


def test_greedy_batches_prompts_of_different_lengths():
    # A fake model whose next token is (last token + 1) % 5 + 1, row by row.
    def logits_fn(ids):
        out = np.zeros((*ids.shape, 7))
        out[np.arange(ids.shape[0])[:, None], np.arange(ids.shape[1]), (ids % 5) + 1] = 1.0
        return out

    assert greedy(logits_fn, [[1], [3, 4, 2]], 3) == [[2, 3, 4], [3, 4, 5]]
    # A stop id ends its row and is not returned (keras_attn.decoding's contract).
    assert greedy(logits_fn, [[1], [3]], 5, stop_token_ids=[4]) == [[2, 3], []]
    with pytest.raises(ValueError, match="maximum sequence length"):
        greedy(logits_fn, [[1, 2]], 5, max_length=4)
    with pytest.raises(ValueError, match="prompts"):
        greedy(logits_fn, [[]], 1)


def test_with_no_padding_id_every_id_is_generated():
    # Next token: (last + 1) % 3; ids 0 and 2 are tokens when `pad_token_id` is None (GPT-2, Llama).
    def logits_fn(ids):
        out = np.zeros((*ids.shape, 3))
        out[np.arange(ids.shape[0])[:, None], np.arange(ids.shape[1]), (ids + 1) % 3] = 1.0
        return out

    assert greedy(logits_fn, [[1], [2, 0]], 4, pad_token_id=None) == [[2, 0, 1, 2], [1, 2, 0, 1]]
    assert greedy(logits_fn, [[1]], 4, pad_token_id=None, stop_token_ids=[0]) == [[2]]
    # A padding id is never generated: the next most likely id (here the lowest) instead.
    assert greedy(logits_fn, [[1]], 2, pad_token_id=2) == [[0, 1]]


@pytest.mark.parametrize(
    "tamper, words",
    [
        # Removing a file's entry no longer turns its check off: the file is then unlisted.
        (lambda m, f: m["files"].pop("model.onnx"), r"points to \['model.onnx'\] but does not"),
        (lambda m, f: m["files"].pop("tokenizer/vocab.txt"), "not in manifest.json"),
        (lambda m, f: (f / "extra.onnx").write_bytes(b"x"), "extra.onnx"),
        (lambda m, f: m["onnx"].update(file="../../etc/passwd"), "not a plain name"),
        (lambda m, f: m["onnx"].update(file="/etc/passwd"), "not a plain name"),
        (lambda m, f: m["files"].update({"../x": "0" * 64}), "not a plain name"),
        (lambda m, f: m["decoding"].update(file="other.onnx"), "does not list their sha256"),
        (lambda m, f: m.update(files={}), "lists no files"),
        # The typed manifest: a version this reader does not know, a key it does not know, a
        # missing or mistyped field, a bare NaN.
        (
            lambda m, f: m.update(format_version=1),
            "format_version 1; this reader knows 2, 3, 4, 5, 6, 7, 8, 9",
        ),
        (lambda m, f: m.update(format_version="2"), "format_version '2'"),
        (lambda m, f: m.update(surprise=1), "field 'surprise': Extra inputs"),
        (lambda m, f: m.pop("outputs"), "field 'outputs': Field required"),
        (lambda m, f: m["inputs"][0].update(shape="batch"), "field 'inputs.0.shape'"),
        (lambda m, f: m["parity"].update(max_abs_diff=float("nan")), "not strict JSON: NaN"),
        (lambda m, f: m.update(task="translate"), "field 'task'"),
    ],
)
def test_manifest_integrity_holes_are_closed(toy_artifact, tmp_path, tamper, words):
    """Issue 19: deleting a file's entry turned its hash check off, and `onnx.file` could name
    a file outside the folder or outside `files`."""
    copy = tmp_path / "copy"
    shutil.copytree(toy_artifact[0], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    tamper(manifest, copy)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=words):
        Predictor(copy)
