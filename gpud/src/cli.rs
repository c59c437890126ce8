//! Command line: `gpud --probe [--backend B]` and
//! `gpud --socket NAME --device N --backend B [--spin-us U] [--module SLOT:DIR]...
//! [--memory-limit BYTES | --memory-fraction F] [--copy-piece-bytes B] [--copies-in-flight N] [--mapped-grid N|off]
//! [--lane-sms N|off] [--cpu-runs cpu|gpu] [--group-launches on|off]`.

use crate::backend::pace::Pacing;
use crate::backend::{self, BackendKind};
use crate::buffers::MemoryLimit;
use crate::error::{Error, Result};
use crate::modules::CpuRuns;

pub const USAGE: &str = "usage: gpud --socket NAME --device N --backend cpu|cuda|auto [--spin-us U] [--module SLOT:DIR]... [--memory-limit BYTES | --memory-fraction F] [--copy-piece-bytes B] [--copies-in-flight N] [--mapped-grid N|off] [--lane-sms N|off] [--cpu-runs cpu|gpu] [--group-launches on|off]\n       gpud --probe [--backend cpu|cuda|auto]";

/// Default time spent polling the SQ before sleeping on its eventfd.
pub const DEFAULT_SPIN_US: u64 = 50;
/// Upper bound for `--spin-us`: a second of spinning is already absurd.
pub const MAX_SPIN_US: u64 = 1_000_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonOpts {
    /// Abstract socket name, without the leading NUL.
    pub socket: String,
    pub device: u32,
    pub backend: BackendKind,
    pub spin_us: u64,
    /// Users' modules to load before `ready`: (slot, directory).
    pub modules: Vec<(u16, std::path::PathBuf)>,
    pub memory_limit: MemoryLimit,
    /// Puts' and gets' copies: piece size, pieces in flight per direction.
    pub pacing: Pacing,
    /// SMs reserved for small launches (None: off).
    pub lane_sms: Option<u32>,
    /// Which body the CPU backend runs of a kernel that has both.
    pub cpu_runs: CpuRuns,
    /// Group launches on or off; None: the backend's default (on for the
    /// CPU, off for CUDA, whose group entries no GPU has run yet).
    pub group_launches: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Probe { backend: BackendKind },
    Daemon(DaemonOpts),
    Help,
}

fn usage(msg: impl Into<String>) -> Error {
    Error::Usage(msg.into())
}

pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Command> {
    let mut probe = false;
    let mut socket = None;
    let mut device = None;
    let mut backend = None;
    let mut spin_us = None;
    let mut modules = Vec::new();
    let mut memory_limit = None;
    let mut pacing = Pacing::default();
    let mut lane_sms = None;
    let mut cpu_runs = None;
    let mut group_launches = None;
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        // Accept both `--flag value` and `--flag=value`.
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| -> Result<String> {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| usage(format!("{name} needs a value")))
        };
        match flag.as_str() {
            "--probe" => probe = true,
            "-h" | "--help" => return Ok(Command::Help),
            "--socket" => {
                let v = value("--socket")?;
                if v.is_empty() || v.len() > 100 || v.contains('\0') {
                    return Err(usage(format!("bad socket name {v:?}")));
                }
                socket = Some(v)
            }
            "--device" => {
                let v = value("--device")?;
                device = Some(v.parse::<u32>().map_err(|_| usage(format!("bad device {v:?}")))?)
            }
            "--backend" => {
                let v = value("--backend")?;
                backend = Some(
                    BackendKind::parse(&v).ok_or_else(|| usage(format!("bad backend {v:?}")))?,
                )
            }
            "--spin-us" => {
                let v = value("--spin-us")?;
                let us = v.parse::<u64>().map_err(|_| usage(format!("bad --spin-us {v:?}")))?;
                spin_us = Some(us.min(MAX_SPIN_US))
            }
            "--module" => {
                let v = value("--module")?;
                let (slot, dir) = v
                    .split_once(':')
                    .and_then(|(s, d)| Some((s.parse::<u16>().ok()?, d)))
                    .filter(|(s, d)| *s < crate::layout::EC_MODULE_SLOTS && !d.is_empty())
                    .ok_or_else(|| usage(format!("bad --module {v:?} (SLOT:DIR)")))?;
                modules.push((slot, std::path::PathBuf::from(dir)))
            }
            "--memory-limit" => {
                let v = value("--memory-limit")?;
                let n = v.parse::<u64>().map_err(|_| usage(format!("bad --memory-limit {v:?}")))?;
                if memory_limit.replace(MemoryLimit::Bytes(n)).is_some() {
                    return Err(usage("one memory limit"));
                }
            }
            "--memory-fraction" => {
                let v = value("--memory-fraction")?;
                let f = v
                    .parse::<f64>()
                    .ok()
                    .filter(|f| *f > 0.0 && *f <= 1.0)
                    .ok_or_else(|| usage(format!("bad --memory-fraction {v:?} (0 < F <= 1)")))?;
                let ppm = ((f * 1e6).round() as u32).max(1);
                if memory_limit.replace(MemoryLimit::Fraction(ppm)).is_some() {
                    return Err(usage("one memory limit"));
                }
            }
            "--copy-piece-bytes" => {
                let v = value("--copy-piece-bytes")?;
                pacing.piece = v
                    .parse::<usize>()
                    .ok()
                    .filter(|b| (4096..=1 << 30).contains(b) && b % 4096 == 0)
                    .ok_or_else(|| usage(format!("bad --copy-piece-bytes {v:?} (pages, 4 KiB to 1 GiB)")))?
            }
            "--copies-in-flight" => {
                let v = value("--copies-in-flight")?;
                pacing.depth = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .ok_or_else(|| usage(format!("bad --copies-in-flight {v:?} (1 to 64)")))?
            }
            "--mapped-grid" => {
                let v = value("--mapped-grid")?;
                pacing.mapped_grid = match v.as_str() {
                    "off" => 0,
                    n => n
                        .parse::<u32>()
                        .ok()
                        .filter(|n| (1..=1 << 20).contains(n))
                        .ok_or_else(|| usage(format!("bad --mapped-grid {v:?} (off, or 1 to 1048576 blocks)")))?,
                }
            }
            "--lane-sms" => {
                let v = value("--lane-sms")?;
                lane_sms = Some(match v.as_str() {
                    "off" => None,
                    n => Some(
                        n.parse::<u32>()
                            .ok()
                            .filter(|n| (1..=1024).contains(n))
                            .ok_or_else(|| usage(format!("bad --lane-sms {v:?} (off, or 1 to 1024 SMs)")))?,
                    ),
                })
            }
            "--cpu-runs" => {
                let v = value("--cpu-runs")?;
                cpu_runs = Some(match v.as_str() {
                    "cpu" => CpuRuns::Cpu,
                    "gpu" => CpuRuns::Gpu,
                    _ => return Err(usage(format!("bad --cpu-runs {v:?} (cpu or gpu)"))),
                });
            }
            "--group-launches" => {
                let v = value("--group-launches")?;
                group_launches = Some(match v.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => return Err(usage(format!("bad --group-launches {v:?} (on or off)"))),
                });
            }
            other => return Err(usage(format!("unknown argument {other:?}"))),
        }
    }
    let backend = backend.unwrap_or(BackendKind::Auto);
    if probe {
        if socket.is_some()
            || device.is_some()
            || spin_us.is_some()
            || !modules.is_empty()
            || memory_limit.is_some()
            || lane_sms.is_some()
            || cpu_runs.is_some()
            || group_launches.is_some()
        {
            return Err(usage("--probe takes only --backend"));
        }
        return Ok(Command::Probe { backend });
    }
    Ok(Command::Daemon(DaemonOpts {
        socket: socket.ok_or_else(|| usage("--socket is required"))?,
        device: device.ok_or_else(|| usage("--device is required"))?,
        backend,
        spin_us: spin_us.unwrap_or(DEFAULT_SPIN_US),
        modules,
        memory_limit: memory_limit.unwrap_or_default(),
        pacing,
        lane_sms: lane_sms.unwrap_or(backend::DEFAULT_LANE_SMS),
        cpu_runs: cpu_runs.unwrap_or_default(),
        group_launches,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Command> {
        parse(s.split_whitespace().map(String::from))
    }

    #[test]
    fn parses_the_daemon_line() {
        assert_eq!(
            p("--socket erlcuda-1-0-ab --device 0 --backend cpu").unwrap(),
            Command::Daemon(DaemonOpts {
                socket: "erlcuda-1-0-ab".into(),
                device: 0,
                backend: BackendKind::Cpu,
                spin_us: 50,
                modules: vec![],
                memory_limit: MemoryLimit::Default,
                pacing: Pacing::default(),
                lane_sms: backend::DEFAULT_LANE_SMS,
                cpu_runs: CpuRuns::Cpu,
                group_launches: None,
            })
        );
        assert_eq!(
            p("--backend=auto --spin-us=0 --device=3 --socket=x").unwrap(),
            Command::Daemon(DaemonOpts {
                socket: "x".into(),
                device: 3,
                backend: BackendKind::Auto,
                spin_us: 0,
                modules: vec![],
                memory_limit: MemoryLimit::Default,
                pacing: Pacing::default(),
                lane_sms: backend::DEFAULT_LANE_SMS,
                cpu_runs: CpuRuns::Cpu,
                group_launches: None,
            })
        );
        assert_eq!(
            p("--socket x --device 0 --module 3:/a/b --module=0:/c:d").unwrap(),
            Command::Daemon(DaemonOpts {
                socket: "x".into(),
                device: 0,
                backend: BackendKind::Auto,
                spin_us: 50,
                modules: vec![(3, "/a/b".into()), (0, "/c:d".into())],
                memory_limit: MemoryLimit::Default,
                pacing: Pacing::default(),
                lane_sms: backend::DEFAULT_LANE_SMS,
                cpu_runs: CpuRuns::Cpu,
                group_launches: None,
            })
        );
        let runs = |a: &str| match p(&format!("--socket x --device 0 {a}")) {
            Ok(Command::Daemon(o)) => Some(o.cpu_runs),
            _ => None,
        };
        assert_eq!(runs("--cpu-runs gpu"), Some(CpuRuns::Gpu));
        assert_eq!(runs("--cpu-runs=cpu"), Some(CpuRuns::Cpu));
        assert_eq!(runs("--cpu-runs both"), None);
        let lim = |a: &str| match p(&format!("--socket x --device 0 {a}")) {
            Ok(Command::Daemon(o)) => Some(o.memory_limit),
            _ => None,
        };
        assert_eq!(lim("--memory-limit 1048576"), Some(MemoryLimit::Bytes(1 << 20)));
        assert_eq!(lim("--memory-fraction=0.5"), Some(MemoryLimit::Fraction(500_000)));
        for bad in ["--memory-fraction 0", "--memory-fraction 1.5", "--memory-limit -1", "--memory-limit 1 --memory-limit 2"] {
            assert_eq!(lim(bad), None, "{bad}");
        }
        let pace = |a: &str| match p(&format!("--socket x --device 0 {a}")) {
            Ok(Command::Daemon(o)) => Some(o.pacing),
            _ => None,
        };
        assert_eq!(pace("--copy-piece-bytes 1048576 --copies-in-flight 2"), Some(Pacing { piece: 1 << 20, depth: 2, ..Pacing::default() }));
        assert_eq!(pace("--mapped-grid 64").map(|p| p.mapped_grid), Some(64));
        assert_eq!(pace("--mapped-grid off").map(|p| p.mapped_grid), Some(0));
        let lane = |s: &str| match p(&format!("--socket x --device 0 {s}")) {
            Ok(Command::Daemon(o)) => Some(o.lane_sms),
            _ => None,
        };
        assert_eq!(lane("--lane-sms 8"), Some(Some(8)));
        assert_eq!(lane("--lane-sms off"), Some(None));
        assert_eq!(lane(""), Some(backend::DEFAULT_LANE_SMS));
        for bad in ["--lane-sms 0", "--lane-sms -1", "--lane-sms 1025", "--lane-sms on"] {
            assert_eq!(lane(bad), None, "{bad}");
        }
        for bad in ["--copy-piece-bytes 1000", "--copy-piece-bytes 0", "--copies-in-flight 0", "--copies-in-flight 65", "--mapped-grid 0", "--mapped-grid on"] {
            assert_eq!(pace(bad), None, "{bad}");
        }
        for bad in ["--module x:/a", "--module 1000:/a", "--module 1:", "--module /a"] {
            assert!(p(&format!("--socket x --device 0 {bad}")).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_probe() {
        assert_eq!(p("--probe").unwrap(), Command::Probe { backend: BackendKind::Auto });
        assert_eq!(
            p("--probe --backend cuda").unwrap(),
            Command::Probe { backend: BackendKind::Cuda }
        );
    }

    #[test]
    fn refuses_bad_lines() {
        for bad in [
            "",
            "--socket x",
            "--device 0",
            "--socket x --device -1",
            "--socket x --device 0 --backend gpu",
            "--socket x --device 0 --spin-us lots",
            "--socket",
            "--probe --socket x",
            "--probe --lane-sms 8",
            // The benchmarks' tools are gpud-bench's, not gpud's.
            "--bench-backend",
            "--baseline --backend cpu",
            "--frobnicate",
            "stray",
        ] {
            assert!(matches!(p(bad), Err(Error::Usage(_))), "accepted {bad:?}");
        }
    }
}
