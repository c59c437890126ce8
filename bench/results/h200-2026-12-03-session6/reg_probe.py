"""cuMemHostRegister of a 256 MiB shared mapping: one call against 2/4/8
   chunks registered from as many threads at once (each its own call)."""
import ctypes, mmap, os, time, threading, sys
cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0: raise RuntimeError(f"{what}: {r}")
t0 = time.perf_counter(); ck(cu.cuInit(0), "cuInit"); t1 = time.perf_counter()
dev = ctypes.c_int(); ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "dev")
ctx = ctypes.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "ctx"); ck(cu.cuCtxSetCurrent(ctx), "cur")
t2 = time.perf_counter()
print(f"cuInit {1e3*(t1-t0):.1f} ms, primary context {1e3*(t2-t1):.1f} ms", flush=True)
SZ = 256 << 20
FL = 0x1 | 0x2  # PORTABLE | DEVICEMAP
cu.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
cu.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
def fresh():
    fd = os.memfd_create("arena"); os.ftruncate(fd, SZ)
    base = libc.mmap(None, SZ, 3, 1, fd, 0)  # PROT_READ|WRITE, MAP_SHARED
    ctypes.memset(base, 1, SZ)  # faulted in, as the NIF's prefault does
    return fd, base
def reg(base, parts):
    step = SZ // parts
    errs = []
    def one(i):
        cu.cuCtxSetCurrent(ctx)
        r = cu.cuMemHostRegister_v2(ctypes.c_void_p(base + i * step), step, FL)
        if r: errs.append(r)
    ts = [threading.Thread(target=one, args=(i,)) for i in range(parts)]
    t = time.perf_counter()
    for x in ts: x.start()
    for x in ts: x.join()
    el = time.perf_counter() - t
    for i in range(parts): cu.cuMemHostUnregister(ctypes.c_void_p(base + i * step))
    return el, errs
for rnd in range(3):
    for parts in (1, 2, 4, 8):
        fd, base = fresh()
        el, errs = reg(base, parts)
        print(f"round {rnd} parts {parts}: {1e3*el:.1f} ms {'errors ' + str(errs) if errs else ''}", flush=True)
        libc.munmap(base, SZ); os.close(fd)
