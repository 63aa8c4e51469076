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


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "README should show the library in use"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
