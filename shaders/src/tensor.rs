use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::workspace::{self, Lease};
use crate::KernelError;

/// A row-major f32 tensor in one device buffer.
///
/// Cloning is cheap: it shares the buffer, which is freed (or, for a
/// workspace buffer, free for reuse) when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub handle: Handle,
    pub shape: Vec<usize>,
    /// Keeps a workspace buffer from being reused while the tensor lives.
    lease: Lease,
}

impl Tensor {
    /// A tensor of `shape` in the buffer `handle`, which holds its values.
    pub fn from_handle(handle: Handle, shape: &[usize]) -> Self {
        Tensor {
            handle,
            shape: shape.to_vec(),
            lease: Lease::default(),
        }
    }

    /// Uploads `data` as a tensor of `shape`.
    pub fn from_f32<R: Runtime>(client: &ComputeClient<R>, data: &[f32], shape: &[usize]) -> Self {
        debug_assert_eq!(data.len(), shape.iter().product::<usize>());
        Tensor::from_handle(crate::profile::upload(client, f32::as_bytes(data)), shape)
    }

    /// An uninitialised tensor of `shape` for a pass's intermediate values,
    /// in a workspace buffer that later passes reuse once it is dropped.
    pub fn empty<R: Runtime>(client: &ComputeClient<R>, shape: &[usize]) -> Self {
        let len: usize = shape.iter().product();
        let (handle, lease) = workspace::take(client, len * size_of::<f32>());
        Tensor {
            handle,
            shape: shape.to_vec(),
            lease,
        }
    }

    /// An uninitialised tensor of `shape` in a buffer of its own, for values
    /// that outlive a pass (weights widened at load).
    pub fn allocate<R: Runtime>(client: &ComputeClient<R>, shape: &[usize]) -> Self {
        let len: usize = shape.iter().product();
        Tensor::from_handle(crate::profile::empty(client, len * size_of::<f32>()), shape)
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows of a tensor seen as a matrix whose rows are its last dimension.
    pub fn rows(&self) -> usize {
        self.len() / self.cols().max(1)
    }

    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Rows that belong to one sequence: the next-to-last dimension of a
    /// tensor of three or more, else all of them. One row per sequence is a
    /// decode step (`[sequences, 1, ..]`).
    pub(crate) fn rows_per_sequence(&self) -> usize {
        match self.shape.as_slice() {
            [_, rows, _] => *rows,
            _ => self.rows(),
        }
    }

    /// This tensor's shape with the last dimension set to `cols`: the shape
    /// of a matmul's output, which keeps the input's leading dimensions.
    pub fn shape_with_cols(&self, cols: usize) -> Vec<usize> {
        let mut shape = self.shape.clone();
        if let Some(last) = shape.last_mut() {
            *last = cols;
        }
        shape
    }

    /// Waits for the device and copies the tensor to the host.
    pub fn to_vec<R: Runtime>(&self, client: &ComputeClient<R>) -> Result<Vec<f32>, KernelError> {
        let bytes = crate::profile::read(client, &self.handle)?;
        Ok(f32::from_bytes(&bytes)[..self.len()].to_vec())
    }

    /// The same buffer seen with another shape of the same size.
    pub fn reshape(&self, shape: &[usize]) -> Tensor {
        debug_assert_eq!(self.len(), shape.iter().product::<usize>());
        Tensor {
            handle: self.handle.clone(),
            shape: shape.to_vec(),
            lease: self.lease.clone(),
        }
    }

    /// What keeps its buffer from reuse, for a weight seen in it.
    pub(crate) fn lease(&self) -> Lease {
        self.lease.clone()
    }

    /// The same tensor, keeping `lease`'s buffer from reuse too.
    pub(crate) fn with_lease(self, lease: Lease) -> Tensor {
        Tensor { lease, ..self }
    }

    /// The buffer as u32 words, for a kernel argument the kernel does not
    /// read (the unused half of a choice between an f32 and a packed
    /// buffer).
    pub(crate) fn words_arg<R: Runtime>(&self) -> ArrayArg<R> {
        // SAFETY: f32 and u32 words have the same size; the length is the
        // tensor's own element count.
        unsafe { ArrayArg::from_raw_parts(self.handle.clone(), self.len().max(1)) }
    }

    pub(crate) fn arg<R: Runtime>(&self) -> ArrayArg<R> {
        // SAFETY: the length is the tensor's own element count, which the
        // buffer was allocated for.
        unsafe { ArrayArg::from_raw_parts(self.handle.clone(), self.len()) }
    }
}
