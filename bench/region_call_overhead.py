"""Where a kernel region's call goes on CPU workers (issue 38): a small
residual MLP (4 blocks of LayerNorm, Linear, GELU, Linear; width 16, batch
32) trained with ``kernels="inductor"``; each region's compiled function is
timed inside the executor's workers and again alone in the main thread
(the same inputs' shapes), then the regions are called from 1 and 2 Python
threads at once.

    OPTS='{"devices": 2, "pipeline": {"schedule": "1f1b", "microbatches": 4}, "kernels": "inductor"}' \
        PYTHONPATH=build/python .venv/bin/python bench/region_call_overhead.py

Results: bench/RESULTS.md, "modelpar against torch.compile's default".
"""
import copy, time, torch, os, threading
from modelpar.kernels import regions as R
torch.manual_seed(0)
W = 16
class Block(torch.nn.Module):
    def __init__(s):
        super().__init__(); s.fc1 = torch.nn.Linear(W, 2*W); s.fc2 = torch.nn.Linear(2*W, W); s.norm = torch.nn.LayerNorm(W)
    def forward(s, x): return x + s.fc2(torch.nn.functional.gelu(s.fc1(s.norm(x))))
model = torch.nn.Sequential(*[Block() for _ in range(4)], torch.nn.Linear(W, 4))
x = torch.randn(32, W); y = torch.randn(32, 4)
opts = eval(os.environ["OPTS"])
step = torch.compile(lambda a, b: torch.nn.functional.mse_loss(model(a), b), backend="modelpar", options=opts)
for _ in range(3): step(x, y).backward()
acc = {}; lock = threading.Lock(); sigs = {}
def timed_call(self, inputs, sizes):
    sig = R._signature(inputs, sizes); fn = self.compiled.get(sig)
    t1 = time.perf_counter()
    with torch.no_grad(): out = list(fn(*inputs))
    t2 = time.perf_counter()
    with lock:
        c = acc.setdefault(self.key, [0, 0.0]); c[0] += 1; c[1] += t2 - t1; sigs[self.key] = (self, sig)
    return out
R.KernelRegion.__call__ = timed_call
N = 10
t0 = time.perf_counter()
for _ in range(N): step(x, y).backward()
wall = (time.perf_counter() - t0) / N
in_exec = sum(v[1] for v in acc.values()) / N
alone = 0.0
with torch.no_grad():
    for key, (reg, sig) in sigs.items():
        fn = reg.compiled[sig]
        ins = [torch.empty_strided(sh, st, dtype=dt) for sh, st, dt, dv in sig[0]]
        for i in ins:
            if i.dtype.is_floating_point: i.normal_()
            else: i.zero_()
        for _ in range(5): fn(*ins)
        t = time.perf_counter()
        for _ in range(50): fn(*ins)
        alone += (time.perf_counter() - t) / 50 * acc[key][0] / N
# The same step with ATen's kernels (the default), measured in the same run.
aten_model = copy.deepcopy(model)
aten_step = torch.compile(lambda a, b: torch.nn.functional.mse_loss(aten_model(a), b),
                          backend="modelpar", options={**opts, "kernels": "aten"})
for _ in range(3): aten_step(x, y).backward()
t0 = time.perf_counter()
for _ in range(N): aten_step(x, y).backward()
aten_wall = (time.perf_counter() - t0) / N
print(f"kernels=aten: step {aten_wall*1e3:.2f} ms")
print(f"{os.environ['OPTS']}: step {wall*1e3:.2f} ms; regions' fn time per step in the executor {in_exec*1e3:.2f} ms, alone in the main thread {alone*1e3:.2f} ms; {sum(v[0] for v in acc.values())/N:.0f} calls")
# The same regions called from 2 Python threads at once, half each.
items = list(sigs.items())
prepared = []
for key, (reg, sig) in items:
    ins = [torch.empty_strided(sh, st, dtype=dt) for sh, st, dt, dv in sig[0]]
    for i in ins:
        if i.dtype.is_floating_point: i.normal_()
        else: i.zero_()
    prepared.append((reg.compiled[sig], ins))
def worker(part, out, reps=50):
    torch.set_num_threads(1)
    with torch.no_grad():
        t = time.perf_counter()
        for _ in range(reps):
            for fn, ins in part: fn(*ins)
        out.append(time.perf_counter() - t)
for nthreads in (1, 2):
    outs = []
    ths = [threading.Thread(target=worker, args=(prepared[i::nthreads], outs)) for i in range(nthreads)]
    t = time.perf_counter()
    for th in ths: th.start()
    for th in ths: th.join()
    print(f"{nthreads} thread(s): all {len(prepared)} regions x 50 in {time.perf_counter() - t:.3f} s")
import sys
sys.setswitchinterval(0.0001)
outs = []
ths = [threading.Thread(target=worker, args=(prepared[i::2], outs)) for i in range(2)]
t = time.perf_counter()
for th in ths: th.start()
for th in ths: th.join()
print(f"2 threads, switch interval 0.1 ms: {time.perf_counter() - t:.3f} s")
