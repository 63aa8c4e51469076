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
