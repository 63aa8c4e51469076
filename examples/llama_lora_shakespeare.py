"""A Llama-layout checkpoint folder -> LoRA fine-tuning on Shakespeare -> export -> serve.

    python examples/llama_lora_shakespeare.py               # about two minutes on 2 CPU cores
    python examples/llama_lora_shakespeare.py --seconds 10  # a quick look

Nothing is downloaded (no network at run time), so the example first WRITES a small
Llama-layout folder: RANDOM weights (RMSNorm, SwiGLU, rotary positions, grouped-query
attention, untied head) written by `save_pretrained(model_type="llama")`, and a Llama-3-style
byte-level BPE `tokenizer.json` learned by the `tokenizers` library. It stands in for a real
Llama checkpoint, labelled as such; the steps after it are those for a real one:

1. `CausalLM.from_pretrained(folder)` and `from_tokenizer_json(folder / "tokenizer.json")`;
2. `backbone.enable_lora(rank)`: only the query and value adapters train (their share of
   the weights is printed), for `--seconds`, on Shakespeare; held-out loss before and after;
3. `save_lora_weights`: the adapters alone, a small safetensors file;
4. `export_model`: the adapters are merged into the base weights for ONNX, and the export
   checks the merged graph against the adapted Keras model;
5. the server answers `/generate` from the export: the same ids as Keras `generate`.
"""

import argparse
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
from keras_attn.tokenizers import from_tokenizer_json

PROMPT = "to be or not to be"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=90.0, help="LoRA training time")
    p.add_argument("--lines", type=int, default=20000, help="Shakespeare lines to use")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--vocabulary-size", type=int, default=2000)
    p.add_argument("--sequence-length", type=int, default=64)
    p.add_argument("--hidden-dim", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--out", default=None, help="folder for the checkpoint and the export")
    return p.parse_args(argv)


def write_toy_llama_folder(folder: Path, lines: list[str], args) -> None:
    """The stand-in checkpoint: random weights in the Llama layout, and its tokenizer.json."""
    folder.mkdir(parents=True, exist_ok=True)
    learn_bpe(lines, args.vocabulary_size, llama3=True).save(str(folder / "tokenizer.json"))
    tokenizer = from_tokenizer_json(folder / "tokenizer.json")
    keras.utils.set_random_seed(0)
    DecoderBackbone(
        tokenizer.vocabulary_size(), args.sequence_length + args.new_tokens,
        hidden_dim=args.hidden_dim, num_layers=2, num_heads=4, num_key_value_heads=2,
        intermediate_dim=2 * args.hidden_dim, dropout=0.0, normalize_first=True,
        activation="swish", position_encoding="rotary", mask_zero=False,
        normalization="rms_norm", gated_feed_forward=True, attention_bias=False,
        attention_output_bias=False, feed_forward_bias=False, tie_word_embeddings=False,
        layer_norm_epsilon=1e-6,
    ).save_pretrained(folder, model_type="llama")  # fmt: skip


def main(argv=None):
    args = parse_args(argv)
    from keras_attn_export import export_model
    from keras_attn_serving import Predictor

    out = Path(args.out or tempfile.mkdtemp(prefix="llama_lora_"))
    folder = out / "toy-llama"
    lines = load_corpus().lines()[: args.lines]
    write_toy_llama_folder(folder, lines, args)
    print(f"wrote a toy Llama-layout folder (RANDOM weights, not a trained model): {folder}")

    # From here on, as with a real Llama folder.
    # Ids in, ids out here (no preprocessor): the tokenizer goes to `export_model` itself.
    lm = CausalLM.from_pretrained(folder, preprocessor=None)
    tokenizer = from_tokenizer_json(folder / "tokenizer.json")
    documents = [tokenizer.tokenize(" ".join(lines[i : i + 200])).numpy()
                 for i in range(0, len(lines), 200)]  # fmt: skip
    x, y = lm_windows(documents, args.sequence_length)
    held_out = len(x) // 10
    lm.backbone.enable_lora(args.rank)
    trainable = sum(int(np.prod(w.shape)) for w in lm.trainable_weights)
    total = sum(int(np.prod(w.shape)) for w in lm.weights)
    print(f"LoRA rank {args.rank}: {trainable:,} of {total:,} weights train "
          f"({100 * trainable / total:.2f}%)")  # fmt: skip
    lm.compile(optimizer=keras.optimizers.Adam(3e-3), loss=lm_loss())
    before = lm.evaluate(x[:held_out], y[:held_out], verbose=0)
    lm.fit(x[held_out:], y[held_out:], batch_size=16, epochs=100, verbose=0,
           callbacks=[TimeBudget(args.seconds)])  # fmt: skip
    after = lm.evaluate(x[:held_out], y[:held_out], verbose=0)
    print(f"held-out loss {before:.3f} -> {after:.3f} after {args.seconds:g} s of LoRA")
    lm.backbone.save_lora_weights(out / "adapter.safetensors")
    size = (out / "adapter.safetensors").stat().st_size
    print(f"adapters alone: {size / 1e3:.0f} kB")

    manifest = export_model(lm, out / "export", tokenizer=tokenizer, verbose=False)
    parity = manifest["parity"]["max_abs_diff"]
    print(f"exported with the adapters merged: parity to the adapted Keras model {parity:.2e}")
    prompt = tokenizer.tokenize(PROMPT).numpy().tolist()
    (in_keras,) = lm.generate([prompt], args.new_tokens)
    served = Predictor(out / "export").generate_ids([prompt], args.new_tokens)[0]
    text = tokenizer.detokenize(prompt + served).numpy().decode()
    print(f"served (onnxruntime, no TensorFlow): {text!r}; same ids as Keras: "
          f"{served == in_keras}")  # fmt: skip
    return {
        "trainable_percent": 100 * trainable / total,
        "loss_before": float(before),
        "loss_after": float(after),
        "parity_max_abs_diff": parity,
        "served_equals_keras": float(served == in_keras),
    }


if __name__ == "__main__":
    main()
