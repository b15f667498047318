"""``device=``: where weight and learned matching compute.

This machine has no GPU, so the device is emulated (:mod:`virtual_device`: tensors on
``cpu:0`` told apart from the host's, and every operation that mixes the two where CUDA
refuses to recorded). On it the matchers must put the models, the products and the dense maps
on the device, never mix it with the host, and hand back on the host the transform the host
computes (the emulated device's arithmetic is the host's: bit for bit). A device the machine
lacks is one line, exit 2, before any model is read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from test_learned import TEXT, perturbed, planted  # noqa: F401 - (planted: a fixture)
from test_matching import assert_planted_recovered, plant
from virtual_device import DEVICE, SeparateDevice, on_device

import glmc
from glmc.cli.main import main
from glmc.data.text import text_dataset
from glmc.devices import matching_device, resolve_device
from glmc.errors import GlmcError
from glmc.io.folders import write_model
from glmc.matching.learned import LearnedMatchingOptions, learned_many, learned_matching
from glmc.matching.problem import Problem
from glmc.matching.weight import WeightMatchingOptions, weight_matching
from glmc.methods import AlignOptions
from glmc.model import CanonicalModel
from glmc.symmetry.transform import Transform
from glmc.threads import num_threads


def on_the_device(run: Callable[[], Any]) -> Any:
    """``run()`` on the emulated device (one thread: the emulation is per thread), which must
    never mix it with the host."""
    with num_threads(1), SeparateDevice() as mode:
        out = run()
    assert not mode.crossings, mode.crossings
    return out


def on_the_host(t: Transform) -> bool:
    return not any(on_device(x) for e in t.elements.values() for x in e.tensors().values())


def assert_same(t: Transform, ref: Transform) -> None:
    """The same elements, bit for bit, in the same dtypes."""
    assert t.elements.keys() == ref.elements.keys()
    for space, e in t.elements.items():
        mine, theirs = e.tensors(), ref.elements[space].tensors()
        assert mine.keys() == theirs.keys(), space
        for k, x in mine.items():
            assert x.dtype == theirs[k].dtype and torch.equal(x, theirs[k]), (space, k)


def copy(m: CanonicalModel) -> CanonicalModel:
    """A model of its own (a handed-over pair is emptied)."""
    return CanonicalModel(m.config, {k: v.clone() for k, v in m.state.items()}, m.files, m.free)


def cuda_devices(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """The machine has ``count`` CUDA devices (0: no CUDA), as torch reports it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


# -- naming a device -----------------------------------------------------------------------


@pytest.mark.parametrize(("count", "name", "message"), [
    (0, "tpu9", "unknown device 'tpu9' (cpu, cuda, cuda:N or auto; this machine has cpu)"),
    (0, "cuda", "device 'cuda' requested but CUDA is not available (this machine has cpu)"),
    (0, "cuda:1", "device 'cuda:1' requested but CUDA is not available (this machine has cpu)"),
    (1, "cuda:3", "device 'cuda:3' requested but this machine has 1 CUDA device (cpu, cuda:0)"),
    (2, "cuda:2", "device 'cuda:2' requested but this machine has 2 CUDA devices (cpu, cuda:0, "
                  "cuda:1)"),
    (1, "mps", "device 'mps': glmc computes on cpu or cuda (this machine has cpu, cuda:0)"),
])
def test_a_device_the_machine_lacks_is_one_error_naming_what_it_has(monkeypatch, count, name,
                                                                     message):
    cuda_devices(monkeypatch, count)
    with pytest.raises(GlmcError) as e:
        resolve_device(name)
    assert str(e.value) == message
    with pytest.raises(GlmcError):  # (a notebook's options are refused when made)
        AlignOptions(device=name)


def test_a_device_the_machine_has_is_resolved(monkeypatch):
    cuda_devices(monkeypatch, 0)
    assert resolve_device("auto") == resolve_device(None) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    cuda_devices(monkeypatch, 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("cuda") == resolve_device("auto") == torch.device("cuda", 1)
    # (learned matching's deterministic kernels need cuBLAS's fixed workspace)
    assert os.environ.get("CUBLAS_WORKSPACE_CONFIG")


def test_under_torchrun_matching_stays_on_the_cpu(monkeypatch):
    cuda_devices(monkeypatch, 1)
    monkeypatch.setattr("glmc.distributed.spread", lambda: True)
    assert matching_device("cpu") == torch.device("cpu")
    with pytest.raises(GlmcError, match="under torchrun the ranks match on the CPU"):
        matching_device("cuda:0")


@pytest.fixture(scope="module")
def folders(tmp_path_factory, h) -> Path:
    """Two tiny GPT-2 folders (B = g·A, float32) and a text file for the barrier."""
    root = tmp_path_factory.mktemp("devices")
    a = h.make_tiny("gpt2", n_layer=1, d=16, n_head=2, vocab=30, dtype=torch.float32)
    for name, m in (("a", a.canonical()), ("b", plant(a.canonical(), "full-group-fix-ones"))):
        (root / name).mkdir()
        write_model(root / name, m)
    (root / "text.txt").write_text("".join(chr(97 + i % 26) for i in range(3000)))
    return root


@pytest.mark.parametrize("command", [
    "align {a} {b} -o {out}", "merge {a} {b} -o {out}", "merge {a} {b} {b} -o {out}",
    "barrier {a} {b} --data {text} --tokenizer char"])
@pytest.mark.parametrize(("count", "device", "message"), [
    (0, "cuda", "device 'cuda' requested but CUDA is not available (this machine has cpu)"),
    (1, "cuda:3", "device 'cuda:3' requested but this machine has 1 CUDA device (cpu, cuda:0)"),
    (0, "gpu", "unknown device 'gpu'"),
])
def test_a_bad_device_is_refused_before_any_model_is_read(folders, tmp_path, monkeypatch,
                                                          capsys, command, count, device,
                                                          message):
    cuda_devices(monkeypatch, count)

    def read(*args, **kwargs):
        raise AssertionError("a model was read before the device was checked")

    monkeypatch.setattr("glmc.io.folders.load_model", read)
    argv = command.format(a=folders / "a", b=folders / "b", out=tmp_path / "out",
                          text=folders / "text.txt").split()
    assert main([*argv, "--device", device]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and len(err.splitlines()) == 1, err
    assert err.startswith(f"glmc {argv[0]}: error: {message}"), err
    assert not (tmp_path / "out").exists()


# -- weight matching -----------------------------------------------------------------------


def test_the_weighted_models_are_made_on_the_device_and_the_models_stay(h):
    """The copies the steps read (A's kept, B's made when read) go through ``.to(device)``;
    the models' own tensors stay on the host."""
    a = h.make_tiny("gpt2", n_layer=1, d=16, n_head=2).canonical()
    b = plant(a, "full-group")

    def problem() -> Problem:
        prob = Problem(a, b, WeightMatchingOptions(device=DEVICE))
        assert prob.device == DEVICE
        assert all(on_device(prob.A[n]) and on_device(prob.B[n]) for n in prob.names)
        return prob

    on_the_device(problem)
    assert not any(on_device(t) for m in (a, b) for t in m.state.values())


OPTIONS = [{}, {"residual": "permutation"}, {"residual": "none", "weighting": "layer"},
           {"unit_cost": "angle"}, {"init": "spectral"}, {"inner": "permutation"},
           {"inner": "orthogonal", "init": "identity"}, {"hand_over": True}]


@pytest.mark.parametrize("options", OPTIONS,
                         ids=lambda o: ",".join(map(str, o.values())) or "default")
def test_weight_matching_on_the_device_hands_back_the_hosts_transform(h, arch, options):
    a = h.make_tiny(arch, n_layer=2, d=32, n_head=4, seed=1, dtype=torch.float32).canonical()
    b = h.make_tiny(arch, n_layer=2, d=32, n_head=4, seed=2, dtype=torch.float32).canonical()
    with num_threads(1):
        ref = weight_matching(copy(a), copy(b), WeightMatchingOptions(**options))
    got = on_the_device(lambda: weight_matching(copy(a), copy(b),
                                                WeightMatchingOptions(device=DEVICE, **options)))
    assert on_the_host(got.transform)
    assert_same(got.transform, ref.transform)  # (the models' dtype: float32 maps)
    assert [r["distance"] for r in got.trace] == [r["distance"] for r in ref.trace]


@pytest.mark.parametrize(("case", "options"), [
    ("full-group", {}), ("full-group-fix-ones", {}), ("full-group-residual-permutation", {}),
    ("permutation-only", {"residual": "permutation"})])
def test_planted_recovery_stays_exact_on_the_device(h, arch, case, options):
    tiny = h.make_tiny(arch, n_layer=2, d=32, n_head=4)
    a = tiny.canonical()
    b = plant(a, case)
    al = on_the_device(lambda: assert_planted_recovered(h, tiny, a, b, device=DEVICE,
                                                        **options))
    assert on_the_host(al.transform) and not any(on_device(t) for t in al.aligned.state.values())


def test_rotary_and_grouped_heads_on_the_device(h):
    """Llama's heads: rotary inner maps, and query heads ordered within their key/value
    groups."""
    a, b = (h.make_tiny("llama", seed=s, dtype=torch.float32).canonical() for s in (1, 2))
    with num_threads(1):
        ref = weight_matching(a, b)
    got = on_the_device(lambda: weight_matching(a, b, WeightMatchingOptions(device=DEVICE)))
    assert on_the_host(got.transform)
    assert_same(got.transform, ref.transform)


def test_device_cpu_is_the_default_bit_for_bit(folders, tmp_path, capsys):
    """``glmc align --device cpu`` writes the default's model and transform, bit for bit (and
    so does ``glmc.align(..., device="cpu")``)."""
    outs = []
    for i, extra in enumerate(([], ["--device", "cpu"])):
        out = tmp_path / f"out{i}"
        assert main(["align", str(folders / "a"), str(folders / "b"), "-o", str(out),
                     "--json", *extra]) == 0
        outs.append({f.name: load_file(str(f)) for f in sorted(out.glob("*.safetensors"))})
    capsys.readouterr()
    assert outs[0].keys() == outs[1].keys() and outs[0]
    for name, tensors in outs[0].items():
        assert tensors.keys() == outs[1][name].keys()
        assert all(torch.equal(t, outs[1][name][k]) for k, t in tensors.items()), name
    default, cpu = (glmc.align(folders / "a", folders / "b", **kw)
                    for kw in ({}, {"device": "cpu"}))
    assert_same(cpu.transform, default.transform)
    assert all(torch.equal(cpu.aligned.state[k], t) for k, t in default.aligned.state.items())


def test_n_models_frames_on_the_device(h):
    """MergeMany, the star and universe matching: their weight matchings on the device, the
    frame and the merged model back on the host, the host's bit for bit."""
    a = h.make_tiny("vit", n_layer=1, d=16, n_head=2, d_mlp=32).canonical()
    models = [a, plant(a, "full-group", 1), plant(a, "full-group", 2)]
    for frame in ("mergemany", "universe"):
        with num_threads(1):
            ref = glmc.merge_many(models, frame=frame)
        got = on_the_device(lambda frame=frame: glmc.merge_many(models, frame=frame,
                                                                 device=DEVICE))
        assert all(on_the_host(t) for t in got.frame.transforms)
        for t, r in zip(got.frame.transforms, ref.frame.transforms, strict=True):
            assert_same(t, r)
        assert all(torch.equal(got.model.state[k], v) and not on_device(got.model.state[k])
                   for k, v in ref.model.state.items())


# -- learned matching ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def data():
    return text_dataset("toy", TEXT, context=16)


STEPS = {"steps": 8, "eval_every": 4, "lr": 3e-2, "patience": 0, "perm_lr_scale": 1.0}


@pytest.mark.parametrize("inner", ["invertible", "permutation"])
def test_learned_matching_on_the_device_takes_the_hosts_steps(planted, data, inner):  # noqa: F811
    """Its steps (the path's models, the latents, the batches) on the device; heads reassigned
    from the perturbed start get their inner maps afresh there too."""
    a, b, wm = planted
    start = perturbed(wm)
    with num_threads(1):
        ref = learned_matching(a, b, data, start, LearnedMatchingOptions(**STEPS), inner=inner)
    got = on_the_device(lambda: learned_matching(
        a, b, data, start, LearnedMatchingOptions(device=DEVICE, **STEPS), inner=inner))
    assert on_the_host(got.transform)
    assert_same(got.transform, ref.transform)
    assert [r["loss"] for r in got.log] == [r["loss"] for r in ref.log]


def test_refining_three_models_on_the_device(planted, data):  # noqa: F811
    a, b, wm = planted
    c = a.transformed(Transform.random(a.spec, torch.Generator().manual_seed(7), torch.float32,
                                       subgroups={"residual": "fix_ones"}))
    start = [Transform.identity(a.spec), wm, perturbed(weight_matching(a, c).transform)]
    opts = {**STEPS, "free_frame": True}
    with num_threads(1):
        ref = learned_many([a, b, c], data, start, LearnedMatchingOptions(**opts))
    got = on_the_device(lambda: learned_many([a, b, c], data, start,
                                             LearnedMatchingOptions(device=DEVICE, **opts)))
    for t, r in zip(got.transforms, ref.transforms, strict=True):
        assert on_the_host(t)
        assert_same(t, r)


def test_a_run_resumes_on_another_device(planted, data, tmp_path):  # noqa: F811
    """The checkpoint is read onto the host, and the device is not one of the options a
    resumed run must share."""
    a, b, wm = planted
    ckpt = tmp_path / "latents.pt"
    opts = {**STEPS, "checkpoint": str(ckpt), "checkpoint_every": 4}
    straight = learned_matching(a, b, data, wm, LearnedMatchingOptions(**opts))

    def stop(step, loss, val):
        if step == 5:
            raise KeyboardInterrupt

    ckpt.unlink()
    with pytest.raises(KeyboardInterrupt):
        on_the_device(lambda: learned_matching(a, b, data, wm, LearnedMatchingOptions(
            device=DEVICE, **opts), progress=stop))
    resumed = learned_matching(a, b, data, wm, LearnedMatchingOptions(**opts, resume=True))
    assert_same(resumed.transform, straight.transform)


# -- the barrier ---------------------------------------------------------------------------


def test_the_barrier_matches_where_it_evaluates(h, monkeypatch):
    """``run_barrier(device=...)`` aligns there too, unless the options name a device. (Only
    where the matching runs is checked: the evaluator builds its module with ``to_empty``,
    whose fresh parameters the emulation cannot follow.)"""
    from glmc.barrier import run_barrier
    from glmc.data import ImageDataset
    from glmc.methods import builtin

    a = h.make_tiny("vit", n_layer=1, d=16, n_head=2, d_mlp=32, dtype=torch.float32).canonical()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 16, 3, 8, 8, generator=g)
    y = torch.randint(0, 5, (3, 16), generator=g)
    ds = ImageDataset("toy", x[0], y[0], x[1], y[1], x[2], y[2], 5, torch.zeros(3),
                      torch.ones(3))
    b = plant(a, "full-group-fix-ones")
    seen = []
    matching = builtin.weight_matching

    def spy(a, b, opts, **kwargs):
        seen.append(opts.device)
        return matching(a, b, opts, **kwargs)

    monkeypatch.setattr(builtin, "weight_matching", spy)
    with num_threads(1), SeparateDevice():
        run_barrier(a, b, ds, methods=("weight",), points=3, device=DEVICE)
        run_barrier(a, b, ds, methods=("weight",), points=3, device=DEVICE,
                    options=AlignOptions(device="cpu"))
    assert seen == [DEVICE, "cpu"]
