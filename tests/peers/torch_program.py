# SPDX-License-Identifier: MIT
"""A PyTorch program, run on PyTorch's own caching allocator or on
cudamem's memory manager, that prints one JSON record of its results.

    CUBLAS_WORKSPACE_CONFIG=:4096:8 python tests/peers/torch_program.py \\
        --allocator torch
    CUDAMEM_MEMORY_MANAGER=pool CUBLAS_WORKSPACE_CONFIG=:4096:8 \\
        python tests/peers/torch_program.py --allocator cudamem

``--allocator``:

- ``torch``: PyTorch's own allocator; cudamem is not imported;
- ``cudamem``: ``cudamem.interop.use_with_torch()`` right after ``import
  torch``, before PyTorch's first CUDA allocation: every allocation of
  the process comes from cudamem's manager;
- ``mempool``: PyTorch allocates once with its own allocator, then the
  whole program runs inside ``torch.cuda.use_mem_pool(
  cudamem.interop.torch_mempool())``.

cudamem's manager is the one ``CUDAMEM_MEMORY_MANAGER`` names (or its
default).  Determinism: fixed seeds, ``torch.use_deterministic_algorithms
(True)``, cuDNN deterministic and not benchmarking, TF32 off, and
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (set here when the environment does
not set it); so every step is ``bitwise`` (tests/peers/peer_common.py).

The steps:

- mlp.*: a 4-layer MLP with dropout (the GPU's random numbers), trained
  200 steps with autograd, Adam and a cross-entropy written with
  elementwise ops and reductions, on batches drawn by a seeded
  generator: the 200 losses, every parameter and Adam's state at the
  end, and the trained model's outputs on held-out data;
- streams.*: 120 rounds on two PyTorch streams, each round's tensors
  made on one stream and dropped at once, results gathered into one
  tensor; and a chain of tensors handed between the streams through
  events (``record_stream`` where a tensor is used on the other stream).

The record's ``memory`` has the peaks: ``peak_device_used`` (the
device's used memory from ``torch.cuda.mem_get_info``, less what was
used once PyTorch's context was made, sampled after every step); with
PyTorch's allocator (``torch`` and ``mempool``) ``peak_torch_allocated``
and ``peak_torch_reserved`` (``torch.cuda.max_memory_allocated`` /
``max_memory_reserved``); with cudamem (``cudamem`` and ``mempool``)
``peak_allocated_bytes`` (``memory_stats()``'s counter) and
``peak_pool_reserved_bytes`` / ``peak_limit_used_bytes`` (sampled).
Exit status 1 when a step raised (the record's ``error`` says where).
"""

import argparse
import contextlib
import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peer_common import Record  # noqa: E402

SEED = 1234
STEPS = 200
BATCH = 256
FEATURES = 64
CLASSES = 10


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allocator", choices=("torch", "cudamem", "mempool"),
                    required=True)
    args = ap.parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    manager = os.environ.get("CUDAMEM_MEMORY_MANAGER", "default")
    rec = Record("torch", args.allocator,
                 manager if args.allocator != "torch" else "-")
    where = "setup"
    cudamem = None
    try:
        import torch

        if args.allocator == "cudamem":
            import cudamem
            from cudamem import interop

            interop.use_with_torch()      # before any CUDA allocation
        rec.note("torch", torch.__version__)
        rec.note("cublas_workspace_config",
                 os.environ["CUBLAS_WORKSPACE_CONFIG"])
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        free0, total = torch.cuda.mem_get_info()
        base = total - free0
        pool_ctx = contextlib.nullcontext()
        if args.allocator == "mempool":
            import cudamem
            from cudamem import interop

            torch.zeros(1, device="cuda")     # PyTorch's allocator in use
            pool = interop.torch_mempool()
            pool_ctx = torch.cuda.use_mem_pool(pool)

        def sample():
            free, total = torch.cuda.mem_get_info()
            got = {"device_used": total - free - base}
            if args.allocator != "cudamem":
                got["torch_allocated"] = torch.cuda.max_memory_allocated()
                got["torch_reserved"] = torch.cuda.max_memory_reserved()
            if cudamem is not None:
                st = cudamem.memory_stats()
                got["allocated_bytes"] = st["peak_allocated_bytes"]
                got["pool_reserved_bytes"] = st["pool_reserved_bytes"]
                got["limit_used_bytes"] = st["limit_used_bytes"]
                got["torch_bytes"] = st["by_client"]["torch"]
            return got

        rec.sampler(sample)
        with pool_ctx:
            where = "mlp"
            train_mlp(torch, rec)
            torch.cuda.synchronize()
            where = "streams"
            streams(torch, rec)
            torch.cuda.synchronize()
        where = "teardown"
        gc.collect()
        torch.cuda.synchronize()
        if cudamem is not None:
            st = cudamem.memory_stats()
            rec.note("manager_in_use", st["manager"])
            rec.note("torch_bytes_after", st["by_client"]["torch"])
            err = interop.torch_last_error()
            rec.note("torch_last_error", None if err is None else repr(err))
    except BaseException:  # noqa: BLE001 - the record says what failed
        rec.fail(where)
    return rec.emit()


def host(t):
    return t.detach().to("cpu").contiguous().numpy()


def train_mlp(torch, rec):
    nn = torch.nn
    torch.manual_seed(SEED)
    torch.cuda.manual_seed_all(SEED)
    gen = torch.Generator().manual_seed(SEED)   # data, on the host
    centers = torch.randn(CLASSES, FEATURES, generator=gen) * 2
    labels = torch.randint(0, CLASSES, (8192,), generator=gen)
    data = centers[labels] + torch.randn(8192, FEATURES, generator=gen)
    x_all = data.to("cuda")
    y_all = labels.to("cuda")
    model = nn.Sequential(
        nn.Linear(FEATURES, 256), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(256, 256), nn.GELU(),
        nn.Linear(256, 128), nn.ReLU(),
        nn.Linear(128, CLASSES)).to("cuda")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    classes = torch.arange(CLASSES, device="cuda")

    def loss_fn(logits, y):
        # Cross-entropy from elementwise ops and reductions only (no
        # scatter or atomics, whatever PyTorch's kernels for nll_loss do).
        onehot = (y[:, None] == classes[None, :]).to(logits.dtype)
        return -(torch.log_softmax(logits, dim=1) * onehot).sum(1).mean()
    losses = torch.empty(STEPS, device="cuda")
    n_train = 6144
    for step in range(STEPS):
        idx = torch.randint(0, n_train, (BATCH,), generator=gen)
        xb = x_all[idx.to("cuda")]
        yb = y_all[idx.to("cuda")]
        model.train()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        losses[step] = loss.detach()
        if step % 50 == 49:
            rec.sample()
    rec.step("mlp.losses", host(losses))
    for name, p in model.named_parameters():
        rec.step("mlp.param.%s" % name, host(p))
        st = opt.state[p]
        rec.step("mlp.adam_exp_avg.%s" % name, host(st["exp_avg"]))
        rec.step("mlp.adam_exp_avg_sq.%s" % name, host(st["exp_avg_sq"]))
    model.eval()
    with torch.no_grad():
        out = model(x_all[n_train:])
    rec.step("mlp.eval_logits", host(out))
    acc = (out.argmax(dim=1) == y_all[n_train:]).float().mean()
    rec.step("mlp.eval_accuracy", host(acc))


def streams(torch, rec):
    s = [torch.cuda.Stream(), torch.cuda.Stream()]
    rounds = 120
    out = torch.zeros(rounds, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    done = []
    for i in range(rounds):
        st = s[i % 2]
        with torch.cuda.stream(st):
            size = (1 << 18) + (i % 5) * 4099
            t = torch.arange(size, dtype=torch.int64, device="cuda") * (i + 1)
            for _ in range(4):                # longer work on the stream
                t = (t * 3 + i) % 1000003
            out[i] = t.sum()
            del t
            ev = torch.cuda.Event()
            ev.record(st)
            done.append(ev)
    for ev in done:
        ev.synchronize()
    rec.step("streams.rounds", host(out))

    # A chain: made on stream 0, used on stream 1 after an event, the
    # result used back on stream 0 after another.  record_stream tells
    # the allocator about each use on the other stream.
    s0, s1 = s
    acc = None
    for i in range(20):
        with torch.cuda.stream(s0):
            a = torch.arange(1 << 16, dtype=torch.int64, device="cuda") + i
            if acc is not None:
                acc.record_stream(s0)
                a += acc
            e0 = torch.cuda.Event()
            e0.record(s0)
        s1.wait_event(e0)
        with torch.cuda.stream(s1):
            a.record_stream(s1)
            b = a * 2 - 1
            acc = b % 65521
            e1 = torch.cuda.Event()
            e1.record(s1)
        s0.wait_event(e1)
        del a, b
    with torch.cuda.stream(s0):
        acc.record_stream(s0)
        result = acc.clone()
    s0.synchronize()
    s1.synchronize()
    rec.step("streams.chain", host(result))


if __name__ == "__main__":
    sys.exit(main())
