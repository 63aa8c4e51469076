"""Benchmark: an encoder-decoder's generation with shared decoder steps vs each request alone,
and `transformers.generate` on the same weights.

    python bench/seq2seq_batching.py                       # 1, 8, 32 streams; 3 rounds
    python bench/seq2seq_batching.py --streams 1 8 --rounds 1 --new-tokens 16   # quicker

`transformers` writes a BART folder of RANDOM weights (`--dim`, `--layers` encoder and as many
decoder layers, `--dim / 64` heads, `--vocabulary-size`); `Seq2SeqLM.from_pretrained` loads it
and `export_model` writes `encode.onnx` + `decode.onnx`. In this process, with no HTTP:

- "shared": `Predictor(max_decode_rows=32).stream_ids` from one thread per stream: the
  requests in flight share each decoder step (`keras_attn_serving.seq2seq_batching`);
- "alone": `Predictor(num_threads=1).stream_ids` from one thread per stream, each request
  decoding in its own run, as the server did before (one intra-op thread per session run,
  the threads sharing the cores);
- "transformers": one `generate` call on all the streams' sources at once (a static batch,
  right-padded; torch's own threads), the peer.

Each stream asks for exactly `--new-tokens` greedy ids of a source of 8-48 ids (no stop id;
`min_new_tokens` for transformers). Prints new tokens/s per mode and stream count (best of
`--rounds`), the ratios to the peer, and the CPU flags; writes JSON.
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

# Run as a script, this file's folder leads sys.path, and bench/export.py would shadow the
# `export` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import numpy as np  # noqa: E402


def write_model(work: Path, args) -> Path:
    """The random BART folder (written by `transformers`) and its export; the artifact."""
    import torch
    from keras_attn_export import export_model
    from transformers import BartConfig, BartForConditionalGeneration

    from keras_attn.models import Seq2SeqLM

    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=args.vocabulary_size, d_model=args.dim, encoder_layers=args.layers,
        decoder_layers=args.layers, encoder_attention_heads=args.dim // 64,
        decoder_attention_heads=args.dim // 64, encoder_ffn_dim=4 * args.dim,
        decoder_ffn_dim=4 * args.dim, max_position_embeddings=args.max_length,
    )  # fmt: skip
    model = BartForConditionalGeneration(config).eval()
    model.save_pretrained(work / "hf")
    lm = Seq2SeqLM.from_pretrained(work / "hf", preprocessor=None, dropout=0.0)
    artifact = work / "artifact"
    export_model(lm, artifact, formats=("onnx",), batch_sizes=(1, 2), sequence_lengths=(8,),
                 verbose=False)  # fmt: skip
    return artifact


def threaded(predictor, sources: list[list[int]], new_tokens: int) -> float:
    """Seconds for one thread per source to stream its `new_tokens` ids, started together."""
    barrier = threading.Barrier(len(sources) + 1)
    counts = [0] * len(sources)

    def run(k: int) -> None:
        barrier.wait()
        counts[k] = len(list(predictor.stream_ids(sources[k], new_tokens)))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(sources))]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    assert counts == [new_tokens] * len(sources), counts
    return elapsed


def peer(folder: Path, sources: list[list[int]], new_tokens: int) -> float:
    import torch
    from transformers import BartForConditionalGeneration

    model = BartForConditionalGeneration.from_pretrained(folder).eval()
    pad = model.config.pad_token_id
    width = max(map(len, sources))
    ids = torch.full((len(sources), width), pad, dtype=torch.long)
    for row, source in enumerate(sources):
        ids[row, : len(source)] = torch.tensor(source)
    with torch.no_grad():
        start = time.perf_counter()
        out = model.generate(
            input_ids=ids,
            attention_mask=ids != pad,
            do_sample=False,
            num_beams=1,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
        )
        elapsed = time.perf_counter() - start  # fmt: skip
    assert out.shape[1] >= new_tokens, out.shape
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--out", default="bench/results/seq2seq_batching.json")
    args = parser.parse_args()

    from keras_attn_serving import Predictor

    from keras_attn.hardware import cpu_flags

    work = Path(tempfile.mkdtemp(prefix="seq2seq_batching_"))
    artifact = write_model(work, args)
    shared = Predictor(artifact, max_decode_rows=32)
    alone = Predictor(artifact, num_threads=1)
    rng = np.random.default_rng(0)
    rows = []
    for streams in args.streams:
        sources = [[int(t) for t in rng.integers(4, args.vocabulary_size, int(rng.integers(8, 49)))]
                   for _ in range(streams)]  # fmt: skip
        threaded(shared, sources[:1], 2)  # warm the sessions
        times: dict[str, list[float]] = {"shared": [], "alone": [], "transformers": []}
        for _ in range(args.rounds):
            times["shared"].append(threaded(shared, sources, args.new_tokens))
            times["alone"].append(threaded(alone, sources, args.new_tokens))
            times["transformers"].append(peer(work / "hf", sources, args.new_tokens))
        rate = {mode: streams * args.new_tokens / min(t) for mode, t in times.items()}
        rows.append({"streams": streams, **{f"{m}_tokens_per_s": r for m, r in rate.items()},
                     "shared_over_transformers": rate["shared"] / rate["transformers"],
                     "shared_over_alone": rate["shared"] / rate["alone"]})  # fmt: skip
    flags = cpu_flags()
    print(f"\nBART layout, random weights: d={args.dim}, {args.layers}+{args.layers} layers, "
          f"vocabulary {args.vocabulary_size}; {args.new_tokens} greedy ids per stream; best "
          f"of {args.rounds} rounds")  # fmt: skip
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, flags: "
          f"{' '.join(flags) or '(none read)'}\n")  # fmt: skip
    print(f"{'streams':>7} {'shared':>10} {'alone':>10} {'transformers':>13} "
          f"{'shared/tf':>10} {'shared/alone':>13}   (new tokens/s)")  # fmt: skip
    for row in rows:
        print(
            f"{row['streams']:>7} {row['shared_tokens_per_s']:>10.0f} "
            f"{row['alone_tokens_per_s']:>10.0f} {row['transformers_tokens_per_s']:>13.0f} "
            f"{row['shared_over_transformers']:>10.2f} {row['shared_over_alone']:>13.2f}"
        )
    shared.close()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "seq2seq generation: shared steps vs alone vs "
                               "transformers", "args": vars(args), "cpu_flags": flags,
                               "rows": rows}, indent=2))  # fmt: skip
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
