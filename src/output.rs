//! Standard output as the commands write it. A reader that goes away
//! (`cleave run ... | head -c 3`) ends the command quietly with success,
//! as `head` users expect; any other failure (`> /dev/full`) is an error
//! naming stdout. `println!` would panic in both cases.

use std::fmt;
use std::io::{self, Write};

/// Writes `text` to stdout and flushes it.
pub fn write(text: fmt::Arguments) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    stdout.write_fmt(text)?;
    stdout.flush()
}

/// [`write`], with the error saying it was stdout.
pub fn print(text: fmt::Arguments) -> anyhow::Result<()> {
    write(text).map_err(|e| anyhow::Error::new(e).context("writing to stdout"))
}

/// Whether `error` is stdout's reader having gone away.
pub fn is_closed_pipe(error: &anyhow::Error) -> bool {
    error
        .chain()
        .filter_map(|cause| cause.downcast_ref::<io::Error>())
        .any(|e| e.kind() == io::ErrorKind::BrokenPipe)
}

/// `println!` that returns the error instead of panicking.
macro_rules! outln {
    () => {
        $crate::output::print(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::print(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that returns the error instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::print(format_args!($($arg)*))
    };
}

pub(crate) use {out, outln};
