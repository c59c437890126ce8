//! Paced bulk copies between the arena and device buffers (puts and gets):
//! each copy is cut into pieces, and at most `depth` pieces per direction
//! are on the copy engine at once, so a small job's own copies wait behind
//! one piece, never behind a whole 256 MiB transfer. Copy engines are not
//! split by priorities or green contexts: beside a 512 MiB copy a small
//! job that copies waited 9.6 ms, and 9.9 ms with the copy cut into 4 MiB
//! pieces all queued at once; with one piece in flight per direction its
//! p99 was 57 us (1 MiB pieces, 36 GB/s) or 116 us (4 MiB, 49 GB/s), and
//! two in flight starved it (H200, standalone CUDA probes).
//!
//! Pacing costs bandwidth (the engine idles between a piece's end and the
//! loop's next poll, and one piece in flight is below PCIe's speed: a
//! 256 MiB put ran at 0.74x pinned PCIe on an H100), so it applies only
//! while small jobs run: a small launch (`note_small`) paces the copies
//! for the next `SMALL_WINDOW`; otherwise pieces are queued ahead up to
//! `AHEAD_BYTES` a direction, and the copy engine never waits for gpud's
//! loop. A small job that comes in the middle of a copy waits behind at
//! most that much once (0.6 ms at 54 GB/s); those after it are paced. The
//! CPU backend copies a piece as it is issued, so there nothing goes ahead.
//!
//! The pacer is the bookkeeping only; a backend supplies how a piece is
//! issued and how it is seen finished (`M`, its mark: a CUDA event, or
//! nothing on the CPU, where a piece is copied when it is issued).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::Ticket;
use crate::error::Result;

/// Which way a copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Arena to a device buffer (a put).
    ToDevice = 0,
    /// A device buffer to the arena (a get).
    ToHost = 1,
}

/// Piece size and pieces in flight per direction (`--copy-piece-bytes`,
/// `--copies-in-flight`), and the most blocks a large launch that reads
/// host memory through the mapping runs with while small jobs run
/// (`--mapped-grid`, 0: no cap).
///
/// Why the cap: such a launch (a large job from binaries, its inputs read
/// in place over PCIe) keeps every thread's loads in flight at once, far
/// more than PCIe needs to run at full speed, and a small job's own reads
/// of its inputs queue behind them. Beside `vector_add` of 2^24 from
/// binaries (H100), small jobs took 1.3-1.5 ms about twice per large job,
/// about as long as the launch's reads of one input, and small-job p99
/// was 1.1-1.3 ms, with no step of gpud's loop or the VM that long. The
/// kernels are grid-stride, so any grid is correct; fewer blocks keep
/// fewer reads in flight. Swept there (mixed section at scale 4, small
/// jobs' p99 / max µs, large jobs beside ÷ alone): no cap 713-716 / 944-958,
/// 0.90-0.99; 256 blocks 531 / 923; 64: 259-262 / 404-437; 32: 142 / 533;
/// 16: 71-79 / 158-634, 1.01-1.08; 8: 55 / 665, 0.97. 16 keeps the p99
/// under 100 µs and costs the large job nothing: PCIe, not the SMs, bounds
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pacing {
    pub piece: usize,
    pub depth: usize,
    pub mapped_grid: u32,
}

impl Pacing {
    /// At least a page a piece and one piece in flight.
    fn at_least_one(self) -> Pacing {
        Pacing { piece: self.piece.max(4096), depth: self.depth.max(1), ..self }
    }
}

impl Default for Pacing {
    /// 2 MiB, one in flight: between the probe's 1 MiB (p99 57 us, 36
    /// GB/s) and 4 MiB (116 us, 49 GB/s), for the goal of a small job's
    /// p99 within 100 us beside any large one; mapped launches capped at
    /// 16 blocks (the sweep above).
    fn default() -> Pacing {
        Pacing { piece: 2 << 20, depth: 1, mapped_grid: 16 }
    }
}

/// How long after a small launch copies stay paced: longer than the gap
/// between one caller's small jobs (tens of microseconds), short enough
/// that a lone small job does not slow the copies for long.
pub const SMALL_WINDOW: Duration = Duration::from_millis(2);

/// Bytes queued ahead on a direction while no small job runs: enough that
/// the engine never runs dry between polls of gpud's loop.
pub const AHEAD_BYTES: usize = 32 << 20;

/// One copy: `bytes` between device address `dev` and host address `host`.
struct Copy {
    ticket: Ticket,
    dev: u64,
    host: usize,
    bytes: usize,
    /// Bytes issued so far.
    issued: usize,
}

/// A piece on the engine: its mark, and the ticket it finishes (the last
/// piece of its copy), if any.
struct Flying<M> {
    mark: M,
    finishes: Option<Ticket>,
}

#[derive(Default)]
struct Lane<M> {
    waiting: VecDeque<Copy>,
    flying: VecDeque<Flying<M>>,
}

pub struct Pacer<M> {
    pacing: Pacing,
    lanes: [Lane<M>; 2],
    /// Copies taken and not reported finished.
    open: usize,
    /// Copies are paced until then (the last small launch + SMALL_WINDOW).
    paced_until: Option<Instant>,
    /// Bytes a direction may queue ahead while no small job runs: 0 where
    /// a piece is copied when it is issued (the CPU backend), since
    /// issuing more at once only holds gpud's loop longer.
    ahead: usize,
}

impl<M> Pacer<M> {
    /// A pacer that queues up to `ahead` bytes a direction while no small
    /// job runs (`AHEAD_BYTES` where copies are asynchronous, else 0).
    pub fn new(pacing: Pacing, ahead: usize) -> Pacer<M> {
        Pacer { pacing: pacing.at_least_one(), lanes: [Lane { waiting: VecDeque::new(), flying: VecDeque::new() }, Lane { waiting: VecDeque::new(), flying: VecDeque::new() }], open: 0, paced_until: None, ahead }
    }

    pub fn set_pacing(&mut self, pacing: Pacing) {
        self.pacing = pacing.at_least_one();
    }

    /// Takes a copy; [`advance`](Pacer::advance) issues its pieces and
    /// reports `ticket` once the last one has finished.
    pub fn push(&mut self, dir: Dir, ticket: Ticket, dev: u64, host: usize, bytes: usize) {
        self.lanes[dir as usize].waiting.push_back(Copy { ticket, dev, host, bytes, issued: 0 });
        self.open += 1;
    }

    /// Copies taken and not reported finished yet.
    pub fn open(&self) -> usize {
        self.open
    }

    /// A small launch was just made: pace the copies for `SMALL_WINDOW`.
    pub fn note_small(&mut self, now: Instant) {
        self.paced_until = Some(now + SMALL_WINDOW);
    }

    /// Whether a small launch came in the last `SMALL_WINDOW`.
    pub fn small_recently(&self, now: Instant) -> bool {
        self.paced_until.is_some_and(|t| now < t)
    }

    /// The grid a large launch that reads host memory through the mapping
    /// runs with now: `grid`, capped at `mapped_grid` while small jobs run.
    pub fn mapped_grid(&self, grid: u32, now: Instant) -> u32 {
        if self.pacing.mapped_grid > 0 && self.small_recently(now) {
            grid.min(self.pacing.mapped_grid)
        } else {
            grid
        }
    }

    /// Pieces a direction may have in flight now: `depth` while small jobs
    /// run, else as many as make the pacer's `ahead` bytes.
    pub fn depth(&self, now: Instant) -> usize {
        if self.small_recently(now) {
            self.pacing.depth
        } else {
            self.pacing.depth.max(self.ahead / self.pacing.piece)
        }
    }

    /// Reports the copies whose last piece has finished (`finished` says
    /// whether a mark's piece is done; pieces finish in the order issued
    /// on a lane; `release` gets a finished piece's mark back), then
    /// issues pieces until [`depth`](Pacer::depth) are in flight on each
    /// lane (`issue` starts one: direction, device address, host address,
    /// bytes).
    pub fn advance(
        &mut self,
        done: &mut Vec<Ticket>,
        mut issue: impl FnMut(Dir, u64, usize, usize) -> Result<M>,
        mut finished: impl FnMut(&M) -> Result<bool>,
        mut release: impl FnMut(M),
    ) -> Result<()> {
        let depth = self.depth(Instant::now());
        for (i, lane) in self.lanes.iter_mut().enumerate() {
            let dir = if i == 0 { Dir::ToDevice } else { Dir::ToHost };
            while let Some(f) = lane.flying.front() {
                if !finished(&f.mark)? {
                    break;
                }
                let f = lane.flying.pop_front().expect("front exists");
                release(f.mark);
                if let Some(t) = f.finishes {
                    done.push(t);
                    self.open -= 1;
                }
            }
            while lane.flying.len() < depth {
                let Some(c) = lane.waiting.front_mut() else { break };
                let n = (c.bytes - c.issued).min(self.pacing.piece);
                let last = c.issued + n == c.bytes;
                // A copy of 0 bytes is one empty piece: it still has to be
                // reported after everything queued before it.
                let mark = issue(dir, c.dev + c.issued as u64, c.host + c.issued, n)?;
                c.issued += n;
                let finishes = last.then_some(c.ticket);
                if last {
                    lane.waiting.pop_front();
                }
                lane.flying.push_back(Flying { mark, finishes });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces cut at `piece`, at most `depth` issued before the earlier
    /// ones finish, each copy reported once after its last piece, lanes
    /// independent.
    #[test]
    fn pieces_are_paced_and_each_copy_reported_once() {
        let mut p: Pacer<u32> = Pacer::new(Pacing { piece: 4096, depth: 1, mapped_grid: 0 }, AHEAD_BYTES);
        // Small jobs run all along (the window outlasts the test).
        p.paced_until = Some(Instant::now() + Duration::from_secs(3600));
        p.push(Dir::ToDevice, 1, 1 << 20, 0, 10_000);
        p.push(Dir::ToDevice, 2, 2 << 20, 65536, 0);
        p.push(Dir::ToHost, 3, 3 << 20, 131072, 4096);
        let mut issued = Vec::new();
        let mut next = 0u32;
        let mut done_marks = std::collections::HashSet::new();
        let mut reported = Vec::new();
        for round in 0..10 {
            let mut done = Vec::new();
            p.advance(
                &mut done,
                |d, dev, host, n| {
                    issued.push((round, d, dev, host, n));
                    next += 1;
                    Ok(next)
                },
                |m| Ok(done_marks.contains(m)),
                |_| {},
            )
            .unwrap();
            reported.extend(done);
            // Everything issued so far finishes before the next round.
            done_marks.extend(1..=next);
        }
        assert_eq!(reported, vec![3, 1, 2]);
        assert_eq!(p.open(), 0);
        let to_dev: Vec<_> = issued.iter().filter(|i| i.1 == Dir::ToDevice).map(|i| (i.0, i.2, i.3, i.4)).collect();
        assert_eq!(
            to_dev,
            vec![
                (0, 1 << 20, 0, 4096),
                (1, (1 << 20) + 4096, 4096, 4096),
                (2, (1 << 20) + 8192, 8192, 10_000 - 8192),
                (3, 2 << 20, 65536, 0),
            ]
        );
    }

    /// A large launch that reads host memory is capped at `mapped_grid`
    /// blocks only while small jobs run, and never with the cap off.
    #[test]
    fn mapped_launches_are_capped_only_while_small_jobs_run() {
        let t0 = Instant::now();
        let mut p: Pacer<u32> = Pacer::new(Pacing { mapped_grid: 64, ..Pacing::default() }, AHEAD_BYTES);
        assert_eq!(p.mapped_grid(8448, t0), 8448, "no small job yet");
        p.note_small(t0);
        assert_eq!(p.mapped_grid(8448, t0), 64);
        assert_eq!(p.mapped_grid(10, t0), 10, "a smaller grid stays");
        assert_eq!(p.mapped_grid(8448, t0 + SMALL_WINDOW), 8448, "the window has passed");
        let mut off: Pacer<u32> = Pacer::new(Pacing { mapped_grid: 0, ..Pacing::default() }, AHEAD_BYTES);
        off.note_small(t0);
        assert_eq!(off.mapped_grid(8448, t0), 8448);
    }

    /// With no small job in the window, a copy's pieces are queued ahead
    /// (AHEAD_BYTES a direction) in one poll; a small launch brings the
    /// depth back to `depth` for SMALL_WINDOW.
    #[test]
    fn pieces_go_ahead_unless_small_jobs_run() {
        let piece = 1 << 20;
        let mut p: Pacer<u32> = Pacer::new(Pacing { piece, depth: 1, mapped_grid: 0 }, AHEAD_BYTES);
        let t0 = Instant::now();
        assert_eq!(p.depth(t0), AHEAD_BYTES / piece);
        p.note_small(t0);
        assert_eq!(p.depth(t0), 1);
        assert_eq!(p.depth(t0 + SMALL_WINDOW), AHEAD_BYTES / piece);
        p.paced_until = None;
        p.push(Dir::ToHost, 7, 0, 0, 100 * piece);
        let mut issued = 0u32;
        let mut done = Vec::new();
        p.advance(&mut done, |_, _, _, _| { issued += 1; Ok(issued) }, |_| Ok(false), |_| {}).unwrap();
        assert_eq!(issued as usize, AHEAD_BYTES / piece, "queued ahead in one poll");
        // A small job now: nothing more is issued until the engine drains
        // to one piece.
        p.note_small(Instant::now());
        p.advance(&mut done, |_, _, _, _| { issued += 1; Ok(issued) }, |m| Ok(*m < 32), |_| {}).unwrap();
        assert_eq!(issued as usize, AHEAD_BYTES / piece, "31 done, one left: none issued");
        assert!(done.is_empty());
        // Where pieces are copied as they are issued, none go ahead.
        let cpu: Pacer<u32> = Pacer::new(Pacing { piece, depth: 1, mapped_grid: 0 }, 0);
        assert_eq!(cpu.depth(t0), 1);
    }
}
