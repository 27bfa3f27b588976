use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::KernelError;

/// A row-major f32 tensor in one device buffer.
///
/// Cloning is cheap: it shares the buffer, which is freed when the last
/// clone is dropped.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub handle: Handle,
    pub shape: Vec<usize>,
}

impl Tensor {
    /// Uploads `data` as a tensor of `shape`.
    pub fn from_f32<R: Runtime>(client: &ComputeClient<R>, data: &[f32], shape: &[usize]) -> Self {
        debug_assert_eq!(data.len(), shape.iter().product::<usize>());
        Tensor {
            handle: client.create_from_slice(f32::as_bytes(data)),
            shape: shape.to_vec(),
        }
    }

    /// An uninitialised tensor of `shape`.
    pub fn empty<R: Runtime>(client: &ComputeClient<R>, shape: &[usize]) -> Self {
        let len: usize = shape.iter().product();
        Tensor {
            // A zero-sized buffer is not allowed on every backend.
            handle: client.empty(len.max(1) * size_of::<f32>()),
            shape: shape.to_vec(),
        }
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
        let bytes = client
            .read_one(self.handle.clone())
            .map_err(|e| KernelError::Read(format!("{e:?}")))?;
        Ok(f32::from_bytes(&bytes)[..self.len()].to_vec())
    }

    /// The same buffer seen with another shape of the same size.
    pub fn reshape(&self, shape: &[usize]) -> Tensor {
        debug_assert_eq!(self.len(), shape.iter().product::<usize>());
        Tensor {
            handle: self.handle.clone(),
            shape: shape.to_vec(),
        }
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
