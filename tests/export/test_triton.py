"""The Triton model writer: `config.pbtxt` read by Triton's own ModelConfig protobuf, matching
the ONNX graph it sits beside."""

import hashlib
import json

import onnx
import pytest
from google.protobuf import text_format
from keras_attn_export.triton import TRITON_TYPES, triton_config, write_triton_model
from tritonclient.grpc import model_config_pb2

ONNX_TYPES = {"TYPE_INT32": onnx.TensorProto.INT32, "TYPE_INT64": onnx.TensorProto.INT64,
              "TYPE_FP32": onnx.TensorProto.FLOAT, "TYPE_BOOL": onnx.TensorProto.BOOL}  # fmt: skip


def parse(text):
    """Triton's parser: text format into its `ModelConfig` message (unknown fields, bad enum
    values and bad types are errors)."""
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_config_matches_the_graph_and_files_are_checked(toy_artifact, tmp_path):
    folder = toy_artifact[0]
    model = write_triton_model(folder, tmp_path / "repo", name="toy", version=3,
                               max_batch_size=16, max_queue_delay_us=500)  # fmt: skip
    config = parse((model / "config.pbtxt").read_text())
    assert (config.name, config.backend, config.max_batch_size) == ("toy", "onnxruntime", 16)
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert [(g.count, g.kind) for g in config.instance_group] == [
        (1, model_config_pb2.ModelInstanceGroup.KIND_CPU)
    ]
    graph = onnx.load(model / "3" / "model.onnx").graph
    for declared, actual in ((config.input, graph.input), (config.output, graph.output)):
        actual = {v.name: v.type.tensor_type for v in actual}
        assert {t.name for t in declared} == set(actual)
        for tensor in declared:
            onnx_type = actual[tensor.name]
            name = model_config_pb2.DataType.Name(tensor.data_type)
            assert ONNX_TYPES[name] == onnx_type.elem_type
            dims = onnx_type.shape.dim
            assert dims[0].dim_param  # a free batch axis, which Triton fills
            # Triton's dims leave out the batch axis; fixed sizes must agree, -1 is free.
            assert len(tensor.dims) == len(dims) - 1
            for size, dim in zip(tensor.dims, dims[1:], strict=True):
                assert size == (dim.dim_value if dim.dim_value else -1)
    copied = hashlib.sha256((model / "3" / "model.onnx").read_bytes()).hexdigest()
    assert copied == json.loads((folder / "manifest.json").read_text())["files"]["model.onnx"]


def test_unbatched_tensors_turn_triton_batching_off_and_odd_files_are_named():
    manifest = {"onnx": {"file": "model.opt.onnx", "files": ["model.opt.onnx"]},
                "inputs": [{"name": "token_ids", "dtype": "int64", "shape": [1, "sequence"]}],
                "outputs": [{"name": "logits", "dtype": "float32", "shape": [1, 7]}]}  # fmt: skip
    config = parse(triton_config(manifest, "m.v2", max_batch_size=8, instances=2))
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert config.default_model_filename == "model.opt.onnx"
    assert [list(t.dims) for t in (*config.input, *config.output)] == [[1, -1], [1, 7]]
    assert config.instance_group[0].count == 2
    assert set(TRITON_TYPES.values()) <= set(model_config_pb2.DataType.keys())
    # A tensor that is only the batch axis (a score per row): dims [1], reshaped to [].
    scores = {"onnx": {"file": "model.onnx"},
              "inputs": [{"name": "token_ids", "dtype": "int32", "shape": ["batch", "sequence"]}],
              "outputs": [{"name": "score", "dtype": "float32", "shape": ["batch"]}]}  # fmt: skip
    (score,) = parse(triton_config(scores, "m")).output
    assert list(score.dims) == [1] and score.HasField("reshape") and not score.reshape.shape


@pytest.mark.parametrize(
    "change, words",
    [
        ({"name": "a/b"}, "`name`"),
        ({"max_batch_size": -1}, "`max_batch_size`"),
        ({"max_queue_delay_us": 1.5}, "`max_queue_delay_us`"),
        ({"instances": 0}, "`instances`"),
        ({"version": 0}, "`version`"),
    ],
)
def test_bad_arguments_name_themselves(toy_artifact, tmp_path, change, words):
    options = {"name": "toy", **change}
    with pytest.raises(ValueError, match=words):
        write_triton_model(toy_artifact[0], tmp_path, **options)


def test_refusals_name_the_problem(toy_artifact, tmp_path):
    import shutil

    with pytest.raises(ValueError, match="`artifact` must be a folder"):
        write_triton_model(tmp_path, tmp_path / "repo")
    tampered = tmp_path / "toy"
    shutil.copytree(toy_artifact[0], tampered)
    with open(tampered / "model.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ValueError, match="does not match its sha256"):
        write_triton_model(tampered, tmp_path / "repo")
    no_onnx = {"onnx": None, "inputs": [], "outputs": []}
    with pytest.raises(ValueError, match="no ONNX graph"):
        triton_config(no_onnx, "m")
    strings = {"onnx": {"file": "model.onnx"}, "outputs": [],
               "inputs": [{"name": "x", "dtype": "complex64", "shape": ["batch"]}]}  # fmt: skip
    with pytest.raises(ValueError, match="`x` has dtype complex64"):
        triton_config(strings, "m")
