"""`POST /v1/rerank` (and `/rerank`): documents ordered by a pair classifier's relevance to
a query, in the request and answer shape vLLM, text-embeddings-inference, infinity and
Jina/Cohere share."""

import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import APIRouter, Request
from keras_attn_serving.handling import predict
from keras_attn_serving.protocol import ServingError, shown
from keras_attn_serving.routes_openai import _body, _model, _unicode
from keras_attn_serving.routes_text import tokenized

if TYPE_CHECKING:
    pass


router = APIRouter()


RERANK_FIELDS = {"model", "query", "documents", "top_n", "return_documents", "user"}


@router.post("/v1/rerank")
@router.post("/rerank")
async def rerank(request: Request):
    """Documents ordered by relevance to a query, by a pair classifier (a cross-encoder):
    the request and answer of vLLM, text-embeddings-inference, infinity and Jina/Cohere
    (`query`, `documents`, `top_n` -> `results` of `index`, `relevance_score`)."""
    payload = await _body(request, RERANK_FIELDS)
    chosen, model = await _model(request, payload, "classify")
    query, documents = payload.get("query"), payload.get("documents")
    if not isinstance(query, str) or not query:
        raise ServingError(400, f"`query` must be a non-empty string; received "
                                f"{shown(query)}"[:200], param="query")  # fmt: skip
    if isinstance(documents, list):
        documents = [d.get("text") if isinstance(d, dict) else d for d in documents]
    if not isinstance(documents, list) or not documents or not all(
        isinstance(d, str) for d in documents
    ):  # fmt: skip
        raise ServingError(400, "`documents` must be a non-empty list of strings (or of "
                                f"{{\"text\"}} objects); received {shown(documents)}"[:300],
                           param="documents")  # fmt: skip
    settings = request.app.state.settings
    if len(documents) > settings.max_rows_per_request:
        raise ServingError(413, f"request has {len(documents)} documents; at most "
                                f"{settings.max_rows_per_request} (--max-rows-per-request)",
                           param="documents")  # fmt: skip
    top_n = payload.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int)
                              or top_n < 1):  # fmt: skip
        raise ServingError(400, f"`top_n` must be an integer >= 1; received {shown(top_n)}",
                           param="top_n")  # fmt: skip
    give_back = payload.get("return_documents", True)
    if not isinstance(give_back, bool):
        raise ServingError(400, "`return_documents` must be true or false",
                           param="return_documents")  # fmt: skip
    limit = settings.max_text_chars
    for field, text in [("query", query), *(("documents", d) for d in documents)]:
        _unicode(text, field)
    pairs = [(query[:limit], document[:limit]) for document in documents]
    feeds, packed = await tokenized(request, model.encode_pairs, pairs)
    assert model.batcher is not None  # `_model` built it with the server's batcher
    _, outputs = await predict(request, (chosen, model.predictor, model.batcher), feeds)
    scores = relevance(next(iter(outputs.values())))
    order = sorted(range(len(documents)), key=lambda i: -scores[i])[:top_n]
    results = [{"index": i, "relevance_score": float(scores[i]),
                **({"document": {"text": documents[i]}} if give_back else {})}
               for i in order]  # fmt: skip
    tokens = sum(len(p) for p in packed)
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": payload["model"],
        "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def relevance(logits: Any) -> np.ndarray:
    """A pair classifier's relevance scores in [0, 1]: the sigmoid of a single logit, or
    the probability of the last class (`relevant`) of several."""
    logits = np.asarray(logits, np.float64).reshape(len(logits), -1)
    if logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logits[:, 0]))
    shifted = np.exp(logits - logits.max(1, keepdims=True))
    return shifted[:, -1] / shifted.sum(1)
