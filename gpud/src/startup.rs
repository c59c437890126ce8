//! Where gpud's start goes: the phases from `main` to `ready`, measured with
//! monotonic timestamps, kept in the log for good (one GPU run then shows
//! where the time goes).
//!
//! The daemon marks the end of each phase; a backend may split its own
//! opening into sub-phases (CUDA: driver init, context, module). At ready
//! the phases go out twice: in the `ready` log line, for people, and as the
//! protocol line `startup NAME=MICROSECONDS ... total=MICROSECONDS` just
//! before `ready`, which `erlcuda_device` keeps for `erlcuda:devices()`
//! (`startup` map). What happens before `main` (fork, exec, loading) is not
//! seen from here: the VM's `ready_us` minus `total` is that.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

static PROCESS_START: OnceLock<Instant> = OnceLock::new();

/// Called first thing in `main`: the origin of every startup timestamp.
pub fn mark_process_start() {
    let _ = PROCESS_START.set(Instant::now());
}

/// The origin: `main`'s first instant, or the first call here (tests and
/// embedders that never went through `main`).
pub fn process_start() -> Instant {
    *PROCESS_START.get_or_init(Instant::now)
}

/// Time since [`process_start`].
pub fn since_start() -> Duration {
    process_start().elapsed()
}

/// Phases in order, each the time since the previous mark.
#[derive(Debug, Clone)]
pub struct Phases {
    last: Instant,
    phases: Vec<(&'static str, Duration)>,
}

impl Default for Phases {
    fn default() -> Phases {
        Phases::new(process_start())
    }
}

impl Phases {
    pub fn new(origin: Instant) -> Phases {
        Phases { last: origin, phases: Vec::new() }
    }

    /// Ends phase `name` now.
    pub fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.phases.push((name, now.saturating_duration_since(self.last)));
        self.last = now;
    }

    /// Ends phase `name` now, split into `parts` (a backend's own
    /// measurements, taken within the phase); what they do not cover is
    /// `name` itself.
    pub fn mark_split(&mut self, name: &'static str, parts: &[(&'static str, Duration)]) {
        let now = Instant::now();
        let whole = now.saturating_duration_since(self.last);
        let covered: Duration = parts.iter().map(|p| p.1).sum();
        self.phases.extend_from_slice(parts);
        self.phases.push((name, whole.saturating_sub(covered)));
        self.last = now;
    }

    pub fn phases(&self) -> &[(&'static str, Duration)] {
        &self.phases
    }

    /// Sum of the phases: from the origin to the last mark.
    pub fn total(&self) -> Duration {
        self.phases.iter().map(|p| p.1).sum()
    }

    /// The protocol line: `startup a=12 b=3400 total=3412` (µs).
    pub fn protocol_line(&self) -> String {
        let mut s = String::from("startup");
        for (name, d) in self.phases.iter().chain([("total", self.total())].iter()) {
            s.push_str(&format!(" {name}={}", d.as_micros()));
        }
        s
    }

    /// For the log: `12.3 ms (a 0.0, b 3.4, ...)`.
    pub fn summary(&self) -> String {
        let ms = |d: &Duration| d.as_secs_f64() * 1e3;
        let parts: Vec<String> = self.phases.iter().map(|(n, d)| format!("{n} {:.1}", ms(d))).collect();
        format!("{:.1} ms ({})", ms(&self.total()), parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_and_print_as_the_vm_parses_them() {
        let t0 = Instant::now();
        let mut p = Phases::new(t0);
        std::thread::sleep(Duration::from_millis(2));
        p.mark("handshake");
        std::thread::sleep(Duration::from_millis(3));
        p.mark_split("backend", &[("cuda_init", Duration::from_millis(1)), ("context", Duration::from_millis(1))]);
        let names: Vec<_> = p.phases().iter().map(|x| x.0).collect();
        assert_eq!(names, ["handshake", "cuda_init", "context", "backend"]);
        assert!(p.total() >= Duration::from_millis(5));
        assert!(p.total() <= t0.elapsed());
        let line = p.protocol_line();
        let words: Vec<_> = line.split(' ').collect();
        assert_eq!(words[0], "startup");
        assert_eq!(words.len(), 6);
        let total: u128 = words[5].strip_prefix("total=").unwrap().parse().unwrap();
        let sum: u128 = words[1..5].iter().map(|w| w.split_once('=').unwrap().1.parse::<u128>().unwrap()).sum();
        // Rounding each phase down to whole µs loses under 1 µs per phase.
        assert!(total >= sum && total - sum < 4, "{line}");
        assert!(p.summary().contains("cuda_init 1.0"), "{}", p.summary());
    }
}
