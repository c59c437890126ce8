//! The latency lane: the stream small launches go on, and where the other
//! launches' streams are made, so that a large launch cannot hold a small
//! one back.
//!
//! With SMs reserved (`--lane-sms N`, a driver of CUDA 12.5 or later) two
//! green contexts split the device: N SMs (the driver rounds up to its
//! granularity) run small launches only, the rest run everything else.
//! Every kernel stream is made in one of the two, none in the primary
//! context, whose kernels could take every SM. Both run functions of the
//! modules loaded in the primary context and read memory it allocated and
//! registered: a green context shares them.
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

use std::ptr;

use cudarc::driver::sys;

use super::{driver, setup};
use crate::error::Result;

/// The lane and the partition the device's SMs are in.
pub(super) struct Lane {
    /// Small launches' stream (null: none, they share the others').
    pub(super) stream: sys::CUstream,
    green: Option<Green>,
}

/// The two green contexts of a reservation.
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
            match Green::split(dev, want) {
                Ok(g) => {
                    // SAFETY: a green context just created, destroyed in close.
                    let stream = unsafe { driver::green_stream_create(g.lane, greatest.unwrap_or(0)) };
                    let stream = match stream {
                        Ok(s) => s,
                        Err(e) => {
                            let mut l = Lane { stream: ptr::null_mut(), green: Some(g) };
                            // SAFETY: no stream made in either context.
                            unsafe { l.close() };
                            return setup("cuGreenCtxStreamCreate", Err(e));
                        }
                    };
                    return Ok(Lane { stream, green: Some(g) });
                }
                Err(why) => log!(Notice, "gpud[{device}]: no SMs reserved for small launches: {why}"),
            }
        }
        let stream = match greatest {
            Some(p) => setup("cuStreamCreateWithPriority", driver::stream_create_with_priority(p))?,
            None => ptr::null_mut(),
        };
        Ok(Lane { stream, green: None })
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
