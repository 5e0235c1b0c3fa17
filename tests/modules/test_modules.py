"""fjit.jit(nn.Module): parameters and buffers as runtime inputs, the cache key, the wrapper's
nn.Module behaviour, buffer write-back, sharp edges, hooks, and torch's own layers.

Training equivalence over several optimizer steps lives in tests/modules/test_module_training.py.
"""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fjit


def mlp(seed=0, width=16):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, width), nn.GELU(), nn.Dropout(0.5), nn.Linear(width, 4))


def conv_bn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())


# ----------------------------------------------------------------------------- the wrapper

def test_jit_of_a_module_is_a_module_that_computes_what_it_computes():
    model = mlp().eval()
    jm = fjit.jit(model)
    assert isinstance(jm, nn.Module) and isinstance(jm, fjit.FjitModule)
    x = torch.randn(5, 8)
    torch.testing.assert_close(jm(x), model(x))
    # the parameters are inputs of the trace, not constants
    trace = fjit.last_traces(jm)[-1]
    assert {v.name for v in trace.inputs} >= {"p_0_weight", "p_0_bias", "p_3_weight", "p_3_bias"}
    assert not trace.consts


def test_the_wrapper_answers_what_a_jitted_function_answers():
    """fjit.explain, fjit.cache_info, fjit.last_traces and the lru_cache-style methods take the
    wrapper as they take a jitted function (explain was a TypeError, and jm.cache_info() an
    AttributeError naming the wrapped Linear)."""
    jm = fjit.jit(nn.Linear(3, 4))
    jm.cache_clear()            # wrappers of equal modules share programs: start from none
    x = torch.randn(2, 3)
    jm(x)
    jm(x)
    jm(torch.randn(5, 3))
    assert jm.cache_info() == fjit.cache_info(jm) == (1, 2, 2)
    text = str(fjit.explain(jm))
    assert text.startswith("fjit: 'Linear.forward' compiled 2 times (1 cache hits, 2 programs cached)")
    assert "argument 'input'" in text and "shape (2, 3) -> (5, 3)" in text
    assert "linear" in str(fjit.last_traces(jm)[-1])
    assert isinstance(fjit.last_backward_traces(jm), list)
    jm.cache_clear()
    assert jm.cache_info() == (0, 0, 0) and fjit.last_traces(jm) == []
    torch.testing.assert_close(jm(x), jm._fj_module(x))
    assert jm.cache_info() == (0, 1, 1)
    with pytest.raises(TypeError, match="fjit.explain expects a function or module made by fjit.jit, got Linear"):
        fjit.explain(nn.Linear(3, 4))


def test_wrapper_state_is_the_modules_own():
    model = mlp()
    jm = fjit.jit(model)
    assert list(jm.state_dict()) == list(model.state_dict())
    assert all(a is b for a, b in zip(jm.parameters(), model.parameters()))
    assert [n for n, _ in jm.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert getattr(jm, "0") is model[0]                  # attributes fall through to the module
    jm.eval()
    assert not model.training and not model[2].training
    jm.train()
    assert model.training and model[2].training
    other = mlp(seed=1)
    jm.load_state_dict(other.state_dict())
    torch.testing.assert_close(model[0].weight, other[0].weight)


def test_to_changes_the_modules_dtype_and_recompiles():
    model = mlp().eval()
    jm = fjit.jit(model)
    x = torch.randn(3, 8)
    jm(x)
    assert jm.to(torch.float64) is jm
    assert model[0].weight.dtype is torch.float64
    got = jm(x.double())
    assert got.dtype is torch.float64
    torch.testing.assert_close(got, model(x.double()))
    assert fjit.cache_info(jm).misses == 2


def test_pickle_and_deepcopy_give_a_working_wrapper_of_a_copy():
    model = mlp().eval()
    jm = fjit.jit(model)
    x = torch.randn(3, 8)
    jm(x)
    for clone in (pickle.loads(pickle.dumps(jm)), copy.deepcopy(jm)):
        assert isinstance(clone, fjit.FjitModule)
        torch.testing.assert_close(clone(x), model(x))
        assert getattr(clone, "0").weight is not model[0].weight
        with torch.no_grad():
            getattr(clone, "0").weight.add_(1.0)
        assert not torch.allclose(clone(x), model(x))   # its own parameters, read per call
    with pytest.raises(TypeError):
        fjit.FjitModule(lambda x: x, {})


# ----------------------------------------------------------------------------- runtime inputs, key

def test_parameter_updates_are_seen_without_a_recompile():
    model = mlp(width=17).eval()
    jm = fjit.jit(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(6, 8)
    for _ in range(3):
        opt.zero_grad()
        jm(x).square().sum().backward()
        opt.step()
        torch.testing.assert_close(jm(x), model(x))
    model[0].weight = nn.Parameter(torch.randn(17, 8))    # a new Parameter object, same metadata
    torch.testing.assert_close(jm(x), model(x))
    assert fjit.cache_info(jm).misses == 1


def test_train_eval_switch_never_reuses_a_stale_program():
    model = mlp(width=18)
    jm = fjit.jit(model)
    x = torch.randn(64, 8)
    with torch.no_grad():
        jm.eval()
        evaluated = jm(x)
        torch.testing.assert_close(evaluated, model(x))
        jm.train()
        torch.manual_seed(3)
        trained = jm(x)
        torch.manual_seed(3)
        torch.testing.assert_close(trained, model(x))       # eager's dropout stream
        assert not torch.allclose(trained, evaluated)
        model[2].eval()                                     # one submodule's flag alone
        torch.testing.assert_close(jm(x), evaluated)
    assert fjit.cache_info(jm).misses == 3      # eval, train, train with dropout in eval


def test_identical_blocks_share_one_program_and_different_ones_do_not():
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(4)]
    jitted = [fjit.jit(b) for b in blocks]
    x = torch.randn(3, 8)
    h = x
    before = fjit.cache_info(jitted[0]).misses
    with torch.no_grad():
        for b, jb in zip(blocks, jitted):
            got = jb(h)
            torch.testing.assert_close(got, b(h))
            h = got
    assert fjit.cache_info(jitted[-1]) == fjit.cache_info(jitted[0])   # one shared cache
    assert fjit.cache_info(jitted[0]).misses == before + 1
    # other configuration (GELU's approximate), other program
    tanh = nn.Sequential(nn.Linear(8, 8), nn.GELU(approximate="tanh"))
    jt = fjit.jit(tanh)
    with torch.no_grad():
        torch.testing.assert_close(jt(x), tanh(x))
    assert fjit.cache_info(jt) != fjit.cache_info(jitted[0])
    assert fjit.cache_info(jitted[0]).misses == before + 1


def test_a_replaced_submodule_is_read_not_the_old_one():
    model = mlp().eval()
    jm = fjit.jit(model)
    x = torch.randn(3, 8)
    jm(x)
    model[1] = nn.Tanh()
    torch.testing.assert_close(jm(x), model(x))
    model[0] = nn.Linear(8, 16)
    torch.testing.assert_close(jm(x), model(x))


# ----------------------------------------------------------------------------- buffers

def test_batch_norm_buffers_are_written_back_as_eager_writes_them():
    net, ref = conv_bn(), conv_bn()
    jn = fjit.jit(net)
    for step in range(3):
        x = torch.randn(4, 3, 8, 8)
        torch.testing.assert_close(jn(x), ref(x))
        for (name, b), r in zip(net.named_buffers(), ref.buffers()):
            torch.testing.assert_close(b, r, msg=f"step {step}: {name}")
    assert int(net[1].num_batches_tracked) == 3
    trace = str(fjit.last_traces(jn)[-1])
    assert "'1.running_mean': " in trace and "'1.num_batches_tracked': " in trace   # the write-back
    running = net[1].running_mean.clone()
    jn.eval()
    ref.eval()
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(jn(x), ref(x))
    torch.testing.assert_close(net[1].running_mean, running)      # eval reads, never writes
    assert "running_mean': " not in str(fjit.last_traces(jn)[-1])


def test_buffer_objects_keep_their_identity():
    net = conv_bn()
    before = [id(b) for b in net.buffers()]
    fjit.jit(net)(torch.randn(2, 3, 6, 6))
    assert [id(b) for b in net.buffers()] == before


class _CachedIndices(nn.Module):
    """timm's ConViT: a registered buffer re-assigned in forward when the input's length changes
    (a cache), and one assigned an input statistic on every call."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 3)
        self.register_buffer("rel", torch.zeros(1, 1, 3), persistent=False)
        self.register_buffer("last_mean", torch.zeros(()), persistent=False)

    def forward(self, x):
        n = x.shape[1]
        if self.rel.shape[1] != n:
            self.rel = torch.arange(n * 3, dtype=x.dtype).reshape(1, n, 3) / n
        self.last_mean = x.mean().detach()
        return self.proj(x + self.rel).tanh()


def test_a_buffer_assigned_in_forward_is_the_modules_afterwards_as_in_eager():
    """Such an assignment was undone with the trace's state swap, silently: the module kept its
    old buffer ((1, 1, 3) where eager's holds (1, 16, 3)); now the program returns the value and
    the wrapper puts it in the buffer's slot, and the next call keys on the new buffer."""
    net = _CachedIndices()
    ref = copy.deepcopy(net)
    jn = fjit.jit(net)
    for step in range(4):
        x = torch.randn(2, 5 if step < 3 else 7, 3, generator=torch.Generator().manual_seed(step))
        got, want = jn(x), ref(x)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        want.sum().backward()
        for (name, b), r in zip(net.named_buffers(), ref.buffers()):
            torch.testing.assert_close(b, r, msg=f"step {step}: {name}")
        torch.testing.assert_close(net.proj.weight.grad, ref.proj.weight.grad)
    assert "rel" not in net.state_dict()


def test_functional_batch_norm_on_input_statistics_is_fj102():
    def f(x, mean, var):
        return F.batch_norm(x, mean, var, training=True)
    with pytest.raises(fjit.InputMutationError, match="batch_norm.*writes to input 'mean'"):
        fjit.jit(f)(torch.randn(3, 4), torch.zeros(4), torch.ones(4))

    def g(x):     # statistics the function made: functionalized, values as eager's
        mean, var = torch.zeros(4), torch.ones(4)
        return F.batch_norm(x, mean, var, training=True), mean, var
    x = torch.randn(3, 4)
    torch.testing.assert_close(fjit.jit(g)(x), g(x))


def test_instance_norm_running_statistics_written_back():
    model = nn.InstanceNorm1d(4, track_running_stats=True)
    ref = copy.deepcopy(model)
    jm = fjit.jit(model)
    for _ in range(2):
        x = torch.randn(3, 4, 7)
        torch.testing.assert_close(jm(x), ref(x))
    torch.testing.assert_close(model.running_mean, ref.running_mean)
    torch.testing.assert_close(model.running_var, ref.running_var)
    assert "'running_var': " in str(fjit.last_traces(jm)[-1])


# ----------------------------------------------------------------------------- sharp edges

class Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        self.last_batch = x.shape[0]
        return self.fc(x)


class ClampsWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        with torch.no_grad():
            self.fc.weight.clamp_(-0.1, 0.1)
        return self.fc(x)


def test_attribute_assignment_in_forward_is_fj104():
    with pytest.raises(fjit.SideEffectError, match="FJ104.*mutation of 'self'"):
        fjit.jit(Counting())(torch.randn(2, 3))


def test_inplace_write_to_a_parameter_is_fj102_naming_it():
    model = ClampsWeight()
    weight = model.fc.weight.detach().clone()
    with pytest.raises(fjit.InputMutationError, match="FJ102.*parameter 'fc.weight'"):
        fjit.jit(model)(torch.randn(2, 3))
    assert torch.equal(model.fc.weight, weight)


def test_global_module_parameter_is_fj101_naming_it_and_the_fix():
    model = mlp()
    glb = {"model": model, "torch": torch}
    exec("def uses_model(x):\n    return model(x).sum(-1)\n", glb)
    with pytest.raises(fjit.UnproxiedTensorError) as info:
        fjit.jit(glb["uses_model"])(torch.randn(2, 8))
    message = str(info.value)
    assert "global 'model', parameter '0.weight'" in message
    assert "fjit.jit(model)" in message and "functional_call" in message


def test_jit_of_a_bound_forward_is_fj101_naming_the_parameter():
    model = mlp()
    with pytest.raises(fjit.UnproxiedTensorError,
                       match="'self' of 'Sequential.forward', parameter '0.weight'.*fjit.jit.model."):
        fjit.jit(model.forward)(torch.randn(2, 8))


def test_a_module_passed_as_an_argument_is_fj201_suggesting_jit_of_it():
    with pytest.raises(fjit.UnsupportedInputError, match=r"FJ201.*fjit\.jit\(module\)"):
        fjit.jit(lambda m, x: m(x))(mlp(), torch.randn(2, 8))


def test_functional_call_inside_a_jitted_function():
    model = mlp().eval()

    def f(params, x):
        return torch.func.functional_call(model, params, (x,)).relu()
    params = dict(model.named_parameters())
    x = torch.randn(3, 8)
    torch.testing.assert_close(fjit.jit(f)(params, x), model(x).relu())


def test_diagnose_lists_the_configuration():
    model = mlp()
    report = fjit.diagnose(model, torch.randn(2, 8))
    assert report.ok
    shown = {(b.name, b.kind): b.type_name for b in report.bindings}
    assert shown[("0.in_features", "config")] == "int = 8"
    assert shown[("2.p", "config")] == "float = 0.5"
    assert shown[("1.approximate", "config")] == "str = 'none'"
    assert shown[("3", "submodule")] == "Linear"
    assert "config '0.out_features': int = 16" in str(fjit.diagnose(fjit.jit(model), torch.randn(2, 8)))
    bad = fjit.diagnose(Counting(), torch.randn(2, 3))
    assert [e.code for e in bad.edges] == ["FJ104"]


# ----------------------------------------------------------------------------- hooks

class KeywordModel(nn.Module):
    """Called as transformers models are: keyword tensors, Nones between them, a non-None default
    after them, and a default that is not None before one (which must not be passed)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x=None, mask=None, cache=None, labels=None, scale=2.0, extra=None):
        y = self.fc(x) * scale
        if mask is not None:
            y = y * mask
        loss = None if labels is None else (y - labels).square().mean()
        return y if extra is None else y + extra, loss


def test_keyword_calls_of_a_module_take_the_positional_fast_path_and_compute_eagers_result():
    """model(x=..., labels=...) is called with its keywords by position (Nones filled in between),
    which the fast path serves: every call is eager's, cached calls compile nothing, and a call
    the plan cannot cover (a default other than None in between, a forward pre-hook that takes
    keyword arguments) keeps its keywords and is still eager's."""
    torch.manual_seed(0)
    model = KeywordModel()
    jitted = fjit.jit(model)
    x, mask, labels, extra = (torch.randn(3, 6) for _ in range(4))
    calls = [dict(x=x, labels=labels), dict(x=x, mask=mask), dict(labels=labels, x=x),
             dict(x=x, extra=extra), dict(x=x, scale=0.5)]
    for kwargs in calls * 2:
        for got, want in zip(jitted(**kwargs), model(**kwargs)):
            if want is None:
                assert got is None
            else:
                torch.testing.assert_close(got, want)
    # (x, labels) and (labels, x) are one positional call: one program
    assert jitted.cache_info().misses == len(calls) - 1
    plans = jitted.__dict__["_fj_positions"]
    assert plans[0, ("x", "labels")] == ((True, "x"), (False, None), (False, None), (True, "labels"))
    assert plans[0, ("x", "extra")] is None          # scale's default 2.0 lies in between
    # a hook that reads the call's keywords gets them as the caller passed them
    model.register_forward_pre_hook(lambda m, args, kwargs: (args, {**kwargs, "mask": kwargs["mask"] * 3}),
                                    with_kwargs=True)
    for _ in range(2):
        got, _ = jitted(x=x, mask=mask)
        torch.testing.assert_close(got, model.fc(x) * 2.0 * mask * 3)


def test_forward_hooks_run_including_ones_registered_later():
    model = mlp().eval()
    jm = fjit.jit(model)
    x = torch.randn(3, 8)
    jm(x)
    handle = model[0].register_forward_hook(lambda m, args, out: out * 2)
    pre = model[3].register_forward_pre_hook(lambda m, args: (args[0] + 1,))
    torch.testing.assert_close(jm(x), model(x))
    handle.remove()
    torch.testing.assert_close(jm(x), model(x))
    pre.remove()
    torch.testing.assert_close(jm(x), model(x))


def test_a_hook_that_records_activations_is_fj104():
    model = mlp().eval()
    seen = []
    model[1].register_forward_hook(lambda m, args, out: seen.append(out))
    with pytest.raises(fjit.SideEffectError, match="FJ104"):
        fjit.jit(model)(torch.randn(2, 8))


def test_a_backward_hook_is_a_clear_error_before_any_trace():
    model = mlp().eval()
    model[3].register_full_backward_hook(lambda m, gi, go: None)
    with pytest.raises(fjit.UnsupportedOpError, match="FJ202.*module '3' has a backward hook"):
        fjit.jit(model)
    fresh = mlp().eval()
    jm = fjit.jit(fresh)
    jm(torch.randn(2, 8))
    fresh[0].register_full_backward_pre_hook(lambda m, go: None)   # registered after compiling
    with pytest.raises(fjit.UnsupportedOpError, match="module '0' has a backward hook"):
        jm(torch.randn(2, 8))


def test_forward_changing_a_torch_layers_configuration_is_fj104():
    class Annealing(nn.Module):     # the change is made to a torch layer, not to the user's class
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.5)

        def forward(self, x):
            self.drop.p = 0.1
            return self.drop(x)
    seq = nn.Sequential(nn.Linear(3, 3))
    seq.register_forward_pre_hook(lambda m, args: setattr(m[0], "in_features", 4))
    with pytest.raises(fjit.SideEffectError, match="attribute '0.in_features' was set"):
        fjit.jit(seq)(torch.randn(2, 3))
    with pytest.raises(fjit.SideEffectError, match="FJ104"):
        fjit.jit(Annealing())(torch.randn(2, 3))


def test_a_library_layer_setting_its_attribute_in_forward_is_fj104_at_that_line():
    """A layer of a library (not the user's code, so compared after the call rather than watched)
    that sets a public attribute in forward (transformers' Funnel: `self.pooling_mult = ...`) is
    FJ104 located at the storing line of its class, not at the call."""
    class Pooling(nn.Module):
        def __init__(self):
            super().__init__()
            self.mult = 1

        def forward(self, x):
            self.mult = 2
            return x * self.mult
    Pooling.__module__ = "torch.nn.modules.pooling"        # as a library's class
    line = Pooling.forward.__code__.co_firstlineno + 1
    with pytest.raises(fjit.SideEffectError, match="attribute '0.mult' was set") as raised:
        fjit.jit(nn.Sequential(Pooling()))(torch.randn(2, 3))
    assert f"test_modules.py:{line}:" in str(raised.value)


def test_cached_module_calls_take_the_generated_fast_path():
    """Parameters are torch.nn.Parameter, not torch.Tensor: the fast path must accept them, or
    every cached call walks its arguments (about 4 us more per call on a 3-layer MLP)."""
    from fjit.frontend.inputs import MISS
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    jm = fjit.jit(model)
    x = torch.randn(3, 4)
    jm(x)
    jm(x)
    state, flags = jm._fj_layout.read(model)
    out = jm._fj_jitted._cache.fast_call(*state, flags, x)
    assert out is not MISS
    torch.testing.assert_close(out[0], model(x))


def test_last_backward_traces_of_a_module():
    """fjit.last_backward_traces accepts the module wrapper, as last_traces does: an RMSNorm's
    backward (on values it recomputes: 2^16 elements) fuses into C kernels, and its gradients
    are eager's."""
    model = torch.nn.RMSNorm(256)
    jm = fjit.jit(model)
    x = torch.randn(256, 256)
    jm(x).square().sum().backward()
    got = model.weight.grad.clone()
    stages = fjit.last_backward_traces(jm)
    assert stages and "# C kernel" in str(stages[-1])
    model.weight.grad = None
    model(x).square().sum().backward()
    torch.testing.assert_close(got, model.weight.grad)


# ----------------------------------------------------------------------------- library patterns
# What third-party model code does (timm, transformers, torchvision): submodules shared between
# blocks, tied weights, caches filled on `self`, asking whether a compiler is tracing.

class _SharedPosEnc(nn.Module):
    """timm's CoaT: one positional-encoding conv shared by several serial blocks."""

    def __init__(self):
        super().__init__()
        self.cpe = nn.Linear(6, 6)
        self.blocks = nn.ModuleList([nn.Linear(6, 6) for _ in range(2)])
        for b in self.blocks:
            b.shared = self.cpe            # the same module registered under a second name
        self.head = nn.Linear(6, 3)
        self.head2 = nn.Linear(6, 3)
        self.head2.weight = self.head.weight   # a tied weight: two modules, one Parameter

    def forward(self, x):
        for b in self.blocks:
            x = b(x) + b.shared(x)
        return self.head(x) + self.head2(x)


def test_shared_submodules_and_tied_weights_come_back_as_they_went_in():
    torch.manual_seed(0)
    model = _SharedPosEnc()
    before = {n: p for n, p in model.named_parameters(remove_duplicate=False)}
    jm = fjit.jit(model)
    x = torch.randn(4, 6)
    for _ in range(2):
        out = jm(x)
        out.sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        model(x).sum().backward()
        for n, p in model.named_parameters():
            torch.testing.assert_close(grads[n], p.grad, msg=n)
        model.zero_grad()
    after = {n: p for n, p in model.named_parameters(remove_duplicate=False)}
    assert after.keys() == before.keys()
    assert all(after[n] is before[n] and type(after[n]) is nn.Parameter for n in after)
    assert model.blocks[0].shared is model.cpe and model.head2.weight is model.head.weight


class _CachesOnSelf(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind, self.lin = kind, nn.Linear(4, 4)
        self._pos, self.table = None, {}

    def forward(self, x):
        if self.kind == "attribute":
            if self._pos is None:
                self._pos = torch.arange(x.shape[0]).float()[:, None]   # CACHE-ATTRIBUTE
            return self.lin(x) + self._pos
        if x.shape[0] not in self.table:
            self.table[x.shape[0]] = torch.ones(x.shape[0], 4)           # CACHE-DICT
        return self.lin(x) + self.table[x.shape[0]]


@pytest.mark.parametrize("kind, marker", [("attribute", "CACHE-ATTRIBUTE"), ("dict", "CACHE-DICT")])
def test_a_cache_filled_in_forward_is_fj104_at_its_line_and_leaves_no_proxy(kind, marker):
    model = _CachesOnSelf(kind)
    with pytest.raises(fjit.SideEffectError, match="FJ104") as info:
        fjit.jit(model)(torch.randn(3, 4))
    line = next(i for i, text in enumerate(open(__file__).read().splitlines(), 1) if f"# {marker}" in text)
    assert info.value.lineno == line and 'backend="fjit"' in str(info.value)
    assert model._pos is None and model.table == {}      # the module as it was: no proxy kept
    model(torch.randn(3, 4))                             # and eager still runs it


def test_a_cache_filled_in_forward_leaves_no_proxy_in_warn_mode_either():
    model = _CachesOnSelf("attribute")
    x = torch.randn(3, 4)
    with pytest.warns(fjit.SharpEdgeWarning, match="FJ104"):
        jm = fjit.jit(model, sharp_edges="warn")
        out = jm(x)
    assert model._pos is None
    torch.testing.assert_close(out, model(x))


def test_torch_compiler_is_compiling_is_true_while_tracing_and_restored_after():
    """transformers' mask builders and torch.optim ask it to leave out data-dependent Python."""
    def f(x):
        if not torch.compiler.is_compiling() and bool((x > 0).all()):   # eager-only shortcut
            return x
        return x.relu() * 2
    x = torch.randn(5)
    torch.testing.assert_close(fjit.jit(f)(x), f(x))
    probes = fjit.jit(lambda x: (x + 1, torch.compiler.is_compiling(), torch._dynamo.is_compiling(),
                                 torch.compiler.is_dynamo_compiling()))(x)
    assert probes[1:] == (True, True, False)
    assert torch.compiler.is_compiling() is False

    def bad(x):
        raise ValueError("boom")
    with pytest.raises(ValueError):
        fjit.jit(bad)(x)
    assert torch.compiler.is_compiling() is False


def test_an_error_deep_in_library_code_names_the_chain_from_the_traced_function():
    class Deep(nn.Module):
        def forward(self, x):
            if x.sum() > 0:          # DEEP-BRANCH
                return x
            return -x

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(Deep())

        def forward(self, x):
            return self.inner(x) * 2
    with pytest.raises(fjit.DataDependentError) as info:
        fjit.jit(Outer())(torch.randn(3))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    line = next(i for i, text in enumerate(open(__file__).read().splitlines(), 1) if "# DEEP-BRANCH" in text)
    assert info.value.lineno == line
    assert "Outer.forward" in notes and f"test_modules.py:{line} in " in notes, notes


class _AttentionBiasCache(nn.Module):
    """timm's LeViT / EfficientViT / TinyViT: in eval mode, a tensor computed from a parameter is
    cached on `self` per device and reused by later calls."""

    def __init__(self):
        super().__init__()
        self.attention_biases = nn.Parameter(torch.randn(2, 5))
        self.register_buffer("idxs", torch.tensor([[0, 1, 2], [4, 3, 2], [1, 1, 0]]), persistent=False)
        self.attention_bias_cache = {}

    def biases(self, device):
        if self.training:
            return self.attention_biases[:, self.idxs]
        key = str(device)
        if key not in self.attention_bias_cache:
            self.attention_bias_cache[key] = self.attention_biases[:, self.idxs]
        return self.attention_bias_cache[key]

    def forward(self, x):
        return (x @ x.transpose(-1, -2) + self.biases(x.device)).softmax(-1)


def test_a_cache_computed_from_parameters_alone_is_recomputed_per_call_not_an_error():
    """Eager fills it once and reuses it; the compiled program computes it on every call, which
    gives the same values (functionalized), and the module keeps no proxy."""
    model = _AttentionBiasCache().eval()
    jm = fjit.jit(model)
    x = torch.randn(2, 3, 3)
    for _ in range(2):
        torch.testing.assert_close(jm(x), model(x))
    model.attention_bias_cache.clear()
    jm(x)
    assert model.attention_bias_cache == {}
