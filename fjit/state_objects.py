"""Program state objects: an argument of a jitted module's forward that the forward updates.

transformers' key/value caches (`DynamicCache`, `StaticCache`, `EncoderDecoderCache` and their
layers) are objects a model's forward reads and writes: it rebinds a layer's tensors
(`self.keys = torch.cat([self.keys, k], -2)`), writes into them in place (`StaticLayer.update`'s
`index_copy_`), and sets plain attributes on first use (`is_initialized`, `device`).  `generate`
hands one to every call and reads it between calls.  fjit treats such an object as BatchNorm's
buffers are treated: program state.

- Before the call, the object is described as a plain nested dict (`describe`): its attributes,
  with tensors as inputs and every other value (ints, flags, devices, dtypes, the class's name) as
  constants, so the key holds its structure and the program one layout of it.
- In the trace, a stand-in of the same class is rebuilt around the proxies (`rebuild`), and the
  forward runs on it.  Its tensors' in-place writes are functionalized, as a local's are.
- After the forward, the stand-in's state is described again (`described_after`): for each
  tensor, unchanged, rebound to a new value, or written in place; other attributes as they are
  now.  The traced function returns that description, and references to the stand-in in its output
  are replaced by a marker.
- After each call, the description is applied to the caller's object (`write_back`): a rebound
  tensor is set, a tensor written in place is copied into (its storage kept: a static cache's
  address does not change), other attributes are set; the output gets the caller's object back.

Which classes are state: transformers' `Cache` and `CacheLayerMixin` (found by name, so fjit does
not import transformers).  An attribute value of another kind (an arbitrary object) is FJ201,
naming the attribute.
"""
from __future__ import annotations

import sys

import torch

from fjit.errors import UnsupportedInputError, located
from fjit.strict.locate import user_location

# module name -> class names of that module whose instances (and subclasses') are state
_STATE_BASES = {"transformers.cache_utils": ("Cache", "CacheLayerMixin")}
_CLASS_KEY = "__fjit_state__"          # a description's class, by qualified name
_CLASSES: dict[str, type] = {}          # qualified name -> class, for the trace's stand-ins

UNCHANGED = "__fjit_unchanged__"        # a tensor neither rebound nor written
_WRITTEN = "__fjit_written__"           # {_WRITTEN: new value}: written in place
_TYPE = "__fjit_type__"                 # {_TYPE: name}: an attribute holding a class
_MARKER = "__fjit_state_object__"       # {_MARKER: i}: the i-th state argument, in an output


_FOUND_BASES: list = []     # the classes, once their module is imported


def _bases() -> tuple:
    """The state classes, or () while none of their modules is imported (a call of a model that
    takes no cache pays a dict lookup per module)."""
    if _FOUND_BASES:
        return _FOUND_BASES[0]
    for module_name in _STATE_BASES:
        if module_name in sys.modules:
            break
    else:
        return ()
    found = tuple(getattr(sys.modules[m], n) for m, names in _STATE_BASES.items() if m in sys.modules
                  for n in names if hasattr(sys.modules[m], n))
    if found:
        _FOUND_BASES.append(found)
    return found


def is_state(x) -> bool:
    bases = _bases()
    return bool(bases) and isinstance(x, bases)


def _name(cls: type) -> str:
    name = f"{cls.__module__}.{cls.__qualname__}"
    _CLASSES[name] = cls
    return name


def find(args: tuple, kwargs: dict) -> list:
    """The state objects among a call's arguments (top level), in order."""
    bases = _bases()
    if not bases:
        return []
    return [v for v in (*args, *kwargs.values()) if isinstance(v, bases)]


def describe(obj, where: str) -> dict:
    """`obj` as a nested dict of tensors and constants (see the module docstring)."""
    out = {_CLASS_KEY: _name(type(obj))}
    for k, v in vars(obj).items():
        out[k] = _value(v, f"{where}.{k}")
    return out


def _value(v, where: str):
    if is_state(v):
        return describe(v, where)
    if isinstance(v, torch.Tensor) or v is None or isinstance(
            v, (bool, int, float, str, torch.dtype, torch.device, torch.Size)):
        return v
    if isinstance(v, type):
        return {_TYPE: _name(v)}
    if isinstance(v, (list, tuple)):
        return type(v)(_value(x, f"{where}[{i}]") for i, x in enumerate(v))
    if isinstance(v, dict):
        return {k: _value(x, f"{where}[{k!r}]") for k, x in v.items()}
    raise UnsupportedInputError(located(
        "FJ201", f"the state object's attribute {where} is a {type(v).__qualname__}, which fjit "
                 f"cannot carry between calls", *user_location(),
        "keep the object's state in tensors, numbers and flags, or run the model with "
        "torch.compile(model, backend=\"fjit\")"))


def is_description(x) -> bool:
    return isinstance(x, dict) and _CLASS_KEY in x


def rebuild(description: dict, inputs: dict):
    """The trace's stand-in for a described object: an instance of its class (made without its
    __init__) whose attributes are the description's, tensors being the call's proxies.
    `inputs` collects {id(proxy): (proxy, its variable now)} for `described_after`."""
    cls = _CLASSES[description[_CLASS_KEY]]
    obj = cls.__new__(cls)
    for k, v in description.items():
        if k != _CLASS_KEY:
            obj.__dict__[k] = _rebuilt(v, inputs)
    return obj


def _rebuilt(v, inputs: dict):
    if is_description(v):
        return rebuild(v, inputs)
    if isinstance(v, torch.Tensor):      # a proxy: written in place, it is functionalized
        v._fj_is_input = False
        inputs[id(v)] = (v, v.ir)
        return v
    if isinstance(v, dict) and _TYPE in v:
        return _CLASSES[v[_TYPE]]
    if isinstance(v, (list, tuple)):
        return (list if isinstance(v, list) else type(v))(_rebuilt(x, inputs) for x in v)
    if isinstance(v, dict):
        return {k: _rebuilt(x, inputs) for k, x in v.items()}
    return v


def described_after(obj, inputs: dict) -> dict:
    """The stand-in's state after the forward, for write_back."""
    out = {_CLASS_KEY: _name(type(obj))}
    for k, v in vars(obj).items():
        out[k] = _after(v, inputs)
    return out


def _after(v, inputs: dict):
    if is_state(v):
        return described_after(v, inputs)
    if isinstance(v, torch.Tensor):
        seen = inputs.get(id(v))
        if seen is None:
            return v                      # rebound: a new value
        return UNCHANGED if v.ir is seen[1] else {_WRITTEN: v}
    if isinstance(v, type):
        return {_TYPE: _name(v)}
    if isinstance(v, (list, tuple)):
        return type(v)(_after(x, inputs) for x in v) if not hasattr(v, "_fields") else \
            type(v)(*(_after(x, inputs) for x in v))
    if isinstance(v, dict):
        return {k: _after(x, inputs) for k, x in v.items()}
    return v


def write_back(obj, after: dict) -> None:
    """Apply a described_after description (real tensors now) to the caller's object."""
    for k, v in after.items():
        if k != _CLASS_KEY:
            obj.__dict__[k] = _applied(obj.__dict__.get(k), v)


def _applied(now, v):
    if isinstance(v, str) and v == UNCHANGED:
        return now
    if isinstance(v, dict) and _WRITTEN in v:
        with torch.no_grad():
            now.copy_(v[_WRITTEN])       # the caller's tensor keeps its storage
        return now
    if isinstance(v, dict) and _TYPE in v:
        return _CLASSES[v[_TYPE]]
    if is_description(v):
        if now is not None and _name(type(now)) == v[_CLASS_KEY]:
            write_back(now, v)
            return now
        return _made(v)
    if isinstance(v, (list, tuple)):
        items = [_applied(now[i] if isinstance(now, (list, tuple)) and i < len(now) else None, x)
                 for i, x in enumerate(v)]
        if isinstance(now, list) and isinstance(v, list) and len(now) == len(items):
            now[:] = items                # the caller's list object is kept
            return now
        return type(v)(items) if not hasattr(v, "_fields") else type(v)(*items)
    if isinstance(v, dict):
        return {k: _applied(now.get(k) if isinstance(now, dict) else None, x) for k, x in v.items()}
    return v


def _made(description: dict):
    cls = _CLASSES[description[_CLASS_KEY]]
    obj = cls.__new__(cls)
    write_back(obj, description)
    return obj


def marked(out, objects: list):
    """`out` with each of `objects` (the trace's stand-ins) replaced by a marker, in any nesting
    of tuples, lists, dicts and transformers' ModelOutput."""
    index = {id(o): i for i, o in enumerate(objects)}

    def mark(x):
        i = index.get(id(x))
        if i is not None:
            return {_MARKER: i}
        return _mapped(x, mark)
    return mark(out)


def unmarked(out, objects: list):
    """`out` with each marker replaced by the caller's object it stands for."""
    def unmark(x):
        if isinstance(x, dict) and len(x) == 1 and _MARKER in x:
            return objects[x[_MARKER]]
        return _mapped(x, unmark)
    return unmark(out)


def _mapped(x, fn):
    if isinstance(x, dict) and type(x) is not dict and hasattr(x, "__dataclass_fields__"):
        for k, v in list(x.items()):     # a ModelOutput: its items and attributes agree
            new = fn(v)
            if new is not v:
                x[k] = new
        return x
    if isinstance(x, dict):
        return {k: fn(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(fn(v) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(fn(v) for v in x)
    return x
