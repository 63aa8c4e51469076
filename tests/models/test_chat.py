"""Chatting in Keras with a folder `transformers` wrote: the preprocessor renders and
tokenizes conversations as `apply_chat_template` does, and `generate` on a conversation
gives `transformers`' greedy reply, ending at the checkpoint's end-of-turn id unasked."""

import keras
import numpy as np
import pytest

from keras_attn.models import CausalLM
from tests.chat_folder import set_end_tokens, write_chat_folder
from tests.serving.test_chat_template import conversations

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.tf_only  # the preprocessor's tokenizer runs in TensorFlow


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat") / "hf"
    model, tokenizer = write_chat_folder(folder)
    return folder, model, tokenizer


def test_conversations_become_the_ids_transformers_makes(chat_folder):
    folder, _, tokenizer = chat_folder
    preprocessor = CausalLM.from_pretrained(folder).preprocessor
    cases = conversations(50)
    texts = [preprocessor.apply_chat_template(chat) for chat in cases]
    ids = preprocessor.tokenizer(texts).to_list()
    for chat, text, row in zip(cases, texts, ids, strict=True):
        assert text == tokenizer.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=True
        )
        expected = tokenizer.apply_chat_template(chat, add_generation_prompt=True,
                                                 return_dict=False)  # fmt: skip
        assert row == list(expected), chat


def _greedy(model, ids, steps, eos=None):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False,
                             eos_token_id=eos, pad_token_id=0)  # fmt: skip
    return out[0, len(ids) :].tolist()


def test_a_chat_turn_ends_at_the_checkpoints_end_id_unasked(chat_folder, tmp_path):
    folder, model, tokenizer = chat_folder
    chat = [{"role": "user", "content": "to be or not to be"}]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
    free = _greedy(model, list(ids), 12, eos=[])  # no end: what greedy picks
    # The checkpoint says an id greedy picks later ends a turn: the reply stops before it.
    k = next(k for k in range(2, 12) if free[k] not in free[:k])
    end = free[k]
    set_end_tokens(folder, [end, 10_000 % len(tokenizer)])
    lm = CausalLM.from_pretrained(folder)
    assert lm.preprocessor.end_token_ids == [end, 10_000 % len(tokenizer)]
    reply = lm.generate(chat, max_new_tokens=12)
    assert reply == tokenizer.decode(free[:k], skip_special_tokens=True).lstrip()
    assert _greedy(model, list(ids), 12, eos=[end]) == free[: k + 1]  # transformers ends there
    # A batch of conversations; the caller's stop ids win over the checkpoint's.
    both = lm.generate([chat, chat], max_new_tokens=12)
    assert both == [reply, reply]
    longer = lm.generate(chat, max_new_tokens=6, stop_token_ids=[])
    assert longer == tokenizer.decode(free[:6], skip_special_tokens=True).lstrip()


def test_the_chat_preprocessor_round_trips_through_keras_files(chat_folder, tmp_path):
    folder, _, _ = chat_folder
    lm = CausalLM.from_pretrained(folder)
    lm.save(tmp_path / "chat.keras")
    loaded = keras.saving.load_model(tmp_path / "chat.keras")
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    assert loaded.preprocessor.apply_chat_template(chat) == lm.preprocessor.apply_chat_template(
        chat
    )
    assert loaded.preprocessor.end_token_ids == lm.preprocessor.end_token_ids
    assert loaded.generate(chat, max_new_tokens=5) == lm.generate(chat, max_new_tokens=5)
    logits = lm(np.array([[3, 4, 5]], "int32"))
    np.testing.assert_allclose(loaded(np.array([[3, 4, 5]], "int32")), logits, atol=1e-6)


def test_conversations_need_a_chat_template(chat_folder):
    folder, _, _ = chat_folder
    plain = CausalLM.from_pretrained(folder, preprocessor=None)
    with pytest.raises(ValueError, match="no chat preprocessor"):
        plain.generate([{"role": "user", "content": "hi"}], max_new_tokens=2)
    lm = CausalLM.from_pretrained(folder)
    with pytest.raises(ValueError, match=r"messages\[0\].role"):
        lm.generate([{"content": "hi"}], max_new_tokens=2)
