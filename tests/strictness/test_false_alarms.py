"""No false alarms: each function below is pure as far as a caller can tell, so fjit must trace it,
give eager's answer, and raise or warn nothing."""
from __future__ import annotations

import copy
import logging
import random
import warnings

import numpy as np
import pytest
import torch

import fjit

LOG = logging.getLogger("fjit.tests.false_alarms")


def assert_no_alarm(fn, *args):
    want = fn(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # a SharpEdgeWarning (or any warning) fails the test
        got = fjit.jit(fn)(*args)
        report = fjit.diagnose(fn, *args)
    torch.testing.assert_close(got, want)
    assert report.ok and report.edges == [], str(report)


# ----------------------------------------------------------------------------- copies of inputs

def copy_list_then_append(xs):
    ys = copy.copy(xs)
    ys.append(xs[0] * 2)
    return ys


def deepcopy_list_then_append(xs):
    ys = copy.deepcopy(xs)
    ys.append(xs[0] * 2)
    ys[0] = ys[0] + 1
    return ys, xs


def copy_dict_then_setitem(d):
    e = copy.copy(d)
    e["z"] = d["a"] + 1
    del e["a"]
    return e


def deepcopy_dict_then_update(d):
    e = copy.deepcopy(d)
    e.update(z=d["a"] * 3)
    e.pop("a")
    return e, d


def deepcopy_nested_then_mutate(d):
    e = copy.deepcopy(d)
    e["xs"].append(e["a"] + 1)
    e["xs"].sort(key=lambda t: t.shape[0])
    return e


COPY_CASES = [
    (copy_list_then_append, ([torch.ones(3), torch.zeros(3)],)),
    (deepcopy_list_then_append, ([torch.ones(3), torch.zeros(3)],)),
    (copy_dict_then_setitem, ({"a": torch.ones(3), "b": torch.zeros(2)},)),
    (deepcopy_dict_then_update, ({"a": torch.ones(3)},)),
    (deepcopy_nested_then_mutate, ({"a": torch.ones(3), "xs": [torch.zeros(3)]},)),
]


@pytest.mark.parametrize("fn,args", COPY_CASES, ids=[f.__name__ for f, _ in COPY_CASES])
def test_mutating_a_copy_of_an_input_container_is_not_fj103(fn, args):
    assert_no_alarm(fn, *args)


def test_the_callers_containers_are_untouched():
    xs, d = [torch.ones(3)], {"a": torch.ones(3)}
    fjit.jit(deepcopy_list_then_append)(xs)
    fjit.jit(deepcopy_dict_then_update)(d)
    assert len(xs) == 1 and list(d) == ["a"]


# ----------------------------------------------------------------------------- logging queries

def level_query_in_if(x):
    if LOG.isEnabledFor(logging.DEBUG):
        return x + 1
    return x - 1


def effective_level(x):
    return x * LOG.getEffectiveLevel()


def get_logger_by_module_name(x):
    logger = logging.getLogger(__name__)
    child = logger.getChild("sub")
    if child.isEnabledFor(logging.INFO) or logger.hasHandlers():
        return x + 2
    return x + logging.getLevelName("INFO") == "INFO"


def root_logger_level(x):
    return x + logging.getLogger().getEffectiveLevel()


LOG_CASES = [level_query_in_if, effective_level, get_logger_by_module_name, root_logger_level]


@pytest.mark.parametrize("fn", LOG_CASES, ids=lambda f: f.__name__)
def test_logging_level_queries_are_not_side_effects(fn):
    assert_no_alarm(fn, torch.ones(3))


def test_logging_below_the_effective_level_is_still_fj104():
    # Documented choice: a logging call is a side effect whatever the level, because the level
    # can change between calls and a compiled call would never log.
    def debug_call(x):
        LOG.debug("x: %s", x.shape)
        return x + 1

    LOG.setLevel(logging.WARNING)
    with pytest.raises(fjit.SideEffectError) as info:
        fjit.jit(debug_call)(torch.ones(3))
    assert info.value.lineno == debug_call.__code__.co_firstlineno + 1


# ----------------------------------------------------------------------------- nn.init on intermediates

def init_zeros(x):
    w = torch.empty(3)
    torch.nn.init.zeros_(w)
    return x + w


def init_ones_then_scale(x):
    w = torch.empty(3, 3)
    torch.nn.init.ones_(w)
    return x @ (w * 0.5)


def init_eye(x):
    w = torch.empty(3, 3)
    torch.nn.init.eye_(w)
    return x @ w


INIT_CASES = [init_zeros, init_ones_then_scale, init_eye]


@pytest.mark.parametrize("fn", INIT_CASES, ids=lambda f: f.__name__)
def test_nn_init_on_an_intermediate(fn):
    assert_no_alarm(fn, torch.arange(3.0))


# ----------------------------------------------------------------------------- state that is only read

class Scaler:
    def __init__(self):
        self.factor = 2.0
        self.history = []

    def scale(self, x):
        return x * self.factor + len(self.history)


SCALER = Scaler()


def reads_a_global_object_through_a_method(x):
    return SCALER.scale(x)


def seeded_generators_made_inside(x):
    # Deterministic: eager draws the same numbers on every call too.
    r = random.Random(0)
    g = np.random.default_rng(0)
    return x + r.random() + float(g.normal())


@pytest.mark.parametrize("fn", [reads_a_global_object_through_a_method,
                                seeded_generators_made_inside], ids=lambda f: f.__name__)
def test_reached_state_and_generator_detectors_leave_pure_code_alone(fn):
    # The detectors of state reached through objects and of Python/numpy generators must not flag
    # reading a global object that is never written, nor a generator seeded inside the function.
    assert_no_alarm(fn, torch.ones(3))


# -- dispatch-side false alarms (proxies and opaque calls) --------------------------------------

def test_vmap_inside_a_jitted_function_traces_as_one_op():
    def f(x, w):
        rows = torch.vmap(lambda r: r * 2 + r.sum())(x)
        dots = torch.func.vmap(torch.dot, in_dims=(0, None))(x, w)
        return rows + dots[:, None]
    x, w = torch.randn(3, 4), torch.randn(4)
    jf = fjit.jit(f)
    for _ in range(2):
        torch.testing.assert_close(jf(x, w), f(x, w))
    assert torch.vmap.__module__.startswith("torch")     # restored after tracing


def test_cpu_and_to_copy_on_a_cpu_input_then_writing_the_copy():
    def f(x):
        y = x.to(torch.float32, copy=True)
        y.add_(1)
        z = x.cpu() * 2
        return y, z
    x = torch.randn(3)
    x0 = x.clone()
    got, expected = fjit.jit(f)(x), f(x.clone())
    torch.testing.assert_close(got, expected)
    assert torch.equal(x, x0)


def _library_layers():
    torch.manual_seed(0)
    conv = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1),
        torch.nn.GroupNorm(2, 4), torch.nn.SiLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(4, 3)).eval()
    encoder = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()
    return [(conv, torch.randn(2, 3, 9, 9).to(memory_format=torch.channels_last)),
            (encoder, torch.randn(2, 5, 16))]


def test_functional_call_writes_its_parameter_dict_back_unchanged_no_fj103():
    # torch.func.functional_call ends with params.update({k: params[k] ...}) of the very same
    # objects: not a mutation of the input dict
    for module, x in _library_layers():
        params = {**dict(module.named_parameters()), **dict(module.named_buffers())}

        def f(params, x):
            return torch.func.functional_call(module, params, (x,))
        torch.testing.assert_close(fjit.jit(f)(params, x), f(params, x))


def test_a_real_write_into_an_input_dict_is_still_fj103():
    def f(d, x):
        d.update({"w": x * 2})       # a new object under an existing key
        return d["w"]
    with pytest.raises(fjit.InputMutationError):
        fjit.jit(f)({"w": torch.ones(2)}, torch.ones(2))


def test_library_layers_under_autocast_from_the_caller():
    for module, x in _library_layers():
        params = {**dict(module.named_parameters()), **dict(module.named_buffers())}

        def f(params, x):
            return torch.func.functional_call(module, params, (x,))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, expected = fjit.jit(f)(params, x), f(params, x)
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.float(), expected.float(), atol=1e-2, rtol=1e-2)


def test_torch_device_made_inside_the_function():
    """torch.device(type='cpu') is a value: the tracer's function mode must not turn its 'cpu'
    into the meta device (found by the torch.compile backend's FX graphs)."""
    def f(x):
        return x.to(torch.device(type="cpu")) + torch.ones(2, device=torch.device("cpu"))
    x = torch.ones(2)
    torch.testing.assert_close(fjit.jit(f)(x), f(x))


def test_requires_grad_on_a_detached_alias_of_an_input_is_no_write():
    """x.detach().requires_grad_() sets a flag of the detached tensor alone: eager writes no data
    and x keeps its own flag.  It was reported as FJ102 (a write through a view of input 'x');
    requires_grad_ on the input itself still is one."""
    def detached_leaf(x):
        y = x.detach().requires_grad_()
        return (y * 2).sin() + x

    def flagged_later(x):
        y = x.detach()
        y.requires_grad_(True)
        return y.cos()
    x = torch.randn(5)
    for fn in (detached_leaf, flagged_later):
        assert_no_alarm(fn, x)
        out = fjit.jit(fn)(x)
        assert out.requires_grad and not x.requires_grad
    with pytest.raises(fjit.InputMutationError, match="requires_grad_ writes to input"):
        fjit.jit(lambda x: x.requires_grad_() * 2)(torch.randn(3))

    def write_after(x):      # the flagged alias still shares x's data: a write through it is one
        y = x.detach().requires_grad_()
        with torch.no_grad():
            y.add_(1)
        return y * 2
    with pytest.raises(fjit.InputMutationError, match="add_ writes to input 'x'.*through a view"):
        fjit.jit(write_after)(torch.randn(3))


def test_requires_grad_assignment_is_requires_grad_():
    """`t.requires_grad = True` is `t.requires_grad_(True)`, as in eager.  transformers' Wav2Vec2
    and HuBERT feature encoders set it on a view of their input (`hidden_states = input_values[:, None];
    hidden_states.requires_grad = True`, for gradient checkpointing); the proxy's property had no
    setter, and fjit.jit failed with an internal AttributeError.  On the input itself it is FJ102."""
    def view_flagged(x, w):
        h = x[:, None]
        h.requires_grad = True
        return (h * w).sum()

    def computed_flagged(x):
        h = x * 2
        h.requires_grad = True
        return h.sin()
    x, w = torch.randn(3, 4), torch.randn(1, 4, requires_grad=True)
    assert_no_alarm(view_flagged, x, w)
    jf = fjit.jit(view_flagged)
    for _ in range(2):           # compiling call and cached call
        out, ref = jf(x, w), view_flagged(x, w)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(torch.autograd.grad(out, w)[0], torch.autograd.grad(ref, w)[0])
    assert not x.requires_grad
    assert fjit.jit(computed_flagged)(x).requires_grad
    with pytest.raises(fjit.InputMutationError, match="requires_grad_ writes to input 'x'"):
        fjit.jit(lambda x: setattr(x, "requires_grad", True) or x * 2)(torch.randn(3))


def test_grad_assignment_is_a_located_error_or_nothing():
    """`t.grad = None` on a value the function computed clears nothing, as in eager; on an input
    it is the caller's state, and any other value is an earlier backward's: a located FJ202, where
    the proxy had no setter and raised an internal AttributeError."""
    def clears(x):
        h = x * 2
        h.grad = None
        h[0].grad = None          # a view of a computed value: nothing to clear either
        return h + 1
    x = torch.randn(3)
    torch.testing.assert_close(fjit.jit(clears)(x), clears(x))
    with pytest.raises(fjit.UnsupportedOpError, match="FJ202.*assigning .grad"):
        fjit.jit(lambda x: setattr(x, "grad", None) or x * 2)(torch.randn(3))
    with pytest.raises(fjit.UnsupportedOpError, match="FJ202.*assigning .grad"):
        fjit.jit(lambda x: setattr(x[0], "grad", None) or x * 2)(torch.randn(3))


def test_a_lazy_module_before_its_first_call_is_fj201_with_its_own_fix():
    """nn.LazyLinear's parameters are placeholders until its first call: FJ201 names the
    placeholder's type and says to call the module once first (the generic fix for a tensor
    subclass, as_subclass, would be wrong advice); after one eager call it compiles."""
    model = torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.ReLU())
    x = torch.randn(3, 6)
    with pytest.raises(fjit.UnsupportedInputError, match="UninitializedParameter.*call the module once eagerly"):
        fjit.jit(model)(x)
    with torch.no_grad():
        model(x)
    torch.testing.assert_close(fjit.jit(model)(x), model(x))


# ----------------------------------------------------------------------------- torch's own imports

def test_a_module_torch_imports_on_first_use_is_not_the_functions_side_effect():
    """torch.utils.checkpoint imports torch.distributed.tensor on its first use, which registers
    pytree nodes (a global dict of torch's changes): in a fresh process that was FJ104 "mutation of
    'SUPPORTED_NODES'", located in fjit's own code.  Run in a process of its own, where nothing
    has imported it yet."""
    import subprocess
    import sys
    program = (
        "import sys, torch, fjit\n"
        "from torch.utils.checkpoint import checkpoint\n"
        "assert 'torch.distributed.tensor' not in sys.modules\n"
        "f = lambda x: checkpoint(lambda y: y.sin() * 2, x, use_reentrant=False)\n"
        "x = torch.randn(3, requires_grad=True)\n"
        "torch.testing.assert_close(fjit.jit(f)(x), f(x))\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
