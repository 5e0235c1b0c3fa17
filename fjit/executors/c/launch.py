"""How a C kernel is called from a program: the launcher, and the CPython entry point a binary carries.

A call through ctypes converts each argument on the way in (a tensor's `data_ptr()`, then a
`c_void_p`): about 3 us for a kernel of a dozen tensors, where the kernel itself takes 1-2 us on a
transformer's small activations, and a step runs ~50 of them.  So where the Python headers are
there, each binary also carries a METH_FASTCALL entry point (`entry`, built with FJ_PYTHON_ENTRY)
that takes the tensors themselves and reads their data pointers in C through the function torch
exports for inductor's kernels (torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr):
1.6 us for the same call.  That function accepts only torch.Tensor and nn.Parameter (it throws a
C++ exception for anything else), so the entry point checks the exact type and asks any other
tensor for `data_ptr()`.  It releases the GIL while the kernel runs, as a ctypes call does.
Without the headers or that function, kernels are called through ctypes alone.
"""
from __future__ import annotations

import ctypes
import os
import sysconfig

import torch

from fjit.core.ir import TensorVar
from fjit.executors import runtime_sizes

try:        # torch's CPU allocation without the dispatcher (inductor's): 0.5 us against 1.1 us
    from torch._C._dynamo.guards import _empty_strided_cpu as empty_strided
except ImportError:      # pragma: no cover -- a torch without it
    def empty_strided(shape, strides, dtype):
        return torch.empty_strided(shape, strides, dtype=dtype)


def _python_flags() -> tuple:
    """The compiler flags that build the entry point, or () where it cannot be built or used."""
    include = sysconfig.get_paths().get("include") or ""
    data_ptr = getattr(torch._C._dynamo.guards, "_torchinductor_pyobject_tensor_data_ptr", None)
    if not os.path.exists(os.path.join(include, "Python.h")) or not isinstance(data_ptr, int):
        return ()
    return ("-DFJ_PYTHON_ENTRY", f"-I{include}")


PYTHON_FLAGS = _python_flags()
_NAME_AT = 64    # where the entry point's name lies in its definition's buffer (a PyMethodDef is 32 bytes)
HEADER = "#ifdef FJ_PYTHON_ENTRY\n#define PY_SSIZE_T_CLEAN\n#include <Python.h>\n#endif\n"

_CONVERT = {   # arg type -> (C declaration, conversion of PyObject a, the value meaning "failed")
    "p": ("void *{v} = fj_ptr({a});", "{v} == NULL && PyErr_Occurred()"),
    "q": ("int64_t {v} = PyLong_AsLongLong({a});", "{v} == -1 && PyErr_Occurred()"),
    "d": ("double {v} = PyFloat_AsDouble({a});", "{v} == -1.0 && PyErr_Occurred()"),
}


def entry(name: str, arg_types: list) -> str:
    """The entry point of kernel `name` (parameters of `arg_types`, the kernel's own order), built
    only with FJ_PYTHON_ENTRY; `fjit_callable(data_ptr, Tensor, Parameter)` returns it as a builtin."""
    lines = ["#ifdef FJ_PYTHON_ENTRY",
             "static void *(*fj_data)(PyObject *);",
             "static PyTypeObject *fj_tensor, *fj_parameter;",
             "static void *fj_ptr(PyObject *t) {",
             "    if (Py_TYPE(t) == fj_tensor || Py_TYPE(t) == fj_parameter) return fj_data(t);",
             '    PyObject *p = PyObject_CallMethod(t, "data_ptr", NULL);',
             "    if (p == NULL) return NULL;",
             "    void *v = PyLong_AsVoidPtr(p);",
             "    Py_DECREF(p);",
             "    return v;",
             "}",
             "static PyObject *fj_call(PyObject *self, PyObject *const *args, Py_ssize_t n) {",
             f"    if (n != {len(arg_types)}) {{",
             f'        PyErr_SetString(PyExc_TypeError, "{name} takes {len(arg_types)} arguments");',
             "        return NULL;",
             "    }"]
    for k, t in enumerate(arg_types):
        declare, failed = _CONVERT[t]
        lines += ["    " + declare.format(v=f"a{k}", a=f"args[{k}]"),
                  f"    if ({failed.format(v=f'a{k}')}) return NULL;"]
    call = ", ".join(f"a{k}" for k in range(len(arg_types)))
    lines += ["    Py_BEGIN_ALLOW_THREADS",
              f"    {name}({call});",
              "    Py_END_ALLOW_THREADS",
              "    Py_RETURN_NONE;",
              "}",
              "PyObject *fjit_callable(void *data, PyObject *tensor, PyObject *parameter, PyObject *owner,",
              "                        char *memory) {",
              "    fj_data = (void *(*)(PyObject *))data;",
              "    Py_INCREF(tensor);",
              "    Py_INCREF(parameter);",
              "    fj_tensor = (PyTypeObject *)tensor;",
              "    fj_parameter = (PyTypeObject *)parameter;",
              "    PyMethodDef *def = (PyMethodDef *)memory;",
              f"    def->ml_name = memory + {_NAME_AT};",
              "    def->ml_meth = (PyCFunction)(void (*)(void))fj_call;",
              "    def->ml_flags = METH_FASTCALL;",
              "    def->ml_doc = NULL;",
              "    return PyCFunction_New(def, owner);",
              "}",
              "#endif"]
    return "\n".join(lines) + "\n"


_CALLABLE = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.py_object, ctypes.py_object,
                             ctypes.py_object, ctypes.c_void_p)


def python_entry(library: ctypes.CDLL, name: str):
    """The binary's entry point as a Python builtin, or None where it was built without one.

    Its method definition (and name) live in a buffer the builtin holds as its `self`, not in the
    binary: the builtin's deallocation reads them, and the binary may be unloaded first."""
    if not PYTHON_FLAGS:
        return None
    try:
        make = _CALLABLE(("fjit_callable", library))   # PYFUNCTYPE: called holding the GIL
    except AttributeError:
        return None
    memory = ctypes.create_string_buffer(name.encode(), _NAME_AT + len(name) + 1)
    ctypes.memmove(ctypes.addressof(memory) + _NAME_AT, name.encode(), len(name))
    return make(torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr, torch.Tensor,
                torch.nn.Parameter, memory, ctypes.addressof(memory))


def call(binary, *args) -> None:
    """A built written kernel (batch_norm.py, max_pool.py) called on tensors and numbers: through
    its Python entry point where it has one, else its ctypes function on data pointers."""
    if binary.fast is not None:
        binary.fast(*args)
    else:
        binary.fn(*(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args))


def launcher(region, kernel, binary, fallback, symbols: int = 0):
    """A generated function per kernel: outputs allocated with literal layouts, then one call of
    the entry point with the tensors (else of the ctypes function with their data pointers).

    `symbols`: the region is a symbolic program's parametric region (symbolic_kernels.parametric),
    and the function takes the values of the program's `symbols` symbols after the tensors
    (v0, v1, ...): its outputs' sizes and the kernel's size arguments are Python expressions of
    them.  Its source holds only names this module makes, integer literals and such expressions;
    dtypes come in through its namespace."""
    params = [f"a{k}" for k in range(len(region.inputs))] + [f"v{k}" for k in range(symbols)]
    ns = {"binary": binary, "fallback": fallback, "empty_strided": empty_strided,
          "get_num_threads": torch.get_num_threads}
    lines = [f"def launch({', '.join(params)}):",
             "    fn = binary.fn",
             "    if fn is None:",
             f"        return fallback({', '.join(params)})"]
    outs = []
    for k, v in enumerate(region.outputs):
        ns[f"dtype{k}"] = v.dtype
        shape = ", ".join(map(runtime_sizes.python, v.shape)) + ("," if len(v.shape) == 1 else "")
        strides = ", ".join(map(runtime_sizes.python, v.strides)) + ("," if len(v.strides) == 1 else "")
        lines.append(f"    out{k} = empty_strided(({shape}), ({strides}), dtype{k})")
        outs.append(f"out{k}")
    objects, pointers = [], []
    for kind, k in kernel.params:
        if kind == "size":      # a runtime size's value: a literal, or an expression of the symbols
            objects.append(runtime_sizes.python(k))
            pointers.append(runtime_sizes.python(k))
            continue
        tensor = kind == "out" or isinstance(region.inputs[k], TensorVar)
        name = f"out{k}" if kind == "out" else f"a{k}"
        objects.append(name)
        pointers.append(f"{name}.data_ptr()" if tensor else name)
    if kernel.threaded:       # torch's thread count, read per call (torch.set_num_threads)
        objects.append("get_num_threads()")
        pointers.append("get_num_threads()")
    lines += ["    fast = binary.fast",
              "    if fast is not None:",
              f"        fast({', '.join(objects)})",
              "    else:",
              f"        fn({', '.join(pointers)})",
              f"    return {outs[0] if len(outs) == 1 else '(' + ', '.join(outs) + ')'}"]
    exec(compile("\n".join(lines) + "\n", f"<fjit C launcher {kernel.name}>", "exec"), ns)
    return ns["launch"]
