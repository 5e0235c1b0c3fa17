"""Real architectures through both entry points, judged as the model zoo runner judges them
(benchmarks/zoo.py, benchmarks/README.md): a few training steps of the compiled model against eager
float32 and a float64 golden copy, every loss, output, gradient, parameter and buffer compared.

The parametrized test covers the cheapest models of benchmarks/zoo_models.py that between them have
a timm CNN with BatchNorm and in-place ReLU, a transformers decoder with grouped-query attention and
rotary embeddings, a transformers encoder with a padded attention mask, a torchvision model and a
ViT.  `test_full_zoo` (marker `zoo`, run with FJIT_ZOO=1) runs the whole registry.
"""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_MISSING = [m for m in ("timm", "transformers", "torchvision") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"needs {', '.join(_MISSING)} (the test extra)")

from benchmarks.zoo import STRESS_CASES, check_accuracy, run_model, run_stressed  # noqa: E402
from benchmarks.zoo_models import MODELS  # noqa: E402

SUBSET = [
    "timm_resnet10t",      # timm CNN: BatchNorm (running stats written back), in-place ReLU
    "hf_llama_gqa",        # transformers decoder: GQA (4 query / 2 KV heads), RoPE, eager attention
    "hf_bert",             # transformers encoder: padded attention mask, classification head
    "tv_mobilenet_v3_small",   # torchvision CNN: hard-swish, squeeze-excite, in-place activations
    "tv_vit",              # torchvision ViT: class token, nn.MultiheadAttention
    "tv_maxvit",           # backend pieces pass values computed under autograd to each other: the
                           # measured choice's runs must not reach the caller's graph
]
ENTRIES = ["jit", "backend"]
# The seed a model's check runs at, where seed 0's trajectory crosses an activation's kink.
# MobileNetV3-Small at seed 0: at step 3 one value of block 3's ReLU input (1 of 45056) is exactly
# 0 under one rounding and 1.7e-6 under another, so the ReLU passes its gradient in one run and
# zeroes it in the other, and every earlier weight's gradient differs (the stem's 2.7e-5 off
# float64 against a limit of 1.0e-5).  Which side it lands on depends on the last bits of two
# SGD steps: the backend's joint form lands on the other side from eager, its other forms and
# fjit.jit's do not, and the form a piece keeps is timed, so the test failed or passed with the
# machine's load.  At seeds 1 and 2 every form through both entries passes (each forced by
# FJIT_KEEP_FORM, measured).
SEEDS = {"tv_mobilenet_v3_small": 1}


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("name", SUBSET)
def test_zoo_model(name, entry, monkeypatch):
    # The form a program keeps is timed (fjit/program_choice.py), so which one a test runs depends
    # on the machine and its load.  The channels-last form is measured here but never kept: forced,
    # MobileNetV3-Small's fails the accuracy rule at seed 0 (its stem weight's gradient, 2.7e-5
    # off float64 against a limit of 1.0e-5, after three steps) and passes at seeds 1 and 2, as
    # a value rounded otherwise lands across a hard-swish kink; the joint program and torch
    # autograd's form pass at seed 0 (docs/zoo.md).  It was kept on a loaded machine and this test
    # failed there.
    import fjit.program_choice as program_choice
    for margin in ("CHANNELS_LAST_MARGIN", "CHANNELS_LAST_MARGIN_GROUPED"):
        monkeypatch.setattr(program_choice, margin, 0.0)
    result = check_accuracy(MODELS[name], entry, steps=3, seed=SEEDS.get(name, 0))
    assert result.status == "pass", f"{name} ({entry}): {result.status}: {result.reason}" + (
        f" at {result.where}" if result.where else "")


def test_layouts_observed_on_one_trace_find_their_values_on_the_retrace():
    """timm's Twins: each stage's positional convolution reads tokens laid out as an image (a
    transposed view), so its real result is channels-last where its meta kernel's is not.  Each
    layout corrected on a retrace changes how the next stage's patch embedding decomposes, so the
    retrace names its values differently: observations keyed by var name missed every stage
    after the first, and after three traces the program ran as torch calls alone."""
    import torch

    import fjit
    zm = MODELS["timm_twins_svt_small"]
    model, batch = zm.make(0), zm.example(0)
    jm = fjit.jit(model)
    with torch.no_grad():
        torch.testing.assert_close(jm(*batch.args), model(*batch.args), rtol=1e-4, atol=1e-4)
    assert "fjit_c_" in str(fjit.last_traces(jm)[-1]), "no kernel: the program ran as torch calls alone"


def test_a_zoo_model_is_right_while_its_kernels_are_not_built(monkeypatch, tmp_path):
    """GC ViT with no C kernel built (a compiler that fails: every region runs its prims as torch
    calls, as while kernels build in the background): a region's result must be a fresh tensor in
    its recorded layout, as a kernel's is (a contiguous() of a contiguous value returned that value,
    which a later op wrote into in place: the loss was off by 1.6 at step 2)."""
    from fjit.executors.c import build as c_build, build_queue as c_build_queue
    monkeypatch.setenv("FJIT_C_KERNELS", "background")
    monkeypatch.setenv("FJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(c_build_queue, "_BINARIES", {})
    monkeypatch.setattr(c_build, "_COMPILER", ["false"])
    with pytest.warns(Warning):
        result = check_accuracy(MODELS["timm_gcvit_xxtiny"], "jit", steps=3)
    assert result.status == "pass", f"{result.status}: {result.reason}"


# The stressed subset (benchmarks/zoo.py --stress runs the whole registry): a custom
# autograd.Function whose joint program is one measured form (YOSO), and a CNN with BatchNorm whose
# programs have all three forms (ResNet-10t).
STRESSED = ["hf_yoso", "timm_resnet10t"]


@pytest.mark.parametrize("name", STRESSED)
def test_zoo_model_under_stress(name):
    """Every stress case (kernels built synchronously or late at random points, each form of the
    measured choice kept, one thread), each in its own process, through both entries: eager's
    accuracy every step, or a rounding control failing the rule too (unstable)."""
    import argparse
    args = argparse.Namespace(entry=ENTRIES, steps=3, timeout=300, rounds=0, optimizer="sgd", device="cpu",
                              timed=["jit"], timing=False, default_allocator=False, autocast=None,
                              memory=False, first_call=False)
    row = run_stressed(name, args, list(STRESS_CASES))
    bad = [f"{case} {entry}: {r['status']}: {r['reason']}" for case, results in row["cases"].items()
           for entry, r in results.items() if r["status"] not in ("pass", "unstable")]
    assert not bad, "\n".join(bad)


def test_channels_last_form_one_threaded_trains_as_eager():
    """MobileNetV3-Small with one thread keeps the channels-last form, whose batch norm summed its
    statistics and gradients in float32 in sequence: its first blocks' gradients at step 3 were
    2000x eager's error from float64 (the stress run's 1thread case found it)."""
    import argparse
    args = argparse.Namespace(entry=["jit"], steps=3, timeout=300, rounds=0, optimizer="sgd", device="cpu",
                              timed=["jit"], timing=False, default_allocator=False, autocast=None,
                              memory=False, first_call=False)
    row = run_stressed("tv_mobilenet_v3_small", args, ["form2", "1thread"])
    bad = [f"{case} {entry}: {r['status']}: {r['reason']}" for case, results in row["cases"].items()
           for entry, r in results.items() if r["status"] != "pass"]
    assert not bad, "\n".join(bad)


@pytest.mark.zoo
def test_full_zoo():
    failures = []
    for name in MODELS:
        row = run_model(name, ENTRIES, steps=3, timeout=300, timing=False, rounds=0)
        failures += [f"{name} ({entry}): {res['status']}: {res['reason']}"
                     for entry, res in row["results"].items() if res["status"] not in ("pass", "unstable")]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)


def test_torchvision_is_imported_only_through_import_torchvision():
    """A registry builder that imports torchvision itself fails where its C++ extension does not
    load and the model is the first torchvision one of its process (zoo.py --isolate)."""
    import ast
    import benchmarks.zoo_models as zoo_models
    tree = ast.parse(Path(zoo_models.__file__).read_text())
    direct = [node.lineno for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
              and fn.name != "import_torchvision" for node in ast.walk(fn)
              if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                  (getattr(node, "module", None) or "").startswith("torchvision") or
                  a.name.startswith("torchvision") for a in node.names)]
    assert not direct, f"torchvision imported directly at lines {direct}"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_pinned_allocator_keeps_a_freed_heap_top_mapped():
    """The timing runs pin glibc's trim threshold (harness.pin_allocator): memory freed at the top
    of the heap stays mapped, so later rounds of the same allocations take (almost) no page faults,
    where glibc's defaults give the heap top back and refault all of it every round.  In a fresh
    interpreter, as the allocator's settings are the process's."""
    import subprocess
    script = (
        "import resource, sys, torch\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from benchmarks import harness\n"
        "print(harness.pin_allocator(), harness.environment()['allocator'])\n"
        "def cycle():\n"
        "    ts = [torch.ones(1 << 20) for _ in range(20)]\n"  # 20 x 4 MiB, under the 32 MiB mmap cap
        "    del ts\n"
        "for _ in range(3): cycle()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for _ in range(3): cycle()\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n")
    out = subprocess.run([sys.executable, "-c", script, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0] == "glibc-pinned glibc-pinned"
    # three rounds of 80 MiB are 61,440 pages; the heap may still grow by a few MiB (fragmentation)
    assert int(lines[1]) < 5000, f"{lines[1]} minor faults in three rounds of 80 MiB"
