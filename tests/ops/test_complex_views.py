"""Property tests of the conjugate and negative views: random compositions of `.H`, `.mH`, `.mT`,
`.T`, `adjoint()`, `conj()`, `torch._neg_view`, `resolve_conj()`, `resolve_neg()`,
`conj_physical()`, `view_as_real`/`view_as_complex`, `.real`/`.imag`, elementwise ops and in-place
ops on conjugated or negated views of intermediates, ended by a matmul, a reduction or nothing;
over inputs that carry the bits themselves or not.

Such a view holds its base's data and reads it conjugated or negated: a program that reads the
raw memory (a kernel, a reinterpretation of another view) reads another value, and a trace that
does not know the bits answers `is_conj()` and `resolve_conj()` wrongly.  Every call (the first,
which runs the traced ops, and the cached ones, which run the compiled program) must give
eager's values, eager's bits on the outputs and the traced answers, and eager's gradients.
"""
from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fjit

SETTINGS = dict(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck),
                derandomize=os.environ.get("FJIT_PROPERTY_RANDOM") != "1")
CALLS = 3


def _conj_add_(t):
    w = t.mul(2)
    w.conj().add_(1 + 1j)        # writes conj(conj(w) + 1 + 1j) into w
    return w


def _conj_mul_(t):
    c = (t * 1).conj()
    c.mul_(1j)                   # c is still a conjugated view of what it wrote
    return c


def _mH_mul_(t):
    w = t * 1
    w.mH.mul_(2j)                # through a transposed conjugated view
    return w


def _conj_physical_(t):
    w = t * 1
    w.conj_physical_()
    return w


def _neg_sub_(t):
    n = torch._neg_view(t * 1)
    n.sub_(1)
    return n


# name -> (the op on a complex value, whether it applies to a value of that many dims)
STEPS = {
    "H": (lambda t: t.H, lambda ndim: ndim == 2),
    "T": (lambda t: t.T, lambda ndim: ndim == 2),
    "mH": (lambda t: t.mH, lambda ndim: ndim >= 2),
    "mT": (lambda t: t.mT, lambda ndim: ndim >= 2),
    "adjoint": (lambda t: t.adjoint(), lambda ndim: ndim >= 2),
    "conj": (torch.conj, lambda ndim: True),
    "neg_view": (torch._neg_view, lambda ndim: True),
    "neg": (torch.neg, lambda ndim: True),
    "conj_physical": (torch.conj_physical, lambda ndim: True),
    "resolve_conj": (torch.resolve_conj, lambda ndim: True),
    "resolve_neg": (torch.resolve_neg, lambda ndim: True),
    "scale": (lambda t: t * (0.5 - 2j), lambda ndim: True),
    "add": (lambda t: t + 1, lambda ndim: True),
    "as_real_and_back": (lambda t: torch.view_as_complex(torch.view_as_real(t.resolve_conj())),
                         lambda ndim: True),
    "parts": (lambda t: torch.complex(t.real, t.conj().imag), lambda ndim: True),
    "conj_add_": (_conj_add_, lambda ndim: True),
    "conj_mul_": (_conj_mul_, lambda ndim: True),
    "neg_sub_": (_neg_sub_, lambda ndim: True),
    "mH_mul_": (_mH_mul_, lambda ndim: ndim >= 2),
    "conj_physical_": (_conj_physical_, lambda ndim: True),
}

HEADS = {
    "none": (lambda t: t, lambda ndim: True),
    "sum": (lambda t: t.sum(-1), lambda ndim: True),
    "abs_mean": (lambda t: t.abs().mean(), lambda ndim: True),
    "gram": (lambda t: t.mH @ t, lambda ndim: ndim >= 2),
    "outer": (lambda t: t @ t.H, lambda ndim: ndim == 2),
    "as_real": (lambda t: torch.view_as_real(t.resolve_conj()) * 2, lambda ndim: True),
}

# how an input comes: as it is, or itself a conjugated or negated view
INPUT_FORMS = {"plain": lambda z: z, "conj": torch.conj, "neg": torch._neg_view}


def _program(steps: list, head: str):
    def f(z):
        t = z
        for name in steps:
            t = STEPS[name][0](t)
        r = HEADS[head][0](t)
        return r, r.is_conj(), r.is_neg(), t.is_conj(), t.is_neg()
    return f


def _assert_same(got, want):
    """Values, and the conjugate and negative bits, of eager's result."""
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        assert (got.is_conj(), got.is_neg()) == (want.is_conj(), want.is_neg())
        torch.testing.assert_close(got.resolve_conj().resolve_neg(), want.resolve_conj().resolve_neg())
    else:
        assert got == want


def _loss(r: torch.Tensor) -> torch.Tensor:
    """A real loss whose gradient reads every real and imaginary part."""
    parts = torch.view_as_real(r.resolve_conj()) if r.is_complex() else r
    return (parts * parts).sum() + parts.sum()


@st.composite
def _compositions(draw):
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    ndim = len(shape)
    names = [n for n, (_, fits) in STEPS.items() if fits(ndim)]
    steps = draw(st.lists(st.sampled_from(names), min_size=1, max_size=5))
    head = draw(st.sampled_from([n for n, (_, fits) in HEADS.items() if fits(ndim)]))
    dtype = draw(st.sampled_from([torch.complex64, torch.complex128]))
    form = draw(st.sampled_from(list(INPUT_FORMS)))
    return shape, steps, head, dtype, form


@settings(**SETTINGS)
@given(case=_compositions())
def test_conjugate_and_negative_views_match_eager(case):
    shape, steps, head, dtype, form = case
    f = _program(steps, head)
    jf = fjit.jit(f)
    z = torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(0))
    # then the other forms: an input's bits are part of the cache key
    for name in [form] * CALLS + [n for n in INPUT_FORMS if n != form] + [form]:
        x = INPUT_FORMS[name](z)
        for got, want in zip(jf(x), f(x), strict=True):
            _assert_same(got, want)


@settings(**SETTINGS)
@given(case=_compositions())
def test_conjugate_and_negative_views_give_eagers_gradients(case):
    shape, steps, head, dtype, form = case
    f = _program(steps, head)
    jf = fjit.jit(f)
    z = torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(0))
    for _ in range(CALLS):
        grads = []
        for fn in (jf, f):
            leaf = z.clone().requires_grad_()
            r = fn(INPUT_FORMS[form](leaf))[0]
            grads.append((r.detach(), *torch.autograd.grad(_loss(r), leaf)))
        _assert_same(grads[0][0], grads[1][0])
        torch.testing.assert_close(grads[0][1], grads[1][1])


def test_a_conjugated_view_is_never_a_reinterpretation_of_its_base():
    """The report: `z.H` became `reinterpret(z, ...)` in the compiled program, which reads z's
    data unconjugated, so every call after the first (which runs the traced ops) was wrong."""
    f = lambda z: (z.H * 2).resolve_conj()    # noqa: E731
    jf = fjit.jit(f)
    z = torch.randn(3, 4, dtype=torch.complex64)
    for _ in range(CALLS):
        _assert_same(jf(z), f(z))
    assert "reinterpret(z" not in str(fjit.last_traces(jf)[-1])


# -- negative views of real values: what C kernels read ---------------------------------------

REAL_STEPS = {
    "neg_view": torch._neg_view,
    "resolve_neg": torch.resolve_neg,
    "neg": torch.neg,
    "scale": lambda t: t * 2,
    "sin": torch.sin,
    "add": lambda t: t + 1,
    "mT": lambda t: t.mT,
    "sum": lambda t: t.sum(-1, keepdim=True),
    "neg_sub_": _neg_sub_,
    "imag_of_conj": lambda t: torch.complex(t, t * 2).conj().imag,
}


@settings(**SETTINGS)
@given(steps=st.lists(st.sampled_from(list(REAL_STEPS)), min_size=1, max_size=5),
       shape=st.lists(st.integers(1, 5), min_size=2, max_size=3), negated_input=st.booleans(),
       requires_grad=st.booleans())
def test_negative_views_of_real_values_match_eager(steps, shape, negated_input, requires_grad):
    def f(x):
        t = x
        for name in steps:
            t = REAL_STEPS[name](t)
        return t, t.is_neg(), (t * 3).sum()
    jf = fjit.jit(f)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    for _ in range(CALLS):
        results = []
        for fn in (jf, f):
            leaf = x.clone().requires_grad_(requires_grad)
            out = fn(torch._neg_view(leaf) if negated_input else leaf)
            grads = torch.autograd.grad(_loss(out[0]), leaf) if requires_grad else ()
            results.append((out, grads))
        for got, want in zip(results[0][0], results[1][0], strict=True):
            _assert_same(got.detach() if isinstance(got, torch.Tensor) else got,
                         want.detach() if isinstance(want, torch.Tensor) else want)
        torch.testing.assert_close(results[0][1], results[1][1])
