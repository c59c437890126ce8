//! `gpud-bench --baseline`: the in-process baseline of the benchmarks. The same
//! GPU work as one erlcuda job (inputs copied into the registered arena,
//! one launch through gpud's backend, spin until done, result copied out)
//! done by this process alone: no BEAM, no ring, no eventfd, no validation
//! by another process. `bench/erlcuda_bench.erl` drives it over a port and
//! interleaves its blocks with full-stack blocks (A B A B), so the ratio
//! full stack / baseline is measured under the same conditions.
//!
//! Protocol on stdin/stdout, each message prefixed by its length as a u32
//! big endian (Erlang's `{packet, 4}`):
//! - request `<<Kernel:8, N:32/big, Jobs:32/big>>`: run `Jobs` jobs, one at
//!   a time, of kernel id `Kernel` on `N` elements (vector kernels only);
//! - reply: `Jobs` u32 big endian, each job's time in nanoseconds, or an
//!   empty message when the request is refused. EOF on stdin ends the run.

use std::io::{Read, Write};
use std::time::Instant;

use crate::backend::{self, BackendKind, Launch};
use crate::descriptor::validate;
use crate::error::{Error, Result};
use crate::layout::{ElemType, Kernel, Shape, Sqe};
use crate::testvec::{shaped_sqe, Rng, TestArena};

/// Largest `N` a request may ask for (the arena below holds 3 of them).
const MAX_N: usize = 1 << 22;

/// The driving process broke the protocol (or the job it asked for is
/// refused): the baseline ends, the benchmark reports it.
fn broken(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Handshake(format!("baseline: {what}: {e}"))
}

pub fn run(kind: BackendKind, device: u32) -> Result<()> {
    // The daemon's path: the same lane, so full stack / in-process compares
    // like with like.
    let mut b = backend::open(kind, device, backend::DEFAULT_LANE_SMS)?;
    let mut ta = TestArena::new(&[(3 * MAX_N as u64 * 4).next_multiple_of(1 << 21)]);
    ta.attach(b.as_mut())?;
    let (pa, pb, po) = (ta.alloc(0, MAX_N, 0), ta.alloc(0, MAX_N, 0), ta.alloc(0, MAX_N, 0));
    let sizes = ta.sizes();
    let mut rng = Rng(Instant::now().elapsed().as_nanos() as u64 ^ std::process::id() as u64);
    eprintln!("gpud baseline: {} {}", b.kind(), b.name());
    let (mut stdin, mut stdout) = (std::io::stdin().lock(), std::io::stdout().lock());
    loop {
        let mut len = [0u8; 4];
        match stdin.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(broken("stdin", e)),
        }
        let mut req = vec![0u8; u32::from_be_bytes(len) as usize];
        stdin.read_exact(&mut req).map_err(|e| broken("stdin", e))?;
        let parsed = (req.len() == 9)
            .then(|| {
                let k = Kernel::from_id(u16::from(req[0]))?;
                let n = u32::from_be_bytes(req[1..5].try_into().unwrap()) as usize;
                let jobs = u32::from_be_bytes(req[5..9].try_into().unwrap()) as usize;
                (k.row().shape != Shape::Matmul && n <= MAX_N).then_some((k, n, jobs))
            })
            .flatten();
        let mut reply = Vec::new();
        if let Some((kernel, n, jobs)) = parsed {
            let (a, bv) = (rng.vec(n), rng.vec(n));
            let scalars: Vec<f64> = kernel.sig().args().iter().filter(|a| a.kind == crate::signature::Kind::Scalar).map(|_| 1.5).collect();
            let sqe = Sqe {
                in0: pa,
                in1: pb,
                out: po,
                ..shaped_sqe(kernel, ElemType::F32, n as u32, [0; 3], &scalars)
            };
            let out_len = sqe.out_len as usize;
            let mut result = vec![0f32; out_len];
            reply.reserve(4 * jobs);
            for _ in 0..jobs {
                let t = Instant::now();
                // What the NIF does for a small job: copy the inputs into the
                // arena; what gpud does: validate; then launch and wait; then
                // what the NIF does again: copy the result out.
                ta.write_at(pa, &a);
                if kernel.vector_inputs() == 2 {
                    ta.write_at(pb, &bv);
                }
                let job = validate(&sqe, &sizes).map_err(|s| broken("job", format!("{s:?}")))?;
                let launch = Launch::builtin(kernel, ElemType::F32, std::slice::from_ref(&job), true);
                backend::run_to_completion(b.as_mut(), &ta.arena(), &launch)?;
                ta.read_into(po, &mut result);
                let ns = t.elapsed().as_nanos().min(u32::MAX as u128) as u32;
                reply.extend_from_slice(&ns.to_be_bytes());
            }
            std::hint::black_box(&result);
        }
        stdout
            .write_all(&(reply.len() as u32).to_be_bytes())
            .and_then(|()| stdout.write_all(&reply))
            .and_then(|()| stdout.flush())
            .map_err(|e| broken("stdout", e))?;
    }
}
