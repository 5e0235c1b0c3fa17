"""fjit under torch.distributed, as users combine them: two processes over gloo on the CPU.

`fjit.jit(DDP(m))` runs DDP's own forward eagerly around the compiled forward of m (its per-call
preparation of the reducer is a side effect a traced call would run once: the gradients stopped
being all-reduced after the first step, silently), and `DDP(fjit.jit(m))` hands DDP a module whose
forward is compiled.  Both orders train exactly as eager DDP: after three SGD steps on inputs
that differ between ranks, each parameter equals eager DDP's on its rank, and the ranks agree.
Also with `find_unused_parameters=True` (a branch one rank's inputs never take is not in the
graph), with gradient accumulation under `no_sync()`, with `static_graph=True`, and under bf16
autocast.  FSDP2: `fully_shard(fjit.jit(m))` trains
as eager FSDP2, also under bf16 autocast; `fjit.jit(fully_shard(m))` (DTensor parameters) is FJ201 at the call, whose fix is
that order.
"""
from __future__ import annotations

import copy
import os
import queue
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import fjit

WORLD = 2
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not built in")


class _Branchy(torch.nn.Module):
    """An MLP with a head only rank 1's inputs reach (find_unused_parameters)."""

    def __init__(self, extra: bool):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.GELU(), torch.nn.Linear(16, 16),
                                        torch.nn.LayerNorm(16))
        self.head = torch.nn.Linear(16, 2)
        self.extra = torch.nn.Linear(16, 2) if extra else None

    def forward(self, x, use_extra: bool = False):
        h = self.body(x)
        return self.head(h) + (self.extra(h) if use_extra else 0)


def _wrap(order: str, model: torch.nn.Module, **ddp_options) -> torch.nn.Module:
    if order == "jit_of_ddp":
        return fjit.jit(DDP(model, **ddp_options))
    if order == "ddp_of_jit":
        return DDP(fjit.jit(model), **ddp_options)
    return DDP(model, **ddp_options)


def _train(model, rank: int, scenario: str) -> None:
    # (at lr 0.1 this MLP's square loss grows fast enough that one float32 rounding apart in the
    # first step's gradients, 1e-7 of them, is 1e-1 in a parameter after the third step, eager
    # against eager rounded otherwise; and its bf16 loss grows 5000x: so the steps are small)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for step in range(3):
        opt.zero_grad()
        if scenario == "no_sync":      # two micro-batches, the first without all-reduce
            with model.no_sync():
                model(torch.randn(5, 4, generator=g) + rank).square().sum().backward()
        use_extra = scenario == "unused" and rank == 1
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=scenario == "autocast"):
            loss = model(torch.randn(5, 4, generator=g) + rank, use_extra).float().square().sum()
        loss.backward()
        opt.step()


def _worker(rank: int, path: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=WORLD)
    try:
        out = {}
        for scenario, options in (("plain", {}), ("unused", {"find_unused_parameters": True}),
                                  ("no_sync", {}), ("static_graph", {"static_graph": True}),
                                  ("autocast", {})):
            torch.manual_seed(0)
            base = _Branchy(extra=scenario == "unused")
            params = {}
            for order in ("eager", "jit_of_ddp", "ddp_of_jit"):
                model = _wrap(order, copy.deepcopy(base), **options)
                _train(model, rank, scenario)
                # as lists: a tensor sent through the queue is shared memory its sender frees on exit
                params[order] = [p.detach().tolist() for p in model.parameters()]
            out[scenario] = params
        out["fsdp2"] = _fsdp2(rank)
        results.put((rank, out))
    finally:
        dist.destroy_process_group()


def _fsdp2(rank: int) -> dict:
    """FSDP2 (fully_shard) of the compiled module, trained as eager FSDP2 is; the other order's
    error.  {order: [full parameters]}, {"jit_of_shard": the error's message}."""
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    base = _Branchy(extra=False)
    params = {}
    for scenario in ("plain", "autocast"):
        for order in ("eager", "shard_of_jit"):
            model = copy.deepcopy(base)
            model = fully_shard(fjit.jit(model) if order == "shard_of_jit" else model)
            _train(model, rank, scenario)
            params[order if scenario == "plain" else f"{order} autocast"] = \
                [p.full_tensor().detach().tolist() for p in model.parameters()]
    try:
        fjit.jit(fully_shard(copy.deepcopy(base)))(torch.randn(5, 4))
        params["jit_of_shard"] = "no error"
    except fjit.UnsupportedInputError as e:
        params["jit_of_shard"] = str(e)
    return params


@pytest.fixture(scope="module")
def trained():
    """{scenario: {order: [parameters]}} for each rank, from one pair of processes."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_worker, args=(rank, path, results)) for rank in range(WORLD)]
        for p in procs:
            p.start()
        got = {}
        while len(got) < WORLD and all(p.exitcode in (None, 0) for p in procs):
            try:
                rank, out = results.get(timeout=1)
                got[rank] = out
            except queue.Empty:
                pass
        for p in procs:
            p.join(timeout=60)
    assert len(got) == WORLD and all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return got


@pytest.mark.parametrize("scenario", ["plain", "unused", "no_sync", "static_graph", "autocast"])
@pytest.mark.parametrize("order", ["jit_of_ddp", "ddp_of_jit"])
def test_fjit_with_ddp_trains_as_eager_ddp(trained, order, scenario):
    # under bf16 autocast (its casts traced into the program, which runs with autocast off) a
    # value rounded the other way moves a gradient by a unit of bf16's last place
    tolerance = 2e-3 if scenario == "autocast" else 1e-4
    for rank in range(WORLD):
        eager, got = trained[rank][scenario]["eager"], trained[rank][scenario][order]
        assert len(got) == len(eager)
        for a, b in zip(got, eager):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=tolerance, atol=tolerance)
    for a, b in zip(trained[0][scenario][order], trained[1][scenario][order]):
        assert a == b       # DDP keeps the ranks identical


@pytest.mark.parametrize("scenario", ["", " autocast"])
def test_fsdp2_of_a_jitted_module_trains_as_eager_fsdp2(trained, scenario):
    tolerance = 2e-3 if scenario else 1e-4     # bf16 autocast: see test_fjit_with_ddp_trains_as_eager_ddp
    for rank in range(WORLD):
        eager, got = trained[rank]["fsdp2"]["eager" + scenario], trained[rank]["fsdp2"]["shard_of_jit" + scenario]
        assert len(got) == len(eager)
        for a, b in zip(got, eager):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=tolerance, atol=tolerance)


def test_jitting_a_sharded_module_is_a_located_fj201_whose_fix_is_the_other_order(trained):
    message = trained[0]["fsdp2"]["jit_of_shard"]
    assert "FJ201" in message and "DTensor" in message and "test_distributed.py" in message
    assert "fully_shard(fjit.jit(m))" in message
