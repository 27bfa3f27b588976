use thiserror::Error;

/// Why an op refused to launch, or why its results could not be read back.
#[derive(Debug, Error)]
pub enum KernelError {
    #[error("{op}: {what} has shape {got:?}, expected {expected}")]
    Shape {
        op: &'static str,
        what: &'static str,
        got: Vec<usize>,
        expected: String,
    },
    /// A typed weight that cannot be stored or read as asked: bytes that
    /// are not whole blocks or not the length the shape takes, rows past
    /// its end.
    #[error("{op}: {problem}")]
    Weight { op: &'static str, problem: String },
    /// A kernel library refused to launch (a shape or type it has no
    /// kernel for).
    #[error("{op}: {problem}")]
    Launch { op: &'static str, problem: String },
    #[error("reading a result back from the device failed: {0}")]
    Read(String),
}

/// Fails with [`KernelError::Shape`] unless `ok`.
pub(crate) fn check_shape(
    ok: bool,
    op: &'static str,
    what: &'static str,
    got: &[usize],
    expected: impl FnOnce() -> String,
) -> Result<(), KernelError> {
    if ok {
        Ok(())
    } else {
        Err(KernelError::Shape {
            op,
            what,
            got: got.to_vec(),
            expected: expected(),
        })
    }
}
