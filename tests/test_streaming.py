"""A pair costs the two models in float32 plus one layer's working set.

Tensors are read from the memory-mapped safetensors files one at a time (a sharded
checkpoint shard by shard), converted to float32 where they are used, and no mapping of the
files is left once a model is loaded; certificates run the float64 forward one block at a
time, with the same numbers as a float64 copy of the whole model; a pair that will not fit
in memory is refused before loading, in one line.
"""

from __future__ import annotations

import json
import os
import weakref
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import glmc.io.folders
import glmc.io.outputs
import glmc.verify
from glmc.cli.main import main
from glmc.errors import GlmcError
from glmc.io.files import save_tensors
from glmc.io.folders import StoredState, load_model, open_model
from glmc.verify import canonical_logits, folder_logits, random_inputs


def save_decoder(h, folder: Path, seed: int, *, arch: str = "llama",
                 dtype: torch.dtype = torch.bfloat16, **save_kw) -> None:
    """A random tiny ``arch`` (grouped-query attention) saved as transformers does."""
    t = h.make_tiny(arch, seed=seed, n_layer=3, n_kv_head=2) if arch != "gpt2" else \
        h.make_tiny(arch, seed=seed, tied=False)
    t.stock.to(dtype).save_pretrained(str(folder), **save_kw)


def mapped(paths: list[Path]) -> list[str]:
    """The lines of this process's memory map that map one of ``paths``."""
    names = {str(p.resolve()) for p in paths}
    with open("/proc/self/maps") as f:
        return [line for line in f if line.split()[-1] in names]


@pytest.fixture
def no_whole_reads(monkeypatch):
    """Reading a whole safetensors file at once (``load_file``, ``load``) fails the test."""
    calls = []

    def whole(*args, **kwargs):
        calls.append(args)
        raise AssertionError("a whole safetensors file was read at once")

    for name in ("load_file", "load"):
        monkeypatch.setattr(f"safetensors.torch.{name}", whole)
    return calls


# -- reading ----------------------------------------------------------------------------------


def test_a_sharded_bfloat16_pair_round_trips_through_align(h, tmp_path, no_whole_reads):
    """Two sharded bfloat16 checkpoints (index and shards read lazily, tensor by tensor,
    never a whole file) aligned; OUT is bfloat16, loads with from_pretrained and computes
    B's function (its certificate, and B's logits recomputed here)."""
    from transformers import AutoModelForCausalLM

    for name, seed in (("a", 0), ("b", 1)):
        save_decoder(h, tmp_path / name, seed, max_shard_size="20KB")
        assert len(list((tmp_path / name).glob("model-*-of-*.safetensors"))) > 2
        assert (tmp_path / name / "model.safetensors.index.json").is_file()
    out = tmp_path / "out"
    assert main(["align", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out),
                 "--json"]) == 0
    assert not no_whole_reads
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}  # noqa: SIM118
    report = json.loads((out / "glmc_report.json").read_text())
    assert report["certificate"]["equal"] and report["certificate"]["stored_dtype"] == "bfloat16"
    assert set(report["phases"]) == {"load", "reference", "match", "write", "certify"}
    assert all(p["seconds"] >= 0 for p in report["phases"].values())
    aligned = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert next(aligned.parameters()).dtype == torch.bfloat16
    b = load_model(tmp_path / "b")
    x = random_inputs(b.canonical.config)
    want = folder_logits(b)(x)
    with torch.no_grad():
        got = aligned.double()(input_ids=x, use_cache=False).logits
    assert h.rel_diff(want, got) < 4e-2


def test_loading_keeps_no_mapping_of_the_files_and_reads_as_before(h, tmp_path):
    """The canonical form of a sharded checkpoint is the one of its tensors read whole, in
    float32, and none of its tensors is left backed by the mapped files."""
    save_decoder(h, tmp_path / "m", 0, max_shard_size="20KB")
    shards = sorted((tmp_path / "m").glob("model-*.safetensors"))
    loaded = load_model(tmp_path / "m")
    assert not mapped(shards)
    whole: dict[str, torch.Tensor] = {}
    for shard in shards:
        whole |= load_file(str(shard))
    expect = loaded.importer.to_canonical(loaded.hf_config,
                                          {k: v.float() for k, v in whole.items()})
    assert loaded.canonical.state.keys() == expect.state.keys()
    for k, v in expect.state.items():
        assert loaded.canonical.state[k].dtype == torch.float32
        assert torch.equal(loaded.canonical.state[k], v), k
    stock = loaded.stock_state
    assert isinstance(stock, StoredState) and set(stock) == set(whole)
    assert torch.equal(stock["model.norm.weight"], whole["model.norm.weight"].float())
    del whole  # (load_file's tensors are views of the mapped files)
    assert not mapped(shards)  # (reading stock_state left none)


def test_a_file_changed_since_loading_is_an_error_when_read(h, tmp_path):
    save_decoder(h, tmp_path / "m", 0)
    loaded = load_model(tmp_path / "m")
    save_decoder(h, tmp_path / "m", 1)
    with pytest.raises(GlmcError, match="changed on disk since"):
        loaded.stock_state["model.norm.weight"]


def test_a_nan_is_named_when_its_tensor_is_read(h, tmp_path):
    save_decoder(h, tmp_path / "m", 0, dtype=torch.float32)
    weights = tmp_path / "m" / "model.safetensors"
    state = load_file(str(weights))
    state["model.layers.1.mlp.up_proj.weight"][0, 0] = float("nan")
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.raises(GlmcError, match="tensor model.layers.1.mlp.up_proj.weight contains NaN"):
        load_model(tmp_path / "m")


def test_tensors_are_written_one_at_a_time_as_safetensors_writes_them(tmp_path):
    state = {"b": torch.randn(3, 4, dtype=torch.float64), "a": torch.tensor(2.5),
             "empty": torch.zeros(0, 3), "ids": torch.arange(5), "w": torch.randn(7, 2)}
    save_tensors(tmp_path / "x.safetensors", state, torch.bfloat16, metadata={"format": "pt"})
    back = load_file(str(tmp_path / "x.safetensors"))
    assert back.keys() == state.keys()
    for k, v in state.items():
        want = v.to(torch.bfloat16) if v.is_floating_point() else v
        assert back[k].dtype == want.dtype and torch.equal(back[k], want), k
    with safe_open(str(tmp_path / "x.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
    released = dict(state)
    save_tensors(tmp_path / "y.safetensors", released, release=True)
    assert released == {}
    assert all(torch.equal(v, state[k]) for k, v in load_file(str(tmp_path / "y.safetensors"))
               .items())


# -- certificates, one block at a time --------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_streamed_certificate_is_the_float64_one(h, tmp_path, arch, monkeypatch):
    """Each block's weights cast to float64 only while it runs: the logits of a float64
    copy of the whole stock module (to 1e-12 relative: in fact bit for bit), while no more
    than about one block's weights are held at once."""
    save_decoder(h, tmp_path / "m", 0, arch=arch, dtype=torch.float32)
    loaded = load_model(tmp_path / "m")
    x = random_inputs(loaded.canonical.config)
    with torch.no_grad():
        full = loaded.importer.stock_logits(loaded.stock_module(torch.float64), x)
        canonical_full = loaded.canonical.module(torch.float64)(x)
    held: list[weakref.ref] = []
    peak = [0]
    read = glmc.verify._read

    def tracked(state, key, dtype):
        t = read(state, key, dtype)
        held.append(weakref.ref(t))
        peak[0] = max(peak[0], sum(r().numel() for r in held if r() is not None))
        return t

    monkeypatch.setattr(glmc.verify, "_read", tracked)
    for logits, want in ((folder_logits(loaded, block_params=1), full),
                         (folder_logits(open_model(tmp_path / "m"), block_params=1), full),
                         (canonical_logits(loaded.canonical, block_params=1), canonical_full)):
        peak[0] = 0
        got = logits(x)
        assert got.dtype == torch.float64
        assert h.rel_diff(want, got) <= 1e-12
        assert peak[0] < loaded.canonical.n_params() / 2, (peak[0], loaded.canonical.n_params())
    for logits, want in ((folder_logits(loaded), full),
                         (canonical_logits(loaded.canonical), canonical_full)):
        assert h.rel_diff(want, logits(x)) <= 1e-12  # (a small model: one block, the whole)


def test_a_parameter_missing_from_the_state_is_named(h, tmp_path):
    save_decoder(h, tmp_path / "m", 0, dtype=torch.float32)
    loaded = load_model(tmp_path / "m")
    state = {k: v for k, v in loaded.canonical.state.items() if k != "blocks.1.mlp.fc.weight"}
    x = random_inputs(loaded.canonical.config)
    logits = glmc.verify.streamed_logits(lambda: loaded.canonical.family.build(
        loaded.canonical.config), state, lambda m, x: m(x), block_params=1)
    with pytest.raises(GlmcError, match="tensor blocks.1.mlp.fc.weight .* is missing"):
        logits(x)


# -- a pair that will not fit ----------------------------------------------------------------


def _no_work(*args, **kwargs):
    raise AssertionError("the models were loaded before the memory was checked")


@pytest.mark.parametrize("command", ["align", "merge"])
def test_a_pair_that_does_not_fit_in_memory_is_refused_before_loading(h, tmp_path, monkeypatch,
                                                                      capsys, command):
    """The estimate from the safetensors headers (both models in float32 plus the working
    set; align's bfloat16 pair in bfloat16, A streamed where it would not fit held, see
    ``tests/test_held.py`` and ``tests/test_streamed.py``) against
    MemAvailable: one line saying both and what would make it fit, exit 2, nothing loaded,
    nothing written."""
    for name, seed in (("a", 0), ("b", 1)):
        save_decoder(h, tmp_path / name, seed, max_shard_size="20KB")
    n = glmc.io.outputs.stored_params(tmp_path / "a")
    assert n == sum(p.numel() for p in load_model(tmp_path / "a").stock_module().parameters())
    pair, working = glmc.io.outputs.pair_memory(tmp_path / "a", tmp_path / "b")
    assert pair == 2 * 4 * n and working > 4 * n
    monkeypatch.setattr(glmc.io.outputs, "available_memory", lambda: 6_100_000)
    monkeypatch.setattr(glmc.io.folders, "load_model", _no_work)
    out = tmp_path / "out"
    capsys.readouterr()
    rc = main([command, str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"glmc {command}: error: "), err
    if command == "align":  # (held, it would not fit: A streamed, B alone)
        pair = glmc.io.outputs.pair_memory(tmp_path / "a", tmp_path / "b", half=True,
                                           stream=True)[0]
    dtype = ("bfloat16 (B alone: A streamed from its files)" if command == "align"
             else "float32")
    for fragment in (f"need about {glmc.io.outputs._size(pair)} in {dtype} plus",
                     "of working set; this machine has 6.1 MB available: free memory, or use a "
                     "machine with ≥ "):
        assert fragment in lines[0], lines[0]
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["a", "b"]


def test_a_pair_that_fits_is_not_refused(h, tmp_path, monkeypatch):
    for name, seed in (("a", 0), ("b", 1)):
        save_decoder(h, tmp_path / name, seed)
    need = sum(glmc.io.outputs.pair_memory(tmp_path / "a", tmp_path / "b"))
    monkeypatch.setattr(glmc.io.outputs, "available_memory", lambda: need)
    glmc.io.outputs.check_pair_memory(tmp_path / "a", tmp_path / "b")
    monkeypatch.setattr(glmc.io.outputs, "available_memory", lambda: need - 1)
    with pytest.raises(GlmcError, match="this machine has"):
        glmc.io.outputs.check_pair_memory(tmp_path / "a", tmp_path / "b")
    monkeypatch.setattr(glmc.io.outputs, "available_memory", lambda: None)  # (not Linux)
    glmc.io.outputs.check_pair_memory(tmp_path / "a", tmp_path / "b")


@pytest.mark.parametrize("command", ["merge", "barrier"])
def test_n_models_that_do_not_fit_in_memory_are_refused_before_loading(h, tmp_path, monkeypatch,
                                                                      capsys, command):
    """Three models: their float32 copies and the frame's working set (at least
    ``FRAME_COPIES``) against MemAvailable, one line, exit 2, nothing loaded or written;
    universe matching needs more than MergeMany, and says MergeMany would need less."""
    for name, seed in (("a", 0), ("b", 1), ("c", 2)):
        save_decoder(h, tmp_path / name, seed)
    folders = [str(tmp_path / n) for n in "abc"]
    n = glmc.io.outputs.stored_params(tmp_path / "a")

    def need(frame: str) -> int:
        per_model, fixed = glmc.io.outputs.FRAME_COPIES[frame]
        return (4 * 3 * n + int(4 * (per_model * 3 * n + fixed * n))
                + glmc.io.outputs.RUNTIME_BYTES)

    assert need("universe") > need("mergemany") > need("star")
    monkeypatch.setattr(glmc.io.outputs, "available_memory", lambda: need("mergemany"))
    glmc.io.outputs.check_models_memory(folders, "mergemany")  # (it fits)
    monkeypatch.setattr(glmc.io.folders, "load_model", _no_work)
    out = tmp_path / "out"
    args = [command, *folders, "--frame", "universe"]
    capsys.readouterr()
    rc = main(args + (["-o", str(out)] if command == "merge" else ["--data", "shakespeare"]))
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"glmc {command}: error: the 3 models "), err
    assert "(universe frame)" in lines[0] and "--frame mergemany" in lines[0], lines[0]
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["a", "b", "c"]


def test_a_pair_spread_over_ranks_needs_each_machine_s_share(h, tmp_path, monkeypatch):
    """Weight matching across 8 ranks, one per machine: a machine holds an eighth of the
    pair and of its copies (plus its own runtime and largest tensors), rank 0's too (it
    writes B aligned part by part). ``glmc align`` under torchrun checks this machine's
    share, not the whole pair."""
    from glmc.cli.align import spread_ranks
    from glmc.cli.main import build_parser

    for name, seed in (("a", 0), ("b", 1)):
        save_decoder(h, tmp_path / name, seed)
    a, b = tmp_path / "a", tmp_path / "b"
    n_b = glmc.io.outputs.stored_params(b)
    pair, working = glmc.io.outputs.pair_memory(a, b)
    beside = working - int(4 * glmc.io.outputs.MATCHING_COPIES * n_b)
    share = glmc.io.outputs.pair_memory(a, b, ranks=(1, 8))
    assert share == (pair // 8, int(4 * glmc.io.outputs.MATCHING_COPIES * n_b / 8) + beside)
    two = glmc.io.outputs.pair_memory(a, b, ranks=(2, 8))
    assert two[0] == pair * 2 // 8 and two[1] > share[1]

    args = build_parser().parse_args(["align", str(a), str(b), "-o", str(tmp_path / "o")])
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert spread_ranks(args, merging=False) == {"ranks": (1, 8)}
    assert spread_ranks(args, merging=True) == {}
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert spread_ranks(args, merging=False) == {}


def test_available_memory_reads_meminfo():
    free = glmc.io.outputs.available_memory()
    if not Path("/proc/meminfo").is_file():
        assert free is None
    else:
        assert free is not None and free > 0


# -- one process's share of a model (load_model's ``only``) -----------------------------------

#: Every family's importer, with the variants whose conversion differs: a tied head, GQA,
#: partial rotary with biases, Qwen2's q/k/v biases, a post-LayerNorm encoder.
SHARE_MODELS = {
    "gpt2": dict(tied=True), "vit": {}, "llama-tied": dict(tied=True),
    "qwen2": {}, "gpt_neox": dict(rotary_pct=0.5), "bert": {},
}


@pytest.fixture(scope="module")
def share_folders(tmp_path_factory) -> dict[str, Path]:
    from conftest import make_tiny

    tmp = tmp_path_factory.mktemp("shares")
    folders = {}
    for name, kw in SHARE_MODELS.items():
        arch = name.removesuffix("-tied")
        t = make_tiny(arch, seed=3, dtype=torch.float32, **kw)
        t.stock.to(torch.bfloat16 if arch == "llama" else torch.float32).save_pretrained(
            str(tmp / name))
        folders[name] = tmp / name
    return folders


@pytest.mark.parametrize("name", sorted(SHARE_MODELS))
def test_a_share_is_the_full_load_of_its_tensors_and_reads_no_other_matrix(
        name, share_folders, monkeypatch):
    """For random thirds of the canonical tensors: each wanted tensor equals the full load's
    (``torch.equal``), every other one is a placeholder of its shape on the meta device, and
    the stored matrices read are only those the wanted tensors are made from (vectors,
    small, are read always)."""
    import random

    folder = share_folders[name]
    full = load_model(folder).canonical
    read: list[str] = []
    stored_read = StoredState.read

    def recorded(self, key, dtype=None):
        read.append(key)
        return stored_read(self, key, dtype)

    monkeypatch.setattr(StoredState, "read", recorded)
    meta = open_model(folder).state.meta
    matrices = {k for k, t in meta.items() if t.dim() >= 2}
    rng = random.Random(name)
    names = sorted(full.state)
    for _ in range(3):
        only = set(rng.sample(names, len(names) // 3))
        read.clear()
        part = load_model(folder, only=only).canonical
        assert part.partial
        for n in names:
            t = part.state[n]
            if n in only:
                assert not t.is_meta and torch.equal(t, full.state[n]), n
            else:
                assert t.is_meta and t.shape == full.state[n].shape, n
        # (together, the matrices each wanted tensor alone reads; a tied embedding is read
        # for the embedding and for the head)
        got = [m for m in read if m in matrices]
        needed = set()
        for n in only:
            read.clear()
            load_model(folder, only={n})
            needed |= {m for m in read if m in matrices}
        assert set(got) == needed and needed < matrices


def test_a_conversion_that_reads_a_matrix_value_runs_whole(monkeypatch, share_folders):
    """An importer that branches on a matrix's values (here: the embedding's largest entry)
    cannot run over placeholders: the conversion runs whole, and the share still holds the
    full load's tensors."""
    from glmc.families.transformer.llama import DecoderImporter

    convert = DecoderImporter.to_canonical

    def branching(self, hf_config, state):
        model = convert(self, hf_config, state)
        if float(state["model.embed_tokens.weight"].abs().max()) > 1e9:  # (never)
            raise AssertionError
        return model

    monkeypatch.setattr(DecoderImporter, "to_canonical", branching)
    folder = share_folders["qwen2"]
    full = load_model(folder).canonical
    only = {"blocks.0.attn.q.weight", "blocks.1.mlp.fc.weight"}
    part = load_model(folder, only=only).canonical
    assert all(torch.equal(part.state[n], full.state[n]) for n in only)
    assert sum(not t.is_meta for t in part.state.values()) == len(only)


def test_a_share_of_a_glmc_folder_reads_only_its_tensors(tmp_path, monkeypatch):
    """A glmc folder holds the canonical tensors themselves: a share reads those alone."""
    from conftest import make_tiny

    from glmc.io.folders import write_model

    (tmp_path / "m").mkdir()
    write_model(tmp_path / "m", make_tiny("gpt2", seed=1, dtype=torch.float32).canonical(),
                stock=False)
    full = load_model(tmp_path / "m").canonical
    read: list[str] = []
    stored_read = StoredState.read
    monkeypatch.setattr(StoredState, "read",
                        lambda self, key, dtype=None: read.append(key) or stored_read(
                            self, key, dtype))
    only = {"blocks.1.attn.q.weight", "embed.tok"}
    part = load_model(tmp_path / "m", only=only).canonical
    assert sorted(read) == sorted(only)
    assert all(torch.equal(part.state[n], full.state[n]) for n in only)
    assert all(t.is_meta for n, t in part.state.items() if n not in only)


def test_a_read_tensor_updated_in_place_by_an_unread_one_is_refused_to_the_placeholders():
    """A placeholder cannot write its (absent) values into a read tensor, whose other
    references would keep the old ones: every in-place form raises ``Unreadable`` (the
    conversion then runs whole); a placeholder updated in place carries the sources of
    what was written into it, and an operation with one gives one."""
    from glmc.io.partial import Absent, Unreadable, placeholder

    w = placeholder(torch.empty(3, 4, device="meta"), ["w"])
    real = torch.randn(3, 4)
    for update in (lambda: real.add_(w), lambda: real.__iadd__(w),
                   lambda: real.__setitem__(0, w[0]), lambda: torch.add(real, w, out=real),
                   lambda: real.copy_(w)):
        with pytest.raises(Unreadable):
            update()
    x = placeholder(torch.empty(3, 4, device="meta"), ["x"])
    x.add_(w)
    assert isinstance(x, Absent) and x.sources == {"x", "w"}
    y = (real * x[:, :2].sum(1, keepdim=True)).T
    assert isinstance(y, Absent) and y.sources == {"x", "w"} and y.shape == (4, 3)
    assert isinstance(real * 2, torch.Tensor) and not isinstance(real * 2, Absent)
