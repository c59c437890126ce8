"""matmul_f32 builds against cuBLAS SGEMM (TF32 off), interleaved rounds.
   (Calls 1-6 ran it with this timing loop written out; it is now
   ptx_launch.interleaved_times, the same steps.)
   python3 mm_probe.py [--ncu] [--sizes 1024,4096] name=dir ...
   dir holds erlcuda_kernels_sm80.ptx and the abi.rs it was built with
   (tile height, k depth and stages follow that abi). Run from .gpu-bundle."""
import sys, os, statistics
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "kernels"))
import numpy as np, torch, cupy as cp
import ptx_launch as pl
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
args = sys.argv[1:]
ncu = "--ncu" in args
sizes = [4096] if ncu else [512, 1024, 2048, 4096, 8192]
if "--sizes" in args:
    sizes = [int(x) for x in args[args.index("--sizes") + 1].split(",")]
    del args[args.index("--sizes"):args.index("--sizes") + 2]
variants = []
for a in args:
    if a.startswith("--"):
        continue
    name, d = a.split("=", 1)
    # dir@ROWS: tiles of ROWS rows, whatever the launch
    d, _, force = d.partition("@")
    abi = pl.read_abi(os.path.join(d, "abi.rs"))
    abi["force_rows"] = int(force) if force else None
    k = cp.RawModule(path=os.path.join(d, "erlcuda_kernels_sm80.ptx")).get_function("matmul_f32")
    variants.append((name, abi, k))

def smem(abi, rows):
    wide = rows == abi["MATMUL_WIDE_BM"]
    bk = abi["MATMUL_WIDE_BK"] if wide else abi["MATMUL_BK"]
    st = abi.get("MATMUL_WIDE_STAGES", 2) if wide else abi.get("MATMUL_STAGES", 2)
    return st * bk * (rows + 4 + abi["MATMUL_BN"]) * 4  # (stages: the cp.async builds)

rounds = 1 if ncu else 5


def report(s, times):
    """One line per build: median time, TFLOP/s, and cuBLAS's median over it."""
    base = statistics.median(times["cublas"])
    for name, ts in times.items():
        m = statistics.median(ts)
        tflops = 2.0 * s ** 3 / m / 1e12
        print(f"n{s} {name:14s} {m*1e3:8.3f} ms {tflops:6.2f} TFLOP/s  {base/m:.3f}x cublas  (min {min(ts)*1e3:.3f})",
              flush=True)


def check(label, f, out, ref, bound):
    """Runs f once into the NaN-poisoned `out`; prints its largest error
    relative to |A||B| against the f64 reference."""
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    f()
    cp.cuda.Device().synchronize()
    err = ((out - ref).abs() / bound.clamp_min(1e-30)).max().item()
    print(f"{label}: max rel err {err:.2e} {'OK' if err < 1e-4 else 'WRONG'}", flush=True)


for s in sizes:
    g = torch.Generator(device="cuda"); g.manual_seed(1234 + s)
    A = torch.randn(s, s, device="cuda", generator=g); B = torch.randn(s, s, device="cuda", generator=g)
    C = torch.empty(s, s, device="cuda")
    ref = torch.matmul(A.double(), B.double()).float()
    bound = torch.matmul(A.abs(), B.abs())
    Ce = torch.full((s, s), float("nan"), device="cuda")
    job = [(A.data_ptr(), B.data_ptr(), Ce.data_ptr(), s, s, s)]
    fns = [("cublas", lambda: torch.matmul(A, B, out=C))]
    keep = []
    for name, abi, k in variants:
        rows = abi["force_rows"] or pl.matmul_rows(job, abi)
        table, total = pl.matmul_table(job, rows, abi["MATMUL_BN"])
        dt = cp.asarray(table.view(np.uint8)); keep.append(dt)
        sm = smem(abi, rows)
        if sm > 48 * 1024:
            k.max_dynamic_shared_size_bytes = sm
        params = (dt, pl.u32(1), pl.u32(total), pl.u32(rows))
        fns.append((f"{name}/{rows}", (lambda k, total, params, sm: lambda: k((total,), (256,), params, shared_mem=sm))(k, total, params, sm)))
    for name, f in fns[1:]:
        check(f"n{s} {name}", f, Ce, ref, bound)
    reps = 3 if ncu else (40 if s <= 1024 else (20 if s <= 2048 else (10 if s <= 4096 else 4)))
    times = pl.interleaved_times(cp, fns, rounds, reps, before=torch.cuda.synchronize)
    report(s, times)
    del A, B, C, ref, bound, Ce
    torch.cuda.empty_cache()
