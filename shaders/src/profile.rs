//! What cleave asks of its devices, counted as it asks: kernel launches (by
//! kernel), buffers allocated, reads back to the host (and the time the
//! host spends waiting on them) and writes to a device. Every launch,
//! allocation, read and write cleave makes goes through this module, so the
//! counters are complete: `cleave run --profile` reports them per decode
//! token, and tests assert a decode step's allocations and reads.
//!
//! With kernel timing on, each launch also waits for the device before and
//! after it, and the time between (less what a wait on the idle device
//! takes) is summed per kernel. That changes the host's pace, so a profile
//! times kernels in a pass of its own.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::KernelError;

static LAUNCHES: AtomicU64 = AtomicU64::new(0);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static ALLOCATED_BYTES: AtomicU64 = AtomicU64::new(0);
static READS: AtomicU64 = AtomicU64::new(0);
static READ_BYTES: AtomicU64 = AtomicU64::new(0);
static READ_WAIT_NANOS: AtomicU64 = AtomicU64::new(0);
static WRITES: AtomicU64 = AtomicU64::new(0);
static WRITE_BYTES: AtomicU64 = AtomicU64::new(0);

/// Whether launches are timed one by one.
static TIMING: AtomicBool = AtomicBool::new(false);
/// Per kernel: launches timed and their summed time, while timing is on.
static KERNEL_TIMES: Mutex<BTreeMap<&'static str, (u64, Duration)>> = Mutex::new(BTreeMap::new());

/// The counters at one moment, or their change between two.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub launches: u64,
    /// Device buffers cleave asked for (each from cubecl's memory pool).
    pub allocations: u64,
    pub allocated_bytes: u64,
    /// Reads of device buffers back to the host, each waiting for the
    /// device to finish what came before.
    pub reads: u64,
    pub read_bytes: u64,
    /// Time the host spent blocked in those reads.
    pub read_wait: Duration,
    /// Writes of host data into device buffers.
    pub writes: u64,
    pub write_bytes: u64,
}

impl Counters {
    /// The counters as they stand, summed over every device and thread.
    pub fn now() -> Counters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counters {
            launches: get(&LAUNCHES),
            allocations: get(&ALLOCATIONS),
            allocated_bytes: get(&ALLOCATED_BYTES),
            reads: get(&READS),
            read_bytes: get(&READ_BYTES),
            read_wait: Duration::from_nanos(get(&READ_WAIT_NANOS)),
            writes: get(&WRITES),
            write_bytes: get(&WRITE_BYTES),
        }
    }

    /// What happened since `earlier`.
    pub fn since(self, earlier: Counters) -> Counters {
        Counters {
            launches: self.launches.saturating_sub(earlier.launches),
            allocations: self.allocations.saturating_sub(earlier.allocations),
            allocated_bytes: self.allocated_bytes.saturating_sub(earlier.allocated_bytes),
            reads: self.reads.saturating_sub(earlier.reads),
            read_bytes: self.read_bytes.saturating_sub(earlier.read_bytes),
            read_wait: self.read_wait.saturating_sub(earlier.read_wait),
            writes: self.writes.saturating_sub(earlier.writes),
            write_bytes: self.write_bytes.saturating_sub(earlier.write_bytes),
        }
    }
}

impl std::ops::Add for Counters {
    type Output = Counters;

    fn add(self, other: Counters) -> Counters {
        Counters {
            launches: self.launches + other.launches,
            allocations: self.allocations + other.allocations,
            allocated_bytes: self.allocated_bytes + other.allocated_bytes,
            reads: self.reads + other.reads,
            read_bytes: self.read_bytes + other.read_bytes,
            read_wait: self.read_wait + other.read_wait,
            writes: self.writes + other.writes,
            write_bytes: self.write_bytes + other.write_bytes,
        }
    }
}

/// One kernel's launches and the device time they took, while timed.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    pub kernel: &'static str,
    pub launches: u64,
    pub time: Duration,
}

/// Turns timing of each launch on or off; turning it on forgets earlier
/// times.
pub fn time_kernels(on: bool) {
    if on {
        kernel_times_guard().clear();
    }
    TIMING.store(on, Ordering::Relaxed);
}

/// The times summed since timing was turned on, longest first.
pub fn kernel_times() -> Vec<KernelTime> {
    let mut times: Vec<KernelTime> = kernel_times_guard()
        .iter()
        .map(|(&kernel, &(launches, time))| KernelTime { kernel, launches, time })
        .collect();
    times.sort_by(|a, b| b.time.cmp(&a.time).then(a.kernel.cmp(b.kernel)));
    times
}

fn kernel_times_guard() -> std::sync::MutexGuard<'static, BTreeMap<&'static str, (u64, Duration)>> {
    // A panic while the map was held leaves nothing half-written in it.
    KERNEL_TIMES.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Waits until `client`'s device has finished everything queued.
pub fn sync<R: Runtime>(client: &ComputeClient<R>) -> Result<(), KernelError> {
    cubecl::future::block_on(client.sync()).map_err(KernelError::from_device)
}

/// Runs `launch`, which launches `kernel` once on `client`, and counts it;
/// while timing, waits for the device before and after and adds the time
/// between to the kernel's.
pub fn launch<R: Runtime, T>(client: &ComputeClient<R>, kernel: &'static str, launch: impl FnOnce() -> T) -> T {
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
    if !TIMING.load(Ordering::Relaxed) {
        return launch();
    }
    // A device that fails to sync fails the read that follows too, which
    // reports it; the time of this launch is then meaningless anyway.
    let _ = sync(client);
    // What waiting on the idle device costs, taken off the launch's time.
    let idle = Instant::now();
    let _ = sync(client);
    let idle = idle.elapsed();
    let start = Instant::now();
    let out = launch();
    let _ = sync(client);
    let time = start.elapsed().saturating_sub(idle);
    let mut times = kernel_times_guard();
    let entry = times.entry(kernel).or_default();
    entry.0 += 1;
    entry.1 += time;
    out
}

/// An uninitialised device buffer of `bytes` bytes (at least one word: a
/// zero-sized buffer is not allowed on every backend).
pub(crate) fn empty<R: Runtime>(client: &ComputeClient<R>, bytes: usize) -> Handle {
    let bytes = bytes.max(4);
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    ALLOCATED_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    client.empty(bytes)
}

/// A new device buffer holding `bytes`.
pub fn upload<R: Runtime>(client: &ComputeClient<R>, bytes: &[u8]) -> Handle {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    ALLOCATED_BYTES.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    count_write(bytes.len());
    client.create_from_slice(bytes)
}

/// `handle`'s buffer on `from`, copied into a new buffer on `to` (a
/// peer copy where the runtime has one, else through the host).
pub fn copy_to_client<R: Runtime>(from: &ComputeClient<R>, handle: &Handle, to: &ComputeClient<R>) -> Handle {
    let bytes = handle.size();
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    ALLOCATED_BYTES.fetch_add(bytes, Ordering::Relaxed);
    count_write(bytes as usize);
    from.clone()
        .to_client(handle.clone(), to, ElemType::Float(FloatKind::F32))
}

fn count_write(bytes: usize) {
    WRITES.fetch_add(1, Ordering::Relaxed);
    WRITE_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Waits for the device and copies `handle`'s bytes to the host.
pub(crate) fn read<R: Runtime>(client: &ComputeClient<R>, handle: &Handle) -> Result<Vec<u8>, KernelError> {
    let start = Instant::now();
    let bytes = client.read_one(handle.clone()).map_err(KernelError::from_device)?;
    READ_WAIT_NANOS.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    READS.fetch_add(1, Ordering::Relaxed);
    READ_BYTES.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    Ok(bytes.to_vec())
}
