//! Opening the files a model is made of. Each must be a regular file: a
//! FIFO under a model file's name would block its reader forever, a device
//! such as /dev/zero would never end, and a directory fails obscurely, so
//! the kind is checked before the file is opened. Every loader (configs,
//! tokenizers, weights, adapters, GGUF files, pipeline parts) opens its
//! files through here.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Opens `path` for reading if it is a regular file (links followed).
pub fn open_regular(path: &Path) -> io::Result<File> {
    if !std::fs::metadata(path)?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    File::open(path)
}

/// The bytes of `path`, which must be a regular file.
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open_regular(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The text of `path`, which must be a regular file holding UTF-8.
pub fn read_regular_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read_regular(path)?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    // FIFOs, which would block a test that opened one, are tried under a
    // deadline by the CLI's error tests (tests/errors.rs).
    #[test]
    fn only_regular_files_are_opened() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.json");
        std::fs::write(&file, "{}").unwrap();
        assert_eq!(read_regular_to_string(&file).unwrap(), "{}");
        let err = read_regular(dir.path()).unwrap_err();
        assert_eq!(err.to_string(), "not a regular file");
    }
}
