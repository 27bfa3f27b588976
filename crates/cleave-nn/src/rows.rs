//! The rows of a decoder's forward pass as every device that attends needs
//! them: each row's position, the cache row its keys and values go to, and
//! the cache rows it attends to in a full-attention layer and in a
//! sliding-window one (llama.cpp's `inp_pos` and KQ mask play this role).
//!
//! They are made on a device when a layer there first asks. A decode step
//! over the same sequences as the step before, each one token further,
//! takes that step's rows and moves them on by one position on each device
//! (`advance_decode_rows`), so that a steady decode writes nothing from the
//! host.

use std::cell::OnceCell;

use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{advance_decode_rows, KeyRanges, RowIndex};

use crate::causal::Context;
use crate::error::{ModelError, Result};
use crate::placement::Placement;

/// A pass's rows on one device.
pub struct DeviceRows {
    pub positions: RowIndex,
    pub cache_rows: RowIndex,
    keys: KeyRanges,
    sliding_keys: Option<KeyRanges>,
}

impl DeviceRows {
    /// The key ranges of a full-attention layer, or of a sliding one.
    pub fn keys(&self, sliding: bool) -> Result<&KeyRanges> {
        match sliding {
            false => Ok(&self.keys),
            true => self
                .sliding_keys
                .as_ref()
                .ok_or_else(|| ModelError::Device("no sliding-window key ranges for this pass".into())),
        }
    }
}

/// A pass's rows, on each device that has asked for them.
pub struct PassRows {
    /// `(slot, positions it will hold after the pass)` per sequence.
    seqs: Vec<(usize, usize)>,
    /// Each sequence's rows in the pass.
    counts: Vec<usize>,
    /// Its rows as the host made them, one position on for each step they
    /// were moved on since (for a device that asks later).
    positions: Vec<u32>,
    cache_rows: Vec<u32>,
    keys: Vec<(u32, u32)>,
    sliding: Vec<(u32, u32)>,
    /// The sliding window's keys (0: the model has none).
    window: usize,
    devices: Vec<OnceCell<DeviceRows>>,
}

impl PassRows {
    /// The rows of a pass over `seqs` (`(slot, ids)` each) after what `ctx`
    /// holds, with sliding windows of `window` keys (0: none): the last
    /// pass's moved on where it was a decode step of the same sequences
    /// and this one is the next, else new ones.
    pub fn for_pass<R: Runtime>(
        placement: &Placement<R>,
        ctx: &mut Context,
        seqs: &[(usize, &[u32])],
        window: usize,
    ) -> PassRows {
        let lens: Vec<usize> = seqs.iter().map(|&(slot, _)| ctx.len(slot)).collect();
        let next = |rows: &PassRows| {
            // The last pass a decode step too: one row per sequence.
            rows.window == window
                && rows.seqs.len() == seqs.len()
                && rows.positions.len() == seqs.len()
                && rows
                    .seqs
                    .iter()
                    .zip(seqs)
                    .zip(&lens)
                    .all(|((&(slot, end), &(s, ids)), &len)| slot == s && ids.len() == 1 && len == end)
        };
        match ctx.take_rows() {
            Some(mut rows) if next(&rows) => {
                rows.step(placement);
                rows
            }
            _ => PassRows::new(ctx, seqs, window, placement.devices().len()),
        }
    }

    fn new(ctx: &Context, seqs: &[(usize, &[u32])], window: usize, devices: usize) -> PassRows {
        let mut rows = PassRows {
            seqs: Vec::new(),
            counts: Vec::new(),
            positions: Vec::new(),
            cache_rows: Vec::new(),
            keys: Vec::new(),
            sliding: Vec::new(),
            window,
            devices: (0..devices).map(|_| OnceCell::new()).collect(),
        };
        for &(slot, ids) in seqs {
            let base = slot * ctx.capacity();
            let start = ctx.len(slot);
            rows.seqs.push((slot, start + ids.len()));
            rows.counts.push(ids.len());
            for position in start..start + ids.len() {
                rows.positions.push(position as u32);
                rows.cache_rows.push((base + position) as u32);
                let (start, end) = KeyRanges::causal(position, 0);
                rows.keys.push((base as u32 + start, base as u32 + end));
                let (start, end) = KeyRanges::causal(position, window);
                rows.sliding.push((base as u32 + start, base as u32 + end));
            }
        }
        rows
    }

    /// Moves every row one position on: on the devices that hold them, by
    /// a kernel; on the host, for the devices that may ask later.
    fn step<R: Runtime>(&mut self, placement: &Placement<R>) {
        for (device, cell) in self.devices.iter_mut().enumerate() {
            if let Some(rows) = cell.get_mut() {
                let sliding = rows.sliding_keys.as_mut().map(|keys| (keys, self.window));
                advance_decode_rows(
                    placement.client(device),
                    &mut rows.positions,
                    &mut rows.cache_rows,
                    &mut rows.keys,
                    sliding,
                );
            }
        }
        for (_, end) in &mut self.seqs {
            *end += 1;
        }
        for (i, position) in self.positions.iter_mut().enumerate() {
            *position += 1;
            self.cache_rows[i] += 1;
            self.keys[i].1 += 1;
            // The sequence's first cache row: its range ended at it plus
            // the old position plus one.
            let base = self.sliding[i].1 - *position;
            let (start, end) = KeyRanges::causal(*position as usize, self.window);
            self.sliding[i] = (base + start, base + end);
        }
    }

    /// `(slot, first position, rows)` of each sequence, in the pass's
    /// order of rows.
    pub fn sequences(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let seqs = self.seqs.iter().zip(&self.counts);
        seqs.map(|(&(slot, end), &rows)| (slot, end - rows, rows))
    }

    /// The rows on `device`, made there now if it is the first time.
    pub fn get<R: Runtime>(&self, placement: &Placement<R>, device: usize) -> Result<&DeviceRows> {
        let cell = self
            .devices
            .get(device)
            .ok_or_else(|| ModelError::Device(format!("no device #{device} in this group")))?;
        Ok(cell.get_or_init(|| {
            let client = placement.client(device);
            DeviceRows {
                positions: RowIndex::new(client, &self.positions),
                cache_rows: RowIndex::new(client, &self.cache_rows),
                keys: KeyRanges::new(client, &self.keys),
                sliding_keys: (self.window > 0).then(|| KeyRanges::new(client, &self.sliding)),
            }
        }))
    }
}
