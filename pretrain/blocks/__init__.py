"""Block preparation: tokenize the corpus once, split it by document and pack it into
fixed-length blocks of token ids, cached as Arrow. Imports neither the model nor the loss."""
