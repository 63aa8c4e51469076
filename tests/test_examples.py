"""Each example runs a short version of itself; README code blocks run as written."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quickstart_learns_the_pattern():
    from examples import quickstart

    accuracy = quickstart.main(["--epochs", "2", "--samples", "2000"])
    assert accuracy > 0.9  # a trained model, not an untrained one (~1/23 by chance)


@pytest.mark.slow
@pytest.mark.tf_only
def test_main_job_toy_pipeline(tmp_path):
    """The README's main job at toy size: train, export, onnxruntime parity, generation."""
    from examples import shakespeare_lm

    summary = shakespeare_lm.main(
        ["--minutes", "0.02", "--max-documents", "2", "--vocabulary-size", "400",
         "--vocabulary-lines", "3000", "--hidden-dim", "16", "--num-layers", "1",
         "--num-heads", "2", "--sequence-length", "16", "--batch-size", "16",
         "--new-tokens", "4", "--out", str(tmp_path / "lm")]
    )  # fmt: skip
    assert summary["parity_max_abs_diff"] <= 1e-4
    assert 1.0 < summary["held_out_perplexity"] < 400  # trained at least a little
    assert summary["sample"].startswith("to be or not to be")
    assert (tmp_path / "lm" / "model.onnx").is_file() and (tmp_path / "lm.keras").is_file()


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "README should show the library in use"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
