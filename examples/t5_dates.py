"""A T5-layout encoder-decoder, end to end: a Hugging Face T5 folder written, loaded with its
tokenizer, fine-tuned on dates → ISO dates, evaluated with the lectures' metrics (BLEU,
METEOR, word error rate, BERTScore), exported and served, `/generate` with beam search.

The weights start RANDOM: no pretrained seq2seq checkpoint ships in any package here (no
network at run time), so the folder this writes is a T5 *layout* (relative position bias,
RMSNorm, gated GELU, no biases), not Google's T5. With a real T5 folder, skip step 1.

1. `Seq2SeqBackbone` in T5's configuration, written by `save_pretrained` as `config.json` +
   `model.safetensors` (the keys `transformers`' `T5ForConditionalGeneration` reads), with a
   character-level Unigram `tokenizer.json` (T5's Metaspace settings);
2. `Seq2SeqLM.from_pretrained(folder)`: the model and its `Seq2SeqLMPreprocessor` (source
   text → ids + `</s>`; target text → labels and decoder inputs behind the start id);
3. `fit` on teacher-forcing batches; greedy and beam decoding of held-out dates; BLEU, METEOR
   and WER over characters (dates have few words), BERTScore with the packaged MiniLM;
4. `export_model`: `encode.onnx` + `decode.onnx`, checked against Keras at every step; the
   server answers `/generate` with `num_beams` as Keras `generate(sampler="beam")` does.

    python examples/t5_dates.py                    # ~4 minutes on 2 CPU cores
"""

import argparse
import json
import tempfile
from pathlib import Path

import keras
import numpy as np

from keras_attn.data.dates import make_dates
from keras_attn.metrics import bert_score, bleu, exact_match, meteor, word_error_rate
from keras_attn.models import Seq2SeqBackbone, Seq2SeqLM
from keras_attn.optimizers import WarmupDecay, adamw

SPECIALS = ["<pad>", "</s>", "<unk>"]  # T5's ids 0, 1, 2
MARK = "▁"  # SentencePiece's word mark


def char_tokenizer_json(texts: list[str]) -> dict:
    """A T5-style `tokenizer.json`: a Unigram model whose pieces are the characters of
    `texts` (and the word mark), Metaspace pre-tokenizer and decoder, `</s>` after a text."""
    chars = sorted({c for text in texts for c in text if c != " "})
    pieces = [[token, 0.0] for token in SPECIALS] + [[c, -1.0] for c in [MARK, *chars]]
    metaspace = {"type": "Metaspace", "replacement": MARK, "prepend_scheme": "always",
                 "split": True}  # fmt: skip
    end = {"SpecialToken": {"id": "</s>", "type_id": 0}}
    text = {"Sequence": {"id": "A", "type_id": 0}}
    return {
        "version": "1.0", "truncation": None, "padding": None, "normalizer": None,
        "added_tokens": [
            {"id": i, "content": token, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True}
            for i, token in enumerate(SPECIALS)
        ],
        "pre_tokenizer": metaspace,
        "post_processor": {
            "type": "TemplateProcessing", "single": [text, end], "pair": [text, end, text, end],
            "special_tokens": {"</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}},
        },
        "decoder": metaspace,
        "model": {"type": "Unigram", "unk_id": 2, "vocab": pieces, "byte_fallback": False},
    }  # fmt: skip


def write_t5_folder(folder: Path, texts: list[str], hidden_dim: int) -> None:
    """Step 1: a randomly initialized T5-layout folder with its tokenizer."""
    spec = char_tokenizer_json(texts)
    backbone = Seq2SeqBackbone(
        len(spec["model"]["vocab"]), None, hidden_dim=hidden_dim, num_encoder_layers=2,
        num_decoder_layers=2, num_heads=4, intermediate_dim=2 * hidden_dim, dropout=0.0,
        activation="gelu_tanh", gated_feed_forward=True, normalize_first=True,
        normalization="rms_norm", layer_norm_epsilon=1e-6, score="dot",
        position_encoding="relative", relative_attention_num_buckets=16,
        relative_attention_max_distance=64, attention_bias=False, feed_forward_bias=False,
        tie_word_embeddings=False, mask_decoder_padding=False, decoder_start_token_id=0,
    )  # fmt: skip
    backbone.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), "utf-8")


def scores(predictions: list[str], references: list[str], minilm: tuple) -> dict[str, float]:
    """Exact match, and BLEU / METEOR / WER with characters as words, BERTScore F1."""
    spaced = lambda texts: [" ".join(text) for text in texts]  # noqa: E731
    encoder, preprocessor = minilm
    return {
        "exact_match": exact_match(predictions, references),
        "bleu": bleu(spaced(predictions), spaced(references)),
        "meteor": meteor(spaced(predictions), spaced(references))["corpus"],
        "wer": word_error_rate(spaced(predictions), spaced(references))["corpus"],
        "bertscore_f1": bert_score(predictions, references, encoder, preprocessor=preprocessor)[
            "f1"
        ]["corpus"],
    }


def serve(lm: Seq2SeqLM, out: Path, sources: list[str], num_beams: int) -> dict[str, float]:
    """Step 4: export, serve, `/generate` with beam search; whether it equals Keras."""
    from fastapi.testclient import TestClient
    from keras_attn_export import export_model
    from keras_attn_serving.server import ModelRepository, create_app

    manifest = export_model(lm, out / "repository" / "dates" / "1", formats=("onnx",),
                            batch_sizes=(1, 2), sequence_lengths=(8, 16))  # fmt: skip
    print(f"exported: {manifest.seq2seq.encoder_file} + {manifest.seq2seq.file}, step logits "
          f"within {manifest.seq2seq.step_logits_max_abs_diff:.1e} of Keras")  # fmt: skip
    same = []
    with TestClient(create_app(ModelRepository(out / "repository"))) as client:
        for source in sources:
            body = {"text_input": source, "parameters": {"max_tokens": 12,
                                                         "num_beams": num_beams}}  # fmt: skip
            served = client.post("/v2/models/dates/generate", json=body).json()["text_output"]
            in_keras = lm.generate(source, 12, sampler="beam", num_beams=num_beams)
            print(f"  served {source!r} -> {served!r} (Keras: {in_keras!r})")
            same.append(served == in_keras)
    return {"served_equals_keras": float(all(same)),
            "step_logits_max_abs_diff": manifest.seq2seq.step_logits_max_abs_diff}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=20000)
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--num-beams", type=int, default=3)
    parser.add_argument("--out", default=None, help="folder for the T5 folder and artifact")
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(0)
    out = Path(args.out or tempfile.mkdtemp(prefix="t5_dates_"))
    train, test = make_dates(args.train), make_dates(args.test, seed=1)
    texts = [text for pair in train + test for text in pair]
    write_t5_folder(out / "t5-dates", texts, args.hidden_dim)
    lm = Seq2SeqLM.from_pretrained(out / "t5-dates")
    print(f"step 1-2: a random T5-layout folder at {out / 't5-dates'}, loaded with its "
          f"{type(lm.preprocessor).__name__}")  # fmt: skip

    x, labels, weights = lm.preprocessor.training_batch(tuple(map(list, zip(*train, strict=True))))
    x = {name: np.asarray(value)[:, :40] for name, value in x.items()}
    labels, weights = np.asarray(labels)[:, :40], np.asarray(weights)[:, :40]
    steps = args.epochs * -(-len(labels) // 64)
    lm.compile(optimizer=adamw(WarmupDecay(3e-3, max(1, steps // 10), steps), weight_decay=0.01))
    lm.fit(x, labels, sample_weight=weights, batch_size=64, epochs=args.epochs, verbose=2)

    from keras_attn.data import checkpoint_folder
    from keras_attn.models import Encoder
    from keras_attn.models.heads import folder_preprocessor

    minilm = (Encoder.from_pretrained(checkpoint_folder(), dropout=0.0),
              folder_preprocessor(checkpoint_folder(), 32))  # fmt: skip
    sources, references = [s for s, _ in test], [t for _, t in test]
    results: dict = {}
    for name, kwargs in (("greedy", {}), ("beam", {"sampler": "beam",
                                                    "num_beams": args.num_beams})):  # fmt: skip
        predictions = lm.generate(sources, 12, **kwargs)
        results[name] = scores(predictions, references, minilm)
        print(f"{name:<7}" + "  ".join(f"{k} {v:.3f}" for k, v in results[name].items()))
    for source, target, predicted in list(zip(sources, references, predictions, strict=True))[:3]:
        print(f"  {source!r:>32} -> {predicted!r}  (expected {target!r})")
    results["served"] = serve(lm, out, sources[:2], args.num_beams)
    return results


if __name__ == "__main__":
    main()
