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

use super::handles::{Event, GreenCtx, Module, Stream};
use super::{driver, setup};
use crate::error::Result;

/// A kernel that does nothing, launched on both partitions' streams before
/// gpud serves (see [`try_streams`]).
const PROBE_PTX: &str = ".version 7.0\n.target sm_70\n.address_size 64\n\
                         .visible .entry erlcuda_lane_probe()\n{\n\tret;\n}\n";

/// The lane and the partition the device's SMs are in.
pub(super) struct Lane {
    /// Small launches' stream (None: none, they share the others').
    /// Declared before `green`: dropped before the context it is in.
    pub(super) stream: Option<Stream>,
    green: Option<Green>,
}

/// The two green contexts of a reservation.
struct Green {
    lane: GreenCtx,
    rest: GreenCtx,
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
        let lane = GreenCtx::create(dev, &lane).map_err(|e| format!("cuGreenCtxCreate: {:?}", e.0))?;
        // On an error `lane` is dropped (destroyed) with the return.
        let rest = GreenCtx::create(dev, &rest).map_err(|e| format!("cuGreenCtxCreate: {:?}", e.0))?;
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
            Some(p) => Some(setup("cuStreamCreateWithPriority", Stream::with_priority(p))?),
            None => None,
        };
        Ok(Lane { stream, green: None })
    }

    /// The lane of reservation `g`, once a kernel has run on a stream of
    /// each partition; Err (everything made dropped) says why not.
    fn tried(g: Green, priority: i32) -> std::result::Result<Lane, String> {
        let stream = g.lane.stream(priority).map_err(|e| format!("cuGreenCtxStreamCreate: {:?}", e.0))?;
        let lane = Lane { stream: Some(stream), green: Some(g) };
        let rest = lane.work_stream().map_err(|e| e.to_string())?;
        let lane_stream = lane.stream.as_ref().map_or(ptr::null_mut(), Stream::raw);
        // `rest` is dropped here, synchronized by try_streams or never
        // used; on an error `lane` is dropped too.
        try_streams(&[lane_stream, rest.raw()])?;
        Ok(lane)
    }

    /// A stream for launches that are not small: in the partition of the
    /// SMs not reserved, where there is a reservation. The caller drops it
    /// before the lane.
    pub(super) fn work_stream(&self) -> Result<Stream> {
        match &self.green {
            Some(g) => setup("cuGreenCtxStreamCreate", g.rest.stream(0)),
            None => setup("cuStreamCreate", Stream::non_blocking()),
        }
    }

    /// Under a reservation, a stream in the primary context, whose kernels
    /// may take every SM, the reserved ones too (`None` without one: the
    /// work streams have every SM already). A large launch goes there while
    /// no small job runs (launch.rs), so the reservation costs large jobs
    /// nothing when there are no small ones to keep it for.
    pub(super) fn wide_stream(&self) -> Result<Option<Stream>> {
        match &self.green {
            Some(_) => Ok(Some(setup("cuStreamCreate", Stream::non_blocking())?)),
            None => Ok(None),
        }
    }

    /// gpud's `lane` line: `green <lane SMs> <other SMs>`, `priority` or
    /// `none`.
    pub(super) fn describe(&self) -> String {
        match &self.green {
            Some(g) => format!("green {} {}", g.lane_sms, g.rest_sms),
            None if self.stream.is_none() => "none".into(),
            None => "priority".into(),
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
    // Both dropped (the event destroyed, then the module unloaded) on
    // every way out: each stream was synchronized, or the failed call
    // enqueued nothing.
    let module = Module::load_ptx(&ptx).map_err(named("cuModuleLoadData"))?;
    let name = CString::new("erlcuda_lane_probe").map_err(|_| "bad probe name".to_string())?;
    let f = module.function(&name).map_err(named("cuModuleGetFunction"))?;
    let ev = Event::new().map_err(named("cuEventCreate"))?;
    for &s in streams {
        // SAFETY: a function of no parameters and no memory; live
        // streams and event.
        unsafe { driver::launch_kernel(f, 1, 32, 0, s, &mut []) }
            .map_err(named("cuLaunchKernel on a green context's stream"))?;
        unsafe { driver::event_record(ev.raw(), s) }.map_err(named("cuEventRecord on a green context's stream"))?;
        unsafe { driver::stream_synchronize(s) }.map_err(named("cuStreamSynchronize"))?;
        if !unsafe { driver::event_query(ev.raw()) }.map_err(named("cuEventQuery"))? {
            return Err("an event behind a green context's work had not fired once it was done".into());
        }
    }
    Ok(())
}
