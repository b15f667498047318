"""The command line, run in-process: exit codes, outputs, written folders, and one-line
errors (exit 2, no traceback) on bad input."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2LMHeadModel, ViTForImageClassification
from transformers.utils import logging as hf_logging

import glmc
from glmc.cli.main import COMMANDS, main
from glmc.families.transformer.circuit import to_circuit
from glmc.io.folders import load_model, write_model
from glmc.symmetry.groups import Permutation
from glmc.symmetry.transform import Transform

hf_logging.disable_progress_bar()
STOCK_CLASSES = {"gpt2": GPT2LMHeadModel, "vit": ViTForImageClassification}


@pytest.fixture
def cli(capsys):
    """Run ``glmc ARGS`` in-process: (exit code, stdout, stderr)."""

    def run(*args: object) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            rc = main([str(a) for a in args])
        except SystemExit as e:  # argparse: --help and usage errors
            rc = e.code
        out, err = capsys.readouterr()
        return rc, out, err

    return run


def save(tiny, path):
    """An HF folder of ``tiny`` (float32), written by transformers' save_pretrained."""
    tiny.stock.to(torch.float32).save_pretrained(path)
    return path


def write_copy(path, model):
    path.mkdir(parents=True)
    return write_model(path, model.to(torch.float32))


def random_transform(model, seed: int = 3, **subgroups: str) -> Transform:
    return Transform.random(model.spec, torch.Generator().manual_seed(seed), subgroups=subgroups)


def moving_every_head(t: Transform, spec) -> Transform:
    """``t`` with every head permutation replaced by a cyclic shift (never the identity).

    With a head permutation left in place, float32 matching may miss the inner head maps (see
    test_matching.py::test_planted_inner_head_maps_are_recovered_in_float32); the CLI tests
    keep to planted pairs that do not depend on that."""
    elements = dict(t.elements)
    for space, role in spec.roles.items():
        if role == "heads":
            p = elements[space]
            elements[space] = Permutation(torch.arange(p.perm.numel()).roll(1))
    return Transform(elements)


@pytest.fixture
def pair(h, tmp_path, arch):
    """Two unrelated random models A, B saved as HF folders."""
    a = save(h.make_tiny(arch, seed=1), tmp_path / "a")
    b = save(h.make_tiny(arch, seed=2), tmp_path / "b")
    return a, b


@pytest.fixture
def gpt2_folder(h, tmp_path):
    return save(h.make_tiny("gpt2", seed=1), tmp_path / "model")


# -- help ----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_help_has_an_example(cli, command):
    rc, out, _ = cli(command, "--help")
    assert rc == 0
    assert "example" in out.lower() and f"glmc {command}" in out
    assert "(default: None)" not in out and "(default: False)" not in out  # only informative


def test_help_shows_informative_defaults(cli):
    rc, out, _ = cli("align", "--help")
    assert rc == 0 and "(default: 15)" in out and "(default: orthogonal)" in out


def test_top_level_help(cli):
    rc, out, _ = cli("--help")
    assert rc == 0 and "example" in out.lower()
    assert all(c in out for c in COMMANDS)
    assert "(default: None)" not in out and "(default: False)" not in out


def test_version(cli):
    rc, out, _ = cli("--version")
    assert rc == 0 and out == f"glmc {glmc.__version__}\n"
    assert glmc.__version__ == importlib.metadata.version("glmc")  # (pyproject reads it)


def test_help_and_version_do_not_import_torch():
    """Building the parser, every --help and --version stay clear of torch, transformers and
    numpy, so they answer at once (benchmarks/startup.py times them)."""
    code = textwrap.dedent("""
        import contextlib, io, sys
        from glmc.cli.main import COMMANDS, build_parser, main
        build_parser()
        for argv in (["--help"], ["--version"], *([c, "--help"] for c in COMMANDS)):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
                main(argv)
        print(sorted(m for m in ("torch", "transformers", "numpy") if m in sys.modules))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "[]"


def test_option_values_are_refused_before_torch_loads(tmp_path):
    """A bad option value is one line at once: the commands check values and the output
    location before importing torch (or transformers)."""
    code = textwrap.dedent("""
        import contextlib, io, sys
        from glmc.cli.main import main
        bad = [["barrier", "a", "b", "--data", "x", "--points", "0"],
               ["barrier", "a", "b", "--data", "x", "--points", "5000"],
               ["barrier", "a", "b", "--data", "x", "--plot", "curves.jpg"],
               ["barrier", "a", "b", "--data", "x", "--align", "fancy"],
               ["align", "a", "b", "-o", "out", "--iters", "0"],
               ["align", "a", "b", "-o", "out", "--lam", "bogus"],
               ["align", "a", "b", "-o", "a", "--force"],
               ["merge", "a", "b", "-o", "out", "--alpha", "2"],
               ["merge", "a", "b", "-o", "out", "--steps", "0"],
               ["train", "--arch", "gpt2", "--data", "x", "-o", "out", "--steps", "0"],
               ["demo", "-o", "out", "--points", "1"]]
        for argv in bad:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                assert main(argv) == 2, argv
            assert err.getvalue().count("\\n") == 1 and "error: " in err.getvalue(), argv
        print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
    """)
    (tmp_path / "a").mkdir()
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "[]"


def test_learned_checkpoint_default_is_the_librarys(cli):
    """One default for --checkpoint-every: LearnedMatchingOptions', which the help explains."""
    from glmc.cli.main import build_parser
    from glmc.matching.options import LearnedMatchingOptions

    default = LearnedMatchingOptions().checkpoint_every
    for command in ("align", "merge", "barrier"):
        args = build_parser().parse_args([command, "a", "b", "-o", "out", "--data", "x"]
                                         if command != "barrier" else
                                         [command, "a", "b", "--data", "x"])
        assert args.checkpoint_every == default, command
    _, out, _ = cli("align", "--help")
    assert (f"0: only when the run ends, so a run killed before then leaves nothing to "
            f"--resume (default: {default})") in " ".join(out.split())


def test_help_lists_every_registered_method(cli):
    """The commands' help and choices come from the one registry (glmc.methods, torch-free)."""
    from glmc.methods import METHODS

    _, barrier_help, _ = cli("barrier", "--help")
    for name in METHODS:
        assert name in " ".join(barrier_help.split()), name
    for name, method in METHODS.items():  # (align takes the methods that move B)
        rc, _, err = cli("align", "a", "b", "-o", "out", "--align", name)
        assert ("invalid choice" in err) != method.transform, (name, rc, err)


# -- verify --------------------------------------------------------------------------------


def test_verify_unrelated_models_exits_1(cli, pair):
    rc, out, _ = cli("verify", *pair)
    assert rc == 1 and "DIFFERENT" in out


@pytest.mark.parametrize("copy", ["same", "fix-ones-transformed", "orthogonal-transformed",
                                  "circuit-transformed"])
def test_verify_symmetric_copies_exits_0(h, cli, tmp_path, arch, copy):
    tiny = h.make_tiny(arch, seed=1)
    a = save(tiny, tmp_path / "a")
    model = load_model(a).canonical
    if copy == "same":
        b = a
    elif copy == "fix-ones-transformed":
        b = tmp_path / "b"
        moved = model.transformed(random_transform(model, residual="fix_ones"))
        assert write_copy(b, moved) == "hf"
    elif copy == "orthogonal-transformed":
        b = tmp_path / "b"
        assert write_copy(b, model.transformed(random_transform(model))).startswith("glmc")
    else:
        b = tmp_path / "b"
        circuit = to_circuit(model)
        assert write_copy(b, circuit.transformed(random_transform(circuit))).startswith("glmc")
    rc, out, _ = cli("verify", a, b)
    assert rc == 0, out
    assert "same function" in out
    rc, _, _ = cli("verify", b, a)
    assert rc == 0


def test_verify_json(cli, pair):
    rc, out, _ = cli("verify", *pair, "--json")
    assert rc == 1
    report = json.loads(out)
    assert report["equal"] is False and report["max_abs_diff"] > 0
    rc, out, _ = cli("verify", pair[0], pair[0], "--json", "--seed", "3", "--batch", "2")
    assert rc == 0
    report = json.loads(out)
    assert report["equal"] is True and report["max_abs_diff"] == 0.0


# -- align ---------------------------------------------------------------------------------


def test_align_writes_a_stock_folder_with_transform_and_report(cli, pair, tmp_path, arch):
    a, b = pair
    out_dir = tmp_path / "out"
    rc, out, err = cli("align", a, b, "-o", out_dir)
    assert rc == 0, err
    assert {"config.json", "model.safetensors", "transform.safetensors",
            "glmc_report.json"} <= {p.name for p in out_dir.iterdir()}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders
    report = json.loads((out_dir / "glmc_report.json").read_text())
    assert report["format"] == "hf" and report["certificate"]["equal"] is True
    assert report["matching"]["iterations"] >= 1
    STOCK_CLASSES[arch].from_pretrained(out_dir, local_files_only=True)
    # The aligned model is B's function, and it is B moved by the saved transform.
    assert cli("verify", b, out_dir)[0] == 0
    assert cli("verify", a, out_dir)[0] == 1
    cb, aligned = load_model(b).canonical, load_model(out_dir).canonical
    moved = Transform.load(out_dir / "transform.safetensors").apply(cb.spec, cb.state)
    for k, v in aligned.state.items():
        torch.testing.assert_close(moved[k], v, rtol=1e-4, atol=1e-5)


def test_align_with_data_starts_weight_matching_from_activation_matching(cli, h, tmp_path):
    """`--data` moves weight matching's start (activation matching's residual map): another
    transform than the data-free run's, and still B's function, certified."""
    a = save(h.make_tiny("gpt2", seed=1), tmp_path / "a")
    b = save(h.make_tiny("gpt2", seed=2), tmp_path / "b")
    vocab = load_model(a).canonical.config.vocab_size
    symbols = "".join(chr(0x41 + i) for i in range(vocab))  # exactly the models' vocabulary
    rng = np.random.default_rng(0)
    text = tmp_path / "text.txt"
    text.write_text(symbols + "".join(rng.choice(list(symbols), 20_000)))
    maps = {}
    for name, extra in (("free", []), ("data", ["--data", text, "--tokenizer", "char"])):
        out_dir = tmp_path / name
        rc, out, err = cli("align", a, b, "-o", out_dir, "--json", *extra)
        assert rc == 0, err
        assert json.loads(out)["certificate"]["equal"] is True
        maps[name] = Transform.load(out_dir / "transform.safetensors").elements["res"].matrix()
    assert (maps["free"] - maps["data"]).abs().max() > 1e-3


@pytest.mark.parametrize("options", [["--heads", "circuit"], ["--residual", "permutation"],
                                     ["--no-stock"]])
def test_align_options(cli, gpt2_folder, tmp_path, options):
    out_dir = tmp_path / "out"
    rc, out, err = cli("align", gpt2_folder, gpt2_folder, "-o", out_dir, "--json", *options)
    assert rc == 0, err
    report = json.loads(out)
    assert report["certificate"]["equal"] is True
    expected = "hf" if options == ["--residual", "permutation"] else "glmc"
    assert report["format"].startswith(expected)
    assert cli("verify", gpt2_folder, out_dir)[0] == 0


def test_align_token_counts_file(cli, gpt2_folder, tmp_path):
    counts = tmp_path / "counts.json"
    counts.write_text(json.dumps({"0": 5, "3": 2, "7": 1}))
    rc, _, err = cli("align", gpt2_folder, gpt2_folder, "-o", tmp_path / "out",
                     "--token-counts", counts)
    assert rc == 0, err
    counts.write_text(json.dumps([1, 2, 3]))
    rc, _, err = cli("align", gpt2_folder, gpt2_folder, "-o", tmp_path / "out2",
                     "--token-counts", counts)
    assert rc == 2 and str(counts) in err and "Traceback" not in err
    assert not (tmp_path / "out2").exists()


# -- merge ---------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [[], ["--heads", "circuit"]], ids=["inner", "circuit"])
def test_merge_of_a_planted_pair(h, cli, tmp_path, arch, options):
    """B = g·A (g fixes the all-ones direction, so B is a stock folder): the aligned merge is
    A's function, the plain average is not."""
    a = save(h.make_tiny(arch, seed=1), tmp_path / "a")
    model = load_model(a).canonical
    b = tmp_path / "b"
    g = moving_every_head(random_transform(model, residual="fix_ones"), model.spec)
    assert write_copy(b, model.transformed(g)) == "hf"
    rc, _, err = cli("merge", a, b, "-o", tmp_path / "aligned", "--align", "weight", *options)
    assert rc == 0, err
    assert cli("verify", a, tmp_path / "aligned")[0] == 0
    if not options:  # circuit form is no stock architecture
        STOCK_CLASSES[arch].from_pretrained(tmp_path / "aligned", local_files_only=True)
    # (the stock average has no head form to choose: --heads circuit is refused with it)
    rc, _, err = cli("merge", a, b, "-o", tmp_path / "plain", "--align", "none")
    assert rc == 0, err
    assert cli("verify", a, tmp_path / "plain")[0] == 1
    report = json.loads((tmp_path / "plain" / "glmc_report.json").read_text())
    assert report["align"] == "none" and report["alpha"] == 0.5 and report["format"] == "hf"
    # The stock weights averaged as loaded (LayerNorm γ and β too), written as they are; A
    # ties its GPT-2 head, B (an export) does not: the average is untied.
    sa, sb = load_model(a).stock_state, load_model(b).stock_state
    written = load_file(tmp_path / "plain" / "model.safetensors")
    for name in set(sa) & set(sb):
        assert torch.equal(written[name], torch.lerp(sb[name], sa[name], 0.5)), name
    if arch == "gpt2":
        assert torch.equal(written["lm_head.weight"], torch.lerp(
            sb["lm_head.weight"], sa["transformer.wte.weight"], 0.5))
    rc, _, err = cli("merge", a, b, "-o", tmp_path / "canonical", "--align", "canonical",
                     *options)
    assert rc == 0, err
    assert cli("verify", a, tmp_path / "canonical")[0] == 1
    assert cli("verify", tmp_path / "plain", tmp_path / "canonical")[0] == 1  # not the same


def test_merge_rejects_alpha_out_of_range(cli, gpt2_folder, tmp_path):
    rc, _, err = cli("merge", gpt2_folder, gpt2_folder, "-o", tmp_path / "m", "--alpha", "2")
    assert rc == 2 and "alpha" in err and not (tmp_path / "m").exists()


# -- canonicalize --------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "fmt"), [([], "glmc"), (["--attention", "circuit"], "glmc"),
                                              (["--stock"], "hf")])
def test_canonicalize(cli, gpt2_folder, tmp_path, options, fmt):
    out_dir = tmp_path / "canon"
    rc, out, err = cli("canonicalize", gpt2_folder, "-o", out_dir, "--json", *options)
    assert rc == 0, err
    report = json.loads(out)
    assert report["format"].startswith(fmt) and report["certificate"]["equal"] is True
    assert cli("verify", gpt2_folder, out_dir)[0] == 0
    if fmt == "hf":
        GPT2LMHeadModel.from_pretrained(out_dir, local_files_only=True)


# -- bad input -----------------------------------------------------------------------------


def _break_not_a_folder(folder):
    shutil.rmtree(folder)
    folder.write_text("hello")
    return folder, "not a model folder"


def _break_missing_path(folder):
    shutil.rmtree(folder)
    return folder, "no such file or folder"


def _break_no_config(folder):
    (folder / "config.json").unlink()
    return folder, "config.json is missing"


def _break_t5(folder):
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "t5"}))
    return folder / "config.json", "unsupported architecture 't5' (supported: "


def _break_bad_json(folder):
    (folder / "config.json").write_text("{not json")
    return folder / "config.json", "not valid JSON"


def _break_shape(folder):
    state = load_file(str(folder / "model.safetensors"))
    state["transformer.wpe.weight"] = state["transformer.wpe.weight"][:-1].contiguous()
    save_file(state, str(folder / "model.safetensors"))
    return folder, "tensor transformer.wpe.weight has shape [15, 32], the config implies [16, 32]"


def _break_nan(folder):
    state = load_file(str(folder / "model.safetensors"))
    state["transformer.h.1.mlp.c_fc.bias"][0] = float("nan")
    save_file(state, str(folder / "model.safetensors"))
    return folder, "tensor transformer.h.1.mlp.c_fc.bias contains NaN"


def _break_no_weights(folder):
    (folder / "model.safetensors").unlink()
    return folder, "no model.safetensors"


def _break_corrupt_weights(folder):
    (folder / "model.safetensors").write_bytes(b"\x00garbage")
    return folder / "model.safetensors", "cannot read safetensors file"


def _break_pickle(folder):
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    return folder / "pytorch_model.bin", "--allow-pickle"


BREAKERS = {f.__name__.removeprefix("_break_"): f for f in (
    _break_not_a_folder, _break_missing_path, _break_no_config, _break_t5, _break_bad_json,
    _break_shape, _break_nan, _break_no_weights, _break_corrupt_weights, _break_pickle)}


@pytest.mark.parametrize("command", ["verify", "align", "merge"])
@pytest.mark.parametrize("breaker", list(BREAKERS))
def test_bad_input_is_a_one_line_error(h, cli, tmp_path, gpt2_folder, command, breaker):
    good = save(h.make_tiny("gpt2", seed=2), tmp_path / "good")
    named, message = BREAKERS[breaker](gpt2_folder)  # the file the error must name
    extra = [] if command == "verify" else ["-o", tmp_path / "out"]
    rc, out, err = cli(command, good, gpt2_folder, *extra)
    assert rc == 2
    assert "Traceback" not in err + out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"glmc {command}: error: ")
    assert str(named) in lines[0] and message in lines[0]
    assert not (tmp_path / "out").exists()


def test_sharded_checkpoints(h, cli, tmp_path):
    folder = tmp_path / "sharded"
    h.make_tiny("gpt2", dtype=torch.float32).stock.save_pretrained(folder, max_shard_size="20KB")
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 1 and not (folder / "model.safetensors").exists()
    assert cli("verify", folder, folder)[0] == 0
    shards[0].unlink()
    rc, _, err = cli("verify", folder, folder)
    assert rc == 2 and f"{shards[0]}: shard named in model.safetensors.index.json" in err


def test_align_replaces_an_existing_output_only_with_force(cli, gpt2_folder, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "stale.txt").write_text("someone's result")
    rc, _, err = cli("align", gpt2_folder, gpt2_folder, "-o", out_dir)
    assert rc == 2 and "exists and is not empty" in err and "--force" in err
    assert (out_dir / "stale.txt").read_text() == "someone's result"
    assert cli("align", gpt2_folder, gpt2_folder, "-o", out_dir, "--force")[0] == 0
    assert not (out_dir / "stale.txt").exists() and (out_dir / "transform.safetensors").exists()
    rc, _, err = cli("align", gpt2_folder, gpt2_folder, "-o", out_dir)  # glmc's own output too
    assert rc == 2 and "--force" in err
    assert cli("align", gpt2_folder, gpt2_folder, "-o", out_dir, "--force")[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "out"]  # no temp, no .old


def test_force_replaces_a_file_and_later_runs_replace_the_folder(cli, gpt2_folder, tmp_path):
    out = tmp_path / "out"
    out.write_text("a file where the output goes")
    rc, _, err = cli("canonicalize", gpt2_folder, "-o", out)
    assert rc == 2 and "exists and is not empty" in err and out.read_text().startswith("a file")
    for _ in range(2):  # the first replaces the file, the second its own output
        assert cli("canonicalize", gpt2_folder, "-o", out, "--force")[0] == 0
        assert (out / "glmc_report.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "out"]  # no .old left


@pytest.mark.parametrize("command", ["merge", "canonicalize", "train"])
def test_commands_refuse_to_replace_a_folder_glmc_did_not_write(cli, gpt2_folder, tmp_path,
                                                                 command):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "weights.bin").write_text("precious")
    args = {"merge": ("merge", gpt2_folder, gpt2_folder),
            "canonicalize": ("canonicalize", gpt2_folder),
            "train": ("train", "--arch", "gpt2", "--data", "shakespeare")}[command]
    rc, _, err = cli(*args, "-o", out_dir)
    assert rc == 2 and str(out_dir) in err and "--force" in err and "Traceback" not in err
    assert sorted(p.name for p in out_dir.iterdir()) == ["weights.bin"]


def test_canonicalize_writes_its_report_beside_the_weights(cli, gpt2_folder, tmp_path):
    assert cli("canonicalize", gpt2_folder, "-o", tmp_path / "c")[0] == 0
    report = json.loads((tmp_path / "c" / "glmc_report.json").read_text())
    assert report["command"] == "canonicalize" and report["certificate"]["equal"]
    assert cli("canonicalize", gpt2_folder, "-o", tmp_path / "c")[0] == 2  # its own: --force
    assert cli("canonicalize", gpt2_folder, "-o", tmp_path / "c", "--force")[0] == 0


def test_pickle_checkpoint_loads_with_allow_pickle(cli, gpt2_folder):
    _break_pickle(gpt2_folder)
    assert cli("verify", gpt2_folder, gpt2_folder, "--allow-pickle")[0] == 0


def test_different_interfaces_are_rejected(h, cli, tmp_path):
    a = save(h.make_tiny("gpt2", vocab=50), tmp_path / "a")
    b = save(h.make_tiny("gpt2", vocab=40), tmp_path / "b")
    rc, _, err = cli("verify", a, b)
    assert rc == 2 and "vocab_size (50 vs 40)" in err and "Traceback" not in err


def test_different_sizes_are_rejected_in_the_configs_terms(h, cli, tmp_path):
    a = save(h.make_tiny("gpt2", n_inner=64), tmp_path / "a")
    b = save(h.make_tiny("gpt2", n_inner=128), tmp_path / "b")
    rc, _, err = cli("align", a, b, "-o", tmp_path / "out")
    assert rc == 2 and "Traceback" not in err
    assert "the models differ in n_inner (64 in A, 128 in B)" in err


# -- interruption --------------------------------------------------------------------------


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["glmc.io.folders.write_model", "glmc.api.align"])
@pytest.mark.parametrize("existing", [False, True], ids=["new-out", "existing-out"])
def test_interrupted_align_leaves_no_partial_output(cli, gpt2_folder, tmp_path, monkeypatch,
                                                    where, existing):
    out_dir = tmp_path / "out"
    if existing:
        out_dir.mkdir()  # an earlier result, which a finished run would replace (--force)
        (out_dir / "glmc_report.json").write_text("{}")
    monkeypatch.setattr(where, _interrupt)  # (the command imports both when it runs)
    before = {p.name for p in tmp_path.iterdir()}
    rc, _, err = cli("align", gpt2_folder, gpt2_folder, "-o", out_dir,
                     *(["--force"] if existing else []))
    assert rc == 130 and "interrupted" in err and "Traceback" not in err
    assert {p.name for p in tmp_path.iterdir()} == before  # no stray temp folder
    if existing:
        assert [p.name for p in out_dir.iterdir()] == ["glmc_report.json"]
    else:
        assert not out_dir.exists()


def test_align_takes_its_name_only_once_certified(cli, gpt2_folder, tmp_path, monkeypatch):
    """A Ctrl-C (or a full disk) while the written folder is certified leaves no OUT that
    looks complete without its certificate, so a rerun is not refused."""
    import glmc.writing

    certify = glmc.writing.certify_folder
    seen = []

    def interrupted(folder, *reference):
        seen.append(sorted(p.name for p in Path(folder).iterdir()))
        raise KeyboardInterrupt

    monkeypatch.setattr(glmc.writing, "certify_folder", interrupted)
    out_dir = tmp_path / "out"
    before = {p.name for p in tmp_path.iterdir()}
    rc, _, err = cli("align", gpt2_folder, gpt2_folder, "-o", out_dir)
    assert rc == 130 and "interrupted" in err and "Traceback" not in err
    assert "model.safetensors" in seen[0]  # (written, and certified before the rename)
    assert not out_dir.exists() and {p.name for p in tmp_path.iterdir()} == before
    monkeypatch.setattr(glmc.writing, "certify_folder", certify)
    rc, _, err = cli("align", gpt2_folder, gpt2_folder, "-o", out_dir)
    assert rc == 0, err
    report = json.loads((out_dir / "glmc_report.json").read_text())
    assert report["certificate"]["equal"] is True and report["seconds"] > 0


def test_align_refuses_to_overwrite_an_input(tmp_path, capsys):
    """`glmc align A B -o A` would delete model A: one clear error, A intact."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=11, n_positions=8,
                     bos_token_id=None, eos_token_id=None)
    for name in ("a", "b"):
        GPT2LMHeadModel(cfg).save_pretrained(tmp_path / name)
    before = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert main(["align", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "a")]) == 2
    assert "would replace input" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == before


def test_verify_rejects_an_empty_batch(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=11, n_positions=8,
                     bos_token_id=None, eos_token_id=None)
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "a")
    assert main(["verify", str(tmp_path / "a"), str(tmp_path / "a"), "--batch", "0"]) == 2
    assert "--batch" in capsys.readouterr().err
