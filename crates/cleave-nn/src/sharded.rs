//! A sublayer whose output is a sum over shards on several devices: the
//! heads of attention or the columns of an MLP in tensor split. It carries
//! its split, as a row-parallel layer does: each shard's partial sum, their
//! all-reduce at home, the bias added once and the output norm, then the
//! add into the residual stream. A family's block calls
//! [`Sharded::add_into`] and never sees the split.

use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{add_assign, add_bias, rms_norm, Tensor};

use crate::{Input, ModelError, Placement, Proj, Result};

/// Where a shard's last step puts its output.
#[derive(Clone, Copy)]
pub enum Store<'a> {
    /// Added into the residual stream (at home), by the last projection
    /// as it stores where it can.
    Add(&'a Tensor),
    /// Into a tensor of its own on the shard's device: a partial sum.
    Apart,
}

impl Store<'_> {
    /// `x · Wᵀ + b` of `proj` on device `here`, stored as this says: the
    /// partial sum, or `None` once added.
    pub fn project<R: Runtime>(
        self,
        proj: &Proj,
        placement: &Placement<R>,
        here: usize,
        x: &Tensor,
    ) -> Result<Option<Tensor>> {
        match self {
            Store::Add(into) => proj.accumulate(placement, here, x, into).map(|()| None),
            Store::Apart => proj.forward(placement, here, x).map(Some),
        }
    }

    /// `y`, computed on device `here`, stored as this says.
    pub fn put<R: Runtime>(self, placement: &Placement<R>, here: usize, y: Tensor) -> Result<Option<Tensor>> {
        match self {
            Store::Add(into) => Ok(add_assign(placement.client(here), into, &y).map(|()| None)?),
            Store::Apart => Ok(Some(y)),
        }
    }
}

/// A sublayer in shards, each on one device, whose outputs sum to its
/// output at `home`, where the residual stream is.
pub struct Sharded<S> {
    home: usize,
    shards: Vec<(usize, S)>,
    /// Added once, after the all-reduce (inside the shards' projections
    /// where there is one shard).
    bias: Option<Tensor>,
    /// A norm of the output before the residual add (Gemma), with its ε.
    out_norm: Option<(Tensor, f32)>,
}

impl<S> Sharded<S> {
    /// `shards`, `(device, shard)` each, summed at `home`.
    pub fn new(home: usize, shards: Vec<(usize, S)>) -> Self {
        Sharded {
            home,
            shards,
            bias: None,
            out_norm: None,
        }
    }

    /// With `bias` added once to the shards' sum.
    pub fn with_bias(self, bias: Option<Tensor>) -> Self {
        Sharded { bias, ..self }
    }

    /// With the sum RMS-normed by `weight` before it is added.
    pub fn with_out_norm(self, weight: Option<Tensor>, eps: f32) -> Self {
        Sharded {
            out_norm: weight.map(|w| (w, eps)),
            ..self
        }
    }

    /// The shards, `(device, shard)` each, in the order they are summed.
    pub fn shards(&self) -> &[(usize, S)] {
        &self.shards
    }

    /// `residual += sublayer(input)`, both at home. Shard `i` runs as
    /// `run(i, shard, device, input, store)` with its input on its device.
    /// One shard at home, with no bias or norm after the sum, adds its
    /// output straight into the residual stream (`Store::Add`); otherwise
    /// each returns its partial sum (`Store::Apart`).
    pub fn add_into<R: Runtime>(
        &self,
        placement: &Placement<R>,
        residual: &Tensor,
        input: Input,
        mut run: impl FnMut(usize, &S, usize, Input, Store) -> Result<Option<Tensor>>,
    ) -> Result<()> {
        let home = self.home;
        let client = placement.client(home);
        if let [(device, shard)] = self.shards.as_slice() {
            if *device == home && self.bias.is_none() && self.out_norm.is_none() {
                return run(0, shard, home, input, Store::Add(residual)).map(|_| ());
            }
        }
        // Shards elsewhere get a copy of the input, normed once at home;
        // shards at home norm it as they read.
        let elsewhere = self.shards.iter().any(|(device, _)| *device != home);
        let shared = elsewhere.then(|| input.values(client)).transpose()?;
        let mut partials = Vec::with_capacity(self.shards.len());
        for (i, (device, shard)) in self.shards.iter().enumerate() {
            let copy;
            let input = match &shared {
                Some(x) => {
                    copy = placement.copy_to(x, home, *device);
                    Input::plain(&copy)
                }
                None => input,
            };
            let partial = run(i, shard, *device, input, Store::Apart)?
                .ok_or_else(|| ModelError::Device(format!("a shard on device {device} stored no partial sum")))?;
            partials.push((*device, partial));
        }
        let mut sum = placement.all_reduce(partials, home)?;
        if let Some(bias) = &self.bias {
            add_bias(client, &sum, bias)?;
        }
        if let Some((norm, eps)) = &self.out_norm {
            sum = rms_norm(client, &sum, norm, *eps)?;
        }
        Ok(add_assign(client, residual, &sum)?)
    }
}
