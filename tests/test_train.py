"""glmc train: tiny GPT-2 and ViT runs, reproducibility, kill/resume, and bad input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel, ViTForImageClassification

from glmc.cli.main import main
from glmc.data import TOKENIZER_FILE, load_dataset, load_tokenizer
from glmc.errors import GlmcError
from glmc.io.folders import load_model
from glmc.training import (
    TRAIN_FILE,
    TrainConfig,
    TrainingStopped,
    checkpoint_path,
    lr_factor,
    train,
)

TEXT = "".join(
    f"{w} sat on the mat {i % 7}. the quick brown fox jumps over the lazy dog!\n"
    for i, w in enumerate(["the cat", "a dog", "my hat", "your bat"] * 60)
)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "tiny.txt"
    path.write_text(TEXT)
    return path


def gpt2_cfg(data: Path, **kw) -> TrainConfig:
    base = dict(arch="gpt2", data=str(data), seed=0, n_layer=1, n_embd=16, n_head=2,
                context=16, steps=24, batch_size=8, lr=3e-3, eval_every=8, eval_batches=2,
                log_every=4, checkpoint_every=0, threads=1)
    return TrainConfig(**{**base, **kw})


def vit_cfg(**kw) -> TrainConfig:
    base = dict(arch="vit", data="digits", seed=0, n_layer=1, n_embd=32, n_head=2, n_inner=32,
                patch_size=4, steps=30, batch_size=64, lr=5e-3, eval_every=10, eval_batches=2,
                log_every=5, checkpoint_every=0, threads=1)
    return TrainConfig(**{**base, **kw})


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def assert_loaded_exactly(model: torch.nn.Module, folder: Path) -> None:
    """from_pretrained restored every saved tensor (nothing re-initialised)."""
    state, saved = model.state_dict(), weights(folder)
    assert set(state) == set(saved)
    assert all(torch.equal(state[k], saved[k]) for k in saved)


@pytest.fixture(scope="module")
def gpt2_run(text_file, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("runs") / "gpt"
    return out, train(gpt2_cfg(text_file), out, progress=False)


def test_gpt2_folder_loads_and_records(gpt2_run, text_file) -> None:
    out, record = gpt2_run
    log = record["log"]
    assert log["steps"] == 24 and [v["step"] for v in log["val"]] == [8, 16, 24]
    assert log["train"][-1]["loss"] < log["train"][0]["loss"] - 0.3  # it learns
    assert set(log["test"]) == {"loss", "accuracy"}
    assert json.loads((out / TRAIN_FILE).read_text()) == record
    assert record["seed"] == 0 and record["data"] == str(text_file)

    model = GPT2LMHeadModel.from_pretrained(out, local_files_only=True)
    assert_loaded_exactly(model, out)
    assert model.config.tie_word_embeddings is False
    assert model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr()
    assert model.config.n_positions == 16 and model.config.bos_token_id is None
    assert load_model(out).canonical.config.n_layer == 1

    tok = load_tokenizer(out)  # later commands encode the data exactly as in training
    assert (out / TOKENIZER_FILE).is_file() and tok.to_json() == load_dataset(
        str(text_file)).tokenizer.to_json()
    assert model.config.vocab_size == tok.vocab_size
    assert not checkpoint_path(out).parent.exists()  # checkpoints are gone after success


def test_same_seed_same_weights_other_seed_differs(gpt2_run, text_file, tmp_path) -> None:
    out, _ = gpt2_run
    rng, threads = torch.get_rng_state(), torch.get_num_threads()
    train(gpt2_cfg(text_file), tmp_path / "again", progress=False)
    assert torch.equal(torch.get_rng_state(), rng) and torch.get_num_threads() == threads
    assert_same_weights(out, tmp_path / "again")
    train(gpt2_cfg(text_file, seed=1, steps=2), tmp_path / "other", progress=False)
    w0, w1 = weights(out), weights(tmp_path / "other")
    assert not torch.equal(w0["transformer.wte.weight"], w1["transformer.wte.weight"])


class Killed(Exception):
    """A kill: the run gets no chance to write a checkpoint on the way out."""


@pytest.mark.parametrize("how", ["interrupt", "kill"])
def test_gpt2_stop_and_resume_is_bit_identical(gpt2_run, text_file, tmp_path, how) -> None:
    """Stopped after step 13 (checkpoints every 5): an interrupt (stop_after, as Ctrl-C)
    checkpoints step 13 on the way out; a kill leaves the checkpoint of step 10. Either way
    the resumed run ends with the uninterrupted run's weights and log."""
    out, straight = gpt2_run
    cfg = gpt2_cfg(text_file, checkpoint_every=5)
    seen: list[int] = []

    def on_step(step: int, loss: float) -> None:
        seen.append(step)
        if how == "kill" and step == 13:
            raise Killed

    with pytest.raises(TrainingStopped if how == "interrupt" else Killed) as stopped:
        train(cfg, tmp_path / "r", progress=False, on_step=on_step,
              stop_after=13 if how == "interrupt" else None)
    assert seen == list(range(1, 14)) and checkpoint_path(tmp_path / "r").is_file()
    if how == "interrupt":
        assert stopped.value.step == 13 and stopped.value.checkpoint == checkpoint_path(
            tmp_path / "r")
    assert not (tmp_path / "r").exists()
    record = train(cfg, tmp_path / "r", resume=True, progress=False)
    assert_same_weights(out, tmp_path / "r")
    assert record["log"]["resumed_at"] == [13 if how == "interrupt" else 10]
    assert record["log"]["train"] == straight["log"]["train"]  # same losses, pending ones too
    assert record["log"]["val"] == straight["log"]["val"]
    # resuming a finished run returns its record without training
    again = train(cfg, tmp_path / "r", resume=True, progress=False)
    assert again["log"] == record["log"]


def test_resume_refuses_other_config(text_file, tmp_path) -> None:
    cfg = gpt2_cfg(text_file, steps=6, checkpoint_every=2)
    with pytest.raises(TrainingStopped):
        train(cfg, tmp_path / "r", progress=False, stop_after=3)
    with pytest.raises(GlmcError, match=r"lr=0\.003 \(requested 0\.001\)"):
        train(dataclasses.replace(cfg, lr=1e-3), tmp_path / "r", resume=True, progress=False)
    # runtime-only options may change
    train(dataclasses.replace(cfg, checkpoint_every=1), tmp_path / "r", resume=True,
          progress=False)


def test_vit_digits_trains_and_resumes_mid_epoch(tmp_path) -> None:
    cfg = vit_cfg()
    record = train(cfg, tmp_path / "a", progress=False)
    log = record["log"]
    assert log["train"][-1]["loss"] < log["train"][0]["loss"] - 0.3
    assert log["test"]["accuracy"] > 0.4
    model = ViTForImageClassification.from_pretrained(tmp_path / "a", local_files_only=True)
    assert_loaded_exactly(model, tmp_path / "a")
    assert (model.config.image_size, model.config.num_channels, model.config.num_labels) == (
        8, 1, 10)
    assert load_model(tmp_path / "a").canonical.config.n_layer == 1
    assert not (tmp_path / "a" / TOKENIZER_FILE).exists()
    # 1437 training images / 64 = 22 batches per epoch: checkpoint at 24, kill at 26
    resumed = dataclasses.replace(cfg, checkpoint_every=12)
    with pytest.raises(TrainingStopped):
        train(resumed, tmp_path / "b", progress=False, stop_after=26)
    train(resumed, tmp_path / "b", resume=True, progress=False)
    assert_same_weights(tmp_path / "a", tmp_path / "b")


def test_lr_schedule_warms_up_then_decays() -> None:
    f = [lr_factor(s, 4, 20) for s in range(20)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0] and f[4] == 1.0
    assert all(a > b for a, b in zip(f[4:-1], f[5:], strict=True)) and 0 < f[-1] < 0.02


def test_cli_json_and_help(text_file, tmp_path, capsys) -> None:
    out = tmp_path / "cli"
    code = main(["train", "--arch", "gpt2", "--data", str(text_file), "-o", str(out),
                 "--n-layer", "1", "--n-embd", "8", "--n-head", "2", "--context", "8",
                 "--steps", "3", "--batch-size", "4", "--threads", "1", "--json"])
    captured = capsys.readouterr()
    assert code == 0 and captured.err == ""
    assert json.loads(captured.out)["log"]["steps"] == 3
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "example:\n  glmc train --arch gpt2" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["vit-on-text", "gpt2-on-images", "patch", "empty", "heads",
                                  "not-a-model-folder"])
def test_cli_bad_input_one_line_exit_2(case, text_file, tmp_path, capsys) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("keep me")
    args = {
        "vit-on-text": ["--arch", "vit", "--data", str(text_file)],
        "gpt2-on-images": ["--arch", "gpt2", "--data", "digits"],
        "patch": ["--arch", "vit", "--data", "digits", "--patch-size", "3"],
        "empty": ["--arch", "gpt2", "--data", str(empty)],
        "heads": ["--arch", "gpt2", "--data", str(text_file), "--n-embd", "10", "--n-head", "4"],
        "not-a-model-folder": ["--arch", "gpt2", "--data", str(text_file)],
    }[case]
    out = tmp_path / ("busy" if case == "not-a-model-folder" else "out")
    code = main(["train", *args, "-o", str(out), "--threads", "1", "--steps", "2"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("glmc train: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert case == "not-a-model-folder" or not out.exists()
    expect = {"vit-on-text": "holds text", "gpt2-on-images": "holds images",
              "patch": "patch size 3", "empty": "empty", "heads": "does not divide",
              "not-a-model-folder": "exists and is not empty"}[case]
    assert expect in err
