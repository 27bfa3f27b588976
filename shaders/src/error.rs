use cubecl::server::ServerError;
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
    /// A kernel launched before a read failed on the device: a launch the
    /// driver refused on the device's thread, after its call had returned
    /// `Ok`, or a fault while it ran. Every later read fails as well.
    #[error("the device failed a kernel launched before this read (every later read fails too): {0}")]
    DeviceFailed(String),
}

impl KernelError {
    /// Why waiting on the device or reading from it failed: a kernel that
    /// failed there before, in the device's own words, or the read.
    pub(crate) fn from_device(error: ServerError) -> KernelError {
        match error {
            ServerError::ServerUnhealthy { errors, .. } => {
                let causes: Vec<String> = errors.iter().map(ToString::to_string).collect();
                KernelError::DeviceFailed(causes.join("; "))
            }
            other => KernelError::Read(other.to_string()),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use cubecl::backtrace::BackTrace;

    /// What an H200 answered a read after a kernel whose tensor map CUDA
    /// refused: the error names the failed kernel's cause, not the read.
    #[test]
    fn a_read_after_a_failed_kernel_names_the_failure() {
        let refused = ServerError::Generic {
            reason: "Tile shape must be non-zero and <= 256".into(),
            backtrace: BackTrace::capture(),
        };
        let unhealthy = ServerError::ServerUnhealthy {
            errors: vec![refused],
            backtrace: BackTrace::capture(),
        };
        let message = KernelError::from_device(unhealthy).to_string();
        assert!(
            message.starts_with("the device failed a kernel launched before this read")
                && message.contains("Tile shape must be non-zero and <= 256"),
            "{message}"
        );
        let other = ServerError::Generic {
            reason: "no such buffer".into(),
            backtrace: BackTrace::capture(),
        };
        let message = KernelError::from_device(other).to_string();
        assert!(
            message.starts_with("reading a result back") && message.contains("no such buffer"),
            "{message}"
        );
    }
}
