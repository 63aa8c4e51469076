"""bench/llm_cpu.py's peers: llama.cpp (llama-cpp-python, GGUF Q8_0 / Q4_0) and
onnxruntime-genai (its model builder's int4), each converted from the same Hugging Face
folder and timed in a process of its own, the way `timings` times ours.

    python bench/llm_peers.py llama.cpp MODEL.gguf 512 32 80     # prints RESULT {...}
    python bench/llm_peers.py genai GENAI_FOLDER 512 32 80

Set-up (bench extra only; the library never imports these): `make bench-peers` installs
onnxruntime-genai and builds llama-cpp-python from its source archive for this CPU
(`-march=native`), and keeps the archive's llama.cpp tree in `build/peers`, whose
`convert_hf_to_gguf.py` (with its `gguf-py`) writes the float32 GGUF; llama.cpp's own
quantizer (`llama_model_quantize`, as `llama-quantize` does, its default tensor types) makes
Q8_0 and Q4_0 from it.
"""

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PEERS = HERE.parent / "build" / "peers"

# The bench folders carry a small byte-level BPE (the bench times ids, not text). Its
# pre-tokenizer is GPT-2's kind, but llama.cpp's converter recognizes a tokenizer by a hash of
# the ids it gives a test string, and refuses one it has not seen: the conversion says "gpt-2".
CONVERT = """
import runpy, sys
source, folder, out = sys.argv[1:4]
sys.path[:0] = [source, source + "/gguf-py"]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = ["convert_hf_to_gguf.py", folder, "--outfile", out, "--outtype", "f32"]
runpy.run_path(source + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def llama_cpp_source() -> Path | None:
    """The llama.cpp tree `make bench-peers` unpacked (`LLAMA_CPP_SOURCE` overrides)."""
    if os.environ.get("LLAMA_CPP_SOURCE"):
        return Path(os.environ["LLAMA_CPP_SOURCE"])
    found = sorted(PEERS.glob("llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    return found[-1].parent if found else None


def missing() -> dict[str, str]:
    """Peer name -> why it cannot run here (empty when both can)."""
    why = {}
    try:
        import llama_cpp  # noqa: F401
    except ImportError as error:
        why["llama.cpp"] = f"{error} (make bench-peers)"
    if "llama.cpp" not in why and llama_cpp_source() is None:
        why["llama.cpp"] = "no llama.cpp tree for its converter in build/peers (make bench-peers)"
    try:
        import onnxruntime_genai  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as error:
        why["genai"] = f"{error} (pip install -e '.[bench]')"
    return why


def run(args: list[str], what: str) -> str:
    """`args` run quietly; their stdout (their stderr's end raised when they fail)."""
    done = subprocess.run(args, capture_output=True, text=True, check=False,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def gguf_files(folder: Path, work: Path) -> dict[str, Path]:
    """The folder as GGUF: float32 by llama.cpp's converter, then Q8_0 and Q4_0 by its
    quantizer. Returns {"Q8_0": path, "Q4_0": path}; the float32 file is deleted."""
    import llama_cpp as ll

    float32 = work / f"{folder.name}.f32.gguf"
    run([sys.executable, "-c", CONVERT, str(llama_cpp_source()), str(folder), str(float32)],
        "convert_hf_to_gguf.py")  # fmt: skip
    files = {}
    for name, ftype in (("Q8_0", ll.LLAMA_FTYPE_MOSTLY_Q8_0), ("Q4_0", ll.LLAMA_FTYPE_MOSTLY_Q4_0)):
        params = ll.llama_model_quantize_default_params()
        params.ftype = ftype
        params.nthread = os.cpu_count() or 1
        files[name] = work / f"{folder.name}.{name}.gguf"
        if ll.llama_model_quantize(str(float32).encode(), str(files[name]).encode(), params):
            raise RuntimeError(f"llama_model_quantize {name} failed")
    float32.unlink()
    return files


def genai_folder(folder: Path, work: Path) -> Path:
    """onnxruntime-genai's model builder on the folder: int4, CPU, block 32, accuracy level 4
    (the settings the issue names; the builder's CPU defaults)."""
    out = work / f"{folder.name}-genai-int4"
    run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o",
         str(out), "-p", "int4", "-e", "cpu", "-c", str(work / "genai-cache"),
         "--extra_options", "int4_accuracy_level=4", "int4_block_size=32"],
        "onnxruntime-genai's builder")  # fmt: skip
    return out


def timed(step, runs: int) -> float:
    """Median ms of `step()` over `runs` calls after two warm-ups."""
    times = []
    for _ in range(runs + 2):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[2:])


def llama_cpp_times(path: str, prompt: int, rows: int, position: int, repeats: int = 10) -> dict:
    """llama.cpp through llama-cpp-python's C API, every core: a `prompt`-token prefill (one
    sequence, one `llama_decode`), one decode step of one sequence at position `prompt`, and
    one step of `rows` sequences at `position` (the first sequence's cache copied to the
    others, so each attends over `position` real entries)."""
    import llama_cpp as ll

    ll.llama_backend_init()
    model = ll.llama_model_load_from_file(path.encode(), ll.llama_model_default_params())
    threads = os.cpu_count() or 1
    ids = np.random.default_rng(0).integers(1, 1000, max(prompt, position)).tolist()

    def context(sequences: int, length: int):
        params = ll.llama_context_default_params()
        params.n_ctx = sequences * length
        params.n_batch = params.n_ubatch = max(prompt, rows)
        params.n_seq_max = sequences
        params.kv_unified = True
        params.n_threads = params.n_threads_batch = threads
        return ll.llama_init_from_model(model, params)

    batch = ll.llama_batch_init(max(prompt, rows), 0, 1)

    def decode(ctx, entries: list[tuple[int, int, int]], last_only: bool) -> None:
        """`entries`: (token, position, sequence)."""
        for i, (token, pos, seq) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = (i == len(entries) - 1) or not last_only
        batch.n_tokens = len(entries)
        if ll.llama_decode(ctx, batch):
            raise RuntimeError("llama_decode failed")
        ll.llama_synchronize(ctx)

    one = context(1, prompt + repeats + 16)
    memory = ll.llama_get_memory(one)

    def prefill() -> None:
        ll.llama_memory_clear(memory, True)
        decode(one, [(t, p, 0) for p, t in enumerate(ids[:prompt])], True)

    prefill_ms = timed(prefill, 3)
    at = [prompt]

    def step() -> None:
        decode(one, [(7, at[0], 0)], True)
        at[0] += 1

    step_1_ms = timed(step, repeats)
    ll.llama_free(one)
    many = context(rows, position + repeats // 2 + 8)
    memory = ll.llama_get_memory(many)
    decode(many, [(t, p, 0) for p, t in enumerate(ids[:position])], True)
    for seq in range(1, rows):
        ll.llama_memory_seq_cp(memory, 0, seq, -1, -1)
    at = [position]

    def step_rows() -> None:
        decode(many, [(7, at[0], seq) for seq in range(rows)], False)
        at[0] += 1

    step_rows_ms = timed(step_rows, max(3, repeats // 2))
    ll.llama_free(many)
    ll.llama_batch_free(batch)
    ll.llama_model_free(model)
    return {"prefill_ms": prefill_ms, "step_1_ms": step_1_ms, f"step_{rows}_ms": step_rows_ms}


def genai_times(folder: str, prompt: int, rows: int, position: int, repeats: int = 10) -> dict:
    """onnxruntime-genai's `Generator`, greedy: `append_tokens` of a `prompt`-token prompt
    (the prefill), then one `generate_next_token` (a forward of the last token and its
    choice) for one sequence, and for a batch of `rows` sequences after prompts of
    `position` tokens."""
    import onnxruntime_genai as og

    model = og.Model(folder)
    rng = np.random.default_rng(0)

    def generator(batch: int, length: int):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=length + repeats + 8, batch_size=batch,
                                  do_sample=False)  # fmt: skip
        return og.Generator(model, params)

    ids = rng.integers(1, 1000, (1, prompt)).astype(np.int32)
    prefill_ms = timed(lambda: generator(1, prompt).append_tokens(ids), 3)
    one = generator(1, prompt)
    one.append_tokens(ids)
    step_1_ms = timed(one.generate_next_token, repeats)
    del one
    many = generator(rows, position)
    many.append_tokens(rng.integers(1, 1000, (rows, position)).astype(np.int32))
    step_rows_ms = timed(many.generate_next_token, max(3, repeats // 2))
    return {"prefill_ms": prefill_ms, "step_1_ms": step_1_ms, f"step_{rows}_ms": step_rows_ms}


def peer_times(peer: str, path: Path, prompt: int, rows: int, position: int) -> dict:
    """`peer`'s timings in a process of its own (its memory and threads, not ours)."""
    return result(run([sys.executable, __file__, peer, str(path), str(prompt), str(rows),
                       str(position)], peer))  # fmt: skip


def result(stdout: str) -> dict:
    """The JSON a measuring process printed on its `RESULT ` line."""
    (line,) = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[len("RESULT ") :])


if __name__ == "__main__":
    name, where, *numbers = sys.argv[1:]
    prompt_tokens, row_count, batch_position = map(int, numbers)
    measure = llama_cpp_times if name == "llama.cpp" else genai_times
    print("RESULT " + json.dumps(measure(where, prompt_tokens, row_count, batch_position)))
