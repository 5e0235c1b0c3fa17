"""Strictness has no holes: every side effect and every nondeterministic value below is an error of
the right class and code, located at the line that does it (marked `# <- here: <case>` in this
file), never a program that silently did it once, while tracing."""
from __future__ import annotations

import logging
import os
import pathlib
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import fjit

SOURCE = Path(__file__).read_text().splitlines()
TMP = tempfile.mkdtemp(prefix="fjit_strictness_")


def line_of(case: str) -> int:
    (line,) = [i for i, text in enumerate(SOURCE, 1) if text.rstrip().endswith(f"# <- here: {case}")]
    return line


def check(fn, cls, code, case, *args):
    args = args or (torch.ones(3),)
    with pytest.raises(cls) as info:
        fjit.jit(fn)(*args)
    e = info.value
    assert type(e) is cls, f"{type(e).__name__}: {e}"
    assert e.code == code, str(e)
    assert os.path.realpath(e.filename) == os.path.realpath(__file__), str(e)
    assert e.lineno == line_of(case), str(e)
    return e


# ----------------------------------------------------------------------------- the environment

os.environ["FJIT_STRICT_DOOMED"] = "1"


def env_setitem(x):
    os.environ["FJIT_STRICT_A"] = "1"  # <- here: env_setitem
    return x + 1


def env_update(x):
    y = x * 2
    os.environ.update(FJIT_STRICT_B="1")  # <- here: env_update
    return y


def env_putenv(x):
    os.putenv("FJIT_STRICT_C", "1")  # <- here: env_putenv
    return x + 1


def env_unsetenv(x):
    os.unsetenv("FJIT_STRICT_C")  # <- here: env_unsetenv
    return x + 1


def env_delitem(x):
    del os.environ["FJIT_STRICT_DOOMED"]  # <- here: env_delitem
    return x + 1


def env_setdefault(x):
    os.environ.setdefault("FJIT_STRICT_D", "1")  # <- here: env_setdefault
    return x + 1


def env_pop(x):
    os.environ.pop("FJIT_STRICT_NOT_SET", None)  # <- here: env_pop
    return x + 1


ENV_CASES = [env_setitem, env_update, env_putenv, env_unsetenv, env_delitem, env_setdefault, env_pop]


@pytest.mark.parametrize("fn", ENV_CASES, ids=lambda f: f.__name__)
def test_environment_writes_are_fj104(fn):
    e = check(fn, fjit.SideEffectError, "FJ104", fn.__name__)
    assert e.entry == "FJ104_environment"


def test_environment_write_did_not_leak_from_error_mode():
    # The error is raised at the write: the variable the write was about to set stays unset.
    with pytest.raises(fjit.SideEffectError):
        fjit.jit(env_setdefault)(torch.ones(3))
    assert os.environ.get("FJIT_STRICT_D") is None


# ----------------------------------------------------------------------------- files

def torch_save(x):
    torch.save(x, os.path.join(TMP, "t.pt"))  # <- here: torch_save
    return x + 1


def torch_load(x):
    y = torch.load(os.path.join(TMP, "t.pt"))  # <- here: torch_load
    return x + y


def path_write_text(x):
    Path(TMP, "a.txt").write_text(str(x.shape))  # <- here: path_write_text
    return x + 1


def path_write_bytes(x):
    p = pathlib.Path(TMP) / "b.bin"
    p.write_bytes(b"1")  # <- here: path_write_bytes
    return x + 1


def path_touch(x):
    Path(TMP, "c").touch()  # <- here: path_touch
    return x + 1


def shutil_copy(x):
    shutil.copy(__file__, os.path.join(TMP, "d.py"))  # <- here: shutil_copy
    return x + 1


def shutil_rmtree(x):
    shutil.rmtree(os.path.join(TMP, "missing"), ignore_errors=True)  # <- here: shutil_rmtree
    return x + 1


def os_makedirs(x):
    os.makedirs(os.path.join(TMP, "e", "f"), exist_ok=True)  # <- here: os_makedirs
    return x + 1


def numpy_save(x):
    np.save(os.path.join(TMP, "g.npy"), np.zeros(2))  # <- here: numpy_save
    return x + 1


def tempfile_mkstemp(x):
    tempfile.mkstemp(dir=TMP)  # <- here: tempfile_mkstemp
    return x + 1


FILE_CASES = [torch_save, torch_load, path_write_text, path_write_bytes, path_touch, shutil_copy,
              shutil_rmtree, os_makedirs, numpy_save, tempfile_mkstemp]


@pytest.mark.parametrize("fn", FILE_CASES, ids=lambda f: f.__name__)
def test_file_io_is_fj104(fn):
    torch.save(torch.ones(3), os.path.join(TMP, "t.pt"))
    e = check(fn, fjit.SideEffectError, "FJ104", fn.__name__)
    assert e.entry == "FJ104_file_io"


# ----------------------------------------------------------------------------- state the function does not own

class Counter:
    n = 0


class Registry:
    items = []


class Tracker:
    def __init__(self):
        self.count = 0
        self.calls = []
        self.inner = _Inner()

    def record(self):
        self.calls.append(1)  # <- here: method_appends_to_self

    def bump(self):
        self.count += 1  # <- here: method_assigns_self


class _Inner:
    def __init__(self):
        self.x = 0


TRACKER = Tracker()
CONFIG = {"history": [], "nested": {"k": 0}}


def class_counter(x):
    Counter.n += 1  # <- here: class_counter
    return x + 1


def class_registry(x):
    Registry.items.append(x.shape[0])  # <- here: class_registry
    return x + 1


def method_appends_to_self(x):
    TRACKER.record()
    return x + 1


def method_assigns_self(x):
    y = x + 1
    TRACKER.bump()
    return y


def nested_attribute(x):
    TRACKER.inner.x = 5  # <- here: nested_attribute
    return x + 1


def nested_list_in_dict(x):
    CONFIG["history"].append(1)  # <- here: nested_list_in_dict
    return x + 1


def nested_dict_setitem(x):
    CONFIG["nested"]["k"] = 1  # <- here: nested_dict_setitem
    return x + 1


def alias_of_global_object(x):
    t = TRACKER.inner
    t.x = 7  # <- here: alias_of_global_object
    return x + 1


def make_closure_over_object():
    tracker = Tracker()

    def closure_method(x):
        tracker.inner.x = 3  # <- here: closure_object
        return x + 1
    return closure_method


def default_list(x, cache=[]):  # noqa: B006
    cache.append(1)  # <- here: default_list
    return x + 1


def default_dict(x, cache={}):  # noqa: B006
    cache["k"] = 1  # <- here: default_dict
    return x + 1


def default_kwonly(x, *, seen=set()):  # noqa: B006
    seen.add(1)  # <- here: default_kwonly
    return x + 1


OWN_CASES = [(class_counter, "class_counter"), (class_registry, "class_registry"),
             (method_appends_to_self, "method_appends_to_self"),
             (method_assigns_self, "method_assigns_self"), (nested_attribute, "nested_attribute"),
             (nested_list_in_dict, "nested_list_in_dict"),
             (nested_dict_setitem, "nested_dict_setitem"),
             (alias_of_global_object, "alias_of_global_object"),
             (make_closure_over_object(), "closure_object")]


@pytest.mark.parametrize("fn,case", OWN_CASES, ids=[c for _, c in OWN_CASES])
def test_mutating_state_the_function_does_not_own_is_fj104(fn, case):
    e = check(fn, fjit.SideEffectError, "FJ104", case)
    assert e.entry == "FJ104_mutate_global_object"


@pytest.mark.parametrize("fn", [default_list, default_dict, default_kwonly], ids=lambda f: f.__name__)
def test_mutating_a_mutable_default_is_fj104(fn):
    e = check(fn, fjit.SideEffectError, "FJ104", fn.__name__)
    assert e.entry == "FJ104_mutable_default"
    assert "default argument" in str(e)


def test_class_counter_unchanged_in_warn_mode_after_tracing_is_reported():
    with pytest.warns(fjit.SharpEdgeWarning) as record:
        fjit.jit(class_counter, sharp_edges="warn")(torch.ones(3))
    assert [w.message.edge.lineno for w in record] == [line_of("class_counter")]


# ----------------------------------------------------------------------------- nondeterminism

GENERATOR = np.random.default_rng(0)
LEGACY = np.random.RandomState(0)
PYRNG = random.Random(0)


def numpy_unseeded(x):
    rng = np.random.default_rng()  # <- here: numpy_unseeded
    return x + rng.normal()


def numpy_global_generator(x):
    y = x * 2
    return y + GENERATOR.normal()  # <- here: numpy_global_generator


def numpy_global_generator_alias(x):
    g = GENERATOR
    y = x * 2
    return y + g.integers(0, 10)  # <- here: numpy_global_generator_alias


def numpy_global_randomstate(x):
    return x + LEGACY.uniform()  # <- here: numpy_global_randomstate


def python_global_random(x):
    return x + PYRNG.random()  # <- here: python_global_random


def python_global_gauss(x):
    return x + PYRNG.gauss(0.0, 1.0)  # <- here: python_global_gauss


def python_global_randint(x):
    return x + PYRNG.randint(0, 3)  # <- here: python_global_randint


def python_unseeded_instance(x):
    r = random.Random()  # <- here: python_unseeded_instance
    return x + r.random()


def python_system_random(x):
    return x + random.SystemRandom().random()  # <- here: python_system_random


RANDOM_CASES = [numpy_unseeded, numpy_global_generator, numpy_global_generator_alias,
                numpy_global_randomstate, python_global_random, python_global_gauss,
                python_global_randint, python_unseeded_instance, python_system_random]


@pytest.mark.parametrize("fn", RANDOM_CASES, ids=lambda f: f.__name__)
def test_nondeterministic_generators_are_fj105(fn):
    check(fn, fjit.NondeterminismError, "FJ105", fn.__name__)


# ----------------------------------------------------------------------------- FJ2xx carry locations

def data_dependent_shape(x):
    return torch.nonzero(x)  # <- here: data_dependent_shape


def test_fj202_carries_code_filename_lineno():
    with pytest.raises(fjit.UnsupportedOpError) as info:
        fjit.jit(data_dependent_shape)(torch.ones(3))
    e = info.value
    assert e.code == "FJ202"
    assert os.path.realpath(e.filename) == os.path.realpath(__file__)
    assert e.lineno == line_of("data_dependent_shape")


def test_fj201_carries_code_filename_lineno():
    class Opaque:
        pass

    with pytest.raises(fjit.UnsupportedInputError) as info:
        fjit.jit(lambda x, o: x + 1)(torch.ones(3), Opaque())  # <- here: object_input
    e = info.value
    assert e.code == "FJ201"
    assert os.path.realpath(e.filename) == os.path.realpath(__file__)
    assert e.lineno == line_of("object_input")


# ----------------------------------------------------------------------------- the reported line

FLAG = 0
LOG = logging.getLogger("fjit.tests.strictness")


def branch_else_global(x):
    global FLAG
    if x.shape[0] > 5:
        FLAG = 1
    else:
        FLAG = 2  # <- here: branch_else_global
    return x + 1


def branch_else_object(x):
    if x.shape[0] > 5:
        CONFIG["nested"]["k"] = 1
    else:
        CONFIG["nested"]["k"] = 2  # <- here: branch_else_object
    return x + 1


def alias_logger(x):
    logger = logging.getLogger("fjit.tests.strictness")
    y = x + 1
    logger.warning("rows: %d", y.shape[0])  # <- here: alias_logger
    return y


def multiline_subscript(x):
    CONFIG[  # <- here: multiline_subscript
        "nested"
    ]["k"] = (
        x.shape[0]
    )
    return x + 1


LINE_CASES = [branch_else_global, branch_else_object, alias_logger, multiline_subscript]


@pytest.mark.parametrize("fn", LINE_CASES, ids=lambda f: f.__name__)
def test_reported_at_the_line_that_does_it(fn):
    check(fn, fjit.SideEffectError, "FJ104", fn.__name__)


@pytest.fixture(autouse=True)
def _restore_state():
    saved_env = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved_env)
    os.environ["FJIT_STRICT_DOOMED"] = "1"
    Counter.n = 0
    Registry.items.clear()
    TRACKER.__init__()
    CONFIG["history"].clear()
    CONFIG["nested"]["k"] = 0
    default_list.__defaults__[0].clear()
    default_dict.__defaults__[0].clear()
    default_kwonly.__kwdefaults__["seen"].clear()


# -- mutations that go around the containers' own methods, and bound methods' objects ----------

class _Stepper:
    def __init__(self):
        self.steps = 0

    def step(self, x):
        self.steps += 1          # STEPPER-MUTATES
        return x * 2


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(open(__file__).read().splitlines(), 1)
                if text.rstrip().endswith(f"# {marker}"))


def test_a_bound_method_that_changes_its_object_is_fj104_at_the_line():
    stepper = _Stepper()
    with pytest.raises(fjit.SideEffectError, match="FJ104") as info:
        fjit.jit(stepper.step)(torch.randn(3))
    assert info.value.lineno == _line("STEPPER-MUTATES")
    assert stepper.steps == 1      # it ran once, while tracing: what the error is about


@pytest.mark.parametrize("code, kind", [
    ("list.append(xs, 1.0)", "list"), ("list.extend(xs, [1.0])", "list"),
    ("list.insert(xs, 0, 1.0)", "list"), ("dict.__setitem__(d, 'k', 1)", "dict"),
    ("dict.update(d, k=1)", "dict"), ("dict.setdefault(d, 'k', 1)", "dict"),
])
def test_unbound_container_methods_on_inputs_are_fj103(code, kind):
    namespace: dict = {}
    exec(f"def f(xs, d):\n    {code}\n    return xs[0] * 2 + d['a']\n", namespace)
    with pytest.raises(fjit.InputMutationError, match="FJ103") as info:
        fjit.jit(namespace["f"])([torch.randn(3)], {"a": torch.randn(3)})
    assert kind in str(info.value)


# ----------------------------------------------------------------------------- tracebacks

def _fjit_frames(error: BaseException) -> list[str]:
    import os
    import traceback
    package = os.path.dirname(fjit.__file__) + os.sep
    return [f"{f.filename}:{f.name}" for f in traceback.extract_tb(error.__traceback__)
            if f.filename.startswith(package)]


def _prints(x):
    print("side effect")
    return x * 2


class _AsksItem(torch.nn.Module):
    def forward(self, x):
        return x.sum().item()


@pytest.mark.parametrize("call", [lambda: fjit.jit(lambda x: _prints(x).sum())(torch.randn(3)),
                                  lambda: fjit.jit(_AsksItem())(torch.randn(3))])
def test_an_errors_traceback_ends_at_the_users_line_without_fjits_frames(call, monkeypatch):
    """About 11 fjit frames stood between the user's call and their line; the entry's re-raise is
    the one left.  FJIT_VERBOSE=1 shows them all."""
    with pytest.raises(fjit.FjitError) as caught:
        call()
    frames = _fjit_frames(caught.value)
    assert len(frames) <= 1 and all(f.endswith((":__call__", ":forward")) for f in frames), frames
    last = caught.value.__traceback__
    while last.tb_next is not None:
        last = last.tb_next
    assert last.tb_frame.f_code.co_filename == __file__        # the user's line is the last frame
    monkeypatch.setenv("FJIT_VERBOSE", "1")
    with pytest.raises(fjit.FjitError) as caught:
        call()
    assert len(_fjit_frames(caught.value)) > 3
