"""Issue 26, round two of hostile input: each case was served wrongly (a 5xx, a limit
sidestepped, code run from the working folder) before its fix."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from keras_attn_serving.protocol import (
    ServingError,
    client_timeout_s,
    decode_request,
    requested_outputs,
)

PLANTED = "raise SystemExit('PLANTED MODULE IMPORTED')\n"


def test_repeated_outputs_are_refused_not_encoded_again():
    """10,000 × `{"name": "logits"}` returned 263 MB of JSON past the output-size limit."""
    request = {"outputs": [{"name": "logits"}] * 10_000}
    with pytest.raises(ServingError, match=r"names \['logits'\] more than once") as caught:
        requested_outputs(request, ["logits", "pooled"])
    assert caught.value.status == 400
    once = {"outputs": [{"name": "logits"}, {"name": "pooled"}]}
    assert requested_outputs(once, ["logits", "pooled"]) == [("logits", False), ("pooled", False)]


@pytest.mark.parametrize("value", [-5, float("-inf"), float("inf"), float("nan"), "5", True, []])
def test_a_bad_client_timeout_is_a_400_not_a_504(value):
    with pytest.raises(ServingError, match=r"`parameters.timeout` must be") as caught:
        client_timeout_s(value)
    assert caught.value.status == 400


def test_client_timeouts_in_microseconds():
    assert client_timeout_s(None) is None and client_timeout_s(0) is None
    assert client_timeout_s(2_500_000) == 2.5 and client_timeout_s(1.5e6) == 1.5


def test_a_shape_numpy_cannot_hold_is_a_400_even_with_no_data():
    """`[2**32, 2**32, 0]` with empty data has 0 values, and crashed NumPy's reshape (500)."""
    body = b'{"inputs": [{"name": "token_ids", "datatype": "INT32", "shape": ' \
           b'[4294967296, 4294967296, 0], "data": []}]}'  # fmt: skip
    with pytest.raises(ServingError, match=r"at most 2147483647 each") as caught:
        decode_request(body)
    assert caught.value.status == 400
    empty = b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [0, 3], "data": []}]}'
    assert decode_request(empty)[1]["x"].shape == (0, 3)


def test_import_modules_puts_the_working_folder_back(tmp_path, monkeypatch):
    """The CLI left the working folder first on the import path for the rest of the run, so
    a stray `onnx.py` there was executed by the next `import onnx`."""
    from keras_attn_export.cli import import_modules

    (tmp_path / "named_layers.py").write_text("VALUE = 7\n")
    (tmp_path / "stray_helper.py").write_text(PLANTED)
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    try:
        import_modules(["named_layers"])
        assert sys.modules["named_layers"].VALUE == 7
        assert sys.path == before
        import importlib.util

        assert importlib.util.find_spec("stray_helper") is None
        import_modules([])  # nothing named: the folder is not even looked at
        assert sys.path == before
    finally:
        sys.modules.pop("named_layers", None)


@pytest.mark.slow
def test_cli_export_runs_no_module_planted_in_the_working_folder(tmp_path):
    """`onnx.py` and `keras_attn.py` planted where the CLI runs: the export succeeds with the
    real ones (the console script, as users run it)."""
    import keras

    from keras_attn.models import Encoder, SequenceClassifier

    keras.utils.set_random_seed(0)
    model = SequenceClassifier(Encoder(30, 8, hidden_dim=8, num_layers=1, num_heads=2), 2)
    model.save(tmp_path / "clf.keras")
    for name in ("onnx.py", "keras_attn.py", "tf2onnx.py", "onnxruntime.py"):
        (tmp_path / name).write_text(PLANTED)
    script = Path(sys.executable).parent / "keras-attn-export"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [str(script), "clf.keras", "out", "--formats", "onnx", "--labels", "a,b"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert "PLANTED" not in done.stdout + done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "out" / "model.onnx").is_file()


def test_error_messages_are_bounded_whatever_they_quote():
    """A 400 for 10,000 input names echoed them all: 1.1 MB."""
    names = [f"input_{i}" for i in range(10_000)]
    error = ServingError(400, f"inputs must be ['token_ids']; received {names}")
    assert len(error.message) == 500 and error.message.endswith("…")
    assert ServingError(400, "short").message == "short"


def test_the_offload_runs_large_work_in_another_process_and_keeps_error_statuses():
    """json.loads/json.dumps hold the GIL for the whole call (34 MB of numbers: 0.78 s): in a
    thread they stalled every request. Above `inline_bytes` they run in a worker process."""
    import asyncio

    from keras_attn_serving.offload import Offload
    from keras_attn_serving.protocol import parse_json

    offload = Offload(inline_bytes=1000)
    try:
        assert asyncio.run(offload.run(10, os.getpid)) == os.getpid()
        assert asyncio.run(offload.run(10_000, os.getpid)) != os.getpid()
        with pytest.raises(ServingError) as refused:
            asyncio.run(offload.run(10_000, parse_json, b"{not json"))
        assert refused.value.status == 400 and "not JSON" in refused.value.message
    finally:
        offload.close()
    with pytest.raises(ValueError, match="`processes` must be >= 1"):
        Offload(processes=0)


def test_an_offload_whose_workers_cannot_start_falls_back_to_threads(monkeypatch, caplog):
    """A script that runs the server without `if __name__ == "__main__":` breaks spawned
    workers; the server then logs why once and works in threads, never answering 503s."""
    import asyncio
    from concurrent.futures.process import BrokenProcessPool

    from keras_attn_serving.offload import Offload

    class Broken:
        def submit(self, *args):
            raise BrokenProcessPool("a child process terminated abruptly")

        def shutdown(self, **kwargs):
            pass

    offload = Offload(inline_bytes=10)
    monkeypatch.setattr(offload, "_executor", Broken)
    assert offload.start() is False and offload.threads_only
    assert "if __name__ == '__main__'" in caplog.text
    assert asyncio.run(offload.run(1000, os.getpid)) == os.getpid()
