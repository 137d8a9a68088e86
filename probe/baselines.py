"""The baseline without a neural network: TF-IDF features and logistic regression (scikit-learn)."""

from __future__ import annotations

import time

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline


def tfidf_logistic_regression(
    train_texts: list[str], train_labels: np.ndarray, test_texts: list[str]
) -> tuple[np.ndarray, float]:
    """Predicted classes of `test_texts` and the training seconds.

    Words and word pairs (most topic words of an abstract are terms of two words), seen in two
    documents at least, with sublinear term frequency; an L2-regularised multinomial logistic
    regression on them (lbfgs, deterministic).
    """
    classifier = make_pipeline(
        TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True),
        LogisticRegression(max_iter=1000),
    )
    started = time.perf_counter()
    classifier.fit(train_texts, train_labels)
    return classifier.predict(test_texts), time.perf_counter() - started
