//! The latency lane: the stream small launches go on, and where the other
//! launches' streams are made, so that a large launch cannot hold a small
//! one back.
//!
//! With SMs reserved (`--lane-sms N`, by default 8; a driver of CUDA 12.5
//! or later) two green contexts split the device: N SMs (the driver rounds
//! up to its granularity) run small launches only, the rest run everything
//! else while small jobs run. While none has come for `SMALL_WINDOW`
//! (pace.rs), large launches go on streams of the primary context instead
//! ([`Lane::wide_stream`]), whose kernels may take every SM: the reserved
//! SMs idle only while there are small jobs to keep them for. Launches on
//! the green contexts' streams run
//! functions of the modules the primary context loaded, read memory it
//! allocated and registered, and are followed by its events. Before gpud
//! serves, a kernel that does nothing is run that way on a stream of each
//! partition; where the driver refuses any of it, gpud says why and keeps
//! the priority lane below.
//!
//! Without a reservation, or where the driver has no green contexts, small
//! launches get a stream of the device's greatest priority: the GPU then
//! starts their blocks before a large launch's next ones, but a large
//! launch's running blocks still hold every SM.
//!
//! Standalone probes on the H200 (issue "Small jobs never wait behind large
//! ones"): small-job p99 beside SGEMM 4096 was 2.02 ms on plain streams,
//! 0.67 ms with a priority, 22 µs with 16 SMs reserved; SGEMM lost 25% on
//! the remaining 116.

use std::ffi::CString;
use std::ptr;

use cudarc::driver::sys;

use super::{driver, setup};
use crate::error::Result;

/// A kernel that does nothing, launched on both partitions' streams before
/// gpud serves (see [`try_streams`]).
const PROBE_PTX: &str = ".version 7.0\n.target sm_70\n.address_size 64\n\
                         .visible .entry erlcuda_lane_probe()\n{\n\tret;\n}\n";

/// The lane and the partition the device's SMs are in.
pub(super) struct Lane {
    /// Small launches' stream (null: none, they share the others').
    pub(super) stream: sys::CUstream,
    green: Option<Green>,
}

/// The two green contexts of a reservation.
#[derive(Clone, Copy)]
struct Green {
    lane: sys::CUgreenCtx,
    rest: sys::CUgreenCtx,
    lane_sms: u32,
    rest_sms: u32,
}

impl Green {
    /// Reserves at least `want` of the device's SMs; Err says why it could not.
    fn split(dev: sys::CUdevice, want: u32) -> std::result::Result<Green, String> {
        if let Some(missing) = driver::GREEN_ENTRIES.iter().find(|e| !driver::has_entry(e)) {
            return Err(format!("the driver has no {missing} (green contexts need CUDA 12.5)"));
        }
        let all = driver::device_sm_resource(dev).map_err(|e| format!("cuDeviceGetDevResource: {:?}", e.0))?;
        let total = driver::sm_count(&all);
        if want >= total {
            return Err(format!("{want} SMs asked for, the device has {total}"));
        }
        let (lane, rest) =
            driver::sm_split(&all, want).map_err(|e| format!("cuDevSmResourceSplitByCount: {:?}", e.0))?;
        let (lane_sms, rest_sms) = (driver::sm_count(&lane), driver::sm_count(&rest));
        if lane_sms == 0 || rest_sms == 0 {
            return Err(format!("the split of {total} SMs gave {lane_sms} and {rest_sms}"));
        }
        let lane = driver::green_ctx_create(dev, &lane).map_err(|e| format!("cuGreenCtxCreate: {:?}", e.0))?;
        let rest = match driver::green_ctx_create(dev, &rest) {
            Ok(g) => g,
            Err(e) => {
                // SAFETY: just created, no stream made in it.
                let _ = unsafe { driver::green_ctx_destroy(lane) };
                return Err(format!("cuGreenCtxCreate: {:?}", e.0));
            }
        };
        Ok(Green { lane, rest, lane_sms, rest_sms })
    }
}

impl Lane {
    /// The lane of device `dev` (its primary context current), with
    /// `reserve` SMs of its own where that is asked for and possible.
    pub(super) fn open(device: u32, dev: sys::CUdevice, reserve: Option<u32>) -> Result<Lane> {
        let greatest = match driver::stream_priority_range() {
            Ok((least, greatest)) if greatest < least => Some(greatest),
            _ => None,
        };
        if let Some(want) = reserve {
            match Green::split(dev, want).and_then(|g| Lane::tried(g, greatest.unwrap_or(0))) {
                Ok(lane) => return Ok(lane),
                Err(why) => log!(Notice, "gpud[{device}]: no SMs reserved for small launches: {why}"),
            }
        }
        let stream = match greatest {
            Some(p) => setup("cuStreamCreateWithPriority", driver::stream_create_with_priority(p))?,
            None => ptr::null_mut(),
        };
        Ok(Lane { stream, green: None })
    }

    /// The lane of reservation `g`, once a kernel has run on a stream of
    /// each partition; Err (everything made undone) says why not.
    fn tried(g: Green, priority: i32) -> std::result::Result<Lane, String> {
        let mut lane = Lane { stream: ptr::null_mut(), green: Some(g) };
        let tried = (|| {
            // SAFETY: the contexts live until close, after their streams.
            lane.stream = unsafe { driver::green_stream_create(g.lane, priority) }
                .map_err(|e| format!("cuGreenCtxStreamCreate: {:?}", e.0))?;
            let rest = lane.work_stream().map_err(|e| e.to_string())?;
            let r = try_streams(&[lane.stream, rest]);
            // SAFETY: synchronized by try_streams, or never used.
            let _ = unsafe { driver::stream_destroy(rest) };
            r
        })();
        match tried {
            Ok(()) => Ok(lane),
            Err(why) => {
                // SAFETY: the one work stream made is destroyed.
                unsafe { lane.close() };
                Err(why)
            }
        }
    }

    /// A stream for launches that are not small: in the partition of the
    /// SMs not reserved, where there is a reservation.
    pub(super) fn work_stream(&self) -> Result<sys::CUstream> {
        match &self.green {
            // SAFETY: the context lives until close, after its streams.
            Some(g) => setup("cuGreenCtxStreamCreate", unsafe { driver::green_stream_create(g.rest, 0) }),
            None => setup("cuStreamCreate", driver::stream_create_non_blocking()),
        }
    }

    /// Under a reservation, a stream in the primary context, whose kernels
    /// may take every SM, the reserved ones too (`None` without one: the
    /// work streams have every SM already). A large launch goes there while
    /// no small job runs (launch.rs), so the reservation costs large jobs
    /// nothing when there are no small ones to keep it for.
    pub(super) fn wide_stream(&self) -> Result<Option<sys::CUstream>> {
        match &self.green {
            Some(_) => Ok(Some(setup("cuStreamCreate", driver::stream_create_non_blocking())?)),
            None => Ok(None),
        }
    }

    /// gpud's `lane` line: `green <lane SMs> <other SMs>`, `priority` or
    /// `none`.
    pub(super) fn describe(&self) -> String {
        match &self.green {
            Some(g) => format!("green {} {}", g.lane_sms, g.rest_sms),
            None if self.stream.is_null() => "none".into(),
            None => "priority".into(),
        }
    }

    /// Destroys the lane's stream and the green contexts.
    ///
    /// # Safety
    /// Nothing runs on any stream made by [`Lane::work_stream`], and every
    /// such stream is destroyed already; the lane is not used afterwards.
    pub(super) unsafe fn close(&mut self) {
        if !self.stream.is_null() {
            // SAFETY: made in open, destroyed once.
            let _ = unsafe { driver::stream_destroy(self.stream) };
            self.stream = ptr::null_mut();
        }
        if let Some(g) = self.green.take() {
            // SAFETY: the caller destroyed their streams.
            let _ = unsafe { driver::green_ctx_destroy(g.lane) };
            let _ = unsafe { driver::green_ctx_destroy(g.rest) };
        }
    }
}

/// Runs a kernel of a module loaded in the primary context on each of
/// `streams` (made in green contexts), behind it an event of the primary
/// context, and waits for both: what every launch of gpud does across the
/// contexts. A driver that refused any of it would fail every job on the
/// lane; refused here, gpud keeps the priority lane instead. Err names the
/// call that failed.
fn try_streams(streams: &[sys::CUstream]) -> std::result::Result<(), String> {
    fn named(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> String {
        move |e| format!("{what}: {:?}", e.0)
    }
    let ptx = CString::new(PROBE_PTX).map_err(|_| "the probe's PTX holds a NUL".to_string())?;
    let module = driver::module_load_ptx(&ptx).map_err(named("cuModuleLoadData"))?;
    let tried = (|| {
        let name = CString::new("erlcuda_lane_probe").map_err(|_| "bad probe name".to_string())?;
        // SAFETY: the module just loaded, unloaded below.
        let f = unsafe { driver::module_get_function(module, &name) }.map_err(named("cuModuleGetFunction"))?;
        let ev = driver::event_create().map_err(named("cuEventCreate"))?;
        let each = (|| {
            for &s in streams {
                // SAFETY: a function of no parameters and no memory; live
                // streams and event.
                unsafe { driver::launch_kernel(f, 1, 32, 0, s, &mut []) }
                    .map_err(named("cuLaunchKernel on a green context's stream"))?;
                unsafe { driver::event_record(ev, s) }.map_err(named("cuEventRecord on a green context's stream"))?;
                unsafe { driver::stream_synchronize(s) }.map_err(named("cuStreamSynchronize"))?;
                if !unsafe { driver::event_query(ev) }.map_err(named("cuEventQuery"))? {
                    return Err("an event behind a green context's work had not fired once it was done".into());
                }
            }
            Ok(())
        })();
        // SAFETY: no stream waits on it any more (each was synchronized,
        // or the failed call recorded nothing).
        let _ = unsafe { driver::event_destroy(ev) };
        each
    })();
    // SAFETY: nothing of the module runs any more.
    let _ = unsafe { driver::module_unload(module) };
    tried
}
