"""A GPT-2-layout checkpoint folder -> sampled generation -> export -> `/generate_stream`.

    python examples/gpt2_folder_generate.py               # about a minute on 2 CPU cores
    python examples/gpt2_folder_generate.py --seconds 10  # a quick look

Nothing is downloaded (no network at run time), so the example first WRITES a small
GPT-2-layout folder itself: a byte-level BPE vocabulary (`vocab.json` + `merges.txt`) that
the `tokenizers` library learns from the embedded Shakespeare, and a small model of RANDOM
weights, trained for `--seconds`, written by `save_pretrained(model_type="gpt2")`. It is a toy
stand-in for a real `gpt2` folder, labelled as such; from then on the steps are those for a
real one:

1. `CausalLM.from_pretrained(folder)` and `BytePairTokenizer.from_pretrained(folder)`;
2. sampled `generate` (temperature, top-k, seed);
3. `export_model(lm, ..., tokenizer=tokenizer)`: ONNX, decode graphs, parity checked;
4. the server (`keras_attn_serving`, no TensorFlow) answers `/generate_stream` with the same
   sampling parameters: the same ids as Keras, token by token.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import keras
import numpy as np

if __package__ in (None, ""):  # run as `python examples/NAME.py`: its siblings import too
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.toy_checkpoints import learn_bpe
from keras_attn.callbacks import TimeBudget
from keras_attn.data import lm_windows, load_corpus
from keras_attn.models import CausalLM, DecoderBackbone, lm_loss
from keras_attn.tokenizers import BytePairTokenizer

PROMPT = "to be or not to be"
SAMPLING = {"temperature": 0.8, "top_k": 20, "seed": 5}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0, help="training time for the toy")
    p.add_argument("--lines", type=int, default=20000, help="Shakespeare lines to use")
    p.add_argument("--vocabulary-size", type=int, default=2000)
    p.add_argument("--sequence-length", type=int, default=64)
    p.add_argument("--hidden-dim", type=int, default=96)
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--out", default=None, help="folder for the checkpoint and the export")
    return p.parse_args(argv)


def write_toy_gpt2_folder(folder: Path, lines: list[str], args) -> None:
    """The stand-in checkpoint: BPE files learned by `tokenizers`, a model of random weights
    trained for `args.seconds`, both in the Hugging Face GPT-2 layout."""
    bpe = learn_bpe(lines, args.vocabulary_size)
    folder.mkdir(parents=True, exist_ok=True)
    bpe.model.save(str(folder))  # vocab.json + merges.txt, as GPT-2 ships them
    tokenizer = BytePairTokenizer.from_pretrained(folder)
    keras.utils.set_random_seed(0)
    backbone = DecoderBackbone(
        tokenizer.vocabulary_size(), args.sequence_length + args.new_tokens,
        hidden_dim=args.hidden_dim, num_layers=2, num_heads=4,
        intermediate_dim=4 * args.hidden_dim, dropout=0.0, normalize_first=True,
        activation="gelu_tanh", position_encoding="learned", mask_zero=False,
    )  # fmt: skip
    lm = CausalLM(backbone)
    # `<|endoftext|>` (id 0) pads the last window of each play; the loss skips it.
    documents = [tokenizer.tokenize(" ".join(lines[i : i + 200])).numpy()
                 for i in range(0, len(lines), 200)]  # fmt: skip
    x, y = lm_windows(documents, args.sequence_length)
    lm.compile(optimizer=keras.optimizers.Adam(3e-3), loss=lm_loss())
    history = lm.fit(x, y, batch_size=32, epochs=100, verbose=0,
                     callbacks=[TimeBudget(args.seconds)]).history  # fmt: skip
    print(f"toy checkpoint: {len(history['loss'])} epochs, loss {history['loss'][-1]:.2f}")
    backbone.save_pretrained(folder, model_type="gpt2")


def main(argv=None):
    args = parse_args(argv)
    from fastapi.testclient import TestClient
    from keras_attn_export import export_model
    from keras_attn_serving.server import ModelRepository, create_app

    out = Path(args.out or tempfile.mkdtemp(prefix="gpt2_folder_"))
    folder = out / "toy-gpt2"
    write_toy_gpt2_folder(folder, load_corpus().lines()[: args.lines], args)
    print(f"wrote a toy GPT-2-layout folder (random weights, briefly trained): {folder}")

    # From here on, as with a real GPT-2 folder.
    lm = CausalLM.from_pretrained(folder)
    tokenizer = BytePairTokenizer.from_pretrained(folder)
    prompt_ids = tokenizer.tokenize(PROMPT).numpy().tolist()
    (in_keras,) = lm.generate([prompt_ids], args.new_tokens, sampler="sample", **SAMPLING)
    text = tokenizer.detokenize(prompt_ids + in_keras).numpy().decode()
    print(f"Keras, sampled {SAMPLING}: {text!r}")

    manifest = export_model(lm, out / "repository" / "gpt2" / "1", tokenizer=tokenizer,
                            verbose=False)  # fmt: skip
    parity = manifest["parity"]["max_abs_diff"]
    decoding = manifest["decoding"]
    graphs = [decoding["file"]] + ([decoding["gqa"]["file"]] if decoding["gqa"] else [])
    print(f"exported: ONNX parity {parity:.2e}, decode graphs {graphs}")

    body = {"text_input": PROMPT, "parameters": {**SAMPLING, "max_new_tokens": args.new_tokens}}
    with TestClient(create_app(ModelRepository(out / "repository"))) as client:
        with client.stream("POST", "/v2/models/gpt2/generate_stream", json=body) as response:
            events = [json.loads(line[len("data: "):]) for line in response.iter_lines()
                      if line.startswith("data: ")]  # fmt: skip
    served = [event["token_id"] for event in events]
    streamed = "".join(event["text_output"] for event in events)
    print(f"served over /generate_stream, same parameters: {PROMPT} {streamed!r}")
    print(f"same ids as Keras: {served == in_keras} ({len(served)} tokens)")
    return {
        "parity_max_abs_diff": parity,
        "served_equals_keras": float(served == in_keras),
        "new_tokens": float(len(served)),
        "distinct_ids": float(len(np.unique(in_keras))),
    }


if __name__ == "__main__":
    main()
