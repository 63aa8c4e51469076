"""A tiny instruct checkpoint written by `transformers` itself, as a new user has one: a
Qwen2 model, a byte-level BPE `tokenizer.json` with ChatML's special tokens, the ChatML
template (`chat_template.jinja`) and `generation_config.json` naming the end-of-turn id."""

import json

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "to be or not to be that is the question", "whether tis nobler in the mind to suffer",
    "the slings and arrows of outrageous fortune", "You are a helpful assistant.",
    "system user assistant", "Hello! How are you? naïve café 日本語 🙂 {} [] : , \" 0123456789",
]  # fmt: skip


def write_chat_folder(folder, end_token: str = "<|im_end|>", seed: int = 0):
    """Writes the checkpoint into `folder`; returns `(transformers model, its tokenizer)`."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tokenizer.train_from_iterator(CORPUS * 10, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), eos_token=end_token,
        pad_token="<|endoftext|>",
    )  # fmt: skip
    fast.chat_template = CHATML
    fast.save_pretrained(folder)
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=len(fast), hidden_size=32,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,  # head_dim 16
        intermediate_size=48, max_position_embeddings=256, tie_word_embeddings=True,
        eos_token_id=fast.convert_tokens_to_ids(end_token),
    )  # fmt: skip
    model = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))
    model.save_pretrained(folder)
    return model, fast


def set_end_tokens(folder, ids):
    """Rewrites `generation_config.json`'s `eos_token_id` (what a chat turn stops at)."""
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    config["eos_token_id"] = ids
    path.write_text(json.dumps(config))
