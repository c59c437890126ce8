"""Matmul kernel variants against cuBLAS SGEMM (TF32 off), interleaved rounds.
   python3 mm_probe.py [--ncu] v0.ptx v1.ptx ...   (run from .gpu-bundle)"""
import sys, os, statistics
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels"))
import numpy as np, torch, cupy as cp
import ptx_launch as pl
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
abi = pl.read_abi(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "abi.rs"))
ncu = sys.argv[1] == "--ncu"
paths = sys.argv[2:] if ncu else sys.argv[1:]
# a path may carry @BK: a build with another MATMUL_BK (shared memory follows)
# and @BM: a build with another MATMUL_BM (its tiles follow)
def spec(p):
    f = p.split("@")
    return (f[0], int(f[1]) if len(f) > 1 else abi["MATMUL_BK"], int(f[2]) if len(f) > 2 else abi["MATMUL_BM"])
specs = [spec(p) for p in paths]
paths = [p for p, _, _ in specs]
kerns, smems = [], []
for p, bk, bm in specs:
    k = cp.RawModule(path=p).get_function("matmul_f32")
    sm = 2 * bk * (bm + 4 + abi["MATMUL_BN"]) * 4
    if sm > 48 * 1024:
        k.max_dynamic_shared_size_bytes = sm
    kerns.append(k); smems.append(sm)
threads = 256
sizes = [4096] if ncu else [1024, 2048, 4096, 8192]
rounds = 1 if ncu else 5
for s in sizes:
    g = torch.Generator(device="cuda"); g.manual_seed(1234 + s)
    A = torch.randn(s, s, device="cuda", generator=g); B = torch.randn(s, s, device="cuda", generator=g)
    C = torch.empty(s, s, device="cuda")
    ref = torch.matmul(A, B)
    bound = torch.matmul(A.abs(), B.abs())
    Ce = torch.full((s, s), float("nan"), device="cuda")
    launch = {}
    for bm in sorted({bm for _, _, bm in specs}):
        table, total = pl.matmul_table([(A.data_ptr(), B.data_ptr(), Ce.data_ptr(), s, s, s)], bm, abi["MATMUL_BN"])
        dt = cp.asarray(table.view(np.uint8))
        launch[bm] = (total, (dt, pl.u32(1), pl.u32(total)))
    fns = [("cublas", lambda: torch.matmul(A, B, out=C))] + \
          [(os.path.basename(p) + ("" if sp[1:] == (abi["MATMUL_BK"], abi["MATMUL_BM"]) else "@%d@%d" % sp[1:]),
            (lambda k, sm, tl: (lambda: k((tl[0],), (threads,), tl[1], shared_mem=sm)))(k, sm, launch[sp[2]]))
           for p, k, sm, sp in zip(paths, kerns, smems, specs)]
    for name, f in fns[1:]:
        Ce.fill_(float("nan")); torch.cuda.synchronize(); f(); cp.cuda.Device().synchronize()
        err = ((Ce - ref).abs() / bound.clamp_min(1e-30)).max().item()
        print(f"n{s} {name}: max rel err {err:.2e} {'OK' if err < 1e-4 else 'WRONG'}", flush=True)
    reps = 3 if ncu else (20 if s <= 2048 else (10 if s <= 4096 else 4))
    times = {n: [] for n, _ in fns}
    for r in range(rounds):
        for name, f in fns:
            torch.cuda.synchronize()
            ts = pl.cupy_event_times(cp, f, reps, 2)
            times[name] += ts
    fl = 2.0 * s ** 3
    base = statistics.median(times["cublas"])
    for name, _ in fns:
        m = statistics.median(times[name])
        print(f"n{s} {name:10s} {m*1e3:8.3f} ms {fl/m/1e12:6.2f} TFLOP/s  {base/m:.3f}x cublas  (min {min(times[name])*1e3:.3f})", flush=True)
    del A, B, C, ref, bound, Ce
    torch.cuda.empty_cache()
