//! Per-row indices on a device, made once per forward pass and shared by
//! every layer: the position of each row (rope), the cache row each row's
//! keys and values go to, and the range of cache rows each row attends to.
//! They let one pass carry rows of several sequences, each in its own part
//! of a shared KV cache (llama.cpp's `inp_pos` and KQ mask play this role).

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::grid::{grid_1d, linear_pos};

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
            handle: crate::profile::upload(client, u32::as_bytes(if values.is_empty() { &[0] } else { values })),
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
    /// The smallest `start`: no row sees a key before it.
    start: usize,
    /// Whether every key of `start..end` is in some row's range: then
    /// each is one a row attends to, written before the pass reads it.
    covers_span: bool,
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
            start: ranges.iter().map(|&(s, _)| s as usize).min().unwrap_or(0),
            end: ranges.iter().map(|&(_, e)| e as usize).max().unwrap_or(0),
            longest: ranges
                .iter()
                .map(|&(s, e)| e.saturating_sub(s) as usize)
                .max()
                .unwrap_or(0),
            valid: ranges.iter().all(|&(s, e)| s < e),
            covers_span: covers_span(ranges),
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

    pub(crate) fn start(&self) -> usize {
        self.start
    }

    pub(crate) fn covers_span(&self) -> bool {
        self.covers_span
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

    /// Its bounds after every range has taken one more key at its end,
    /// dropping its first where it would pass `window` keys.
    fn stepped(&mut self, window: Option<usize>) {
        self.bounds.max += 1;
        self.end += 1;
        self.longest = match window {
            Some(window) => (self.longest + 1).min(window),
            None => self.longest + 1,
        };
    }
}

/// Whether the union of `ranges` is one run of keys, with no gap.
fn covers_span(ranges: &[(u32, u32)]) -> bool {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let mut reach = sorted.first().map_or(0, |&(start, _)| start);
    for (start, end) in sorted {
        if start > reach {
            return false;
        }
        reach = reach.max(end);
    }
    true
}

/// One decode step on: each row's position and cache row one further and
/// its full range of keys one longer.
#[cube(launch)]
fn advance_rows(positions: &mut Array<u32>, cache_rows: &mut Array<u32>, keys: &mut Array<u32>, rows: u32) {
    let r = linear_pos() as u32;
    if r < rows {
        positions[r as usize] += 1;
        cache_rows[r as usize] += 1;
        keys[(2 * r + 1) as usize] += 1;
    }
}

/// One decode step on for each row's sliding window of `window` keys,
/// given its new `positions`: one key longer, its first dropped once full.
/// The row's sequence starts at cache row `end - position - 1`.
#[cube(launch)]
fn advance_windows(positions: &Array<u32>, sliding: &mut Array<u32>, rows: u32, window: u32) {
    let r = linear_pos() as u32;
    if r < rows {
        let end = sliding[(2 * r + 1) as usize] + 1;
        let seen = positions[r as usize] + 1;
        let base = end - seen;
        sliding[(2 * r) as usize] = base + seen - min(seen, window);
        sliding[(2 * r + 1) as usize] = end;
    }
}

/// A decode step's rows, one position on, on their device: what
/// [`KeyRanges::causal`] would give each row at its next position (full
/// ranges, and sliding ones of `window` keys where given), without
/// writing anything from the host.
pub fn advance_decode_rows<R: Runtime>(
    client: &ComputeClient<R>,
    positions: &mut RowIndex,
    cache_rows: &mut RowIndex,
    keys: &mut KeyRanges,
    sliding: Option<(&mut KeyRanges, usize)>,
) {
    let rows = positions.len();
    let (count, dim) = grid_1d(rows);
    crate::profile::launch(client, "advance_rows", || {
        advance_rows::launch::<R>(
            client,
            count.clone(),
            dim,
            positions.arg(),
            cache_rows.arg(),
            keys.arg(),
            rows as u32,
        )
    });
    positions.max += 1;
    cache_rows.max += 1;
    keys.stepped(None);
    if let Some((sliding, window)) = sliding {
        crate::profile::launch(client, "advance_windows", || {
            advance_windows::launch::<R>(
                client,
                count,
                dim,
                positions.arg(),
                sliding.arg(),
                rows as u32,
                window as u32,
            )
        });
        sliding.stepped(Some(window));
    }
}

#[cfg(test)]
mod tests {
    use super::covers_span;

    #[test]
    fn a_span_is_covered_where_the_ranges_leave_no_gap() {
        // One sequence's causal rows, and a sliding window's.
        assert!(covers_span(&[(0, 3), (0, 4), (0, 5)]));
        assert!(covers_span(&[(2, 6), (3, 7), (1, 5)]));
        // Two sequences packed back to back.
        assert!(covers_span(&[(0, 4), (0, 4), (4, 9)]));
        // Two sequences in slots apart: the keys between are no row's.
        assert!(!covers_span(&[(0, 4), (16, 18)]));
        assert!(covers_span(&[]));
    }
}
