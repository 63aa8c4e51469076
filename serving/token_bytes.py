"""The bytes one token adds to a text (OpenAI's logprobs `bytes`), read off a `tokenizers`
vocabulary, where decoding the token alone would lose them: a byte-level token that is part
of a character decodes to U+FFFD, and a SentencePiece decoder strips a first piece's space."""

import json
import re

from tokenizers import Tokenizer

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_stand_ins() -> dict[int, str]:
    """Byte -> the printable character GPT-2's byte-level vocabularies write it as: itself
    where printable, else the next code point from 256 on."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    table, extra = {}, 0
    for byte in range(256):
        table[byte] = chr(byte) if byte in printable else chr(256 + extra)
        extra += byte not in printable
    return table


class TokenBytes:
    """`token_bytes(id)`: a byte-level token's own bytes (GPT-2's printable stand-ins mapped
    back); a SentencePiece piece's, `▁` a space (a byte-fallback piece `<0xE3>`, its byte);
    None for an added token or another vocabulary (its text's bytes are right)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        decoder = tokenizer.decoder
        state = json.loads(decoder.__getstate__()) if decoder is not None else {}
        kinds = {d.get("type") for d in state.get("decoders", [state]) if isinstance(d, dict)}
        self.table = ({c: b for b, c in _byte_stand_ins().items()}
                      if "ByteLevel" in kinds else {})  # fmt: skip
        self.pieces = not self.table and bool({"ByteFallback", "Metaspace"} & kinds)
        self.added = frozenset(tokenizer.get_added_tokens_decoder())

    def __call__(self, token_id: int) -> bytes | None:
        token = self.tokenizer.id_to_token(token_id) or ""
        if token_id in self.added or not token:
            return None
        if self.table and all(c in self.table for c in token):
            return bytes(self.table[c] for c in token)
        if self.pieces:
            match = _BYTE_TOKEN.fullmatch(token)
            return bytes([int(match.group(1), 16)]) if match else token.replace("▁", " ").encode()
        return None
