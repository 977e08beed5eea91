//! Opening the files symbolization reads (objects, their debug files) so that neither the
//! open nor a read can wait for ever: whatever sits at the path is opened without
//! blocking and used only if it is a regular file. A FIFO at `/usr/lib/debug/…` (or a
//! device, a directory) would otherwise hold a blocking-pool thread in `open(2)` until
//! something writes to it.

use std::fs::File;
use std::path::Path;

/// `path` opened for reading if it is a regular file; `None` for anything else (a FIFO,
/// a socket, a device, a directory) and for what cannot be opened.
pub(crate) fn open_regular(path: &Path) -> Option<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(elf)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        // `O_NONBLOCK`: opening a FIFO returns at once instead of waiting for a writer,
        // and `O_NOCTTY` keeps a terminal from becoming this process's.
        options.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    }
    let file = options.open(path).ok()?;
    // `fstat` of what was opened, not `stat` of the path, which may change in between.
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    #[cfg(elf)]
    blocking(&file)?;
    Some(file)
}

/// Clears `O_NONBLOCK` again: Linux ignores it for regular files, but a file system may
/// not, and reads of an object file should wait for the disk rather than fail.
#[cfg(elf)]
fn blocking(file: &File) -> Option<()> {
    use std::os::fd::AsRawFd as _;
    let fd = file.as_raw_fd();
    // SAFETY: `fd` is open (borrowed from `file`); F_GETFL reads its flags only. It fails
    // only where `fd` is not open, and F_SETFL below then fails too: no check between.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above; F_SETFL changes only this open file's status flags.
    let set = unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) };
    (set == 0).then_some(())
}

#[cfg(test)]
#[cfg(elf)]
mod tests {
    use std::os::fd::AsRawFd as _;

    use super::*;

    /// A regular file is opened, and read as a regular file is: blocking again.
    #[test]
    fn a_regular_file_is_opened_for_blocking_reads_and_a_directory_is_not() {
        let file = open_regular(Path::new("/proc/self/exe")).expect("this test binary");
        // SAFETY: the descriptor is open (borrowed from `file`); F_GETFL reads its flags.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        assert!(flags >= 0);
        assert_eq!(
            flags & libc::O_NONBLOCK,
            0,
            "O_NONBLOCK cleared: {flags:#x}"
        );
        assert!(
            open_regular(Path::new("/proc/self")).is_none(),
            "a directory"
        );
        assert!(open_regular(Path::new("/nonexistent/krabka")).is_none());
    }
}
