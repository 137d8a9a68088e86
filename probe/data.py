"""The probe's data: labelled documents, their classes and names, the split, the token ids.

Rules, in the order they are applied:

1. Texts and labels come from the shared reader (`probe.labels.read_labelled_documents`):
   one `X.txt` with its label files, cleaned and de-duplicated as for pretraining.
2. Classes: the distinct labels of the chosen level in sorted order, numbered from 0; names
   from Data.xlsx where it has them, the label numbers otherwise.
3. Split, per class (stratified, so a class of a few documents is still tested and trained
   on): the class's documents are ordered with the pretraining run's validation documents
   first, then by a 64-bit hash of their text keyed by `--split_seed`; the first
   `round(test_fraction x class size)` of them, at least one and at most all but one (a class
   of one document is training only), or all its pretraining-validation documents if there
   are more, are the test split. A document's side depends on its text, its class and the
   seed, not on the corpus order.
4. Tokens: the pretraining tokenization (`common.tokenization.tokenize_documents`, end-of-text
   after each document); a document longer than `max_length` keeps its first
   `max_length - 1` tokens and its end-of-text, whose position the classifier reads.
"""

import logging
from dataclasses import dataclass

import datasets
import numpy as np

from common.cli import InputError
from common.corpus import CorpusArguments, document_hashes
from common.tokenization import tokenize_documents
from probe.labels import (
    WOS_AREA_IN_DOMAIN_FILE,
    WOS_DOMAIN_FILE,
    WOS_LABEL_FILE,
    read_labelled_documents,
    read_wos_label_names,
)

logger = logging.getLogger(__name__)

LABEL_FILES = {
    "domain": (WOS_DOMAIN_FILE,),
    "area": (WOS_DOMAIN_FILE, WOS_AREA_IN_DOMAIN_FILE),
    "combined": (WOS_LABEL_FILE,),
}


@dataclass
class ProbeDocuments:
    """Texts with their class (0..num_classes-1) and the classes' names."""

    texts: list[str]
    labels: np.ndarray  # int64, one class per text
    class_names: list[str]
    label_names_source: str | None  # the Data.xlsx the names came from
    source: str  # the X.txt that was read

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def load_probe_documents(
    corpus_args: CorpusArguments, label_level: str, label_names_file: str | None
) -> ProbeDocuments:
    """Read the texts and their labels at `label_level`; raises InputError for bad label files
    or a level with fewer than two classes."""
    label_files = LABEL_FILES[label_level]
    documents = read_labelled_documents(corpus_args, label_files)
    columns = [documents.labels[name] for name in label_files]
    raw_labels = list(zip(*columns, strict=True))  # (YL1,) or (YL1, YL2) or (Y,)
    classes = sorted(set(raw_labels))
    source = documents.stats.sources[0]
    if len(classes) < 2:
        raise InputError(
            f"the {label_level} labels ({', '.join(label_files)}) of {source} hold one class "
            f"({'/'.join(map(str, classes[0]))}); a classifier needs two or more: choose "
            "another --label_level or --subset"
        )
    index = {label: position for position, label in enumerate(classes)}
    names = read_wos_label_names(corpus_args, label_names_file)
    by_label: dict[tuple[int, ...], str] = {}  # a class's name where Data.xlsx gives one
    if names is not None:
        table = {"domain": names.domains, "area": names.areas, "combined": names.labels}
        by_label = {
            (key if isinstance(key, tuple) else (key,)): name
            for key, name in table[label_level].items()
        }
        unnamed = [label for label in classes if label not in by_label]
        if unnamed:
            logger.warning(
                "%s names no class for %d of the %d %s labels; those keep their numbers",
                names.source,
                len(unnamed),
                len(classes),
                label_level,
            )
    logger.info("%d documents in %d %s classes", len(raw_labels), len(classes), label_level)
    return ProbeDocuments(
        texts=documents.texts,
        labels=np.array([index[label] for label in raw_labels], dtype=np.int64),
        class_names=[by_label.get(label, "/".join(map(str, label))) for label in classes],
        label_names_source=None if names is None else names.source,
        source=source,
    )


def split_documents(
    texts: list[str], labels: np.ndarray, test_fraction: float, seed: int, forced_test: np.ndarray
) -> np.ndarray:
    """Boolean mask of the test documents (rule 3 of the module docstring); `forced_test`
    marks the documents that must be tested, never trained on."""
    digests = document_hashes(texts, f"probe-split-{seed}")
    is_test = np.zeros(len(texts), bool)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label).tolist()
        ordered = sorted(members, key=lambda i: (not forced_test[i], digests[i]))
        quota = min(max(round(test_fraction * len(members)), 1), len(members) - 1)
        num_test = max(quota, int(forced_test[members].sum()))
        is_test[ordered[:num_test]] = True
    return is_test


def encode_documents(texts: list[str], tokenizer, max_length: int) -> list[np.ndarray]:
    """Token ids per document, end-of-text last, at most `max_length` (rule 4)."""
    token_ids, lengths = tokenize_documents(texts, tokenizer)
    return [
        ids if len(ids) <= max_length else np.concatenate([ids[: max_length - 1], ids[-1:]])
        for ids in np.split(token_ids, np.cumsum(lengths)[:-1])
    ]


def classification_dataset(
    encoded: list[np.ndarray], labels: np.ndarray, indices: np.ndarray
) -> datasets.Dataset:
    """`input_ids`, `attention_mask` and `labels` of the documents at `indices`, for Trainer
    with `DataCollatorWithPadding`."""
    ids = [encoded[i].tolist() for i in indices]
    return datasets.Dataset.from_dict(
        {
            "input_ids": ids,
            "attention_mask": [[1] * len(row) for row in ids],
            "labels": labels[indices].tolist(),
        }
    )
