//! Replicas as the HTTP side sees them, whatever they serve: a bounded
//! queue of jobs per replica, the counters `/metrics` shows, and the choice
//! of the least-loaded replica for a new job (refused when every queue is
//! full).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use cleave_nn::ModelError;
use tokio::sync::oneshot;

use crate::api::ApiError;

/// Counters one replica keeps: those every replica has, and `work`, those
/// of what it serves.
#[derive(Default)]
pub struct ReplicaStats<S> {
    pub queued: AtomicUsize,
    pub active: AtomicUsize,
    /// Set when a device of the group failed: it takes no more jobs.
    pub failed: AtomicBool,
    /// Jobs in a row that ended in a server error (a 500): reset by the
    /// next that is served.
    pub errors_in_a_row: AtomicUsize,
    /// `(device name, bytes in use)` of each member, after the last change.
    pub memory: Mutex<Vec<(String, u64)>>,
    pub work: S,
}

impl<S> ReplicaStats<S> {
    /// Jobs running or waiting.
    pub fn load(&self) -> usize {
        self.queued.load(Ordering::Relaxed) + self.active.load(Ordering::Relaxed)
    }

    /// Notes how a job ended: served, or with a server error. Jobs refused
    /// for their own fault are not noted.
    pub(crate) fn note_outcome(&self, served: bool) {
        if served {
            self.errors_in_a_row.store(0, Ordering::Relaxed);
        } else {
            self.errors_in_a_row.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether the group serves: not failed, and its last jobs did not all
    /// end in server errors. A group whose every request fails is not
    /// healthy even though no device has failed.
    pub fn is_healthy(&self) -> bool {
        !self.failed.load(Ordering::Relaxed) && self.errors_in_a_row.load(Ordering::Relaxed) < ERRORS_BEFORE_UNHEALTHY
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

    /// Notes what cleave's buffers occupy now on each device, by name.
    pub(crate) fn record_memory(&self, memory: Vec<(String, u64)>) {
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

/// Why a job of a replica that answers it whole (an image, an embedding)
/// has no answer.
#[derive(Debug)]
pub enum JobFailure {
    /// The request's own fault (a prompt the tokenizer refuses, ...).
    Request(String),
    /// The server is shutting down, or the group failed.
    Server(String),
}

/// A job answered whole (an image, embeddings): what it asks, and where
/// its answer goes. A dropped receiver (the client went away) cancels it.
pub struct WholeJob<Q, A> {
    pub request: Q,
    pub reply: oneshot::Sender<Result<A, JobFailure>>,
}

/// Answers `receiver`'s jobs one at a time by `answer` until the
/// dispatcher is dropped or `cancel` is set, keeping `stats`' queue and
/// activity. A job whose client has gone is skipped; one that `answer`
/// ends as cancelled (its client gone, or the server shutting down) gets
/// no answer or the shutdown's; a device failure fails the replica
/// `name`, every waiting job with it, and ends the loop.
pub(crate) fn answer_one_at_a_time<Q, A, S>(
    name: &str,
    (receiver, stats, cancel): (&mpsc::Receiver<WholeJob<Q, A>>, &ReplicaStats<S>, &AtomicBool),
    mut answer: impl FnMut(&WholeJob<Q, A>) -> Result<A, ModelError>,
) {
    loop {
        let job = match receiver.recv_timeout(IDLE_POLL) {
            Ok(job) => job,
            Err(mpsc::RecvTimeoutError::Timeout) if cancel.load(Ordering::Relaxed) => return,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        stats.active.store(1, Ordering::Relaxed);
        stats.queued.fetch_sub(1, Ordering::Relaxed);
        let outcome = match job.reply.is_closed() {
            true => Err(ModelError::Cancelled),
            false => answer(&job),
        };
        stats.active.store(0, Ordering::Relaxed);
        let failure = match outcome {
            Ok(answered) => {
                let _ = job.reply.send(Ok(answered));
                continue;
            }
            // Nobody is waiting for it.
            Err(ModelError::Cancelled) if !cancel.load(Ordering::Relaxed) => continue,
            Err(ModelError::Cancelled) => JobFailure::Server("the server is shutting down".into()),
            Err(e) if e.is_device_failure() => {
                let message = stats.fail(name, &e, receiver, |job, message| {
                    let _ = job.reply.send(Err(JobFailure::Server(message.into())));
                });
                let _ = job.reply.send(Err(JobFailure::Server(message)));
                return;
            }
            Err(e) => JobFailure::Request(e.to_string()),
        };
        let _ = job.reply.send(Err(failure));
    }
}

/// Waits for a job's whole answer from `replica`, noting how it ended
/// there: a failure of the request's own is a 400, the server's a 500.
/// `what` names the answer, for a job that ended without one.
pub(crate) async fn answer<T, S>(
    answer: oneshot::Receiver<Result<T, JobFailure>>,
    replica: &ReplicaStats<S>,
    what: &str,
) -> Result<T, ApiError> {
    let answered = answer.await.map_err(|_| {
        ApiError::internal(format!(
            "the request ended without {what} (the server is shutting down?)"
        ))
    })?;
    let served = answered.map_err(|failure| match failure {
        JobFailure::Request(message) => ApiError::invalid(message, None),
        JobFailure::Server(message) => {
            replica.note_outcome(false);
            ApiError::internal(message)
        }
    })?;
    replica.note_outcome(true);
    Ok(served)
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

/// Server errors in a row after which `/health` counts a group as not
/// serving: one could be a request's own bad luck, three are a pattern.
const ERRORS_BEFORE_UNHEALTHY: usize = 3;

impl<J, S> Dispatcher<J, S> {
    /// Hands `job` to the least-loaded working replica that has room, and
    /// returns that replica's counters, to note how the job ends.
    pub fn submit(&self, job: J) -> Result<Arc<ReplicaStats<S>>, Refused> {
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
        Ok(replica.stats.clone())
    }

    /// The replicas whose groups have not failed.
    pub fn working(&self) -> impl Iterator<Item = &ReplicaHandle<J, S>> {
        self.replicas.iter().filter(|r| !r.stats.failed.load(Ordering::Relaxed))
    }

    /// The replicas that serve (see [`ReplicaStats::is_healthy`]).
    pub fn healthy(&self) -> impl Iterator<Item = &ReplicaHandle<J, S>> {
        self.replicas.iter().filter(|r| r.stats.is_healthy())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(name: &str) -> (ReplicaHandle<u32, ()>, mpsc::Receiver<u32>) {
        let (jobs, receiver) = mpsc::channel();
        let handle = ReplicaHandle {
            name: name.into(),
            jobs,
            stats: Arc::new(ReplicaStats::default()),
            parallel: 1,
            queue_limit: 4,
        };
        (handle, receiver)
    }

    #[test]
    fn a_group_whose_jobs_keep_failing_is_not_healthy_until_one_is_served() {
        let (a, _a_jobs) = replica("0");
        let (b, _b_jobs) = replica("1");
        let dispatcher = Dispatcher {
            replicas: vec![a, b],
            cancel: Arc::default(),
        };
        let stats = dispatcher.submit(7).unwrap();
        assert_eq!(dispatcher.healthy().count(), 2);
        for _ in 0..ERRORS_BEFORE_UNHEALTHY {
            stats.note_outcome(false);
        }
        let healthy: Vec<&str> = dispatcher.healthy().map(|r| r.name.as_str()).collect();
        assert_eq!(healthy, ["1"]);
        // Still working: it takes jobs, and one served makes it healthy.
        assert_eq!(dispatcher.working().count(), 2);
        stats.note_outcome(true);
        assert_eq!(dispatcher.healthy().count(), 2);
        dispatcher.replicas[1].stats.failed.store(true, Ordering::Relaxed);
        assert_eq!(dispatcher.healthy().count(), 1);
    }
}
