"""Draw many random programs of the property families (tests/ops/test_properties.py) and sort the
failures into families.

    python tools/hunt_family_failures.py [--executors torch|c|triton] [-n 500] [--families all]

Each program runs like one example of
tests/ops/test_properties.py::test_family_programs_match_eager, but a failure does not stop the run: it is recorded under a key made from the exception's type and
its message with names and numbers blanked out, keeping the shortest program of each key.  Prints
how many programs ran and, per family of failures, the count and that shortest runnable program.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import traceback
import warnings

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("FJIT_TRITON_CPU", "0")
os.environ.setdefault("FJIT_C_KERNELS", "sync")

EXECUTORS = {"torch": ("torch",), "c": ("c", "torch"), "triton": ("triton", "torch")}


def key_of(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    for line in str(exc).splitlines():            # assert_close: the line that says what differs
        if line.startswith(("Tensor-likes", "Scalars are not", "The values for attribute")):
            msg += " | " + line
            break
    msg = re.sub(r"\b[vxst]\d+\b", "V", msg)
    msg = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "N", msg)
    msg = re.sub(r"<fjit[^>]*>", "<src>", msg)
    msg = re.sub(r"\[[N, ]*\]", "[..]", msg)
    msg = re.sub(r"tensor\(.*", "tensor(..)", msg)
    return f"{type(exc).__name__}: {msg[:220]}"


def _capture_program(data, store: dict) -> None:
    """Make `data.draw` also keep the drawn program in store["program"] (for the report)."""
    real_draw = data.draw

    def draw(strategy, label=None):
        value = real_draw(strategy, label=label)
        if label == "program":
            store["program"] = value
        return value
    data.draw = draw


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--executors", default="torch", choices=sorted(EXECUTORS))
    ap.add_argument("-n", type=int, default=300)
    ap.add_argument("--families", default="all")
    ap.add_argument("--check", action="store_true", help="run under FJIT_CHECK=1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shrink", type=int, default=0,
                    help="shrink the example of each of the N most frequent families")
    args = ap.parse_args()
    os.environ["FJIT_PROPERTY_FAMILIES"] = args.families
    if args.executors == "triton":
        os.environ["FJIT_TRITON_CPU"] = "1"
    if args.check:
        os.environ["FJIT_CHECK"] = "1"
    tests = os.path.join(os.path.dirname(__file__), "..", "tests")
    sys.path.insert(0, os.path.join(tests, "ops"))     # test_properties
    sys.path.insert(0, tests)                          # op_samples, which it imports
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    import test_properties as tp
    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st
    from hypothesis.errors import UnsatisfiedAssumption

    failures: dict = {}
    counts = collections.Counter()
    ran = [0, 0]    # programs run, rejected (eager raised)
    executors = EXECUTORS[args.executors]

    @seed(args.seed)
    @settings(max_examples=args.n, deadline=None, database=None, phases=[tp.Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def one(data):
        captured = {}
        _capture_program(data, captured)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tp.check_family_program(executors, data)
        except UnsatisfiedAssumption:
            ran[1] += 1
            raise
        except Exception as exc:   # noqa: BLE001 - sorting every failure is the point
            k = key_of(exc)
            counts[k] += 1
            program = captured.get("program")
            text = repr(program) if program is not None else "(generator)\n" + \
                "".join(traceback.format_exception(exc)[-6:])
            if k not in failures or len(text) < len(failures[k][0]):
                failures[k] = (text, str(exc)[:1500])
        ran[0] += 1

    one()
    shrunk = {}
    for k, _ in counts.most_common(args.shrink):
        last = {}

        @seed(args.seed)
        @settings(max_examples=args.n, deadline=None, database=None,
                  phases=[tp.Phase.generate, tp.Phase.shrink],
                  suppress_health_check=list(HealthCheck))
        @given(data=st.data())
        def again(data, k=k, last=last):
            _capture_program(data, last)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    tp.check_family_program(executors, data)
            except UnsatisfiedAssumption:
                raise
            except Exception as exc:
                if key_of(exc) == k:
                    last["shrunk"] = (repr(last.get("program")), str(exc)[:1500])
                    raise

        try:
            again()
        except Exception:   # noqa: BLE001 - the last raise is the shrunk example
            if "shrunk" in last:
                shrunk[k] = last["shrunk"]
    failures.update(shrunk)
    print(f"executors={executors} families={args.families} check={args.check}: "
          f"{ran[0]} programs run ({ran[1]} rejected), {sum(counts.values())} failed, "
          f"{len(counts)} distinct failures")
    for k, n in counts.most_common():
        text, msg = failures[k]
        print("=" * 100)
        print(f"[{n}x] {k}\n--- shortest program:{text}\n--- message:\n{msg}")


if __name__ == "__main__":
    main()
