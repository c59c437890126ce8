//! Registering arena segments with the device off the path to `ready`.
//!
//! `cuMemHostRegister` of the arena pins every page of it (faulting in and
//! zeroing the ones the VM never touched) and maps them for the device: on
//! the H200 100-140 ms for 256 MiB, ~130-540 ms for 1 GiB, most of gpud's
//! start when it ran before `ready`. Nothing needs it to be done before the
//! first job: a segment that is not registered yet is served through
//! pageable copies (the CUDA backend's copy-in/copy-out path, see
//! `backend::cuda`), which the driver stages itself.
//!
//! So a [`Registrar`] owns one thread that registers segments in the order
//! asked, one at a time, and reports each result on a channel; the backend
//! collects the results on its own thread whenever it is about to place a
//! launch ([`Registrar::collect`]) and switches a segment to the registered
//! fast path from the next launch on. A launch already placed keeps its
//! path: both are correct, and no pageable copy is in flight once `submit`
//! has returned (the driver has staged host-to-device copies and finished
//! device-to-host ones by then).
//!
//! Orderings, all correct:
//! - jobs before or during a registration: pageable path;
//! - jobs after it was collected: registered path;
//! - a segment that arrives later (arena growth): queued behind the others,
//!   pageable until done;
//! - gpud exits (stdin closed, a device fault) mid-registration:
//!   [`Registrar::shutdown`] skips what has not started, waits for the one
//!   in progress and hands back every finished one, so the backend
//!   unregisters all it registered before the mappings go;
//! - gpud killed mid-registration: the kernel drops the pins with the
//!   process; the next gpud registers anew.
//!
//! The thread does only what [`Pinner`] says (the CUDA backend's pinner
//! calls the driver), so the switch itself is tested on the CPU with a fake.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One segment to register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinRequest {
    pub seg: usize,
    /// The page-aligned range registered around the segment.
    pub reg_base: usize,
    pub reg_len: usize,
    /// The segment's first byte (its device address is what pinning gives).
    pub base: usize,
}

/// What came of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinned {
    pub req: PinRequest,
    /// The device address of `req.base`, or why registration failed.
    pub result: std::result::Result<u64, String>,
    /// How long the registration took.
    pub took: Duration,
    /// When it finished, since gpud started (`startup::process_start`).
    pub at: Duration,
}

/// Does the registering, on the registrar's thread.
pub trait Pinner: Send + 'static {
    /// Registers `req`'s range; returns the device address of `req.base`.
    fn pin(&mut self, req: &PinRequest) -> std::result::Result<u64, String>;

    /// Told each result as soon as it is known, on the registrar's thread
    /// (for the log: the backend's thread may be asleep then).
    fn finished(&mut self, _p: &Pinned) {}
}

pub struct Registrar {
    tx: Option<Sender<PinRequest>>,
    rx: Receiver<Pinned>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Requested and not collected yet.
    pending: usize,
}

impl Registrar {
    /// Starts the thread. `name` names it (`ps -L`, debuggers).
    pub fn spawn(name: String, mut pinner: impl Pinner) -> std::io::Result<Registrar> {
        let (tx, reqs) = mpsc::channel::<PinRequest>();
        let (done, rx) = mpsc::channel::<Pinned>();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        // Fix the origin of `Pinned::at` now if `main` did not (tests).
        let _ = crate::startup::process_start();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            // Ends when the registrar drops its sender (shutdown), after the
            // request in progress; requests not started are skipped once
            // `stop` is set.
            for req in reqs {
                if stopping.load(Ordering::Acquire) {
                    continue;
                }
                let t = Instant::now();
                let result = pinner.pin(&req);
                let p = Pinned { req, result, took: t.elapsed(), at: crate::startup::since_start() };
                pinner.finished(&p);
                if done.send(p).is_err() {
                    break;
                }
            }
        })?;
        Ok(Registrar { tx: Some(tx), rx, stop, thread: Some(thread), pending: 0 })
    }

    /// Queues `req` behind the requests before it.
    pub fn request(&mut self, req: PinRequest) {
        if let Some(tx) = &self.tx {
            if tx.send(req).is_ok() {
                self.pending += 1;
            }
        }
    }

    /// Requested and not collected yet.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Every result available now, without waiting.
    pub fn collect(&mut self) -> Vec<Pinned> {
        let mut out = Vec::new();
        if self.pending == 0 {
            return out;
        }
        while let Ok(p) = self.rx.try_recv() {
            out.push(p);
        }
        self.pending -= out.len();
        out
    }

    /// Waits up to `timeout` for the next result.
    pub fn wait(&mut self, timeout: Duration) -> Option<Pinned> {
        if self.pending == 0 {
            return None;
        }
        match self.rx.recv_timeout(timeout) {
            Ok(p) => {
                self.pending -= 1;
                Some(p)
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Stops the thread: requests not started are dropped, the one in
    /// progress is waited for. Returns every result not collected before,
    /// so that what was registered can be unregistered.
    pub fn shutdown(&mut self) -> Vec<Pinned> {
        self.stop.store(true, Ordering::Release);
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let out: Vec<Pinned> = self.rx.try_iter().collect();
        self.pending = 0;
        out
    }
}

impl Drop for Registrar {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Pins nothing; each `pin` waits for a permit from the test, so the
    /// test decides when each registration finishes.
    struct Gated {
        permits: Receiver<std::result::Result<u64, String>>,
        seen: Arc<Mutex<Vec<usize>>>,
    }

    impl Pinner for Gated {
        fn pin(&mut self, req: &PinRequest) -> std::result::Result<u64, String> {
            self.seen.lock().unwrap().push(req.seg);
            self.permits.recv().unwrap_or_else(|_| Err("no permit".into()))
        }
    }

    fn req(seg: usize) -> PinRequest {
        PinRequest { seg, reg_base: seg << 20, reg_len: 1 << 20, base: seg << 20 }
    }

    type Permit = Sender<std::result::Result<u64, String>>;

    fn gated() -> (Registrar, Permit, Arc<Mutex<Vec<usize>>>) {
        let (permit, permits) = mpsc::channel();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let r = Registrar::spawn("test-registrar".into(), Gated { permits, seen: seen.clone() }).unwrap();
        (r, permit, seen)
    }

    #[test]
    fn results_come_in_order_and_only_once_each_is_done() {
        let (mut r, permit, _) = gated();
        r.request(req(0));
        r.request(req(1));
        assert_eq!(r.pending(), 2);
        // Registration 0 in progress: nothing to collect yet (its jobs take
        // the pageable path).
        std::thread::sleep(Duration::from_millis(20));
        assert!(r.collect().is_empty());
        permit.send(Ok(0xd000)).unwrap();
        let p = r.wait(Duration::from_secs(5)).expect("segment 0");
        assert_eq!((p.req.seg, p.result.clone()), (0, Ok(0xd000)));
        assert!(p.at >= p.took);
        assert_eq!(r.pending(), 1);
        // A failure is reported like a success, with its reason.
        permit.send(Err("no".into())).unwrap();
        let p = r.wait(Duration::from_secs(5)).expect("segment 1");
        assert_eq!((p.req.seg, p.result), (1, Err("no".into())));
        assert_eq!(r.pending(), 0);
        assert!(r.collect().is_empty());
        assert_eq!(r.wait(Duration::from_millis(1)), None);
    }

    #[test]
    fn shutdown_waits_for_the_one_in_progress_and_skips_the_rest() {
        let (mut r, permit, seen) = gated();
        for s in 0..3 {
            r.request(req(s));
        }
        while seen.lock().unwrap().is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Segment 0 is being registered: shutdown must wait for it (its pin
        // has to be undone by the backend), then drop 1 and 2 unstarted.
        let gate = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            permit.send(Ok(0xd000)).unwrap();
            permit
        });
        let left = r.shutdown();
        let _permit = gate.join().unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!((left[0].req.seg, left[0].result.clone()), (0, Ok(0xd000)));
        assert_eq!(*seen.lock().unwrap(), vec![0], "requests after shutdown must not start");
        assert_eq!(r.pending(), 0);
        // Requests after shutdown are ignored, not queued for ever.
        r.request(req(5));
        assert_eq!(r.pending(), 0);
    }
}
