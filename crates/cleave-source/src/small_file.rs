//! Small files read whole (a hub ref, the token, an ollama manifest or
//! parameters layer): their kind and size are checked before they are
//! opened, since a FIFO would block the read and a device never end it,
//! and the read stops past the bound should the file grow meanwhile.

use std::io::Read;
use std::path::Path;

/// The bytes of the regular file at `path` (or of the one a link names),
/// at most `max`. A missing file is the `NotFound` error, for the caller
/// to judge; any other kind of file, or a larger one, is refused.
pub fn read(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let metadata = std::fs::metadata(path)?;
    if !metadata.is_file() {
        return Err(std::io::Error::other(not_a_file(&metadata)));
    }
    let too_large =
        |size: u64| std::io::Error::other(format!("{size} bytes, more than the {max} such a file may have"));
    if metadata.len() > max {
        return Err(too_large(metadata.len()));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// What a path is that should have been a regular file.
pub fn not_a_file(metadata: &std::fs::Metadata) -> String {
    let kind = metadata.file_type();
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO, not a regular file".into();
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device, not a regular file".into();
        }
        if kind.is_socket() {
            return "a socket, not a regular file".into();
        }
    }
    if kind.is_dir() {
        "a directory, not a regular file".into()
    } else {
        "not a regular file".into()
    }
}
