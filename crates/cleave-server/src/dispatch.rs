//! Replicas as the HTTP side sees them, whatever they serve: a bounded
//! queue of jobs per replica, the counters `/metrics` shows, and the choice
//! of the least-loaded replica for a new job (refused when every queue is
//! full).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use cleave_nn::{ModelError, Placed};
use cleave_shaders::cubecl::prelude::Runtime;

/// Counters one replica keeps: those every replica has, and `work`, those
/// of what it serves.
#[derive(Default)]
pub struct ReplicaStats<S> {
    pub queued: AtomicUsize,
    pub active: AtomicUsize,
    /// Set when a device of the group failed: it takes no more jobs.
    pub failed: AtomicBool,
    /// `(device name, bytes in use)` of each member, after the last change.
    pub memory: Mutex<Vec<(String, u64)>>,
    pub work: S,
}

impl<S> ReplicaStats<S> {
    /// Jobs running or waiting.
    pub fn load(&self) -> usize {
        self.queued.load(Ordering::Relaxed) + self.active.load(Ordering::Relaxed)
    }

    /// A device of group `group` failed: marks the replica failed before
    /// anyone hears of it (so that a client that retries on the error goes
    /// to another group), gives every job still in `queue` the error
    /// through `tell`, and returns the error for the running ones.
    pub(crate) fn fail<J>(
        &self,
        group: &str,
        failure: &ModelError,
        queue: &mpsc::Receiver<J>,
        mut tell: impl FnMut(J, &str),
    ) -> String {
        self.failed.store(true, Ordering::Relaxed);
        let message = format!("group {group} failed: {failure}");
        eprintln!("{message}; it takes no more requests");
        while let Ok(job) = queue.try_recv() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            tell(job, &message);
        }
        self.active.store(0, Ordering::Relaxed);
        message
    }

    /// Notes what cleave's buffers occupy on `devices` now.
    pub(crate) fn record_memory<'a, R: Runtime>(&self, devices: impl IntoIterator<Item = &'a Placed<R>>) {
        let memory = devices
            .into_iter()
            .map(|d| (d.name.clone(), d.bytes_in_use().unwrap_or(0)))
            .collect();
        if let Ok(mut slot) = self.memory.lock() {
            *slot = memory;
        }
    }
}

/// The serving side of a replica: where its jobs go.
pub struct ReplicaHandle<J, S> {
    pub name: String,
    pub(crate) jobs: mpsc::Sender<J>,
    pub stats: Arc<ReplicaStats<S>>,
    /// Jobs it runs at once, and those it takes beyond them before refusing.
    pub(crate) parallel: usize,
    pub(crate) queue_limit: usize,
}

/// Why a job found no replica.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Every working replica is at its queue limit.
    Full,
    /// Every replica's group has failed.
    Failed,
}

/// The replicas, and the choice among them.
pub struct Dispatcher<J, S> {
    pub replicas: Vec<ReplicaHandle<J, S>>,
    /// Set at shutdown: every replica ends its jobs and stops.
    pub cancel: Arc<AtomicBool>,
}

impl<J, S> Dispatcher<J, S> {
    /// Hands `job` to the least-loaded working replica that has room.
    pub fn submit(&self, job: J) -> Result<(), Refused> {
        let working: Vec<&ReplicaHandle<J, S>> = self.working().collect();
        if working.is_empty() {
            return Err(Refused::Failed);
        }
        let replica = working
            .into_iter()
            .filter(|r| r.stats.load() < r.parallel + r.queue_limit)
            .min_by_key(|r| r.stats.load())
            .ok_or(Refused::Full)?;
        replica.stats.queued.fetch_add(1, Ordering::Relaxed);
        if replica.jobs.send(job).is_err() {
            replica.stats.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(Refused::Failed);
        }
        Ok(())
    }

    /// The replicas whose groups have not failed.
    pub fn working(&self) -> impl Iterator<Item = &ReplicaHandle<J, S>> {
        self.replicas.iter().filter(|r| !r.stats.failed.load(Ordering::Relaxed))
    }
}

/// How long an idle replica waits for a job before it looks at `cancel`.
pub(crate) const IDLE_POLL: Duration = Duration::from_millis(50);

/// Starts a replica's thread: `serve` loads the model and reports on
/// `ready`, then takes jobs from its receiver. Returns once it is loaded
/// (or failed to load).
pub(crate) fn spawn_replica<J: Send + 'static, S: Default + Send + Sync + 'static>(
    name: &str,
    parallel: usize,
    queue_limit: usize,
    serve: impl FnOnce(mpsc::Receiver<J>, Arc<ReplicaStats<S>>, mpsc::Sender<Result<(), String>>) + Send + 'static,
) -> Result<ReplicaHandle<J, S>, String> {
    let (jobs, receiver) = mpsc::channel();
    let (ready, loaded) = mpsc::channel();
    let stats = Arc::new(ReplicaStats::default());
    let handle = ReplicaHandle {
        name: name.to_string(),
        jobs,
        stats: stats.clone(),
        parallel,
        queue_limit,
    };
    std::thread::Builder::new()
        .name(format!("replica {name}"))
        .spawn(move || serve(receiver, stats, ready))
        .map_err(|e| format!("cannot start a thread for {name}: {e}"))?;
    loaded
        .recv()
        .map_err(|_| format!("{name} stopped while loading"))?
        .map(|()| handle)
}
