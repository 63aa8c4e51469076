"""Three runtimes, one `tokenizer.json`: our in-graph tokenizers (TensorFlow ops), the server's
reader (no TensorFlow) and the `tokenizers` library itself give the same ids, on 10,000
generated lines per model family (issue 27), and the same text back."""

import json

import pytest
from keras_attn_export.describe import write_tokenizer
from keras_attn_serving.tokenizer import JsonTextTokenizer, load_text_tokenizer
from tokenizers import Tokenizer

from keras_attn.tokenizers import BytePairTokenizer, UnigramTokenizer, from_tokenizer_json
from tests.tokenizers.json_cases import CASES, mixed_lines, trained

pytestmark = [pytest.mark.tf_only, pytest.mark.slow]
LINES = 10_000


@pytest.fixture(scope="module")
def lines():
    return mixed_lines(LINES, seed=2027)


@pytest.fixture(scope="module")
def training_lines():
    return mixed_lines(3000, seed=1)


@pytest.mark.parametrize("case", CASES)
def test_ids_equal_in_graph_in_the_server_and_in_tokenizers(case, lines, training_lines, tmp_path):
    spec = trained(case, training_lines)
    reference = Tokenizer.from_str(json.dumps(spec))
    ours = from_tokenizer_json(spec)
    assert isinstance(ours, UnigramTokenizer if case == "unigram" else BytePairTokenizer)
    write_tokenizer(ours, tmp_path / "tokenizer")
    served = load_text_tokenizer(tmp_path / "tokenizer")
    assert isinstance(served, JsonTextTokenizer)

    want = [e.ids for e in reference.encode_batch(lines, add_special_tokens=False)]
    in_graph = ours.tokenize(lines).to_list()
    in_server = served.encode(lines)
    graph_misses = [(line, got, ids) for line, got, ids in zip(lines, in_graph, want, strict=True)
                    if got != ids]  # fmt: skip
    server_misses = [line for line, got, ids in zip(lines, in_server, want, strict=True)
                     if got != ids]  # fmt: skip
    assert len(want) == LINES and sum(map(len, want)) > 20 * LINES
    assert graph_misses[:3] == [] and server_misses[:3] == []

    texts = [t.decode("utf-8") for t in ours.detokenize(ours.tokenize(lines)).numpy()]
    reference_texts = reference.decode_batch(want, skip_special_tokens=True)
    decode_misses = [(a, b) for a, b in zip(texts, reference_texts, strict=True) if a != b]
    assert decode_misses[:3] == []


def test_strings_in_onnx_equals_tokenizers_but_for_nul_and_nel(lines, training_lines, tmp_path):
    """onnxruntime-extensions' `GPT2Tokenizer`, as export writes it for `strings_in`, on the
    same 10,000 lines: every line without NUL or U+0085 (NEL) gives `tokenizers`' ids, special
    tokens included; the operator stops at a NUL and splits around NEL its own way (documented
    in `keras_attn_export.text_onnx`). GPT-2's settings only: the other families are refused."""
    import numpy as np
    import onnx
    from keras_attn_export.text_onnx import text_session, tokenizer_onnx

    pytest.importorskip("onnxruntime_extensions")
    spec = trained("gpt2", training_lines)
    reference = Tokenizer.from_str(json.dumps(spec))
    onnx.save(tokenizer_onnx(from_tokenizer_json(spec)), tmp_path / "bpe.onnx")
    session = text_session(tmp_path / "bpe.onnx")
    want = [e.ids for e in reference.encode_batch(lines, add_special_tokens=False)]
    got = [session.run(["token_ids"], {"text": np.array([line])})[0][0].tolist()
           for line in lines]  # fmt: skip
    plain = [i for i, line in enumerate(lines) if "\x00" not in line and "\x85" not in line]
    assert len(plain) > 0.95 * LINES
    assert sum("<|endoftext|>" in lines[i] or "</s>" in lines[i] for i in plain) > 500
    assert [i for i in plain if got[i] != want[i]][:3] == []
    # The documented difference is real (a test of the note, so it is revisited on upgrade).
    with_nul = [i for i, line in enumerate(lines) if "\x00" in line]
    assert sum(got[i] != want[i] for i in with_nul) > len(with_nul) / 2
    for case in ("roberta", "llama3", "qwen2", "llama2"):
        with pytest.raises(ValueError, match="GPT2Tokenizer"):
            tokenizer_onnx(from_tokenizer_json(trained(case, training_lines)))
