"""The classifiers that train no network, both scikit-learn logistic regressions: on TF-IDF
features of the words (the baseline without a network) and on a network's frozen features
(the linear probe: what the representation tells apart as it is)."""

import time

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

# Enough iterations for lbfgs to converge on standardised features of a few hundred dimensions.
MAX_ITERATIONS = 1000


def tfidf_logistic_regression(
    train_texts: list[str], train_labels: np.ndarray, test_texts: list[str]
) -> tuple[np.ndarray, float]:
    """Predicted classes of `test_texts` and the training seconds: a logistic regression (lbfgs,
    deterministic) on TF-IDF of words and word pairs (most topic words of an abstract are terms
    of two words)."""
    classifier = make_pipeline(
        TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True),
        LogisticRegression(max_iter=MAX_ITERATIONS),
    )
    started = time.perf_counter()
    classifier.fit(train_texts, train_labels)
    return classifier.predict(test_texts), time.perf_counter() - started


def fit_linear_probe(train_features: np.ndarray, train_labels: np.ndarray) -> Pipeline:
    """Standardisation (each feature to mean 0, spread 1 over the training documents) and an
    L2-regularised multinomial logistic regression on the frozen features. Standardising puts
    every dimension on the same footing: a pretrained state has dimensions of very different
    scales, which would otherwise decide the regularisation's and the optimiser's trade-offs."""
    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=MAX_ITERATIONS)).fit(
        train_features, train_labels
    )
