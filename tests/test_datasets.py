"""The standard-library text corpus: fixed content, a held-out tail, windows aligned with their targets."""
import numpy as np
import pytest

from graph_executor_v2.datasets import STDLIB_MODULES, python_source_corpus, random_windows, unigram_entropy


def test_corpus_is_the_sorted_module_list_split_at_the_fraction():
    corpus = python_source_corpus(0.1)
    assert list(STDLIB_MODULES) == sorted(STDLIB_MODULES)
    assert len(corpus.files) + len(corpus.missing) == len(STDLIB_MODULES)
    assert len(corpus.files) >= 60  # nearly all of them exist on any Python from 3.10 on
    total = len(corpus.train) + len(corpus.validation)
    assert abs(len(corpus.validation) - 0.1 * total) <= 1
    assert corpus.train.dtype == np.uint8 and bytes(corpus.train[:200]).isascii()
    again = python_source_corpus(0.1)
    np.testing.assert_array_equal(again.validation, corpus.validation)


def test_unigram_entropy_closed_forms():
    assert unigram_entropy(np.zeros(100, np.uint8)) == 0.0
    assert unigram_entropy(np.arange(256, dtype=np.uint8)) == pytest.approx(np.log(256))
    assert unigram_entropy(np.array([1, 2], np.uint8)) == pytest.approx(np.log(2))


def test_windows_and_targets_are_shifted_by_one(rng):
    data = np.arange(50, dtype=np.uint8)
    inputs, targets = random_windows(data, 6, 9, rng)
    assert inputs.shape == targets.shape == (6, 9) and inputs.dtype == np.int64
    np.testing.assert_array_equal(targets, inputs + 1)


def test_bad_arguments():
    with pytest.raises(ValueError, match="validation_fraction"):
        python_source_corpus(1.0)
    with pytest.raises(ValueError, match="max_bytes"):
        python_source_corpus(max_bytes=1)
    with pytest.raises(ValueError, match="context"):
        random_windows(np.zeros(5, np.uint8), 1, 5, np.random.default_rng(0))
