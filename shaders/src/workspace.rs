//! The buffers kernels write their outputs into, reused from one pass to
//! the next: a decode step asks for the same shapes every time, so after
//! the first step its activations, partial sums and logits all come from
//! here and the device allocates nothing (llama.cpp plans its compute
//! buffers once for the same reason).
//!
//! A buffer is free again once no tensor holds its [`Lease`], and goes to
//! the next request of the same size on the same device from the same
//! thread (a thread's launches form one stream, so the reuse is ordered
//! after every launch that read the buffer before). A request that finds
//! no free buffer of its size gets a new one, and the free buffers no
//! request has taken for the last [`STALE_TAKES`] requests are let go then
//! (the shapes of an earlier, longer prompt), so the pool holds what the
//! passes of late keep asking for. Only buffers up to [`POOLED_BYTES`] are
//! kept: decode's are far smaller, and prefill's large ones come and go
//! with the prompt, which cubecl's own pool serves.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use cubecl::prelude::*;
use cubecl::server::Handle;

/// The largest buffer kept for reuse: more than a decode step's largest
/// output (logits of a 256k vocabulary for 4 sequences), far less than a
/// prefill's.
pub const POOLED_BYTES: usize = 4 << 20;

/// Requests after which a free buffer none of them took is let go: more
/// than a decode step of the largest models asks for (about ten a block).
const STALE_TAKES: u64 = 1 << 14;

/// Held by every tensor made from a workspace buffer, and by its clones:
/// the buffer is reused only once all are dropped.
#[derive(Clone, Debug, Default)]
pub struct Lease(
    // Never read: held for the count the pool looks at.
    #[allow(dead_code)] Option<Arc<()>>,
);

struct Slot {
    handle: Handle,
    bytes: usize,
    lease: Arc<()>,
    /// The request that last took it.
    taken: u64,
}

impl Slot {
    /// Whether no tensor holds the buffer (the pool's own count is the one left).
    fn is_free(&self) -> bool {
        Arc::strong_count(&self.lease) == 1
    }
}

/// A device's buffers, and how many requests they have served.
#[derive(Default)]
struct Pool {
    slots: Vec<Slot>,
    takes: u64,
}

thread_local! {
    /// Each device's buffers (keyed by its client, see `device_key`), made
    /// by this thread.
    static POOLS: RefCell<HashMap<usize, Pool>> = RefCell::new(HashMap::new());
}

/// What identifies a device's client: the address of the properties every
/// client of one device shares (cubecl keeps them behind one `Arc` per
/// device server), which lives as long as the device.
fn device_key<R: Runtime>(client: &ComputeClient<R>) -> usize {
    std::ptr::from_ref(client.properties()) as usize
}

/// A buffer of `bytes` bytes on `client`'s device, and its lease: a free
/// one of the same size where this thread has one, else a new one.
pub(crate) fn take<R: Runtime>(client: &ComputeClient<R>, bytes: usize) -> (Handle, Lease) {
    // An empty tensor's buffer is not worth keeping: cubecl gives it a page
    // of its own, which the pool could not count as it does the others.
    if bytes == 0 || bytes > POOLED_BYTES {
        return (crate::profile::empty(client, bytes), Lease(None));
    }
    POOLS.with_borrow_mut(|pools| {
        let pool = pools.entry(device_key(client)).or_default();
        pool.takes += 1;
        let now = pool.takes;
        if let Some(slot) = pool.slots.iter_mut().find(|s| s.bytes == bytes && s.is_free()) {
            slot.taken = now;
            return (slot.handle.clone(), Lease(Some(slot.lease.clone())));
        }
        pool.slots.retain(|s| !s.is_free() || now - s.taken <= STALE_TAKES);
        let slot = Slot {
            handle: crate::profile::empty(client, bytes),
            bytes,
            lease: Arc::new(()),
            taken: now,
        };
        let taken = (slot.handle.clone(), Lease(Some(slot.lease.clone())));
        pool.slots.push(slot);
        taken
    })
}

/// Lets go of the buffers this thread's workspace keeps on `client`'s
/// device that no tensor holds now: they give way when weights or caches
/// need the room under a memory cap.
pub fn release_idle_workspace<R: Runtime>(client: &ComputeClient<R>) {
    POOLS.with_borrow_mut(|pools| {
        if let Some(pool) = pools.get_mut(&device_key(client)) {
            pool.slots.retain(|s| !s.is_free());
        }
    })
}
