"""The server tokenizes text without the special tokens a `tokenizer.json`'s post-processor
adds (the packer adds them, once): a Llama BOS or a T5 `</s>` used to come twice."""

import pytest
from keras_attn_serving.tokenizer import load_text_tokenizer
from tokenizers import Tokenizer, models, pre_tokenizers, processors


@pytest.mark.parametrize(
    "template",
    [
        ("<s> $A", [("<s>", 1)]),  # Llama's BOS
        ("$A </s>", [("</s>", 2)]),  # T5's end
        ("<s> $A </s>", [("<s>", 1), ("</s>", 2)]),  # BART's
    ],
)
def test_encoded_text_has_no_post_processor_tokens(tmp_path, template):
    single, specials = template
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single=single, special_tokens=specials)
    assert len(tokenizer.encode("hello world").ids) > 2  # the post-processor adds some
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    served = load_text_tokenizer(tmp_path)
    assert served.encode(["hello world", "world"]) == [[3, 4], [4]]
