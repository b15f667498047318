"""Group elements against dense matrix algebra, random group elements, and Transform's
algebra (save/load, inverse, composition) on real canonical specs with nested head spaces."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glmc.errors import GlmcError
from glmc.families.transformer.circuit import to_circuit
from glmc.matching.parametrize import make_latent
from glmc.matching.steps import solve
from glmc.symmetry.groups import (
    BlockInvertibleGroup,
    BlockMatrix,
    BlockOrthogonalGroup,
    BlockPermutationGroup,
    Element,
    FixOnesGroup,
    GroupedPermutationGroup,
    Matrix,
    OrthogonalGroup,
    Permutation,
    PermutationGroup,
    RotaryGroup,
    element_from_tensors,
    element_meta,
    embed_fixing_ones,
    group_from_json,
    group_kind,
    ones_complement_basis,
)
from glmc.symmetry.spec import SymmetrySpec, inp, out
from glmc.symmetry.transform import Transform

F64 = torch.float64
TIGHT = {"rtol": 1e-10, "atol": 1e-10}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_invertible(n: int, g: torch.Generator) -> torch.Tensor:
    """A well-conditioned non-orthogonal matrix."""
    return torch.eye(n, dtype=F64) * 2 + 0.5 * torch.randn(n, n, generator=g, dtype=F64) / n**0.5


def random_orthogonal(n: int, g: torch.Generator) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=F64))
    return q


@st.composite
def elements(draw, size: int | None = None) -> Element:
    """A random element of any kind (of natural size ``size`` when given): permutation,
    orthogonal or general Matrix, orthogonal or general BlockMatrix."""
    kind = draw(st.sampled_from(["permutation", "matrix", "block_matrix"]))
    orthogonal = draw(st.booleans())
    g = gen(draw(st.integers(0, 2**31 - 1)))
    if size is None:
        size = draw(st.integers(1, 12))
    maker = random_orthogonal if orthogonal else random_invertible
    if kind == "permutation":
        return Permutation(torch.randperm(size, generator=g))
    if kind == "matrix":
        return Matrix(maker(size, g), orthogonal=orthogonal)
    block = draw(st.sampled_from([b for b in range(1, size + 1) if size % b == 0]))
    n = size // block
    return BlockMatrix(torch.stack([maker(block, g) for _ in range(n)]), orthogonal=orthogonal)


def dense_on(e: Element, axis_size: int) -> torch.Tensor:
    """The dense (axis_size, axis_size) map ``e`` is on an axis of that size: T ⊗ I on its
    chunks for a permutation or matrix; block g as I ⊗ M_g on chunk g for a block matrix."""
    if isinstance(e, BlockMatrix):
        r = axis_size // e.size
        return torch.block_diag(*[torch.kron(torch.eye(r, dtype=F64), b.double().contiguous())
                                  for b in e.blocks])
    c = axis_size // e.size
    return torch.kron(e.matrix(F64).contiguous(), torch.eye(c, dtype=F64))


def acting(e: Element, variance: str, axis_size: int | None = None) -> torch.Tensor:
    """The dense map that ``apply`` must use: T on an output side, T^{-T} on an input side."""
    t = dense_on(e, axis_size or e.size)
    return t if variance == "out" else torch.linalg.inv(t).T


# -- elements against dense matrices ------------------------------------------------------


@settings(max_examples=80)
@given(e=elements(), variance=st.sampled_from(["out", "in"]), seed=st.integers(0, 1000),
       lead=st.integers(1, 3), trail=st.integers(1, 3), copies=st.integers(1, 3))
def test_apply_is_dense_matrix_product_on_any_axis(e, variance, seed, lead, trail, copies):
    """On an axis of ``copies`` times its natural size too (chunks: a head permutation on
    head_dim rows per head, a key/value head's map on each query head of its group)."""
    n = e.size * copies
    x = torch.randn(lead, n, trail, generator=gen(seed), dtype=F64)
    t = acting(e, variance, n)
    torch.testing.assert_close(e.apply(x, 1, variance), torch.einsum("ij,ajb->aib", t, x),
                               **TIGHT)
    # The same on the first and on the last axis (the layouts of weights' two sides).
    x0 = x[0]
    torch.testing.assert_close(e.apply(x0, 0, variance), t @ x0, **TIGHT)
    torch.testing.assert_close(e.apply(x0.T.contiguous(), 1, variance), (t @ x0).T, **TIGHT)


@settings(max_examples=80)
@given(e=elements(), seed=st.integers(0, 10_000), data=st.data())
def test_conjugation_by_a_permutation_of_chunks_is_dense(e, seed, data):
    """P·E·P⁻¹ on a shared axis (the inner element applied first), for permutations that
    move whole blocks of E (or groups of them), and for finer ones that stay inside E's
    blocks where E commutes with them (a query-head order inside its key/value group)."""
    g = gen(seed)
    r = data.draw(st.integers(1, 3))  # copies of E's natural size on the axis
    axis = e.size * r
    if isinstance(e, BlockMatrix):
        coarser = [m for m in range(1, e.n + 1) if e.n % m == 0]
        m = data.draw(st.sampled_from(coarser + ([e.n * r] if r > 1 else [])))
    else:
        m = data.draw(st.sampled_from([d for d in range(1, e.size + 1) if e.size % d == 0]))
    if isinstance(e, BlockMatrix) and m == e.n * r:  # within each block's span only
        perm = torch.cat([i * r + torch.randperm(r, generator=g) for i in range(e.n)])
    else:
        perm = torch.randperm(m, generator=g)
    p = Permutation(perm)
    if isinstance(e, Matrix) and m != e.size:
        with pytest.raises(ValueError):
            e.conjugated(p, axis)
        return
    c = e.conjugated(p, axis)
    assert type(c) is type(e)
    dp = dense_on(p, axis)
    torch.testing.assert_close(dense_on(c, axis), dp @ dense_on(e, axis) @ dp.T, **TIGHT)


def test_input_side_applies_inverse_transpose():
    """W <- W T^{-1} on the input side of a Linear weight, for a non-orthogonal T."""
    g = gen(3)
    t = random_invertible(5, g)
    w = torch.randn(7, 5, generator=g, dtype=F64)
    e = Matrix(t, orthogonal=False)
    torch.testing.assert_close(e.apply(w, 1, "in"), w @ torch.linalg.inv(t), **TIGHT)
    torch.testing.assert_close(e.apply(w, 1, "out"), w @ t.T, **TIGHT)
    # The QK pairing is kept: (T q)·(T^{-T} k) = q·k.
    q, k = torch.randn(5, generator=g, dtype=F64), torch.randn(5, generator=g, dtype=F64)
    assert float(e.apply(q, 0, "out") @ e.apply(k, 0, "in")) == pytest.approx(float(q @ k))


@settings(max_examples=60)
@given(e=elements())
def test_inverse_is_matrix_inverse(e):
    eye = torch.eye(e.size, dtype=F64)
    torch.testing.assert_close(e.inverse().matrix(F64), torch.linalg.inv(e.matrix(F64)), **TIGHT)
    torch.testing.assert_close(e.inverse().matrix(F64) @ e.matrix(F64), eye, **TIGHT)


@settings(max_examples=60)
@given(data=st.data(), e=elements(), seed=st.integers(0, 1000))
def test_compose_is_matrix_product(data, e, seed):
    """self ∘ other: other first, T = T_self · T_other, also across element kinds."""
    other = data.draw(elements(size=e.size))
    c = e.compose(other)
    torch.testing.assert_close(c.matrix(F64), e.matrix(F64) @ other.matrix(F64), **TIGHT)
    x = torch.randn(e.size, 2, generator=gen(seed), dtype=F64)
    for variance in ("out", "in"):
        expected = e.apply(other.apply(x, 0, variance), 0, variance)
        torch.testing.assert_close(c.apply(x, 0, variance), expected, **TIGHT)


def test_permutation_moves_whole_chunks():
    p = Permutation(torch.tensor([2, 0, 1]))
    assert p.size == 3
    assert p.index(6).tolist() == [4, 5, 0, 1, 2, 3]
    x = torch.arange(6.0)
    assert p.apply(x, 0, "out").tolist() == [4, 5, 0, 1, 2, 3]
    assert not p.is_identity() and p.compose(p.inverse()).is_identity()
    with pytest.raises(ValueError, match="cannot act on an axis of size 7"):
        p.apply(torch.zeros(7), 0, "out")


@settings(max_examples=30)
@given(e=elements())
def test_element_tensors_round_trip(e):
    back = element_from_tensors(e.kind, e.tensors(), element_meta(e))
    assert type(back) is type(e)
    torch.testing.assert_close(back.matrix(F64), e.matrix(F64), rtol=0, atol=0)
    x = torch.randn(e.size, 3, dtype=F64)
    torch.testing.assert_close(back.apply(x, 0, "in"), e.apply(x, 0, "in"), rtol=0, atol=0)


def test_transforms_saved_with_a_block_size_still_load():
    """Earlier versions saved a head permutation with its block size; it is implied now."""
    e = element_from_tensors("permutation", {"perm": torch.tensor([1, 0])},
                             {"kind": "permutation", "block": 4})
    assert isinstance(e, Permutation) and e.perm.tolist() == [1, 0]


# -- groups ---------------------------------------------------------------------------------


def is_permutation_matrix(t: torch.Tensor) -> bool:
    return bool(((t == 0) | (t == 1)).all() and (t.sum(0) == 1).all() and (t.sum(1) == 1).all())


@settings(max_examples=25)
@given(n=st.integers(3, 24), seed=st.integers(0, 2**31 - 1))
def test_random_orthogonal_fixing_ones(n, seed):
    o = OrthogonalGroup(n).subgroup("fix_ones").random(gen(seed)).matrix(F64)
    ones = torch.ones(n, dtype=F64)
    torch.testing.assert_close(o @ o.T, torch.eye(n, dtype=F64), **TIGHT)
    torch.testing.assert_close(o @ ones, ones, **TIGHT)
    torch.testing.assert_close(o.T @ ones, ones, **TIGHT)
    assert not torch.allclose(o, torch.eye(n, dtype=F64))  # not trivially the identity


@settings(max_examples=25)
@given(n=st.integers(2, 24), seed=st.integers(0, 2**31 - 1))
def test_random_orthogonal_does_not_fix_ones_by_default(n, seed):
    o = OrthogonalGroup(n).random(gen(seed)).matrix(F64)
    torch.testing.assert_close(o @ o.T, torch.eye(n, dtype=F64), **TIGHT)
    ones = torch.ones(n, dtype=F64)
    assert float((o @ ones - ones).norm()) > 1e-6


def test_ones_complement_basis_is_orthonormal_and_orthogonal_to_ones():
    for n in (1, 2, 7):
        q = ones_complement_basis(n)
        assert q.shape == (n, n - 1)
        torch.testing.assert_close(q.T @ q, torch.eye(n - 1, dtype=F64), **TIGHT)
        torch.testing.assert_close(q.T @ torch.ones(n, dtype=F64), torch.zeros(n - 1, dtype=F64),
                                   **TIGHT)
    small = random_orthogonal(4, gen(0))
    big = embed_fixing_ones(small)
    torch.testing.assert_close(big @ big.T, torch.eye(5, dtype=F64), **TIGHT)


GROUPS = [
    PermutationGroup(6), GroupedPermutationGroup(6, groups=2), OrthogonalGroup(6),
    FixOnesGroup(6), BlockInvertibleGroup(4, 3), BlockOrthogonalGroup(4, 3),
    BlockPermutationGroup(4, 3), BlockPermutationGroup(3, 4, fixed=2), RotaryGroup(3, 4, 4),
    RotaryGroup(2, 6, 4), RotaryGroup(2, 6, 2, orthogonal=True),
]


def rotations(k: int, rotary: int, angles: torch.Tensor) -> torch.Tensor:
    """The rotary embedding's map at one position: pair (i, i + rotary/2) rotated by
    ``angles[i]`` (transformers' rotate-half layout), the other coordinates left alone."""
    h = rotary // 2
    r = torch.eye(k, dtype=F64)
    i = torch.arange(h)
    r[i, i], r[i + h, i + h] = torch.cos(angles), torch.cos(angles)
    r[i, i + h], r[i + h, i] = -torch.sin(angles), torch.sin(angles)
    return r


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: f"{g.kind}-{g.size}")
def test_random_elements_lie_in_their_group(group):
    e = group.random(gen(7))
    t = e.matrix(F64)
    assert e.size == group.size and t.shape == (group.size, group.size)
    eye = torch.eye(group.size, dtype=F64)
    if group.isometric:
        torch.testing.assert_close(t @ t.T, eye, **TIGHT)
    else:
        assert not torch.allclose(t @ t.T, eye, atol=1e-3)
    if isinstance(group, (PermutationGroup, GroupedPermutationGroup, BlockPermutationGroup)):
        assert is_permutation_matrix(t)
    if isinstance(group, GroupedPermutationGroup):
        assert group.contains(e) and not e.is_identity()
        assert not group.contains(Permutation(torch.tensor([3, 1, 2, 0, 4, 5])))
    if hasattr(group, "k"):
        k = group.k
        mask = torch.block_diag(*[torch.ones(k, k)] * group.n)
        assert bool((t[mask == 0] == 0).all())
        assert bool((torch.linalg.svdvals(t) > 0.5).all())  # well conditioned
    if isinstance(group, BlockPermutationGroup):  # the first ``fixed`` coordinates stay
        f = group.fixed
        for b in e.blocks:
            torch.testing.assert_close(b[:f, :f], torch.eye(f, dtype=F64))
    ident = group.identity(F64).matrix(F64)
    torch.testing.assert_close(ident, eye)


@settings(max_examples=40)
@given(n=st.integers(1, 3), half=st.integers(1, 4), rest=st.integers(0, 3),
       orthogonal=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_rotary_elements_commute_with_every_rotation(n, half, rest, orthogonal, seed):
    """Every element of the rotary group commutes with the rotary map at any position (so
    queries times M and keys times M⁻ᵀ keep every score); a general invertible map does
    not, and neither do rotations of adjacent pairs."""
    rotary, k = 2 * half, 2 * half + rest
    g = gen(seed)
    group = RotaryGroup(n, k, rotary, orthogonal=orthogonal)
    e = group.random(g)
    for _ in range(3):
        r = rotations(k, rotary, 10 * torch.randn(half, generator=g, dtype=F64))
        for m in e.blocks.double():
            torch.testing.assert_close(m @ r, r @ m, **TIGHT)
        general = BlockInvertibleGroup(1, k).random(g).blocks[0].double()
        assert not torch.allclose(general @ r, r @ general, atol=1e-6)
    if half > 1:  # a rotation of the adjacent pairs (0, 1), (2, 3)... is not in the group
        adjacent = torch.eye(k, dtype=F64)
        adjacent[:2, :2] = torch.tensor([[0.6, -0.8], [0.8, 0.6]], dtype=F64)
        r = rotations(k, rotary, torch.linspace(0.3, 2.0, half, dtype=F64))
        assert not torch.allclose(adjacent @ r, r @ adjacent, atol=1e-6)


def test_subgroups_and_permutations():
    """The ablations' groups: permutation matrices of each kind, the orthogonal subgroups,
    and the maps of a LayerNorm model's stream that fix the all-ones direction."""
    assert OrthogonalGroup(5).permutations() == PermutationGroup(5)
    assert OrthogonalGroup(5).subgroup("fix_ones") == FixOnesGroup(5)
    assert BlockInvertibleGroup(4, 3).subgroup("orthogonal") == BlockOrthogonalGroup(4, 3)
    assert BlockInvertibleGroup(4, 3).permutations() == BlockPermutationGroup(4, 3)
    assert RotaryGroup(2, 6, 4).permutations() == BlockPermutationGroup(2, 6, fixed=4)
    assert RotaryGroup(2, 6, 4).subgroup("orthogonal") == RotaryGroup(2, 6, 4, orthogonal=True)
    with pytest.raises(ValueError, match="no subgroup 'mirror'"):
        PermutationGroup(3).subgroup("mirror")
    with pytest.raises(ValueError, match="rotary dimensions 3 must be even"):
        RotaryGroup(1, 4, 3)


def test_group_kinds_are_types_named_by_their_kind():
    """``group_kind`` gives the kind's class; ``to_json`` names the kind and
    ``group_from_json`` reads it back."""
    assert group_kind("permutation") is PermutationGroup
    assert group_kind("orthogonal") is OrthogonalGroup
    assert BlockInvertibleGroup(4, 3) != BlockOrthogonalGroup(4, 3)
    for g in GROUPS:
        assert group_from_json(g.to_json()) == g
    assert PermutationGroup(6).to_json() == {"kind": "permutation", "n": 6}
    with pytest.raises(ValueError, match="unknown group kind 'mirror'"):
        group_kind("mirror")


def test_solve_maximises_a_linear_objective_over_the_group():
    """Weight matching's step (registered per group type in glmc.matching.steps): the
    element T with the largest ⟨T, m⟩, warm-started from the current element."""
    import itertools

    g = gen(3)
    m = torch.randn(4, 4, generator=g, dtype=F64)
    best = max(itertools.permutations(range(4)), key=lambda p: float(m[range(4), list(p)].sum()))
    heads = PermutationGroup(4)
    e = solve(heads, m, heads.identity())
    assert isinstance(e, Permutation) and e.perm.tolist() == list(best)
    assert solve(heads, m, e).perm.tolist() == list(best)  # (optimal: kept)
    grouped = solve(GroupedPermutationGroup(4, groups=2), m)
    for lo in (0, 2):  # each group's own best order
        sub = m[lo:lo + 2, lo:lo + 2]
        want = max(itertools.permutations(range(2)),
                   key=lambda p, sub=sub: float(sub[range(2), list(p)].sum()))
        assert (grouped.perm[lo:lo + 2] - lo).tolist() == list(want)
    for stream in (OrthogonalGroup(4), FixOnesGroup(4)):
        o = solve(stream, m, dtype=F64).matrix(F64)
        torch.testing.assert_close(o @ o.T, torch.eye(4, dtype=F64), **TIGHT)
        if isinstance(stream, FixOnesGroup):
            torch.testing.assert_close(o @ torch.ones(4, dtype=F64), torch.ones(4, dtype=F64))
        else:
            others = (stream.random(gen(s)).matrix(F64) for s in range(20))
            assert all(float((o * m).sum()) >= float((r * m).sum()) for r in others)
    with pytest.raises(TypeError, match="no step for a block_invertible group"):
        solve(BlockInvertibleGroup(2, 2), m)


def test_latents_start_at_their_element():
    """Each group type has its learned-matching latent (glmc.matching.parametrize); at the
    start it gives the start."""
    g = gen(5)
    for group in GROUPS:
        start = group.random(g)
        lat = make_latent(group, start, space="s")
        torch.testing.assert_close(lat().matrix(F64), start.matrix(F64), **TIGHT)
        torch.testing.assert_close(lat.element().matrix(F64), start.matrix(F64), **TIGHT)
        trains = any(p.requires_grad for p in lat.parameters())
        assert trains == (not isinstance(group, BlockPermutationGroup)), group
    with pytest.raises(GlmcError, match="space s: the start is not a permutation"):
        make_latent(PermutationGroup(5), OrthogonalGroup(5).identity(), space="s")
    assert make_latent(BlockInvertibleGroup(2, 3), OrthogonalGroup(6).identity()) is None


# -- Transform on canonical specs -----------------------------------------------------------


@pytest.fixture(params=["gpt2-heads", "vit-heads", "gpt2-circuit"])
def spec_and_state(request, h):
    arch, attention = request.param.split("-")
    model = h.make_tiny(arch, n_layer=2, d=12, n_head=3).canonical()
    if attention == "circuit":
        model = to_circuit(model)
    return model.spec, model.state


def assert_states_close(a, b, **tol):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=k, **(tol or TIGHT))


def test_spec_of_head_form_nests_inner_maps_inside_head_permutations(h):
    spec = h.make_tiny("gpt2", n_layer=1, d=12, n_head=3).canonical().spec
    assert spec.axes["blocks.0.attn.q.weight"][0] == out("qk.0", "heads.0")
    assert spec.axes["blocks.0.attn.k.weight"][0] == inp("qk.0", "heads.0")
    assert spec.axes["blocks.0.attn.o.weight"] == (out("res"), inp("ov.0", "heads.0"))
    assert spec.spaces["heads.0"] == PermutationGroup(3)
    assert spec.spaces["qk.0"] == BlockInvertibleGroup(3, 4)
    assert spec.roles["res"] == "residual" and spec.export == {"res": "fix_ones"}


def test_transform_compose_and_inverse_are_group_operations(spec_and_state):
    spec, state = spec_and_state
    t = Transform.random(spec, gen(1))
    u = Transform.random(spec, gen(2))
    tu = t.compose(u, spec)
    assert_states_close(tu.apply(spec, state), t.apply(spec, u.apply(spec, state)))
    assert_states_close(t.inverse(spec).apply(spec, t.apply(spec, state)), state)
    assert_states_close(t.apply(spec, t.inverse(spec).apply(spec, state)), state)
    assert_states_close(tu.inverse(spec).apply(spec, tu.apply(spec, state)), state)
    # (T∘U)⁻¹ = U⁻¹∘T⁻¹
    uiti = u.inverse(spec).compose(t.inverse(spec), spec)
    assert_states_close(uiti.apply(spec, state), tu.inverse(spec).apply(spec, state))


def test_transform_algebra_is_not_vacuous(spec_and_state):
    """The random elements really move every tensor the spec tags."""
    spec, state = spec_and_state
    moved = Transform.random(spec, gen(1)).apply(spec, state)
    for name, tags in spec.axes.items():
        if any(tags) and bool(state[name].any()):  # (canonical key and value biases are 0)
            assert not torch.allclose(moved[name], state[name]), name
    assert_states_close(Transform.identity(spec).apply(spec, state), state, rtol=0, atol=0)


@pytest.mark.parametrize(("roles_t", "roles_u"), [
    ({"qk", "ov"}, {"heads"}),
    ({"heads"}, {"qk", "ov"}),
    ({"residual", "mlp"}, {"heads", "qk"}),
])
def test_transform_algebra_with_partial_transforms(spec_and_state, roles_t, roles_u):
    """Transforms that leave some spaces out (the identity there) compose and invert too,
    including an inner map composed with a head permutation held by the other factor."""
    spec, state = spec_and_state

    def partial(seed, roles):
        t = Transform.random(spec, gen(seed))
        return Transform({k: e for k, e in t.elements.items() if spec.roles.get(k) in roles})

    t, u = partial(1, roles_t), partial(2, roles_u)
    assert_states_close(t.compose(u, spec).apply(spec, state),
                        t.apply(spec, u.apply(spec, state)))
    for x in (t, u):
        assert_states_close(x.inverse(spec).apply(spec, x.apply(spec, state)), state)


def test_transform_save_load_round_trip(spec_and_state, tmp_path):
    spec, state = spec_and_state
    t = Transform.random(spec, gen(5), subgroups={"residual": "fix_ones"})
    path = tmp_path / "sub" / "transform.safetensors"
    t.save(path)
    back = Transform.load(path)
    assert back.elements.keys() == t.elements.keys()
    for k, e in t.elements.items():
        assert type(back.elements[k]) is type(e), k
        assert element_meta(back.elements[k]) == element_meta(e)
        torch.testing.assert_close(back.elements[k].matrix(F64), e.matrix(F64), rtol=0, atol=0)
    assert_states_close(back.apply(spec, state), t.apply(spec, state), rtol=0, atol=0)
    assert [p.name for p in path.parent.iterdir()] == ["transform.safetensors"]  # no temp left


def test_transform_load_errors(tmp_path):
    with pytest.raises(GlmcError, match="no such transform file"):
        Transform.load(tmp_path / "missing.safetensors")
    from safetensors.torch import save_file

    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2)}, str(plain))
    with pytest.raises(GlmcError, match="not a glmc transform"):
        Transform.load(plain)


def test_spec_validate_and_occurrences():
    spec = SymmetrySpec(
        spaces={"res": OrthogonalGroup(4), "mlp": PermutationGroup(6)},
        axes={"fc.weight": (out("mlp"), inp("res")), "proj.weight": (out("res"), inp("mlp"))},
    )
    assert sorted(spec.occurrences("res")) == [("fc.weight", 1, "in"), ("proj.weight", 0, "out")]
    spec.validate({"fc.weight": (6, 4), "proj.weight": (4, 6)})
    with pytest.raises(ValueError, match="fc.weight axis 1 has size 5, which space 'res'"):
        spec.validate({"fc.weight": (6, 5), "proj.weight": (4, 6)})
    with pytest.raises(ValueError, match="lacks"):
        spec.validate({"fc.weight": (6, 4)})
    assert spec.to_json()["axes"]["fc.weight"] == [[["mlp", "out"]], [["res", "in"]]]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 6), k=st.integers(1, 16), seed=st.integers(0, 10_000),
       singular=st.integers(0, 2))
def test_polar_of_a_batch_is_the_svds_orthogonal_factor(n, k, seed, singular):
    """polar_batch (eigh of MᵀM, the SVD where M is ill-conditioned) maximises ⟨T, M⟩ over
    the orthogonal maps as the SVD's factor does: orthogonal, the same value, and the same
    map where M is well conditioned (float64, 1e-9)."""
    from glmc.matching.solvers import polar, polar_batch

    g = torch.Generator().manual_seed(seed)
    m = torch.randn(n, k, k, generator=g, dtype=torch.float64)
    for i in range(min(singular, n)):  # (rank-deficient members: the SVD takes them)
        m[i, :, 0] = 0.0
    got, want = polar_batch(m), polar(m)
    eye = torch.eye(k, dtype=torch.float64).expand(n, k, k)
    torch.testing.assert_close(got.mT @ got, eye, atol=1e-9, rtol=0)
    torch.testing.assert_close((got * m).sum((1, 2)), (want * m).sum((1, 2)), atol=1e-9,
                               rtol=1e-9)
    s = torch.linalg.svdvals(m)
    well = s[:, -1] > 1e-3 * s[:, 0]
    torch.testing.assert_close(got[well], want[well], atol=1e-9, rtol=0)
