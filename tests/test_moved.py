"""B aligned written part by part from B's folder (``glmc.io.moved``): the same files as the
model made whole and written, bit for bit, while no part is made from more than its budget of
canonical tensors; where a part finds the model not representable as its stock class, a glmc
folder as the whole path writes it; where the export cannot run over placeholders, the whole
path itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import glmc
import glmc.io.moved
from glmc.families.convnet import ConvNetConfig
from glmc.io.folders import load_model, write_glmc, write_model
from glmc.io.moved import Moved
from glmc.symmetry.transform import Transform

#: Every family's importer, with the variants whose export differs: a tied head (untied when
#: written), GQA in bfloat16, partial rotary, Qwen2's q/k/v biases; and a post-LayerNorm
#: encoder (whose export reads values: made whole).
MODELS = {"gpt2": dict(tied=True), "vit": {}, "llama": dict(n_layer=3, n_kv_head=2),
          "qwen2": {}, "gpt_neox": dict(rotary_pct=0.5), "bert": {}}
PARTS = sorted(set(MODELS) - {"bert"})


def save_pair(h, root: Path, name: str) -> tuple[Path, Path]:
    arch = name
    folders = []
    for seed in (0, 1):
        t = h.make_tiny(arch, seed=seed, dtype=torch.float32, **MODELS[name])
        t.stock.to(torch.bfloat16 if arch == "llama" else torch.float32).save_pretrained(
            str(root / f"m{seed}"))
        folders.append(root / f"m{seed}")
    return folders[0], folders[1]


def written(folder: Path) -> dict:
    """The folder's weights and config (its dtype and fields), as files."""
    return {"weights": load_file(str(folder / "model.safetensors")),
            "config": json.loads((folder / "config.json").read_text())}


def assert_same(x: dict, y: dict) -> None:
    assert x["config"] == y["config"]
    assert x["weights"].keys() == y["weights"].keys()
    for k, t in x["weights"].items():
        u = y["weights"][k]
        assert t.dtype == u.dtype and torch.equal(t, u), k


def write_both(tmp_path: Path, moved: Moved, stock: bool = True) -> tuple[str, str]:
    """The moved model written whole and part by part; their formats."""
    (tmp_path / "whole").mkdir()
    (tmp_path / "parts").mkdir()
    whole = write_model(tmp_path / "whole", moved.whole(), stock=stock)
    parts = write_model(tmp_path / "parts", moved.skeleton(), stock=stock, parts=moved)
    return whole, parts


@pytest.fixture
def budget(monkeypatch):
    """A part budget of 3 KB (every model here takes several parts); each part's output
    tensors and the float32 bytes of the canonical tensors it is made from."""
    monkeypatch.setattr(glmc.io.moved, "PART_BYTES", 3 << 10)
    runs: list[tuple[list[str], int]] = []
    cut = glmc.io.moved._parts

    def parts(names, sources, canonical):
        for run in cut(names, sources, canonical):
            made = set().union(*(sources[n] for n in run))
            runs.append((run, sum(4 * canonical[n].numel() for n in made)))
            yield run

    monkeypatch.setattr(glmc.io.moved, "_parts", parts)
    return runs


@pytest.mark.parametrize("name", PARTS)
def test_parts_write_the_whole_model_s_files(h, tmp_path, name, budget):
    """B aligned by weight matching, written as its stock class part by part: the weights
    (in the stored dtype), config and format of the model made whole; several parts, none
    made from more than the budget unless one tensor's sources alone exceed it."""
    fa, fb = save_pair(h, tmp_path, name)
    al = glmc.align(load_model(fa), load_model(fb), max_iter=2)
    moved = Moved(fb, al.b, al.transform)
    assert write_both(tmp_path, moved) == ("hf", "hf")
    assert_same(written(tmp_path / "whole"), written(tmp_path / "parts"))
    kept = tmp_path / "kept"
    kept.mkdir()
    write_model(kept, al.aligned)  # (and the model as the matching made it)
    assert_same(written(kept), written(tmp_path / "parts"))
    assert len(budget) > 2  # (the parts: one output tensor, or within the budget)
    assert all(len(run) == 1 or made <= 3 << 10 for run, made in budget), budget


def test_a_part_that_is_not_stock_gives_the_whole_path_s_glmc_folder(h, tmp_path, budget):
    """A GPT-2 moved by a residual map that does not fix the all-ones direction: its
    writers are no longer mean-zero, found once a part reads them; the stock file begun is
    dropped and a glmc folder written part by part, as the whole path writes it."""
    fa, fb = save_pair(h, tmp_path, "gpt2")
    b = load_model(fb).canonical
    t = Transform.random(b.spec, torch.Generator().manual_seed(0), torch.float32)
    whole, parts = write_both(tmp_path, Moved(fb, b, t))
    assert whole == parts and parts.startswith("glmc (residual writer")
    assert_same(written(tmp_path / "whole"), written(tmp_path / "parts"))
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == sorted(
        p.name for p in (tmp_path / "whole").iterdir())  # (no stock file left behind)


@pytest.mark.parametrize("stock", [True, False])
def test_glmc_folders_are_written_in_parts(tmp_path, budget, stock):
    """A family without a stock class (an MLP) and a B read from a glmc folder (asked for
    without the stock class): the canonical tensors moved, part by part."""
    from conftest import random_model

    cfg = ConvNetConfig(arch="mlp", image_size=4, num_channels=1, num_labels=3, hidden=8,
                        depth=2)
    folder = tmp_path / "b"
    folder.mkdir()
    write_glmc(folder, random_model(cfg, seed=1))
    b = load_model(folder).canonical
    t = Transform.random(b.spec, torch.Generator().manual_seed(2), torch.float32)
    assert write_both(tmp_path, Moved(folder, b, t), stock=stock) == ("glmc", "glmc")
    assert_same(written(tmp_path / "whole"), written(tmp_path / "parts"))


def test_an_export_that_reads_a_value_it_was_not_given_is_made_whole(h, tmp_path, monkeypatch,
                                                                    budget):
    """BERT's export ties the head to the embedding when the two still agree: a value it
    cannot read over placeholders. The model is made whole and written so (the same
    files), no part made."""
    fa, fb = save_pair(h, tmp_path, "bert")
    al = glmc.align(load_model(fa), load_model(fb), max_iter=1)
    moved = Moved(fb, al.b, al.transform)
    wholes = []
    made = Moved.whole
    monkeypatch.setattr(Moved, "whole", lambda self: wholes.append(1) or made(self))
    assert write_both(tmp_path, moved) == ("hf", "hf")
    assert len(wholes) == 2 and not budget  # (once for the whole path, once as the fallback)
    assert_same(written(tmp_path / "whole"), written(tmp_path / "parts"))


def test_a_folder_changed_since_it_was_loaded_is_not_read_again(h, tmp_path):
    from glmc.io.folders import folder_stamp

    fa, fb = save_pair(h, tmp_path, "gpt2")
    stamp = folder_stamp(fb)
    al = glmc.align(load_model(fa), load_model(fb), max_iter=1)
    h.make_tiny("gpt2", seed=2, tied=False).stock.float().save_pretrained(str(fb))
    moved = Moved(fb, al.b, al.transform, stamp)
    for make in (moved.skeleton, moved.whole):
        with pytest.raises(glmc.errors.GlmcError, match="changed on disk since it was loaded"):
            make()


@pytest.mark.parametrize("stock", [True, False])
def test_what_cannot_be_written_as_it_is_made_is_written_whole(h, tmp_path, monkeypatch,
                                                              budget, stock):
    """Where tensors cannot be written one at a time (a big-endian machine, a dtype the
    writer does not name), the model is made whole and written by the whole path: the same
    files, no part made."""
    from glmc.io.files import TensorFile

    fa, fb = save_pair(h, tmp_path, "gpt2")
    al = glmc.align(load_model(fa), load_model(fb), max_iter=1)
    moved = Moved(fb, al.b, al.transform)
    monkeypatch.setattr(TensorFile, "writable", staticmethod(lambda dtypes: False))
    assert write_both(tmp_path, moved, stock=stock) == (("hf", "hf") if stock else
                                                        ("glmc (stock export not requested)",) * 2)
    assert not budget
    assert_same(written(tmp_path / "whole"), written(tmp_path / "parts"))
