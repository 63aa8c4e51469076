"""Issue 26: the manifest's `tokenizer` could point outside the artifact folder, unhashed.

The artifact here is written by hand (a two-node ONNX graph, a WordPiece vocabulary, the
manifest export would write for them): no TensorFlow, no Keras.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from keras_attn_serving import ArtifactError, Predictor
from keras_attn_serving.manifest import (
    FORMAT_VERSION,
    MANIFEST,
    parse_manifest,
    read_manifest,
    sha256,
    verify_files,
)

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "to", "be", "or", "not"]


def write_onnx(path: Path) -> None:
    """`logits = float(token_ids)[..., None]`: the smallest graph `Predictor` can serve."""
    import onnx
    from onnx import TensorProto, helper

    ids = helper.make_tensor_value_info("token_ids", TensorProto.INT32, ["batch", "length"])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "length", 1])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [-1])
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["token_ids"], ["as_float"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["as_float", "axes"], ["logits"]),
        ],
        "tiny",
        [ids],
        [logits],
        initializer=[axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)


def write_tokenizer(folder: Path) -> None:
    """The two files `keras_attn_export.describe.write_tokenizer` writes."""
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(VOCABULARY) + "\n", encoding="utf-8")
    config = {
        "type": "wordpiece",
        "lowercase": True,
        "strip_accents": True,
        "special_tokens": ["[PAD]", "[UNK]", "[CLS]", "[SEP]"],
        "unknown_token": "[UNK]",
        "suffix_indicator": "##",
        "max_bytes_per_word": 100,
        "pad_token_id": 0,
    }
    (folder / "tokenizer.json").write_text(json.dumps(config), encoding="utf-8")


def hashes(folder: Path) -> dict[str, str]:
    return {
        path.relative_to(folder).as_posix(): sha256(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }


def write_manifest(folder: Path, **changes) -> None:
    content = {
        "format_version": FORMAT_VERSION,
        "created": "2026-01-01T00:00:00+00:00",
        "model_name": "tiny",
        "inputs": [{"name": "token_ids", "dtype": "int32", "shape": ["batch", "length"]}],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", "length", 1]}],
        "task": None,
        "labels": None,
        "packer": None,
        "onnx": {"file": "model.onnx", "opset": 17, "files": ["model.onnx"], "fused_ops": {}},
        "saved_model": None,
        "tokenizer": "tokenizer",
        "max_sequence_length": 16,
        "vocabulary_size": len(VOCABULARY),
        "input_ranges": {"token_ids": [0, len(VOCABULARY) - 1]},
        "versions": {},
        "parity": {"tolerance": 1e-4, "max_abs_diff": 0.0, "rows": []},
        "int8": None,
        "decoding": None,
        "text_onnx": None,
        "files": hashes(folder),
    }
    content.update(changes)
    # The writer's schema check: what follows is a manifest export could have written.
    (folder / MANIFEST).write_text(parse_manifest(content).to_json(), encoding="utf-8")


@pytest.fixture
def artifact(tmp_path) -> Path:
    folder = tmp_path / "artifact"
    folder.mkdir()
    write_onnx(folder / "model.onnx")
    write_tokenizer(folder / "tokenizer")
    write_manifest(folder)
    return folder


def refused(folder: Path, words: str) -> str:
    """The `ArtifactError` loading `folder` raises; it matches `words` and quotes no server
    path (the folder's own location)."""
    with pytest.raises(ArtifactError, match=words) as error:
        verify_files(folder, read_manifest(folder))
    with pytest.raises(ArtifactError, match=words):
        Predictor(folder)
    message = str(error.value)
    assert str(folder.parent) not in message and str(folder.resolve().parent) not in message
    return message


def test_a_well_formed_artifact_loads(artifact):
    verify_files(artifact, read_manifest(artifact))
    predictor = Predictor(artifact)
    assert predictor.tokenizer.encode("to be or not") == [4, 5, 6, 7]
    out = predictor.run({"token_ids": np.array([[4, 5, 0]], "int32")})
    np.testing.assert_array_equal(out["logits"][..., 0], [[4.0, 5.0, 0.0]])


def test_the_tokenizer_files_are_files_the_manifest_points_to(artifact):
    assert read_manifest(artifact).referenced_files() == [
        "model.onnx",
        "tokenizer/tokenizer.json",
        "tokenizer/vocab.txt",
    ]


@pytest.mark.parametrize(
    "name", ["../elsewhere", "/abs", "/etc", "tokenizer/../../elsewhere", "tokenizer\\..", "."]
)
def test_a_tokenizer_path_leaving_the_folder_is_refused(artifact, name):
    (artifact.parent / "elsewhere").mkdir()
    write_tokenizer(artifact.parent / "elsewhere" / "tokenizer")
    write_manifest(artifact, tokenizer=name)
    message = refused(artifact, r"field 'tokenizer' is .*not a plain relative name")
    assert repr(name) in message
    with pytest.raises(ArtifactError, match="field 'tokenizer'"):
        Predictor(artifact, verify=False)  # the server reads it even without the hash check


def test_a_tokenizer_folder_linked_outside_is_refused(artifact):
    # The same bytes outside, so every hash still matches: only where it leads is wrong.
    outside = artifact.parent / "outside"
    shutil.move(artifact / "tokenizer", outside)
    (artifact / "tokenizer").symlink_to(outside, target_is_directory=True)
    refused(artifact, "field 'tokenizer' is 'tokenizer': a symbolic link there leads outside")
    with pytest.raises(ArtifactError, match="leads outside"):
        Predictor(artifact, verify=False)


def test_a_tokenizer_file_linked_outside_is_refused(artifact):
    outside = artifact.parent / "vocab.txt"
    shutil.move(artifact / "tokenizer/vocab.txt", outside)
    (artifact / "tokenizer/vocab.txt").symlink_to(outside)
    refused(artifact, "field 'tokenizer' is 'tokenizer': a symbolic link there leads outside")


def test_a_tokenizer_folder_that_is_not_there_is_refused(artifact):
    write_manifest(artifact, tokenizer="missing")
    refused(artifact, "field 'tokenizer' is 'missing': no such folder")


@pytest.mark.parametrize("unlisted", ["tokenizer/vocab.txt", "tokenizer/tokenizer.json"])
def test_a_tokenizer_file_missing_from_files_is_refused(artifact, unlisted):
    files = hashes(artifact)
    del files[unlisted]
    write_manifest(artifact, files=files)
    message = refused(artifact, "field 'tokenizer' names 'tokenizer', whose files")
    assert unlisted in message


def test_a_tokenizer_folder_nobody_hashed_is_refused(artifact):
    # `tokenizer` names a second folder whose files `files` does not list.
    write_tokenizer(artifact / "planted")
    files = {rel: digest for rel, digest in hashes(artifact).items() if "planted" not in rel}
    write_manifest(artifact, tokenizer="planted", files=files)
    refused(artifact, r"field 'tokenizer' names 'planted', whose files \['planted/tokenizer.json'")


def test_an_extra_file_in_the_tokenizer_folder_is_refused(artifact):
    (artifact / "tokenizer/added_tokens.json").write_text("{}")
    refused(artifact, r"whose files \['tokenizer/added_tokens.json'\] are not in manifest.json")


@pytest.mark.parametrize("name", ["vocab.txt", "tokenizer.json"])
def test_a_changed_byte_in_a_tokenizer_file_is_refused(artifact, name):
    path = artifact / "tokenizer" / name
    data = bytearray(path.read_bytes())
    data[3] ^= 1
    path.write_bytes(bytes(data))
    refused(artifact, rf"tokenizer/{name} \(field 'tokenizer'\) does not match its sha256")


FORMAT_4_ENTRIES = {
    "decoding": {"file": None, "pad_id": None},
    "seq2seq": {
        "file": "decode.onnx", "encoder_file": "encode.onnx", "source_pad_id": 58100,
        "pad_id": 58100, "decoder_start_id": 58100,
    },
    "onnx": {
        "file": "model.onnx", "opset": 17, "files": ["model.onnx"], "fused_ops": {},
        "unpadded": {"model.onnx": {"input": "token_ids", "pad_value": 1, "outputs": ["y"]}},
    },
}  # fmt: skip


@pytest.mark.parametrize("version", [2, 3, 4])
def test_older_formats_are_read_under_the_one_padding_name(artifact, version):
    """Format 5 names the padding id `pad_token_id` everywhere (as the library's models do);
    artifacts written before it keep working: their names are read as the new ones."""
    content = json.loads((artifact / MANIFEST).read_text())
    content.update(FORMAT_4_ENTRIES, format_version=version)
    manifest = parse_manifest(content)
    assert manifest.decoding.pad_token_id is None
    assert (manifest.seq2seq.pad_token_id, manifest.seq2seq.never_generated_id) == (58100, 58100)
    assert manifest.onnx.unpadded["model.onnx"].pad_token_id == 1
    written = json.loads(manifest.to_json())
    assert "pad_id" not in written["decoding"] and "source_pad_id" not in written["seq2seq"]


OLD_NAMES = [  # (where, format 4's name, format 5's)
    (("decoding",), "pad_id", "pad_token_id"),
    (("seq2seq",), "source_pad_id", "pad_token_id"),
    (("seq2seq",), "pad_id", "never_generated_id"),
    (("onnx", "unpadded", "model.onnx"), "pad_value", "pad_token_id"),
]


def _entry(content, path):
    for key in path:
        content = content[key]
    return content


@pytest.mark.parametrize(("where", "old", "new"), OLD_NAMES)
def test_format_5_refuses_the_old_padding_names(artifact, where, old, new):
    path, where = where, ".".join(where)
    content = json.loads((artifact / MANIFEST).read_text())
    content.update(FORMAT_4_ENTRIES, format_version=4)
    upgraded = json.loads(parse_manifest(content).to_json())
    upgraded.update(format_version=5)
    _entry(upgraded, path)[old] = 0
    with pytest.raises(ArtifactError, match=f"field '{where}.{old}': Extra inputs"):
        parse_manifest(upgraded)


@pytest.mark.parametrize(("where", "old", "new"), OLD_NAMES)
def test_an_older_manifest_naming_the_padding_id_twice_is_refused(artifact, where, old, new):
    """Both names in a format-4 manifest: refused, not read as whichever comes last."""
    path, where = where, ".".join(where)
    content = json.loads((artifact / MANIFEST).read_text())
    content.update(json.loads(json.dumps(FORMAT_4_ENTRIES)), format_version=4)
    _entry(content, path)[new] = 3
    with pytest.raises(ArtifactError, match=f"field '{where}' holds both '{old}' and '{new}'"):
        parse_manifest(content)
