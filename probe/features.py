"""A GPT-2's view of a document: one vector, pooled from its final hidden states.

A causal language model is trained to predict the next token, and the state at each position
is shaped for that. At the end-of-text the next token is the first of an unrelated document
(pretraining packs shuffled documents into blocks), so pretraining teaches that state to
forget the document it closes: it becomes nearly the same vector for every document, and a
classifier reading it starts from almost nothing. The last word's state is shaped to predict
a full stop or an end-of-text. The mean of the states over the document's tokens keeps what
every position knows about the text; docs/PROBE.md has the measurements behind the default.
"""

from typing import Literal, get_args

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import GPT2Model

# mean: the average over the document's tokens, end-of-text left out; last_token: the last
# token of the text; end_of_text: the end-of-text the probe appends (what
# GPT2ForSequenceClassification reads).
Pooling = Literal["mean", "last_token", "end_of_text"]
POOLINGS = get_args(Pooling)
MEAN, LAST_TOKEN, END_OF_TEXT = POOLINGS
FEATURE_BATCH_SIZE = 64


def pool_hidden_states(
    hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str
) -> torch.Tensor:
    """(batch, positions, width) states of right-padded documents, each ending in its
    end-of-text -> (batch, width)."""
    lengths = attention_mask.sum(dim=1)  # tokens per document, end-of-text included
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    if pooling == END_OF_TEXT:
        return hidden[rows, lengths - 1]
    if pooling == LAST_TOKEN:
        return hidden[rows, (lengths - 2).clamp(min=0)]
    positions = torch.arange(hidden.shape[1], device=hidden.device)
    text = (positions[None, :] < (lengths - 1).clamp(min=1)[:, None]).to(hidden.dtype)
    return (hidden * text[..., None]).sum(dim=1) / text.sum(dim=1, keepdim=True)


@torch.inference_mode()
def document_features(
    transformer: GPT2Model,
    encoded: list[np.ndarray],
    pooling: str,
    pad_token_id: int,
    device: torch.device | str = "cpu",
) -> np.ndarray:
    """(documents, width) float32: each document's pooled final hidden state, the weights
    frozen. Documents are batched by length so little compute goes to padding."""
    transformer.eval().to(device)
    order = np.argsort([len(row) for row in encoded], kind="stable")
    features = np.empty((len(encoded), transformer.config.n_embd), dtype=np.float32)
    for start in range(0, len(order), FEATURE_BATCH_SIZE):
        chosen = order[start : start + FEATURE_BATCH_SIZE]
        rows = [torch.as_tensor(encoded[i], dtype=torch.long, device=device) for i in chosen]
        input_ids = pad_sequence(rows, batch_first=True, padding_value=pad_token_id)
        attention_mask = pad_sequence([torch.ones_like(row) for row in rows], batch_first=True)
        hidden = transformer(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        pooled = pool_hidden_states(hidden, attention_mask, pooling)
        features[chosen] = pooled.float().cpu().numpy()
    return features
