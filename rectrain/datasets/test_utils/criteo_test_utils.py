"""``CriteoTest`` (``torchrec.datasets.test_utils.criteo_test_utils``): a ``unittest.TestCase`` base that
writes small random Criteo TSV and ``.npy`` files and checks rows read back from them."""

import contextlib
import csv
import os
import random
import tempfile
import unittest
from collections.abc import Generator
from typing import Any

import numpy as np

from rectrain.datasets.criteo_tsv import CAT_FEATURE_COUNT, INT_FEATURE_COUNT


class CriteoTest(unittest.TestCase):
    INT_FEATURE_COUNT = INT_FEATURE_COUNT
    CAT_FEATURE_COUNT = CAT_FEATURE_COUNT
    LABEL_VAL_RANGE = (0, 1)
    INT_VAL_RANGE = (0, 100)
    CAT_VAL_RANGE = (0, 1000)

    @classmethod
    @contextlib.contextmanager
    def _create_dataset_tsv(
        cls, num_rows: int = 10, train: bool = True, filename: str = "criteo"
    ) -> Generator[str, None, None]:
        """A TSV of ``num_rows`` random rows (no label column unless ``train``), deleted afterwards."""
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, filename)
            rows = [cls._random_row(train) for _ in range(num_rows)]
            with open(path, "w", newline="") as out:
                csv.writer(out, delimiter="\t").writerows(rows)
            yield path

    @classmethod
    def _random_row(cls, train: bool) -> list[str]:
        label = [str(random.randint(*cls.LABEL_VAL_RANGE))] if train else []
        ints = [str(random.randint(*cls.INT_VAL_RANGE)) for _ in range(cls.INT_FEATURE_COUNT)]
        cats = [f"{random.getrandbits(32):08x}" for _ in range(cls.CAT_FEATURE_COUNT)]
        return label + ints + cats

    def _validate_sample(self, sample: dict[str, Any], train: bool = True) -> None:
        """A row as the default row mapper gives it: label, ints and hex categories in range."""
        expected = self.INT_FEATURE_COUNT + self.CAT_FEATURE_COUNT + (1 if train else 0)
        self.assertEqual(len(sample), expected)
        if train:
            self.assertTrue(self.LABEL_VAL_RANGE[0] <= sample["label"] <= self.LABEL_VAL_RANGE[1])
        for i in range(self.INT_FEATURE_COUNT):
            self.assertTrue(self.INT_VAL_RANGE[0] <= sample[f"int_{i}"] <= self.INT_VAL_RANGE[1])
        for i in range(self.CAT_FEATURE_COUNT):
            self.assertTrue(0 <= int(sample[f"cat_{i}"], 16) <= 16**8 - 1)

    @classmethod
    @contextlib.contextmanager
    def _create_dataset_npys(
        cls,
        num_rows: int = 10,
        filename: str | None = "criteo",
        filenames: list[str] | None = None,
        generate_dense: bool = True,
        generate_sparse: bool = True,
        generate_labels: bool = True,
        dense: np.ndarray | None = None,
        sparse: np.ndarray | None = None,
        labels: np.ndarray | None = None,
    ) -> Generator[tuple[str, ...], None, None]:
        """``<name>_dense/_sparse/_labels.npy`` per name (random unless given), deleted afterwards; yields
        their paths in that order."""
        if dense is None:
            dense = np.random.random((num_rows, INT_FEATURE_COUNT)).astype(np.float32)
        if sparse is None:
            sparse = np.random.randint(
                cls.CAT_VAL_RANGE[0],
                cls.CAT_VAL_RANGE[1] + 1,
                size=(num_rows, CAT_FEATURE_COUNT),
                dtype=np.int32,
            )
        if labels is None:
            labels = np.random.randint(
                cls.LABEL_VAL_RANGE[0], cls.LABEL_VAL_RANGE[1] + 1, size=(num_rows, 1), dtype=np.int32
            )
        wanted = [
            (generate_dense, "dense", dense),
            (generate_sparse, "sparse", sparse),
            (generate_labels, "labels", labels),
        ]
        with tempfile.TemporaryDirectory() as folder:
            paths = []
            for name in filenames if filenames is not None else [filename]:
                for on, kind, array in wanted:
                    if on:
                        paths.append(os.path.join(folder, f"{name}_{kind}.npy"))
                        np.save(paths[-1], array)
            yield tuple(paths)
