//! Per-row indices on a device, made once per forward pass and shared by
//! every layer: the position of each row (rope), the cache row each row's
//! keys and values go to, and the range of cache rows each row attends to.
//! They let one pass carry rows of several sequences, each in its own part
//! of a shared KV cache (llama.cpp's `inp_pos` and KQ mask play this role).

use cubecl::prelude::*;
use cubecl::server::Handle;

/// One u32 per row, on a device.
#[derive(Clone, Debug)]
pub struct RowIndex {
    handle: Handle,
    len: usize,
    /// The largest value, kept to check bounds before a launch.
    max: u32,
}

impl RowIndex {
    pub fn new<R: Runtime>(client: &ComputeClient<R>, values: &[u32]) -> Self {
        RowIndex {
            // A zero-sized buffer is not allowed on every backend.
            handle: client.create_from_slice(u32::as_bytes(if values.is_empty() { &[0] } else { values })),
            len: values.len(),
            max: values.iter().copied().max().unwrap_or(0),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn max(&self) -> u32 {
        self.max
    }

    pub(crate) fn arg<R: Runtime>(&self) -> ArrayArg<R> {
        // SAFETY: the buffer holds `len` u32s (one when empty).
        unsafe { ArrayArg::from_raw_parts(self.handle.clone(), self.len.max(1)) }
    }
}

/// For each query row, the keys it attends to: rows `start..end` of the
/// key and value tensors. A causal row of a sequence sees its own cache
/// part up to itself (the last `window` of it with a sliding window); an
/// encoder row sees its own sequence in a packed batch.
#[derive(Clone, Debug)]
pub struct KeyRanges {
    bounds: RowIndex,
    rows: usize,
    /// The largest `end`, to check against the keys.
    end: usize,
    /// The most keys one row sees.
    longest: usize,
    /// Whether every range is non-empty.
    valid: bool,
}

impl KeyRanges {
    pub fn new<R: Runtime>(client: &ComputeClient<R>, ranges: &[(u32, u32)]) -> Self {
        let flat: Vec<u32> = ranges.iter().flat_map(|&(start, end)| [start, end]).collect();
        KeyRanges {
            bounds: RowIndex::new(client, &flat),
            rows: ranges.len(),
            end: ranges.iter().map(|&(_, e)| e as usize).max().unwrap_or(0),
            longest: ranges
                .iter()
                .map(|&(s, e)| e.saturating_sub(s) as usize)
                .max()
                .unwrap_or(0),
            valid: ranges.iter().all(|&(s, e)| s < e),
        }
    }

    /// The keys a causal row at `position` sees, relative to its sequence:
    /// all before it and itself, or the last `window` of them (0: no window).
    pub fn causal(position: usize, window: usize) -> (u32, u32) {
        let start = if window > 0 {
            (position + 1).saturating_sub(window)
        } else {
            0
        };
        (start as u32, position as u32 + 1)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn end(&self) -> usize {
        self.end
    }

    pub(crate) fn longest(&self) -> usize {
        self.longest
    }

    pub(crate) fn is_valid(&self) -> bool {
        self.valid
    }

    pub(crate) fn arg<R: Runtime>(&self) -> ArrayArg<R> {
        self.bounds.arg()
    }
}
